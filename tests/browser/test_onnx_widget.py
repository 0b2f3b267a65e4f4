"""An ONNX file trained in the widget (headless Chromium) and downloaded back as ONNX.

An MLP built with onnx.helper is chosen in the window's ONNX form with
three digits chunks and the validation file, imported in the page's
Python (weei.onnx, the site's graph runtime), trained by a job in which
the coordinator alone trains, and its last checkpoint is downloaded as
ONNX. onnxruntime's predictions on the downloaded file equal the graph
runtime's on the checkpoint in CPython (wasmtime), and its accuracy on the
validation file is the one the job reported.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from playwright.sync_api import expect
from test_widget import API, fill, open_widget, state

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from test_onnx_import import _digits, mlp  # noqa: E402  (the unit test's MLP and digits reader)

from weei.core.formats.checkpoint import read_checkpoint  # noqa: E402
from weei.onnx import Settings, import_onnx  # noqa: E402
from weei.runtime import ModelRuntime, WasmtimeEngine  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "app" / "static" / "models" / "digits-mlp" / "data"


def test_widget_imports_trains_and_downloads_an_onnx_model(weei_server: Any, page: Any, tmp_path: Path) -> None:
    pg, log = page
    pg.set_viewport_size({"width": 1280, "height": 1000})
    onnx_path = tmp_path / "digits-mlp-onnx.onnx"
    onnx_path.write_bytes(mlp(32))
    open_widget(pg, weei_server.url)
    chunks = [str(DIGITS / f"training-00{k}.bin") for k in (1, 2, 3)]
    pg.get_by_label("Dataset files (and auxiliary weights)").set_input_files(chunks)
    pg.get_by_label("Validation file (optional)").set_input_files(str(DIGITS / "validation.bin"))
    pg.get_by_label("ONNX model (.onnx)").set_input_files(str(onnx_path))
    pg.get_by_label("Loss", exact=True).select_option("cross-entropy")
    pg.get_by_label("Optimizer", exact=True).select_option("adam")
    fill(pg, "Model learning rate", "0.01")
    pg.get_by_label("Data format", exact=True).select_option("digits")
    fill(pg, "Batch size", "16")
    pg.get_by_role("button", name="Import ONNX model").click()
    expect(pg.get_by_text("digits-mlp-onnx.onnx (imported)")).to_be_visible(timeout=60_000)

    fill(pg, "Epochs", "1")
    fill(pg, "Local epochs", "2")
    pg.get_by_label("Validate", exact=True).check()
    fill(pg, "Validate every", "1")
    pg.get_by_role("button", name="Create job").click()
    pg.wait_for_function(f"() => {API}.getState().job?.status === 'ready'", timeout=60_000)
    job = state(pg)["job"]
    assert job["info"]["id"] == "digits-mlp-onnx" and len(job["queue"]) == 3
    pg.get_by_role("button", name="Run validation").click()
    pg.wait_for_function(f"() => {API}.getState().job?.checkpoints[0]?.validationMetrics", timeout=60_000)
    start = pg.get_by_role("button", name="Start", exact=True)
    expect(start).to_be_enabled()
    start.click()
    pg.wait_for_function(f"() => {API}.getState().job?.status === 'completed'", timeout=240_000)
    pg.wait_for_function(f"() => {API}.getState().job.checkpoints.every((c) => c.validationMetrics)", timeout=60_000)
    checkpoints = state(pg)["job"]["checkpoints"]
    accuracy = [c["validationMetrics"]["values"]["accuracy"] for c in checkpoints]
    assert len(accuracy) >= 2 and accuracy[-1] > accuracy[0] + 0.2, accuracy

    # The newest row is first: its Download as ONNX is the last checkpoint's.
    download_onnx = pg.get_by_role("button", name="Download as ONNX")
    expect(download_onnx.first).to_be_visible()
    assert download_onnx.count() == len(checkpoints)
    with pg.expect_download() as onnx_download:
        download_onnx.first.click()
    with pg.expect_download() as checkpoint_download:
        pg.get_by_role("button", name="Download latest checkpoint").click()
    trained = onnx_download.value.path()
    checkpoint = read_checkpoint(Path(checkpoint_download.value.path()).read_bytes())
    assert onnx_download.value.suggested_filename.endswith(".onnx")
    assert checkpoint.metadata.round == checkpoints[-1]["artifact"]["round"]

    records = _digits(DIGITS / "validation.bin")
    x = (records[:, :64] / 16.0).astype(np.float32)
    theirs = ort.InferenceSession(str(trained)).run(None, {"x": x})[0]
    wasm, _ = import_onnx(onnx_path.read_bytes(), Settings(loss="cross-entropy", optimizer="adam", lr=0.01,
                                                           batch_size=16, data="digits", model_id="digits-mlp-onnx"))
    rt = ModelRuntime.load(wasm, WasmtimeEngine())
    rt.load_model(checkpoint.weights)
    _, out = rt._operation("onnxForward", lambda r: {"input": r[0], "batch": len(x)},
                           inputs=[memoryview(x.tobytes())], output="output")
    ours = np.frombuffer(out, np.float32).reshape(theirs.shape)
    np.testing.assert_allclose(ours, theirs, atol=2e-6, rtol=1e-5)
    assert (ours.argmax(1) == theirs.argmax(1)).all()
    evaluated = rt.evaluate(data=(DIGITS / "validation.bin").read_bytes(), format="weei-digits-v1").metrics["accuracy"]
    assert abs(evaluated - float((theirs.argmax(1) == records[:, 64]).mean())) < 1e-9
    assert abs(evaluated - accuracy[-1]) < 1e-6
    assert not log.errors, log.errors
