"""A decoder-only transformer built with onnx.helper, trained next-token on the
byte-transformer's synthetic reasoning chunks in a federated job, exported back
and run by onnxruntime (docs/onnx.md)."""

from __future__ import annotations

import io
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from weei.cli import main  # noqa: E402
from weei.core.formats.checkpoint import read_checkpoint  # noqa: E402
from weei.demo.run import DemoJob, run_job  # noqa: E402
from weei.runtime import ModelRuntime, WasmtimeEngine  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from onnx_transformer import transformer_onnx  # noqa: E402

BYTES = ROOT / "app" / "static" / "models" / "byte-transformer" / "data"
#: The chunks' records are 65 bytes: a context of 64 (weei-bytes-v1 records are context + 1 bytes).
CONTEXT, WIDTH, HEADS, VOCAB, MLP = 64, 32, 2, 256, 64


def transformer(layers: int = 1, seed: int = 0) -> bytes:
    """bench/onnx_transformer.py's graph, small: width 32, a Gelu MLP, no attention biases."""
    return transformer_onnx(seed, width=WIDTH, layers=layers, heads=HEADS, mlp=MLP, context=CONTEXT, vocab=VOCAB,
                            activation="Gelu", attention_bias=False, depth_scaled=True, opset=20)


def _records(path: Path) -> np.ndarray:
    data = path.read_bytes()
    n = struct.unpack_from("<I", data, 4)[0]
    return np.frombuffer(data, np.uint8, n * (CONTEXT + 1), 8).reshape(n, CONTEXT + 1)


def test_transformer_trains_next_token_in_a_federated_job_and_exports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "decoder.onnx").write_bytes(transformer())
    data = tmp_path / "chunks"
    data.mkdir()
    for k in range(1, 13):   # 12 chunks of 48 records: a short job
        (data / f"training-{k:03d}.bin").write_bytes((BYTES / f"training-{k:03d}.bin").read_bytes())
    (data / "validation.bin").write_bytes((BYTES / "validation.bin").read_bytes())
    package = tmp_path / "models" / "decoder"
    assert main(["model", "import", str(tmp_path / "decoder.onnx"), "--loss", "next-token", "--optimizer", "adam",
                 "--lr", "0.005", "--batch-size", "8", "--data-format", "tokens", "--data", str(data), "--id", "decoder",
                 "--out", str(package)]) == 0
    assert "OK: wrote" in capsys.readouterr().out

    monkeypatch.setenv("WEEI_MODELS", str(tmp_path / "models"))
    job = DemoJob("decoder", "decoder", {"epochs": 1, "localEpochs": 1, "batchSize": 8, "coordinatorParticipates": True,
                                         "validationSchedule": {"enabled": True, "unit": "round", "every": 1}},
                  peers=3, validation="validation.bin")
    report = run_job(job, tmp_path / "out", stream=io.StringIO())
    losses = [r["validation"]["loss"] for r in report.rounds if "validation" in r]
    assert report.rejected == 0 and len(losses) >= 2
    assert losses[0] > 5.0 and losses[-1] < losses[0] - 1.0, losses   # ln 256 = 5.55 untrained

    last = sorted((tmp_path / "out" / "decoder").glob("*.weei-checkpoint"))[-1]
    assert main(["model", "export", str(last), "--package", str(package), "--onnx", str(tmp_path / "trained.onnx")]) == 0
    records = _records(BYTES / "validation.bin")[:16]
    theirs = ort.InferenceSession(str(tmp_path / "trained.onnx")).run(None, {"x": records[:, :CONTEXT].astype(np.int64)})[0]
    rt = ModelRuntime.load((package / "model.wasm").read_bytes(), WasmtimeEngine())
    rt.load_model(read_checkpoint(last.read_bytes()).weights)
    x = records[:, :CONTEXT].astype(np.float32)
    _, out = rt._operation("onnxForward", lambda r: {"input": r[0], "batch": len(x)}, inputs=[memoryview(x.tobytes())],
                           output="output")
    ours = np.frombuffer(out, np.float32).reshape(theirs.shape)
    np.testing.assert_allclose(ours, theirs, atol=2e-5, rtol=1e-4)
    assert (ours.argmax(-1) == theirs.argmax(-1)).mean() > 0.999
    blob = b"WBT1" + struct.pack("<I", len(records)) + records.tobytes()
    weei_acc = rt.evaluate(data=blob, format="weei-bytes-v1").metrics["accuracy"]
    assert abs(weei_acc - float((theirs.argmax(-1) == records[:, 1:]).mean())) < 2e-3
