"""The ONNX graph runtime against things nobody here wrote (docs/onnx.md).

Forward: onnxruntime is the oracle of every operator (shapes, broadcasting,
padding); Weei's output must be within the tolerance docs/onnx.md states.
Gradients: the runtime's reverse-mode gradient against central finite
differences of onnxruntime running the same graph in float64 (float32 with
a wider step where onnxruntime has no float64 kernel).
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from weei.onnx import Settings, import_onnx  # noqa: E402
from weei.runtime import ModelRuntime, WasmtimeEngine  # noqa: E402

#: Forward tolerance, |weei - onnxruntime| <= ATOL + RTOL |onnxruntime| (docs/onnx.md).
ATOL, RTOL = 1e-5, 1e-5
#: Transcendentals (weei_math's exp/log/tanh are a few ulp, not libm).
TRANS_ATOL, TRANS_RTOL = 2e-6, 2e-5


def _model(nodes, x_shape, y_shape, inits, opset=17):
    graph = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", *x_shape])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _rng_init(rng, shape, scale=0.5):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _runtime(model, loss="mse"):
    wasm, compiled = import_onnx(model.SerializeToString(), Settings(loss=loss, data="records"))
    rt = ModelRuntime.load(wasm, WasmtimeEngine())
    rt.load_model(rt.create_initial_weights(0))
    return rt, compiled


def _forward(rt, x, training=0):
    _, out = rt._operation("onnxForward", lambda r: {"input": r[0], "batch": x.shape[0], "training": training},
                           inputs=[memoryview(np.ascontiguousarray(x, np.float32).tobytes())], output="output")
    return np.frombuffer(out, np.float32)


def _records(x, labels):
    n = x.shape[0]
    f = int(np.prod(x.shape[1:]))
    out = bytearray(b"WRC1" + struct.pack("<II", n, f))
    for i in range(n):
        out += x[i].astype("<f4").tobytes() + struct.pack("<I", int(labels[i]))
    return bytes(out)


def _cases():
    r = np.random.default_rng(7)
    b4 = {"b0": _rng_init(r, (4,), 0.1)}
    pre = [helper.make_node("Add", ["x", "b0"], ["a"])]   # every case trains something
    img = {"b0": _rng_init(r, (1, 1, 1), 0.1)}
    c = {}
    c["MatMul"] = ([*pre, helper.make_node("MatMul", ["a", "W"], ["y"])], (4,), {**b4, "W": _rng_init(r, (4, 3))})
    c["MatMul-3d"] = ([helper.make_node("Add", ["x", "b0"], ["a"]), helper.make_node("MatMul", ["a", "W"], ["y"])],
                      (2, 4), {**b4, "W": _rng_init(r, (4, 3))})
    c["Gemm-transB"] = ([*pre, helper.make_node("Gemm", ["a", "W", "c"], ["y"], transB=1, alpha=0.5, beta=2.0)], (4,),
                        {**b4, "W": _rng_init(r, (3, 4)), "c": _rng_init(r, (3,))})
    c["Gemm-C2d"] = ([*pre, helper.make_node("Gemm", ["a", "W", "c"], ["y"])], (4,),
                     {**b4, "W": _rng_init(r, (4, 3)), "c": _rng_init(r, (1, 3))})
    # a transposed B with Y's gradient read as it is (alpha 1), and a dense layer whose input has a second reader
    c["Gemm-transB-alpha1"] = ([*pre, helper.make_node("Gemm", ["a", "W", "c"], ["y"], transB=1)], (4,),
                               {**b4, "W": _rng_init(r, (3, 4)), "c": _rng_init(r, (3,))})
    c["Gemm-dense-shared-input"] = ([*pre, helper.make_node("Gemm", ["a", "W", "c"], ["g"]),
                                     helper.make_node("Concat", ["a", "g"], ["y"], axis=1)], (4,),
                                    {**b4, "W": _rng_init(r, (4, 3)), "c": _rng_init(r, (3,))})
    for op in ("Add", "Sub", "Mul", "Div"):
        k = _rng_init(r, (3, 1)) if op != "Div" else (np.abs(_rng_init(r, (3, 1))) + 0.5).astype(np.float32)
        c[f"{op}-broadcast"] = ([helper.make_node("Add", ["x", "b0"], ["a"]), helper.make_node(op, ["a", "k"], ["y"])],
                                (3, 4), {**b4, "k": k})
    for op in ("Relu", "Tanh", "Sigmoid", "Identity"):
        c[op] = ([*pre, helper.make_node(op, ["a"], ["y"])], (4,), b4)
    c["LeakyRelu"] = ([*pre, helper.make_node("LeakyRelu", ["a"], ["y"], alpha=0.2)], (4,), b4)
    c["Softmax"] = ([*pre, helper.make_node("Softmax", ["a"], ["y"])], (4,), b4)
    c["Softmax-axis1-3d"] = ([helper.make_node("Add", ["x", "b0"], ["a"]), helper.make_node("Softmax", ["a"], ["y"], axis=1)],
                             (3, 4), b4)
    c["LogSoftmax"] = ([*pre, helper.make_node("LogSoftmax", ["a"], ["y"])], (4,), b4)
    c["Flatten"] = ([helper.make_node("Add", ["x", "b0"], ["a"]), helper.make_node("Flatten", ["a"], ["y"])], (2, 4), b4)
    c["Reshape"] = ([helper.make_node("Add", ["x", "b0"], ["a"]), helper.make_node("Reshape", ["a", "s"], ["y"])], (2, 4),
                    {**b4, "s": np.array([-1, 2, 2, 2], np.int64)})
    c["Constant"] = ([*pre, helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(_rng_init(r, (4,)))),
                      helper.make_node("Mul", ["a", "k"], ["y"])], (4,), b4)
    c["Dropout-eval"] = ([*pre, helper.make_node("Dropout", ["a"], ["y"])], (4,), b4)
    c["Conv-pad1"] = ([helper.make_node("Add", ["x", "b0"], ["a"]),
                       helper.make_node("Conv", ["a", "W", "cb"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])],
                      (2, 5, 5), {**img, "W": _rng_init(r, (3, 2, 3, 3)), "cb": _rng_init(r, (3,))})
    c["Conv-stride2-asym"] = ([helper.make_node("Add", ["x", "b0"], ["a"]),
                               helper.make_node("Conv", ["a", "W"], ["y"], kernel_shape=[2, 3], strides=[2, 2], pads=[0, 1, 1, 0])],
                              (2, 6, 5), {**img, "W": _rng_init(r, (2, 2, 2, 3))})
    c["MaxPool-2x2"] = ([helper.make_node("Add", ["x", "b0"], ["a"]),
                         helper.make_node("MaxPool", ["a"], ["y"], kernel_shape=[2, 2], strides=[2, 2])], (2, 6, 6), img)
    c["MaxPool-3x3-pad-ceil"] = ([helper.make_node("Add", ["x", "b0"], ["a"]),
                                  helper.make_node("MaxPool", ["a"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                                                   ceil_mode=1)], (2, 6, 6), img)
    c["AveragePool-pad"] = ([helper.make_node("Add", ["x", "b0"], ["a"]),
                             helper.make_node("AveragePool", ["a"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])], (2, 5, 5), img)
    c["AveragePool-count-pad"] = ([helper.make_node("Add", ["x", "b0"], ["a"]),
                                   helper.make_node("AveragePool", ["a"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                                                    count_include_pad=1)], (2, 5, 5), img)
    c["GlobalAveragePool"] = ([helper.make_node("Add", ["x", "b0"], ["a"]), helper.make_node("GlobalAveragePool", ["a"], ["y"])],
                              (3, 4, 4), img)
    c["BatchNormalization"] = ([helper.make_node("Add", ["x", "b0"], ["a"]),
                                helper.make_node("BatchNormalization", ["a", "s", "bb", "m", "v"], ["y"], epsilon=1e-3)],
                               (3, 2, 2), {**img, "s": _rng_init(r, (3,)), "bb": _rng_init(r, (3,)), "m": _rng_init(r, (3,), 0.1),
                                           "v": (np.abs(_rng_init(r, (3,))) + 0.5).astype(np.float32)})
    # the transformer's operators
    c["LayerNormalization"] = ([*pre, helper.make_node("LayerNormalization", ["a", "g", "be"], ["y"], epsilon=1e-3)], (4,),
                               {**b4, "g": _rng_init(r, (4,)) + 1, "be": _rng_init(r, (4,))})
    c["LayerNormalization-axis-2"] = ([helper.make_node("Add", ["x", "b0"], ["a"]),
                                       helper.make_node("LayerNormalization", ["a", "g"], ["y"], axis=-2)], (3, 4),
                                      {**b4, "g": _rng_init(r, (3, 4)) + 1})
    c["Gelu"] = ([*pre, helper.make_node("Gelu", ["a"], ["y"])], (4,), b4, 20)
    c["Gelu-tanh"] = ([*pre, helper.make_node("Gelu", ["a"], ["y"], approximate="tanh")], (4,), b4, 20)
    c["Transpose"] = ([helper.make_node("Add", ["x", "b0"], ["a"]), helper.make_node("Transpose", ["a"], ["y"], perm=[0, 3, 1, 2])],
                      (2, 3, 4), b4)
    c["MatMul-batched-attention"] = ([helper.make_node("Add", ["x", "b0"], ["a"]),
                                      helper.make_node("Transpose", ["a"], ["at"], perm=[0, 1, 3, 2]),
                                      helper.make_node("MatMul", ["a", "at"], ["s"]),
                                      helper.make_node("Softmax", ["s"], ["y"], axis=-1)], (2, 3, 4), b4)
    c["Concat"] = ([helper.make_node("Add", ["x", "b0"], ["a"]), helper.make_node("Tanh", ["a"], ["t"]),
                    helper.make_node("Concat", ["a", "t"], ["y"], axis=1)], (2, 4), b4)
    c["Concat-last-3"] = ([helper.make_node("Add", ["x", "b0"], ["a"]), helper.make_node("Relu", ["a"], ["t"]),
                           helper.make_node("Concat", ["a", "t", "a"], ["y"], axis=-1)], (3, 4), b4)
    c["Gather-embedding"] = ([helper.make_node("Add", ["x", "b0"], ["a"]), helper.make_node("Gather", ["E", "i"], ["e"]),
                              helper.make_node("Add", ["a", "e"], ["y"])], (3, 4),
                             {**b4, "E": _rng_init(r, (5, 4)), "i": np.array([4, 0, -1], np.int64)})
    return c


CASES = _cases()
TRANSCENDENTAL = ("Tanh", "Sigmoid", "Softmax", "LogSoftmax", "Gelu", "attention", "Concat")


def _case(name):
    nodes, shape, inits, *opset = CASES[name]
    return _model(nodes, shape, None, inits, *opset), shape


def _outputs(name: str) -> tuple[np.ndarray, np.ndarray]:
    """(Weei's forward, onnxruntime's) of one case on its fixed input."""
    model, shape = _case(name)
    rt, _ = _runtime(model)
    x = np.random.default_rng(1).standard_normal((5, *shape)).astype(np.float32)
    ref = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    return _forward(rt, x).reshape(ref.shape), ref


@pytest.mark.parametrize("name", sorted(CASES))
def test_forward_matches_onnxruntime(name: str) -> None:
    ours, ref = _outputs(name)
    atol, rtol = (TRANS_ATOL, TRANS_RTOL) if any(t in name for t in TRANSCENDENTAL) else (ATOL, RTOL)
    np.testing.assert_allclose(ours, ref, atol=atol, rtol=rtol)


def _ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance in float32 units in the last place (the bit patterns as a monotonic integer line)."""
    def line(v: np.ndarray) -> np.ndarray:
        i = np.ascontiguousarray(v, np.float32).view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)
    return np.abs(line(a) - line(b))


