"""A decoder-only transformer built with onnx.helper, trained next-token on the
byte-transformer's synthetic reasoning chunks in a federated job, exported back
and run by onnxruntime (docs/onnx.md)."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from weei.cli import main  # noqa: E402
from weei.core.formats.checkpoint import read_checkpoint  # noqa: E402
from weei.demo.run import DemoJob, run_job  # noqa: E402
from weei.runtime import ModelRuntime, WasmtimeEngine  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BYTES = ROOT / "app" / "static" / "models" / "byte-transformer" / "data"
#: The chunks' records are 65 bytes: a context of 64 (weei-bytes-v1 records are context + 1 bytes).
CONTEXT, WIDTH, HEADS, VOCAB, MLP = 64, 32, 2, 256, 64


def transformer(layers: int = 1, seed: int = 0) -> bytes:
    """Pre-norm decoder-only transformer: embeddings, causal attention, a Gelu MLP, untied output."""
    rng = np.random.default_rng(seed)
    T, D, H, dh = CONTEXT, WIDTH, HEADS, WIDTH // HEADS
    inits: dict[str, np.ndarray] = {
        "E": rng.normal(0, 0.02, (VOCAB, D)), "P": rng.normal(0, 0.02, (T, D)),
        "gf": np.ones(D), "bf": np.zeros(D), "Wout": rng.normal(0, 0.02, (D, VOCAB)), "bout": np.zeros(VOCAB),
        "heads": np.array([0, 0, H, dh], np.int64), "width": np.array([0, 0, D], np.int64)}
    mask = np.triu(np.full((T, T), -1e9, np.float32), 1)
    nodes = [helper.make_node("Constant", [], ["mask"], value=numpy_helper.from_array(mask)),
             helper.make_node("Constant", [], ["scale"], value=numpy_helper.from_array(np.array(1 / np.sqrt(dh), np.float32))),
             helper.make_node("Gather", ["E", "x"], ["emb"]), helper.make_node("Add", ["emb", "P"], ["h0"])]
    h = "h0"
    for i in range(layers):
        p = f"l{i}_"
        for k in ("Wq", "Wk", "Wv", "Wo"):
            inits[p + k] = rng.normal(0, 0.02 if k != "Wo" else 0.02 / np.sqrt(2 * layers), (D, D))
        inits.update({p + "g1": np.ones(D), p + "b1": np.zeros(D), p + "g2": np.ones(D), p + "b2": np.zeros(D),
                      p + "W1": rng.normal(0, 0.02, (D, MLP)), p + "c1": np.zeros(MLP),
                      p + "W2": rng.normal(0, 0.02 / np.sqrt(2 * layers), (MLP, D)), p + "c2": np.zeros(D)})
        n = lambda op, ins, out, **kw: nodes.append(helper.make_node(op, [x if x in ("mask", "scale", "heads", "width") or x.startswith("h") else p + x for x in ins], [p + out], **kw))  # noqa: E731
        nodes.append(helper.make_node("LayerNormalization", [h, p + "g1", p + "b1"], [p + "n1"]))
        for k in ("q", "k", "v"):
            n("MatMul", ["n1", "W" + k], k)
            n("Reshape", [k, "heads"], k + "4")
        n("Transpose", ["q4"], "qt", perm=[0, 2, 1, 3])
        n("Transpose", ["k4"], "kt", perm=[0, 2, 3, 1])
        n("Transpose", ["v4"], "vt", perm=[0, 2, 1, 3])
        n("MatMul", ["qt", "kt"], "s")
        n("Mul", ["s", "scale"], "ss")
        n("Add", ["ss", "mask"], "sm")
        n("Softmax", ["sm"], "a", axis=-1)
        n("MatMul", ["a", "vt"], "o")
        n("Transpose", ["o"], "ot", perm=[0, 2, 1, 3])
        n("Reshape", ["ot", "width"], "or")
        n("MatMul", ["or", "Wo"], "proj")
        nodes.append(helper.make_node("Add", [h, p + "proj"], [p + "r1"]))
        n("LayerNormalization", ["r1", "g2", "b2"], "n2")
        n("MatMul", ["n2", "W1"], "f")
        n("Add", ["f", "c1"], "fb")
        n("Gelu", ["fb"], "fg")
        n("MatMul", ["fg", "W2"], "f2")
        n("Add", ["f2", "c2"], "f2b")
        n("Add", ["r1", "f2b"], "out")
        h = p + "out"
    nodes += [helper.make_node("LayerNormalization", [h, "gf", "bf"], ["nf"]),
              helper.make_node("MatMul", ["nf", "Wout"], ["lw"]), helper.make_node("Add", ["lw", "bout"], ["logits"])]
    graph = helper.make_graph(nodes, "decoder", [helper.make_tensor_value_info("x", TensorProto.INT64, ["N", T])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", T, VOCAB])],
                              [numpy_helper.from_array(v if v.dtype == np.int64 else v.astype(np.float32), k)
                               for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]).SerializeToString()


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
