"""Imported ONNX graphs on a real Vulkan device (lavapipe here and in CI;
docs/gpu.md, "Imported ONNX graphs"): the graph runtime's gpuBegin emits a
device program over wgsl/, an imported MLP (Gemm, Relu, softmax
cross-entropy; SGD, Adam, AdamW) and a graph of the elementwise operators
(MatMul, Add/Sub/Mul/Div with broadcasting, Tanh, Sigmoid, LeakyRelu,
Flatten) and a CNN (Conv, MaxPool, AveragePool, GlobalAveragePool) train on
the device, pass the admission gate against the CPU runtime and end a whole
chunk with the CPU's weights to the bit; graphs with LayerNormalization,
Gelu, Transpose and Softmax, a CNN with BatchNormalization and Dropout, and
the imported decoder transformer pass it within fp32-standard's tolerance
(a gradient of rounding noise under Adam fails it, by design); a graph with an operator that has no
kernel falls back by name (graph-not-on-gpu), and the importer ships a GPU
backend only with a graph that has a program.

Skipped only when no Vulkan adapter exists (make installs lavapipe:
apt mesa-vulkan-drivers libvulkan1).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
wgpu = pytest.importorskip("wgpu")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from weei.gpu import GpuError, parse_archive, require_pass  # noqa: E402
from weei.gpu.executor import GpuDevice  # noqa: E402
from weei.gpu.gate import ATOL, RTOL  # noqa: E402
from weei.gpu.session import GpuBackendSpec, GpuWork, run_gate, train_on_gpu  # noqa: E402
from weei.onnx import Settings, import_onnx  # noqa: E402
from weei.onnx.gpu import gpu_archive, kernels  # noqa: E402
from weei.runtime import ModelRuntime, WasmtimeEngine  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "app" / "static" / "models" / "digits-mlp" / "data"
CHUNK = (DIGITS / "training-001.bin").read_bytes()
FORMAT = "weei-digits-v1"
BACKEND = GpuBackendSpec("gpu-webgpu", 64 << 20, "fp32-standard")


def _vulkan_adapter() -> object | None:
    try:
        adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    except Exception:  # no Vulkan loader or driver at all
        return None
    return adapter if adapter is not None and adapter.info.get("backend_type") == "Vulkan" else None


pytestmark = pytest.mark.skipif(
    _vulkan_adapter() is None,
    reason="no Vulkan adapter (install lavapipe: apt mesa-vulkan-drivers libvulkan1, as make does)",
)


@pytest.fixture(scope="module")
def device() -> GpuDevice:
    return GpuDevice.open(wgpu.gpu, preference="gpu")


def _model(nodes: list, inits: dict[str, np.ndarray], out: str, classes: int = 10) -> bytes:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])],
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT, ["N", classes])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _mlp(rng: np.random.Generator) -> bytes:
    inits = {"W1": rng.standard_normal((64, 32)).astype(np.float32) * 0.2, "b1": np.zeros(32, np.float32),
             "W2": rng.standard_normal((32, 10)).astype(np.float32) * 0.2, "b2": np.zeros(10, np.float32)}
    nodes = [helper.make_node("Gemm", ["x", "W1", "b1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Gemm", ["r", "W2", "b2"], ["logits"]), helper.make_node("Softmax", ["logits"], ["y"])]
    return _model(nodes, inits, "y")


def _elementwise(rng: np.random.Generator) -> bytes:
    """Every elementwise operator with a kernel, broadcasting weights and constants over the batch."""
    inits = {"W1": rng.standard_normal((64, 16)).astype(np.float32) * 0.2, "b1": rng.standard_normal(16).astype(np.float32) * 0.1,
             "s": (1.0 + 0.1 * rng.standard_normal((1, 16))).astype(np.float32), "c": np.array(0.25, np.float32),
             "d": (1.5 + 0.1 * rng.standard_normal(16)).astype(np.float32),
             "W2": rng.standard_normal((16, 10)).astype(np.float32) * 0.3, "b2": np.zeros(10, np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["m"]), helper.make_node("Add", ["m", "b1"], ["a"]),
             helper.make_node("Tanh", ["a"], ["t"]), helper.make_node("Mul", ["t", "s"], ["u"]),
             helper.make_node("Sub", ["u", "c"], ["v"]), helper.make_node("Sigmoid", ["v"], ["g"]),
             helper.make_node("Div", ["g", "d"], ["q"]), helper.make_node("Sub", ["q", "a"], ["e"]),
             helper.make_node("LeakyRelu", ["e"], ["l"], alpha=0.1), helper.make_node("Flatten", ["l"], ["f"]),
             helper.make_node("MatMul", ["f", "W2"], ["z"]), helper.make_node("Add", ["z", "b2"], ["logits"])]
    return _model(nodes, inits, "logits")


def _normed(rng: np.random.Generator) -> bytes:
    """LayerNormalization, Gelu (erf and tanh), Reshape, Transpose and a Softmax inside the graph."""
    inits = {"W1": rng.standard_normal((64, 32)).astype(np.float32) * 0.2, "b1": rng.standard_normal(32).astype(np.float32) * 0.1,
             "g": (1.0 + 0.1 * rng.standard_normal(32)).astype(np.float32), "be": 0.1 * rng.standard_normal(32).astype(np.float32),
             "s3": np.array([-1, 4, 8], np.int64), "s2": np.array([-1, 32], np.int64),
             "W2": rng.standard_normal((32, 10)).astype(np.float32) * 0.3, "b2": np.zeros(10, np.float32)}
    nodes = [helper.make_node("Gemm", ["x", "W1", "b1"], ["h"]),
             helper.make_node("LayerNormalization", ["h", "g", "be"], ["n"], epsilon=1e-5),
             helper.make_node("Gelu", ["n"], ["e"]), helper.make_node("Reshape", ["e", "s3"], ["r"]),
             helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1]), helper.make_node("Softmax", ["t"], ["a"], axis=-1),
             helper.make_node("Reshape", ["a", "s2"], ["f"]), helper.make_node("Mul", ["f", "n"], ["m"]),
             helper.make_node("Gelu", ["m"], ["m2"], approximate="tanh"), helper.make_node("Gemm", ["m2", "W2", "b2"], ["logits"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]).SerializeToString()


def _runtime(model: bytes, optimizer: str = "adam", loss: str = "cross-entropy") -> ModelRuntime:
    wasm, _ = import_onnx(model, Settings(loss=loss, optimizer=optimizer, lr=0.01, batch_size=16, data="digits", model_id="g"))
    return ModelRuntime.load(wasm, WasmtimeEngine())


def _archive(runtime: ModelRuntime, weights: bytes, work: GpuWork):
    runtime.load_model(weights)
    begun, _, _ = runtime.gpu_begin(**work.inputs())
    assert "unsupported" not in begun, begun.get("unsupported")
    modules = {p["module"] for p in begun["program"]["pipelines"]}
    source = kernels()
    assert source is not None
    return parse_archive(gpu_archive(modules, source))


def _compare(cpu: bytes, gpu: bytes) -> tuple[float, float]:
    a, b = np.frombuffer(cpu, np.float32), np.frombuffer(gpu, np.float32)
    assert a.shape == b.shape and np.isfinite(b).all()
    diff = np.abs(a.astype(np.float64) - b)
    assert (diff <= ATOL + RTOL * np.abs(a)).all(), diff.max()
    return float(diff.max()), float((a.view(np.uint32) == b.view(np.uint32)).mean())


def _train_both(runtime: ModelRuntime, device: GpuDevice, work: GpuWork) -> None:
    weights = runtime.create_initial_weights(0)
    archive = _archive(runtime, weights, work)
    device.compile(archive)
    gate, cpu_step, gpu_step = run_gate(runtime, device, archive, BACKEND, weights, work, budget_mib=256)
    assert gate.passed, gate.detail
    runtime.load_model(weights)
    cpu = runtime.train(**work.inputs())
    runtime.load_model(weights)
    gpu = train_on_gpu(runtime, device, archive, BACKEND, work, budget_mib=256).train
    # 100 examples in batches of 16 (the last holds 4), each local epoch shuffled
    assert gpu.optimizer_steps == cpu.optimizer_steps == 7 * int(work.settings.get("localEpochs", 1))
    assert gpu.examples == cpu.examples
    for key in cpu.metrics:
        assert gpu.metrics[key] == pytest.approx(cpu.metrics[key], rel=1e-6, abs=1e-7)
    worst, same = _compare(cpu.weights, gpu.weights)
    print(f"gate: {gate.detail}; whole chunk: max |gpu - cpu| {worst:.3g}, {same:.1%} of weights bit-identical")


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adamw"])
def test_an_imported_mlp_trains_on_the_gpu_as_on_the_cpu(device: GpuDevice, optimizer: str) -> None:
    runtime = _runtime(_mlp(np.random.default_rng(1)), optimizer)
    _train_both(runtime, device, GpuWork(data=CHUNK, format=FORMAT, seed=5, settings={"localEpochs": 2}))


def test_matmul_and_broadcasting_elementwise_operators_on_the_gpu(device: GpuDevice) -> None:
    runtime = _runtime(_elementwise(np.random.default_rng(2)))
    _train_both(runtime, device, GpuWork(data=CHUNK, format=FORMAT, seed=6, settings={}))


def test_layernorm_gelu_transpose_and_softmax_on_the_gpu(device: GpuDevice) -> None:
    runtime = _runtime(_normed(np.random.default_rng(9)))
    _train_both(runtime, device, GpuWork(data=CHUNK, format=FORMAT, seed=7, settings={}))


def test_the_imported_decoder_transformer_trains_on_the_gpu(device: GpuDevice) -> None:
    """test_onnx_transformer's decoder (Gather embeddings, LayerNormalization, causal attention with
    batched MatMul, Transpose, Reshape, a constant mask and scale, Softmax, a Gelu MLP), next-token on
    the byte-transformer's chunks: the gate passes within fp32-standard's tolerance, and a whole
    assignment (6 Adam steps of 8 records) stays close to the CPU runtime's."""
    from test_onnx_transformer import BYTES, transformer

    wasm, _ = import_onnx(transformer(1), Settings(loss="next-token", optimizer="adam", lr=0.002, batch_size=8,
                                                   data="tokens", model_id="t"))
    runtime = ModelRuntime.load(wasm, WasmtimeEngine())
    work = GpuWork(data=(BYTES / "training-001.bin").read_bytes(), format="weei-bytes-v1", seed=3, settings={})
    weights = runtime.create_initial_weights(0)
    archive = _archive(runtime, weights, work)
    device.compile(archive)
    gate, _, _ = run_gate(runtime, device, archive, BACKEND, weights, work, budget_mib=256)
    assert gate.passed and not gate.bit_identical, gate.detail
    runtime.load_model(weights)
    cpu = runtime.train(**work.inputs())
    runtime.load_model(weights)
    gpu = train_on_gpu(runtime, device, archive, BACKEND, work, budget_mib=256).train
    assert gpu.optimizer_steps == cpu.optimizer_steps == 6
    assert gpu.metrics["loss"] == pytest.approx(cpu.metrics["loss"], rel=1e-5)
    a, b = np.frombuffer(cpu.weights, np.float32), np.frombuffer(gpu.weights, np.float32)
    worst = float(np.abs(a.astype(np.float64) - b).max())
    print(f"gate: {gate.detail}; 6 steps: max |gpu - cpu| {worst:.3g}, loss {gpu.metrics['loss']} vs {cpu.metrics['loss']}")
    assert worst < 1e-4