def oracle_figures() -> list[tuple[str, int, float, int, int]]:
    """Per case: values compared, the largest |weei - onnxruntime|, the largest distance in ulps, and the
    largest in ulps over the values with |onnxruntime| >= 1e-3 (near 0 an ulp is tiny: a sum that cancels
    differs there by many ulps and a tiny absolute error)."""
    rows = []
    for name in sorted(CASES):
        ours, ref = _outputs(name)
        ulps = _ulps(ours, ref)
        big = np.abs(ref) >= 1e-3
        rows.append((name, ref.size, float(np.abs(ours - ref).max()), int(ulps.max()),
                     int(ulps[big].max()) if big.any() else 0))
    return rows



def _as_double(model):
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for t in m.graph.initializer:
        if t.data_type == TensorProto.FLOAT:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64), t.name))
    for node in m.graph.node:
        for a in node.attribute:
            if a.name == "value" and a.t.data_type == TensorProto.FLOAT:
                a.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(a.t).astype(np.float64)))
    for v in [*m.graph.input, *m.graph.output]:
        v.type.tensor_type.elem_type = TensorProto.DOUBLE
    return m


#: Gradient tolerance: |weei - finite differences| <= GRAD_ATOL + GRAD_RTOL |fd| (float64 reference).
GRAD_ATOL, GRAD_RTOL = 2e-4, 2e-3
#: BatchNormalization trains with batch statistics, which onnxruntime's inference kernel does not
#: compute; Dropout's training mask is random: both are checked in evaluation form only.
NO_GRAD_ORACLE = ("BatchNormalization", "Dropout-eval")


