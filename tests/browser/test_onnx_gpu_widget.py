"""An ONNX graph imported in the page trains on the page's GPU backend (Chromium's SwiftShader).

``importOnnx`` fetches the site's graph runtime and WGSL kernels and
answers the package ``weei model import`` writes: for a small MLP its
``model.wgsl.json`` and a ``gpu-webgpu`` backend, with which a job asked
for ``gpu`` passes the admission gate against the CPU runtime and trains
every assignment on SwiftShader in a training Worker. A graph with a form
the device program does not cover (one tensor as both operands of an Add)
gets no archive: the same job falls back by name (``no-gpu-archive``) and
completes on the CPU. SwiftShader is slow: 16 hidden units, two chunks,
one round.
"""

from __future__ import annotations

import base64
import sys
from pathlib import Path
from typing import Any

import pytest
from site_helpers import TIMEOUT_MS
from test_api import ready

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
pytest.importorskip("onnx")
from test_onnx_form import doubled  # noqa: E402
from test_onnx_import import mlp  # noqa: E402

SETTINGS = {"epochs": 1, "localEpochs": 1, "batchSize": 32, "coordinatorParticipates": True}

IMPORT_AND_TRAIN = """async ({ onnx, name, settings }) => {
  const training = T.api();
  const base = 'models/digits-mlp/data/';
  const files = await Promise.all(['training-001.bin', 'training-002.bin'].map((n) => T.fetchFile(base + n, n)));
  const file = new File([Uint8Array.from(atob(onnx), (c) => c.charCodeAt(0))], name);
  const pkg = await training.importOnnx({ onnx: file, files, loss: 'cross-entropy', optimizer: 'adam',
                                          learningRate: 0.01, batchSize: 32, dataFormat: 'digits' });
  const manifest = JSON.parse(await pkg.manifest.text());
  await training.setBackendPreference('gpu');
  await training.createJob({ wasm: pkg.wasm, manifest: pkg.manifest, files, settings,
                             executionFiles: pkg.executionFiles });
  await training.start();
  await T.waitFor('the job to complete', () => T.done(training.getState()), 300000);
  const state = training.getState();
  return { status: state.job.status, error: state.error || null, execution: state.execution,
           own: state.diagnostics[state.myPeerId], archives: pkg.executionFiles.map((f) => f.name),
           backends: manifest.execution.backends.map((b) => b.id),
           events: training.getDebugLog().events.filter((e) => e.event.startsWith('gpu.')) };
}"""


def _run(browser: Any, url: str, onnx: bytes, name: str) -> dict[str, Any]:
    pg = browser.new_page()
    pg.set_default_timeout(TIMEOUT_MS * 4)
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    ready(pg, url)
    out = pg.evaluate(IMPORT_AND_TRAIN, {"onnx": base64.b64encode(onnx).decode(), "name": name,
                                         "settings": SETTINGS})
    pg.close()
    assert not errors, errors
    return out


def test_an_imported_graph_trains_on_the_gpu_in_the_page(weei_server: Any, webgpu_browser: Any) -> None:
    out = _run(webgpu_browser, weei_server.url, mlp(16), "mlp16.onnx")
    assert out["archives"] == ["model.wgsl.json"] and "gpu-webgpu" in out["backends"], out["backends"]
    assert out["error"] is None and out["status"] == "completed"
    assert out["execution"]["actual"] == "gpu" and out["execution"]["fallback"] == "none", out["events"][:3]
    own = out["own"]
    assert own["execution"]["backend"] == "gpu-webgpu" and own["execution"]["fallbackReason"] is None
    assert own["model"]["wgsl"]["present"] is True
    trained = [e["details"] for e in out["events"] if e["event"] == "gpu.trained"]
    assert len(trained) == 2 and all(t["host"] == "worker" for t in trained), out["events"]
    print("imported MLP on SwiftShader: gate", trained[0]["gate"], "| steps", [t["steps"] for t in trained],
          "| trainingMs", [t["trainingMs"] for t in trained])


def test_an_imported_graph_without_a_device_program_falls_back_by_name(weei_server: Any,
                                                                       webgpu_browser: Any) -> None:
    out = _run(webgpu_browser, weei_server.url, doubled(), "doubled.onnx")
    assert out["archives"] == [] and "gpu-webgpu" not in out["backends"], out["backends"]
    assert out["error"] is None and out["status"] == "completed"
    assert out["execution"]["actual"] == "cpu" and out["execution"]["fallback"] == "cpu: no-gpu-archive"
    assert out["own"]["execution"]["fallbackReason"].startswith("no-gpu-archive:"), out["own"]["execution"]
    print("doubled graph:", out["execution"], out["own"]["execution"]["fallbackReason"])
