"""The served site in headless Chromium: workers train, the page aggregates,
an embedding page on another origin works, and every result is bit-identical
to CPython's (wasmtime, numpy, native C)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from site_helpers import JS_FROM_B64, ROOT, b64

MODELS = ROOT / "app" / "static" / "models"
DIGITS_FORMAT = "weei-digits-v1"
TRAIN = {"initSeed": "7", "seed": "12345", "chunk": 2, "settings": {"localEpochs": 2, "batchSize": 16}}


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def wasmtime_training(options: dict[str, Any]) -> tuple[str, str, dict[str, float], int]:
    """The same training as the test hook trainOnce(options) under wasmtime:
    (start sha, trained sha, metrics, unique examples)."""
    from weei.runtime import ModelRuntime, WasmtimeEngine

    runtime = ModelRuntime.load((MODELS / "digits-mlp" / "model.wasm").read_bytes(), WasmtimeEngine())
    start = runtime.create_initial_weights(int(options["initSeed"]))
    chunk = sorted((MODELS / "digits-mlp" / "data").glob("training-*.bin"))[options["chunk"]]
    runtime.load_model(start)
    result = runtime.train(data=chunk.read_bytes(), format=DIGITS_FORMAT, seed=int(options["seed"]),
                           settings=options["settings"])
    return sha256(start), sha256(result.weights), result.metrics, result.unique_examples or 0


#: The test hooks (window.__weeiTestHooks): index.html has them under `weei serve --test-hooks` (start_server),
#: a page of another origin with window.WEEI_TEST_HOOKS = true (see TEST_HOOKS).
HOOKS = "__weeiTestHooks.get('distributed-training')"
TEST_HOOKS = "window.WEEI_TEST_HOOKS = true"

TRAIN_JS = f"""async (options) => {{
  await weeiReady;
  const hooks = {HOOKS};
  const result = await hooks.trainOnce('digits-mlp', options);
  return {{ result, state: hooks.status(), origin: location.origin }};
}}"""


def check_training(out: dict[str, Any]) -> None:
    start_sha, trained_sha, metrics, unique = wasmtime_training(TRAIN)
    result = out["result"]
    assert result["startSha256"] == start_sha
    assert result["weightsSha256"] == trained_sha, "browser and wasmtime training differ"
    assert result["metrics"] == pytest.approx(metrics, abs=0, rel=0)
    assert result["uniqueExamples"] == unique == 100
    assert result["progressReports"] >= 1


def test_site_loads_and_worker_trains_like_wasmtime(weei_server: Any, page: Any) -> None:
    pg, log = page
    pg.goto(weei_server.url)
    keys = pg.evaluate("weeiReady.then((w) => Object.keys(w.widgetsApi.get('distributed-training')))")
    assert "getState" in keys and "_debug" not in keys, "the test hooks are not on the API object"
    state = pg.evaluate(f"{HOOKS}.status()")
    assert state["baseUrl"] == weei_server.url
    out = pg.evaluate(TRAIN_JS, TRAIN)
    check_training(out)
    assert out["state"]["worker"] == "ready" and out["state"]["trainings"] == 1
    assert not log.errors, log.errors


CARTPOLE = {"initSeed": "3", "experience": {"unitStart": 64, "unitCount": 6, "seed": "424242"},
            "settings": {"localEpochs": 1, "batchSize": 16}}


def test_worker_trains_experience_and_evaluates_like_wasmtime(weei_server: Any, page: Any) -> None:
    from weei.runtime import ModelRuntime, WasmtimeEngine

    pg, log = page
    pg.goto(weei_server.url)
    # Two models in turn in one Worker: loadModel replaces the instance.
    check_training(pg.evaluate(TRAIN_JS, TRAIN))
    out = pg.evaluate(f"""async (options) => {{
      await weeiReady;
      const hooks = {HOOKS};
      const result = await hooks.trainOnce('cartpole-reinforce', {{ ...options, returnWeights: true }});
      const client = await hooks.worker();
      const evaluation = await client.request('evaluate', {{
        weights: result.weights, experience: {{ unitStart: 0, unitCount: 4, seed: '7' }} }});
      const bad = await client.request('train', {{ weights: new ArrayBuffer(12), settings: {{}},
        experience: {{ unitStart: 0, unitCount: 1, seed: '1' }} }}).catch((e) => ({{ reason: e.reason, kind: e.kind }}));
      delete result.weights;
      return {{ result, evaluation: {{ metrics: evaluation.metrics, examples: evaluation.examples }}, bad }};
    }}""", CARTPOLE)
    runtime = ModelRuntime.load((MODELS / "cartpole-reinforce" / "model.wasm").read_bytes(), WasmtimeEngine())
    start = runtime.create_initial_weights(3)
    runtime.load_model(start)
    exp = CARTPOLE["experience"]
    trained = runtime.train(experience=(exp["unitStart"], exp["unitCount"], int(exp["seed"])),
                            settings=CARTPOLE["settings"])
    runtime.load_model(trained.weights)
    runtime.load_auxiliary({})
    evaluation = runtime.evaluate(experience=(0, 4, 7))
    assert out["result"]["startSha256"] == sha256(start)
    assert out["result"]["weightsSha256"] == sha256(trained.weights)
    assert out["result"]["completedUnits"] == trained.completed_units == 6
    assert out["evaluation"] == {"metrics": evaluation.metrics, "examples": evaluation.examples}
    assert out["bad"]["kind"] == "model" and out["bad"]["reason"]  # the module refused 12 bytes of weights
    assert not log.errors, log.errors


def test_weei_ready_does_not_wait_for_python(weei_server: Any, page: Any) -> None:
    pg, log = page
    pg.goto(weei_server.url)
    state = pg.evaluate(f"weeiReady.then(() => {HOOKS}.status())")
    # The page's Pyodide takes seconds; the API object must exist before.
    assert state["pagePython"] in ("not-started", "starting")
    seconds = pg.evaluate(f"{HOOKS}.startPagePython()")
    assert seconds > 0
    assert pg.evaluate(f"{HOOKS}.status().pagePython") == "ready"
    assert not log.errors, log.errors


def _round(rng: np.random.Generator, n: int, k: int) -> dict[str, Any]:
    def f32(scale: float = 1.0) -> bytes:
        return (rng.standard_normal(n) * scale).astype("<f4").tobytes()

    start = f32()
    return {
        "start": start,
        # Ids out of order: the kernel must sort them into canonical order.
        "updates": [(f"a-{j:03d}", int(rng.integers(1, 500)), f32()) for j in rng.permutation(k)],
        "moments": np.abs(rng.standard_normal(2 * n) * 0.01).astype("<f4").tobytes(),
    }


AGGREGATE_JS = f"""async (spec) => {{
  const fromB64 = {JS_FROM_B64};
  await weeiReady;
  const r = await {HOOKS}.aggregate({{
    start: fromB64(spec.start),
    updates: spec.updates.map(([id, count, w]) => ({{ id, count, weights: fromB64(w) }})),
    method: spec.method,
    options: spec.options,
    state: spec.state ? fromB64(spec.state) : null,
    stateStep: spec.stateStep,
    averageOnly: spec.averageOnly,
  }});
  return {{ weightsSha256: r.weightsSha256, stateSha256: r.stateSha256, stateStep: r.stateStep }};
}}"""


@pytest.mark.parametrize("method", ["fedavg", "fedavgm", "fedadam"])
def test_page_kernel_matches_cpython(weei_server: Any, page: Any, method: str) -> None:
    from weei.core.aggregation.aggregate import AggregationState, aggregate_round
    from weei.core.formats.modelinfo import ModelAggregation
    from weei.core.formats.settings import AggregationSettings
    from weei.kernel.native import NativeKernel
    from weei.kernel.numpy_kernel import NumpyKernel

    pg, log = page
    pg.goto(weei_server.url)
    rng = np.random.default_rng(20240501)
    n = 40_003  # not a multiple of the SIMD width or the kernel's tile
    data = _round(rng, n, 5)
    options = {"fedavg": {}, "fedavgm": {"serverLearningRate": 0.7, "momentum": 0.85},
               "fedadam": {"serverLearningRate": 0.01, "beta1": 0.9, "beta2": 0.99, "epsilon": 1e-3}}[method]
    average_only = [{"offset": 400, "bytes": 1200}, {"offset": 80_000, "bytes": 4}]
    state_data = {"fedavg": None, "fedavgm": data["moments"][: 4 * n], "fedadam": data["moments"]}[method]

    settings = AggregationSettings.from_json({"method": method, **options})
    state = AggregationState(method, 3, state_data) if state_data is not None else None
    model = ModelAggregation.from_json({"averageOnly": average_only})
    expected = [
        aggregate_round(kernel, data["start"], data["updates"], settings, state, model)
        for kernel in (NumpyKernel(), NativeKernel())
    ]
    assert expected[0] == expected[1]
    out = pg.evaluate(AGGREGATE_JS, {
        "start": b64(data["start"]),
        "updates": [[aid, count, b64(w)] for aid, count, w in data["updates"]],
        "method": method, "options": options,
        "state": None if state_data is None else b64(state_data), "stateStep": 3,
        "averageOnly": average_only,
    })
    assert out["weightsSha256"] == sha256(expected[0].weights)
    if method == "fedavg":
        assert out["stateSha256"] is None
    else:
        assert expected[0].state is not None
        assert out["stateSha256"] == sha256(expected[0].state.data)
        assert out["stateStep"] == 4
    assert not log.errors, log.errors


def test_page_kernel_robust_matches_cpython(weei_server: Any, page: Any) -> None:
    """Norm clipping, trimmed mean and median in the page's WebAssembly give CPython's bits."""
    from weei.core.aggregation.aggregate import aggregate_round
    from weei.core.formats.settings import AggregationSettings
    from weei.kernel.native import NativeKernel
    from weei.kernel.numpy_kernel import NumpyKernel

    pg, log = page
    pg.goto(weei_server.url)
    rng = np.random.default_rng(20261201)
    n = 40_003  # not a multiple of the SIMD width, the lanes or the rank tile
    data = _round(rng, n, 5)
    aid, count, w = data["updates"][0]
    data["updates"][0] = (aid, count, (np.frombuffer(w, "<f4") * np.float32(100)).tobytes())  # clipped
    for method, options in (("fedavg", {"normClip": 3}), ("fedavgm", {"normClip": 2.5, "combine": "trimmedMean", "trim": 0.3}),
                            ("fedavg", {"combine": "median"})):
        settings = AggregationSettings.from_json({"method": method, **options})
        expected = [aggregate_round(k, data["start"], data["updates"], settings, None) for k in (NumpyKernel(), NativeKernel())]
        assert expected[0] == expected[1]
        out = pg.evaluate(AGGREGATE_JS, {
            "start": b64(data["start"]), "updates": [[a, c, b64(x)] for a, c, x in data["updates"]],
            "method": method, "options": options, "state": None, "stateStep": 0, "averageOnly": None,
        })
        assert out["weightsSha256"] == sha256(expected[0].weights), options
    assert not log.errors, log.errors


def test_cross_origin_embed_trains(weei_server: Any, host_origin: str, page: Any) -> None:
    pg, log = page
    pg.add_init_script(TEST_HOOKS)
    pg.goto(f"{host_origin}/embed?weei={weei_server.url}")
    out = pg.evaluate(TRAIN_JS, TRAIN)
    assert out["origin"] == host_origin != weei_server.url.rstrip("/")
    check_training(out)
    assert not log.errors, log.errors


def test_cross_origin_embed_opens_the_window_and_hides_the_test_hooks(
        weei_server: Any, host_origin: str, page: Any) -> None:
    """The window's modules (widget.js imports widget/*.js) load from the Weei
    server into a page of another origin; that page did not ask for the test hooks."""
    pg, log = page
    pg.goto(f"{host_origin}/embed?weei={weei_server.url}")
    out = pg.evaluate("""async () => {
      const training = (await weeiReady).widgetsApi.get('distributed-training');
      const widget = await training.enable();
      const root = document.querySelector('[data-weei-widget]').shadowRoot;
      const sections = [...root.querySelectorAll('details.sec')].map((d) => d.dataset.section);
      const hooks = typeof window.__weeiTestHooks;
      widget.close();
      return { sections, hooks, debug: '_debug' in training, origin: location.origin,
               open: !!document.querySelector('[data-weei-widget]') };
    }""")
    assert out["origin"] == host_origin
    assert out["sections"] == ["setup", "progress", "events", "metrics", "checkpoints", "tryit", "diagnostics", "peers",
                               "saved", "debug"]
    assert out["hooks"] == "undefined" and out["debug"] is False and out["open"] is False
    assert not log.errors, log.errors


def test_dist_has_only_what_it_needs(site: Path) -> None:
    names = sorted(p.name for p in (site / "pyodide").iterdir())
    assert names == sorted(["pyodide.mjs", "pyodide.asm.mjs", "pyodide.asm.wasm",
                            "python_stdlib.zip", "pyodide-lock.json"])
    assert (site / "kernel" / "aggregate.wasm").is_file()
    assert (site / "models" / "digits-mlp" / "manifest.json").is_file()
    # The window: its entry module and one module per section.
    assert sorted(p.name for p in (site / "widget").iterdir()) == sorted(
        p.name for p in (ROOT / "app" / "static" / "widget").iterdir())
    assert (site / "widget.js").is_file()
