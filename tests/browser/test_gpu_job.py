"""A digits job with executionFiles in the page on Chromium's SwiftShader
(--enable-unsafe-webgpu, as test_webgpu.py launches it): with 'gpu' it trains
on the GPU through the shim in the page's Python; with 'auto' SwiftShader is
refused by name and the job completes on the CPU Workers.
"""

from __future__ import annotations

from typing import Any

from site_helpers import TIMEOUT_MS
from test_api import PRELUDE, ready

# Small shapes: SwiftShader is slow. 15 chunks, one pass: 15 assignments.
SETTINGS = {"epochs": 1, "localEpochs": 1, "batchSize": 32, "coordinatorParticipates": True}

RUN = """async ([preference, settings]) => {
  const training = T.api();
  const pkg = await T.pkg('digits-mlp');
  const archive = await T.fetchFile('models/digits-mlp/model.wgsl.json', 'model.wgsl.json', 'application/json');
  await training.setBackendPreference(preference);
  await training.createJob({ wasm: pkg.wasm, manifest: pkg.manifest, files: pkg.files, settings,
                             executionFiles: [archive] });
  await training.start();
  await T.waitFor('the job to complete', () => T.done(training.getState()), 240000);
  const state = training.getState();
  const own = state.diagnostics[state.myPeerId];
  return { status: state.job.status, error: state.error || null, execution: state.execution, own,
           events: training.getDebugLog().events.filter((e) => e.event.startsWith('gpu.')) };
}"""


def _run(browser: Any, url: str, preference: str) -> dict[str, Any]:
    pg = browser.new_page()
    pg.set_default_timeout(TIMEOUT_MS * 4)
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    ready(pg, url)
    out = pg.evaluate(RUN, [preference, SETTINGS])
    pg.close()
    assert not errors, errors
    return out


def test_a_digits_job_trains_on_the_gpu_in_the_page(weei_server: Any, webgpu_browser: Any) -> None:
    out = _run(webgpu_browser, weei_server.url, "gpu")
    assert out["error"] is None and out["status"] == "completed"
    assert out["execution"]["actual"] == "gpu" and out["execution"]["fallback"] == "none", out["events"][:3]
    own = out["own"]
    assert own["execution"]["backend"] == "gpu-webgpu" and own["execution"]["fallbackReason"] is None
    assert own["gpu"]["webgpu"] == "available" and own["gpu"]["adapter"] != "unknown"
    assert own["model"]["wgsl"]["present"] is True and len(own["model"]["wgsl"]["sha256"]) == 4
    assert own["timings"]["compilationMs"] is not None
    trained = [e for e in out["events"] if e["event"] == "gpu.trained"]
    assert len(trained) == 15
    print("gate:", trained[0]["details"]["gate"], "| step ms:",
          [round(e["details"]["trainingMs"] / max(1, e["details"]["steps"]), 1) for e in trained[:3]],
          "| compilationMs:", own["timings"]["compilationMs"])


def test_auto_refuses_swiftshader_and_the_job_completes_on_the_cpu(weei_server: Any,
                                                                   webgpu_browser: Any) -> None:
    out = _run(webgpu_browser, weei_server.url, "auto")
    assert out["error"] is None and out["status"] == "completed"
    assert out["execution"] == {**out["execution"], "actual": "cpu", "fallback": "cpu: software-adapter"}
    assert out["own"]["execution"]["fallbackReason"].startswith("software-adapter:")
    assert out["own"]["gpu"]["initializationError"].startswith("software-adapter:")