@pytest.mark.parametrize("name", sorted(n for n in CASES if n not in NO_GRAD_ORACLE))
def test_gradient_matches_finite_differences(name: str) -> None:
    model, shape = _case(name)
    rt, compiled = _runtime(model)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, *shape)).astype(np.float32)
    labels = rng.integers(0, 3, 4)
    result, grad = rt._operation("onnxGradient", lambda r: {"data": r[0], "format": "weei-records-v1"},
                                 inputs=[memoryview(_records(x, labels))], output="gradient")
    ours = np.frombuffer(grad, np.float32)
    double = _as_double(model)
    try:
        sess = ort.InferenceSession(double.SerializeToString())
        dtype, h = np.float64, 1e-6
    except Exception:  # onnxruntime has no float64 kernel of this operator: float32 with a wider step
        sess = ort.InferenceSession(model.SerializeToString())
        dtype, h = np.float32, 1e-2
    names = {t.name: t for t in double.graph.initializer}

    def loss(values: dict[str, np.ndarray]) -> float:
        m = onnx.ModelProto()
        m.CopyFrom(double if dtype == np.float64 else model)
        for t in m.graph.initializer:
            if t.name in values:
                t.CopyFrom(numpy_helper.from_array(values[t.name].astype(dtype), t.name))
        y = ort.InferenceSession(m.SerializeToString()).run(None, {"x": x.astype(dtype)})[0].astype(np.float64)
        y = y.reshape(y.shape[0], -1)
        return float(np.mean((y - labels[:, None]) ** 2))

    del sess
    base = {n: numpy_helper.to_array(t).astype(np.float64) for n, t in names.items() if n in compiled.layout}
    assert abs(result["loss"] - loss(base)) <= 1e-4 * max(1.0, abs(loss(base)))
    for n, (offset, _) in compiled.layout.items():
        flat = base[n].reshape(-1)
        for i in range(min(flat.size, 6)):
            plus, minus = {**base}, {**base}
            p, m_ = flat.copy(), flat.copy()
            p[i] += h
            m_[i] -= h
            plus[n], minus[n] = p.reshape(base[n].shape), m_.reshape(base[n].shape)
            fd = (loss(plus) - loss(minus)) / (2 * h)
            tol = GRAD_ATOL + GRAD_RTOL * abs(fd) if dtype == np.float64 else 2e-2 + 2e-2 * abs(fd)
            assert abs(ours[offset + i] - fd) <= tol, (n, i, ours[offset + i], fd)


