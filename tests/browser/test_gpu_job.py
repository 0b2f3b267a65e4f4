"""A digits job with executionFiles in the page on Chromium's SwiftShader
(--enable-unsafe-webgpu, as test_webgpu.py launches it): with 'gpu' it trains
on the GPU through the shim in a training Worker's Python (the page itself
never asks for an adapter or a device: an init script counts its calls); a
CartPole job runs hybrid (episodes in the WASM, the updates on SwiftShader),
in a Worker too; with 'auto' SwiftShader is refused by name and the job
completes on the CPU Workers; a GPU task past its (shortened) deadline stops
its Worker and restarts on the CPU, by name.
"""

from __future__ import annotations

import json
from typing import Any

from site_helpers import ROOT, TIMEOUT_MS
from test_api import PRELUDE, ready

# Small shapes: SwiftShader is slow. 15 chunks, one pass: 15 assignments.
SETTINGS = {"epochs": 1, "localEpochs": 1, "batchSize": 32, "coordinatorParticipates": True}
# 2 rounds of 8 episodes: one update of at most 4000 steps per assignment.
CARTPOLE_SETTINGS = {"epochs": 2, "localEpochs": 1, "batchSize": 16, "coordinatorParticipates": True,
                     "experience": {"unitsPerAssignment": 8}}

# Counts the page's own WebGPU calls (an init script runs in the page, not in its Workers).
COUNT_PAGE_GPU = """(() => {
  window.__pageGpu = { requestAdapter: 0, requestDevice: 0 };
  if (!navigator.gpu) return;
  const requestAdapter = navigator.gpu.requestAdapter.bind(navigator.gpu);
  navigator.gpu.requestAdapter = (...args) => { window.__pageGpu.requestAdapter += 1; return requestAdapter(...args); };
  const requestDevice = GPUAdapter.prototype.requestDevice;
  GPUAdapter.prototype.requestDevice = function (...args) {
    window.__pageGpu.requestDevice += 1;
    return requestDevice.apply(this, args);
  };
})();"""

RUN = """async ([preference, settings, model]) => {
  const training = T.api();
  const pkg = await T.pkg(model);
  const archive = await T.fetchFile(`models/${model}/model.wgsl.json`, 'model.wgsl.json', 'application/json');
  await training.setBackendPreference(preference);
  await training.createJob({ wasm: pkg.wasm, manifest: pkg.manifest, files: pkg.files, settings,
                             executionFiles: [archive] });
  await training.start();
  await T.waitFor('the job to complete', () => T.done(training.getState()), 240000);
  const state = training.getState();
  const own = state.diagnostics[state.myPeerId];
  return { status: state.job.status, error: state.error || null, execution: state.execution, own,
           events: training.getDebugLog().events.filter((e) => e.event.startsWith('gpu.')),
           pageGpu: window.__pageGpu };
}"""


def _run(browser: Any, url: str, preference: str, model: str = "digits-mlp",
         settings: dict[str, Any] = SETTINGS) -> dict[str, Any]:
    pg = browser.new_page()
    pg.set_default_timeout(TIMEOUT_MS * 4)
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.add_init_script(COUNT_PAGE_GPU)
    ready(pg, url)
    out = pg.evaluate(RUN, [preference, settings, model])
    pg.close()
    assert not errors, errors
    return out


def _in_a_worker(out: dict[str, Any], trained: list[dict[str, Any]]) -> None:
    """The GPU work ran in a training Worker: the page opened no adapter and no device."""
    assert out["pageGpu"] == {"requestAdapter": 0, "requestDevice": 0}, out["pageGpu"]
    assert trained and all(t["host"] == "worker" for t in trained), trained[:1]


def test_a_digits_job_trains_on_the_gpu_in_a_worker(weei_server: Any, webgpu_browser: Any) -> None:
    out = _run(webgpu_browser, weei_server.url, "gpu")
    assert out["error"] is None and out["status"] == "completed"
    assert out["execution"]["actual"] == "gpu" and out["execution"]["fallback"] == "none", out["events"][:3]
    own = out["own"]
    assert own["execution"]["backend"] == "gpu-webgpu" and own["execution"]["fallbackReason"] is None
    assert own["gpu"]["webgpu"] == "available" and own["gpu"]["adapter"] != "unknown"
    assert own["model"]["wgsl"]["present"] is True and len(own["model"]["wgsl"]["sha256"]) == len(
        json.loads((ROOT / "app/static/models/digits-mlp/model.wgsl.json").read_text())["modules"])
    assert own["timings"]["compilationMs"] is not None
    trained = [e for e in out["events"] if e["event"] == "gpu.trained"]
    assert len(trained) == 15
    _in_a_worker(out, [e["details"] for e in trained])
    print("gate:", trained[0]["details"]["gate"], "| step ms:",
          [round(e["details"]["trainingMs"] / max(1, e["details"]["steps"]), 1) for e in trained[:3]],
          "| compilationMs:", own["timings"]["compilationMs"])