def _cnn(rng: np.random.Generator) -> bytes:
    """Conv (padded, strided, with and without bias), MaxPool (ceil_mode), AveragePool
    (count_include_pad) and GlobalAveragePool on the digits as 8 x 8 images."""
    f32 = np.float32
    inits = {"shape": np.array([-1, 1, 8, 8], np.int64), "K1": rng.standard_normal((4, 1, 3, 3)).astype(f32) * 0.5,
             "k1": 0.1 * rng.standard_normal(4).astype(f32), "K2": rng.standard_normal((3, 4, 2, 2)).astype(f32) * 0.4,
             "F1": rng.standard_normal((12, 10)).astype(f32) * 0.3, "fb1": np.zeros(10, f32),
             "F2": rng.standard_normal((4, 10)).astype(f32) * 0.3, "fb2": np.zeros(10, f32)}
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["img"]),
             helper.make_node("Conv", ["img", "K1", "k1"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("MaxPool", ["r1"], ["p"], kernel_shape=[3, 3], strides=[3, 3], ceil_mode=1),
             helper.make_node("AveragePool", ["p"], ["q"], kernel_shape=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1),
             helper.make_node("Conv", ["q", "K2"], ["c2"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Relu", ["c2"], ["r2"]), helper.make_node("Flatten", ["r2"], ["f"]),
             helper.make_node("Gemm", ["f", "F1", "fb1"], ["l1"]),
             helper.make_node("GlobalAveragePool", ["r1"], ["g"]), helper.make_node("Flatten", ["g"], ["gf"]),
             helper.make_node("Gemm", ["gf", "F2", "fb2"], ["l2"]), helper.make_node("Add", ["l1", "l2"], ["logits"])]
    return _model(nodes, inits, "logits")


def test_conv_and_pools_on_the_gpu(device: GpuDevice) -> None:
    runtime = _runtime(_cnn(np.random.default_rng(10)))
    _train_both(runtime, device, GpuWork(data=CHUNK, format=FORMAT, seed=8, settings={}))


def _bn_cnn(conv_bias: bool) -> bytes:
    """test_onnx_import's CNN: Conv, BatchNormalization, Relu, MaxPool (ceil_mode), Flatten, Dropout, Gemm."""
    rng = np.random.default_rng(11)
    f32 = np.float32
    inits = {"shape": np.array([-1, 1, 8, 8], np.int64), "W": rng.standard_normal((4, 1, 3, 3)).astype(f32) * 0.5,
             "cb": np.zeros(4, f32), "s": np.ones(4, f32), "bb": np.zeros(4, f32), "m": np.zeros(4, f32),
             "v": np.ones(4, f32), "F": rng.standard_normal((36, 10)).astype(f32) * 0.2, "fb": np.zeros(10, f32)}
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["img"]),
             helper.make_node("Conv", ["img", "W", "cb"] if conv_bias else ["img", "W"], ["c"], kernel_shape=[3, 3],
                              pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["n"]),
             helper.make_node("Relu", ["n"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[3, 3], strides=[3, 3], ceil_mode=1),
             helper.make_node("Flatten", ["p"], ["f"]), helper.make_node("Dropout", ["f"], ["d"], ratio=0.1),
             helper.make_node("Gemm", ["d", "F", "fb"], ["y"])]
    if not conv_bias:
        del inits["cb"]
    return _model(nodes, inits, "y")


def test_batchnorm_and_dropout_on_the_gpu(device: GpuDevice) -> None:
    """BatchNormalization (batch statistics, running ones moved in the weights) and Dropout (its
    masks drawn in the WASM from the assignment's seed, as the CPU runtime draws them)."""
    _train_both(_runtime(_bn_cnn(False)), device, GpuWork(data=CHUNK, format=FORMAT, seed=9, settings={}))


def test_a_gradient_of_rounding_noise_fails_the_gate_under_adam(device: GpuDevice) -> None:
    """A bias right before BatchNormalization has a gradient of zero but for rounding, and the
    device's float32 sums round differently from the CPU's float64: Adam's first step, about lr
    times the gradient's sign, then moves those biases apart by up to 2 lr. The gate sees it
    (gate-mismatch: the job trains on the CPU); with SGD the step is the gradient's size and passes."""
    work = GpuWork(data=CHUNK, format=FORMAT, seed=9, settings={})
    runtime = _runtime(_bn_cnn(True))
    weights = runtime.create_initial_weights(0)
    archive = _archive(runtime, weights, work)
    gate, _, _ = run_gate(runtime, device, archive, BACKEND, weights, work, budget_mib=256)
    assert not gate.passed and gate.max_abs_diff <= 2 * 0.01 + 1e-6, gate.detail
    with pytest.raises(GpuError) as info:
        require_pass(gate)
    assert info.value.reason == "gate-mismatch"
    _train_both(_runtime(_bn_cnn(True), "sgd"), device, work)


def test_concat_and_the_mse_loss_on_the_gpu(device: GpuDevice) -> None:
    rng = np.random.default_rng(12)
    cat = _model([helper.make_node("Gemm", ["x", "W1", "b1"], ["h"]), helper.make_node("MatMul", ["x", "W3"], ["h2"]),
                  helper.make_node("Concat", ["h", "h2"], ["c"], axis=1), helper.make_node("Tanh", ["c"], ["t"]),
                  helper.make_node("Gemm", ["t", "W2", "b2"], ["y"])],
                 {"W1": rng.standard_normal((64, 16)).astype(np.float32) * 0.1, "b1": np.zeros(16, np.float32),
                  "W3": rng.standard_normal((64, 16)).astype(np.float32) * 0.1,
                  "W2": rng.standard_normal((32, 10)).astype(np.float32) * 0.1, "b2": np.zeros(10, np.float32)}, "y")
    _train_both(_runtime(cat), device, GpuWork(data=CHUNK, format=FORMAT, seed=10, settings={}))
    _train_both(_runtime(_mlp(rng), "sgd", loss="mse"), device, GpuWork(data=CHUNK, format=FORMAT, seed=11, settings={}))


def _refused(device: GpuDevice, runtime: ModelRuntime, *words: str) -> None:
    weights = runtime.create_initial_weights(0)
    archive = parse_archive(kernels() or b"")
    with pytest.raises(GpuError) as info:
        run_gate(runtime, device, archive, BACKEND, weights, GpuWork(data=CHUNK, format=FORMAT, seed=1), budget_mib=256)
    assert info.value.reason == "graph-not-on-gpu"
    for word in words:
        assert word in str(info.value), str(info.value)


def test_a_graph_with_an_operator_without_a_kernel_falls_back_by_name(device: GpuDevice) -> None:
    rng = np.random.default_rng(3)
    soft = _model([helper.make_node("Gemm", ["x", "W1", "b1"], ["h"]), helper.make_node("Reshape", ["h", "s3"], ["r"]),
                   helper.make_node("Softmax", ["r"], ["a"], axis=1), helper.make_node("Reshape", ["a", "s2"], ["f"]),
                   helper.make_node("Gemm", ["f", "W2", "b2"], ["y"])],
                  {"W1": rng.standard_normal((64, 32)).astype(np.float32) * 0.1, "b1": np.zeros(32, np.float32),
                   "s3": np.array([-1, 4, 8], np.int64), "s2": np.array([-1, 32], np.int64),
                   "W2": rng.standard_normal((32, 10)).astype(np.float32) * 0.1, "b2": np.zeros(10, np.float32)}, "y")
    _refused(device, _runtime(soft), "Softmax over the last axes", "node 2")
    # a Gemm that is not a dense layer (transB) is named too
    gemm_t = _model([helper.make_node("Gemm", ["x", "W", "b"], ["y"], transB=1)],
                    {"W": rng.standard_normal((10, 64)).astype(np.float32), "b": np.zeros(10, np.float32)}, "y")
    _refused(device, _runtime(gemm_t), "dense Gemm", "node 0")


def test_the_importer_ships_a_gpu_backend_only_with_a_device_program(tmp_path: Path) -> None:
    from weei.modelkit.onnx_package import import_package

    rng = np.random.default_rng(4)
    settings = Settings(loss="cross-entropy", optimizer="adam", lr=0.01, batch_size=16, data="digits", model_id="g")
    (tmp_path / "mlp.onnx").write_bytes(_mlp(rng))
    report = import_package(tmp_path / "mlp.onnx", settings, tmp_path / "mlp", DIGITS)
    manifest = json.loads((tmp_path / "mlp" / "manifest.json").read_text())
    gpu = [b for b in manifest["execution"]["backends"] if b["kind"] == "gpu"]
    assert [b["id"] for b in gpu] == ["gpu-webgpu"]
    assert gpu[0]["minimumDeviceLimits"]["maxStorageBuffersPerShaderStage"] == 6
    archive = parse_archive((tmp_path / "mlp" / "model.wgsl.json").read_bytes())
    assert sorted(m.name for m in archive.modules) == report["gpu"] == \
        ["matmul.wgsl", "onnx.wgsl", "optimizer.wgsl", "reduce.wgsl", "softmax_xent.wgsl"]

    (tmp_path / "tanh.onnx").write_bytes(_model([helper.make_node("Gemm", ["x", "W", "b"], ["y"], transB=1)],
                                                {"W": rng.standard_normal((10, 64)).astype(np.float32),
                                                 "b": np.zeros(10, np.float32)}, "y"))
    report = import_package(tmp_path / "tanh.onnx", settings, tmp_path / "t", DIGITS)
    manifest = json.loads((tmp_path / "t" / "manifest.json").read_text())
    assert [b["kind"] for b in manifest["execution"]["backends"]] == ["cpu"]
    assert not (tmp_path / "t" / "model.wgsl.json").exists()
    assert "dense Gemm" in report["gpu"]


def _imported(tmp_path: Path, model: bytes, name: str) -> dict:
    """An imported package as createJob takes it (its archive as the execution file, when it has one)."""
    from weei.modelkit.onnx_package import import_package

    (tmp_path / f"{name}.onnx").write_bytes(model)
    out = tmp_path / name
    import_package(tmp_path / f"{name}.onnx", Settings(loss="cross-entropy", optimizer="adam", lr=0.01, batch_size=16,
                                                       data="digits", model_id=name), out, DIGITS)
    manifest = json.loads((out / "manifest.json").read_text())
    files = {e["fileName"]: (out / "data" / e["fileName"]).read_bytes()
             for e in manifest["inlineJson"]["dataset-manifest.json"]}
    pkg = {"wasm_name": "model.wasm", "wasm": (out / "model.wasm").read_bytes(),
           "manifest": (out / "manifest.json").read_bytes(), "files": files}
    archive = out / "model.wgsl.json"
    return {**pkg, "execution_files": {archive.name: archive.read_bytes()}} if archive.exists() else pkg


def test_an_imported_mlp_job_trains_on_the_gpu_through_the_controller(tmp_path: Path) -> None:
    """The job a user makes from an imported package: every assignment on the device, the gate
    bit-identical, the final weights those of the same job on the CPU."""
    import asyncio

    from test_gpu_controller import train

    pkg = _imported(tmp_path, _mlp(np.random.default_rng(7)), "mlp")
    assert "execution_files" in pkg
    on_gpu = asyncio.run(train("gpu", pkg))
    assert on_gpu["job"]["status"] == "completed"
    assert on_gpu["execution"]["actual"] == "gpu" and on_gpu["execution"]["fallback"] == "none"
    assert on_gpu["diagnostics"]["me"]["execution"]["backend"] == "gpu-webgpu"
    trained = [e["details"] for e in on_gpu["log"] if e["event"] == "gpu.trained"]
    assert trained and trained[0]["gate"] == "bit-identical"
    on_cpu = asyncio.run(train("cpu", {k: v for k, v in pkg.items() if k != "execution_files"}))
    assert on_cpu["execution"]["actual"] == "cpu"
    worst, same = _compare(on_cpu["weights"], on_gpu["weights"])
    print(f"{len(trained)} assignments on lavapipe: max |gpu - cpu| {worst:.3g}, {same:.1%} bit-identical")
    assert on_gpu["weights"] == on_cpu["weights"]


def test_an_imported_graph_without_kernels_falls_back_by_name_in_a_job(tmp_path: Path) -> None:
    """A package whose graph has no device program: imported, it has no archive (no-gpu-archive);
    given one anyway, the device's gpuBegin names the operator (graph-not-on-gpu); the job completes
    on the CPU either way."""
    import asyncio
    import hashlib

    from test_gpu_controller import fallback_of, train
    from weei.modelkit.package import gpu_backend

    rng = np.random.default_rng(8)
    model = _model([helper.make_node("Gemm", ["x", "W", "b"], ["y"], transB=1)],
                   {"W": rng.standard_normal((10, 64)).astype(np.float32) * 0.1, "b": np.zeros(10, np.float32)}, "y")
    pkg = _imported(tmp_path, model, "gemmt")
    assert "execution_files" not in pkg
    plain = asyncio.run(train("gpu", pkg))
    assert plain["job"]["status"] == "completed" and plain["execution"]["fallback"] == "cpu: no-gpu-archive"

    archive = gpu_archive(["optimizer.wgsl"], kernels() or b"")
    manifest = json.loads(pkg["manifest"])
    manifest["execution"]["backends"].append(gpu_backend(archive))
    forced = {**pkg, "manifest": json.dumps(manifest).encode(), "execution_files": {"model.wgsl.json": archive}}
    assert hashlib.sha256(archive).hexdigest() == manifest["execution"]["backends"][-1]["shaderArchive"]["sha256"]
    state = asyncio.run(train("gpu", forced))
    assert fallback_of(state) == "graph-not-on-gpu"
    assert "Gemm, node 0" in state["diagnostics"]["me"]["execution"]["fallbackReason"]