def test_a_masked_softmax_gives_onnxruntimes_zeros() -> None:
    """A causal mask as exporters write it (-1e9, or the float minimum): the masked probabilities are 0, as
    onnxruntime's are, not the 1.6e-38 at which weei_expf clamps (whose products are subnormal and slow)."""
    for fill in (-1e9, float(np.finfo(np.float32).min)):
        mask = np.triu(np.full((6, 6), fill, np.float32), 1)
        model = _model([helper.make_node("Add", ["x", "M"], ["s"]), helper.make_node("Softmax", ["s"], ["y"], axis=-1)],
                       (6, 6), None, {"M": mask})
        rt, _ = _runtime(model)
        x = np.random.default_rng(4).standard_normal((3, 6, 6)).astype(np.float32)
        ref = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
        ours = _forward(rt, x).reshape(ref.shape)
        assert (ref[:, mask < 0] == 0).all() and (ours[:, mask < 0] == 0).all()
        np.testing.assert_allclose(ours, ref, atol=TRANS_ATOL, rtol=TRANS_RTOL)


if __name__ == "__main__":   # the figures of docs/onnx.md's operator table: python tests/unit/test_onnx_ops.py
    print("| case | values | max abs error | max ulps | max ulps where abs(ref) >= 1e-3 |")
    print("|---|---|---|---|---|")
    for name, size, err, ulps, big_ulps in oracle_figures():
        print(f"| {name} | {size} | {err:.2g} | {ulps} | {big_ulps} |")
