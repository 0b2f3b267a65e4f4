"""An imported ONNX model for the method study (and tests/unit/test_onnx_import.py's CNN): a CNN on digits.

Conv 3x3 (4 channels) + BatchNormalization + ReLU + MaxPool 3x3 + Dropout 0.1 +
Gemm over the digits images seen as 1x8x8; 410 weights, the BatchNormalization
running statistics among them (``averageOnly``). Its initial weights are the
graph's initializers (fixed: an imported model ignores the seed of
createInitialWeights), so a job's seed changes only its training seeds
(shuffle, dropout masks).

The local optimizer of an imported model is chosen at import (docs/onnx.md,
``--optimizer``), so the study imports the graph twice: ``onnx-cnn`` with Adam
at 0.01 (digits-mlp's) and ``onnx-cnn-sgd`` with SGD at 0.1 (the best of 0.03,
0.1 and 0.3 for FedAvg over the study's 12 rounds: docs/methods.md).
"""

from __future__ import annotations

from pathlib import Path

from weei.demo.run import models_dir

__all__ = ["PACKAGES", "cnn_onnx", "write_packages"]

#: model id -> (local optimizer, its default learning rate)
PACKAGES: dict[str, tuple[str, float]] = {"onnx-cnn": ("adam", 0.01), "onnx-cnn-sgd": ("sgd", 0.1)}


def cnn_onnx(seed: int = 3) -> bytes:
    """The CNN graph with initializers drawn from ``seed``."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    inits = {"W": (rng.standard_normal((4, 1, 3, 3)) * 0.3).astype(np.float32), "cb": np.zeros(4, np.float32),
             "s": np.ones(4, np.float32), "bb": np.zeros(4, np.float32), "m": np.zeros(4, np.float32),
             "v": np.ones(4, np.float32), "shape": np.array([-1, 1, 8, 8], np.int64),
             "F": (rng.standard_normal((36, 10)) * 0.2).astype(np.float32), "fb": np.zeros(10, np.float32)}
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["img"]),
             helper.make_node("Conv", ["img", "W", "cb"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["n"]),
             helper.make_node("Relu", ["n"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[3, 3], strides=[3, 3], ceil_mode=1),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Constant", [], ["ratio"], value=numpy_helper.from_array(np.array(0.1, np.float32))),
             helper.make_node("Dropout", ["f", "ratio"], ["d"]),
             helper.make_node("Gemm", ["d", "F", "fb"], ["y"])]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def write_packages(folder: Path) -> None:
    """Import the CNN into ``folder``/<model id> for every entry of PACKAGES, with digits-mlp's chunks."""
    from weei.modelkit.onnx_package import import_package
    from weei.onnx import Settings

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cnn.onnx").write_bytes(cnn_onnx())
    for model_id, (optimizer, lr) in PACKAGES.items():
        import_package(folder / "cnn.onnx", Settings(loss="cross-entropy", optimizer=optimizer, lr=lr, batch_size=16,
                                                     data="digits", model_id=model_id),
                       folder / model_id, models_dir() / "digits-mlp" / "data")
