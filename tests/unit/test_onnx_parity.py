"""The issue's parity check: an imported ONNX MLP with digits-mlp's architecture
and digits-mlp's initial weights reaches the hand-written digits-mlp's
validation accuracy (within 1 point) over the same federated job.

Both jobs run in one process (weei.demo.run) with the demo's digits settings
and the same seed, so the coordinator draws the same job id (every
assignment's training seed) for both. digits-mlp's initial weights are those
its createInitialWeights gave the job: its round-0 checkpoint.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from weei.core.formats.checkpoint import read_checkpoint  # noqa: E402
from weei.demo.run import DEMO_JOBS, DemoJob, run_job  # noqa: E402
from weei.modelkit.onnx_package import import_package  # noqa: E402
from weei.onnx import Settings  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "app" / "static" / "models" / "digits-mlp" / "data"


def digits_mlp_as_onnx(weights: bytes) -> bytes:
    """c/models/digits-mlp: 64 -> 64 ReLU -> 10 logits, weights W1[64][64] b1 W2[64][10] b2 (W is [in][out])."""
    w = np.frombuffer(weights, np.float32)
    parts = {"W1": w[:4096].reshape(64, 64), "b1": w[4096:4160], "W2": w[4160:4800].reshape(64, 10), "b2": w[4800:]}
    assert w.size == 4810
    nodes = [helper.make_node("Gemm", ["x", "W1", "b1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Gemm", ["r", "W2", "b2"], ["logits"])]
    graph = helper.make_graph(nodes, "digits-mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
                              [numpy_helper.from_array(a.copy(), name) for name, a in parts.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_imported_digits_mlp_matches_the_hand_written_one_over_the_same_job(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    job = DEMO_JOBS[0]
    assert job.model == "digits-mlp"
    monkeypatch.delenv("WEEI_MODELS", raising=False)
    hand = run_job(job, tmp_path / "hand", stream=io.StringIO(), seed=0)
    initial = read_checkpoint((tmp_path / "hand" / "digits" / "digits-mlp-round-0000.weei-checkpoint").read_bytes())

    (tmp_path / "mlp.onnx").write_bytes(digits_mlp_as_onnx(bytes(initial.weights)))
    # digits-mlp's training words: softmax cross-entropy, Adam (0.9/0.999/1e-8), lr 0.01, batch 32 by default
    import_package(tmp_path / "mlp.onnx", Settings(loss="cross-entropy", optimizer="adam", lr=0.01, batch_size=32,
                                                   data="digits", model_id="digits-onnx"),
                   tmp_path / "models" / "digits-onnx", DIGITS)
    monkeypatch.setenv("WEEI_MODELS", str(tmp_path / "models"))
    imported = run_job(DemoJob(job.name, "digits-onnx", job.settings, job.peers, job.validation), tmp_path / "onnx",
                       stream=io.StringIO(), seed=0)

    start = read_checkpoint((tmp_path / "onnx" / "digits" / "digits-onnx-round-0000.weei-checkpoint").read_bytes())
    assert bytes(start.weights) == bytes(initial.weights)
    ours = [r["validation"]["accuracy"] for r in imported.rounds]
    theirs = [r["validation"]["accuracy"] for r in hand.rounds]
    assert len(ours) == len(theirs) >= 10 and theirs[-1] >= 0.9, (theirs, ours)
    assert abs(ours[-1] - theirs[-1]) <= 0.01, (theirs, ours)


def test_a_dense_gemm_layer_trains_to_the_hand_written_bits() -> None:
    """A Gemm that is a dense layer runs the SDK's dense kernels (docs/onnx.md, "Parity and speed"),
    and the loss's gradient is weei_softmax_xent's: one train call gives digits-mlp's weights bit for bit."""
    from weei.onnx import import_onnx
    from weei.runtime import ModelRuntime, WasmtimeEngine

    hand = ModelRuntime.load((ROOT / "app" / "static" / "models" / "digits-mlp" / "model.wasm").read_bytes(),
                             WasmtimeEngine())
    weights = hand.create_initial_weights(3)
    wasm, _ = import_onnx(digits_mlp_as_onnx(weights), Settings(loss="cross-entropy", optimizer="adam", lr=0.01,
                                                               batch_size=32, data="digits", model_id="digits-onnx"))
    ours = ModelRuntime.load(wasm, WasmtimeEngine())
    chunk = (DIGITS / "training-001.bin").read_bytes()
    trained = []
    for runtime in (hand, ours):
        runtime.load_model(weights)
        result = runtime.train(data=chunk, format="weei-digits-v1", seed=7, settings={"localEpochs": 2, "batchSize": 32})
        trained.append(bytes(result.weights))
    assert trained[0] == trained[1]