def test_a_cartpole_job_runs_hybrid_in_a_worker(weei_server: Any, webgpu_browser: Any) -> None:
    out = _run(webgpu_browser, weei_server.url, "gpu", "cartpole-reinforce", CARTPOLE_SETTINGS)
    assert out["error"] is None and out["status"] == "completed"
    assert out["execution"]["actual"] == "hybrid" and out["execution"]["fallback"] == "none", out["events"][:3]
    own = out["own"]
    assert own["execution"]["actual"] == "hybrid" and own["execution"]["backend"] == "gpu-webgpu"
    assert own["execution"]["fallbackReason"] is None and own["gpu"]["adapter"] != "unknown"
    trained = [e["details"] for e in out["events"] if e["event"] == "gpu.trained"]
    assert len(trained) == 2 and all(t["hybrid"] and t["steps"] == 1 for t in trained)
    _in_a_worker(out, trained)
    gate = trained[0]["gate"]
    assert gate == "bit-identical" or "weights differ" in gate
    print("cartpole hybrid gate:", gate, "| update ms:", [t["trainingMs"] for t in trained],
          "| compilationMs:", own["timings"]["compilationMs"])


def test_auto_refuses_swiftshader_and_the_job_completes_on_the_cpu(weei_server: Any,
                                                                   webgpu_browser: Any) -> None:
    out = _run(webgpu_browser, weei_server.url, "auto")
    assert out["error"] is None and out["status"] == "completed"
    assert out["execution"] == {**out["execution"], "actual": "cpu", "fallback": "cpu: software-adapter"}
    assert out["own"]["execution"]["fallbackReason"].startswith("software-adapter:")
    assert out["own"]["gpu"]["initializationError"].startswith("software-adapter:")


def test_a_gpu_task_past_its_deadline_stops_the_worker_and_restarts_on_the_cpu(weei_server: Any,
                                                                              webgpu_browser: Any) -> None:
    """trainGpu has a deadline like train (shortened here to 2 s, with a chunk trained 1000 times so the
    GPU cannot finish): the Worker is terminated and replaced, the assignment falls back by name
    (gpu-timeout) and restarts on the CPU, whose update completes a round."""
    pg = webgpu_browser.new_page()
    pg.set_default_timeout(TIMEOUT_MS * 4)
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.add_init_script("window.WEEI_TASK_DEADLINES_MS = { trainGpu: 2000 }")
    ready(pg, weei_server.url)
    out = pg.evaluate("""async (settings) => {
      const training = T.api();
      const pkg = await T.pkg('digits-mlp');
      const archive = await T.fetchFile('models/digits-mlp/model.wgsl.json', 'model.wgsl.json', 'application/json');
      await training.setBackendPreference('gpu');
      const quiet = { ...settings, localEpochs: 1000, validationSchedule: { enabled: false, unit: 'round', every: 1 } };
      await training.createJob({ wasm: pkg.wasm, manifest: pkg.manifest, files: pkg.files, settings: quiet,
                                 executionFiles: [archive] });
      await training.start();
      const fallbacks = () => training.getDebugLog().events.filter((e) => e.event === 'gpu.fallback');
      await T.waitFor('the GPU task to time out', () => fallbacks().length > 0, 240000);
      await T.waitFor('a round trained on the CPU', () => T.rounds(training.getState()).length > 1, 240000);
      const s = training.getState();
      const out = { fallback: fallbacks()[0].details, execution: s.execution, error: s.error,
                    trained: training.getDebugLog().events.filter((e) => e.event === 'gpu.trained').length };
      await training.stop();
      return out;
    }""", SETTINGS)
    pg.close()
    assert out["error"] is None, out
    assert out["fallback"]["reason"] == "gpu-timeout" and out["fallback"]["cpuFallback"] == "restart-assignment"
    assert "deadline-exceeded" in out["fallback"]["error"], out["fallback"]
    assert out["trained"] == 0
    assert not errors, errors
