"""The GPU executor on a real Vulkan device (lavapipe here and in CI): the
committed archive compiles, digits-mlp trains on the GPU from the same
weights and batch as the CPU WASM, cartpole-reinforce's hybrid updates
(episodes in the WASM, the update on the device) match the CPU's, the
admission gate passes, and every failure is refused or falls back by name.

Skipped only when no Vulkan adapter exists (make installs lavapipe:
apt mesa-vulkan-drivers libvulkan1).
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
import wgpu

from weei.gpu import GpuError, pack_archive, parse_archive, require_pass
from weei.gpu.executor import GpuDevice
from weei.gpu.session import GpuBackendSpec, GpuWork, run_gate, train_on_gpu
from weei.runtime import ModelRuntime, WasmtimeEngine

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "app" / "static" / "models" / "digits-mlp"
CARTPOLE = ROOT / "app" / "static" / "models" / "cartpole-reinforce"
SOURCES = {p.name: p.read_text(encoding="utf-8") for p in sorted((ROOT / "wgsl").glob("*.wgsl"))}
ARCHIVE = parse_archive((DIGITS / "model.wgsl.json").read_bytes())
BACKEND = GpuBackendSpec("gpu-webgpu", 16 << 20, "fp32-standard")
FORMAT = "weei-digits-v1"


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


@pytest.fixture()
def runtime() -> ModelRuntime:
    return ModelRuntime.load((DIGITS / "model.wasm").read_bytes(), WasmtimeEngine())


def _chunk(n: int | None = None) -> bytes:
    data = (DIGITS / "data" / "training-001.bin").read_bytes()
    if n is None:
        return data
    return b"WDG1" + struct.pack("<I", n) + data[8 : 8 + 65 * n]


def test_auto_does_not_pick_the_software_adapter() -> None:
    with pytest.raises(GpuError) as info:
        GpuDevice.open(wgpu.gpu, preference="auto")
    assert info.value.reason == "software-adapter"


def test_the_committed_archive_compiles_module_by_module(device: GpuDevice) -> None:
    assert device.facts.backend == "Vulkan"
    fresh = GpuDevice(device.adapter, device.device, device.facts)
    assert fresh.compile(ARCHIVE) > 0.0


def test_a_module_that_does_not_compile(device: GpuDevice) -> None:
    broken = dict(SOURCES)
    broken["reduce.wgsl"] = broken["reduce.wgsl"].replace("var acc = opaque_zero();", "var acc = opaque_zero()")
    archive = parse_archive(pack_archive(broken))
    with pytest.raises(GpuError) as info:
        GpuDevice(device.adapter, device.device, device.facts).compile(archive)
    assert info.value.reason == "module-compile-failed" and "reduce.wgsl" in info.value.message


def test_one_step_on_the_gpu_against_the_cpu_wasm(device: GpuDevice, runtime: ModelRuntime) -> None:
    weights = runtime.create_initial_weights(7)
    gate, cpu, gpu = run_gate(runtime, device, ARCHIVE, BACKEND, weights,
                              GpuWork(data=_chunk(), format=FORMAT, seed=42, settings={"batchSize": 32}), budget_mib=64)
    print(f"\none digits-mlp step, lavapipe vs CPU WASM: {gate.detail}; bit-identical {gate.bit_identical}")
    assert gate.passed, gate.detail
    require_pass(gate)
    assert cpu.optimizer_steps == gpu.train.optimizer_steps == 1
    assert cpu.unique_examples == gpu.train.unique_examples == 32
    # Forward pass, loss and softmax are exact: the metrics are the CPU's to the bit.
    assert gpu.train.metrics == cpu.metrics
    assert gpu.stats.compilation_ms >= 0.0 and gpu.stats.steps == 1
    assert gate.max_abs_diff < 1e-6
    # Every kernel keeps the CPU's order of operations on lavapipe (the sums start from
    # matmul.wgsl's opaque_zero): the whole step is the CPU's to the bit.
    assert gate.bit_identical and gpu.train.weights == cpu.weights


@pytest.mark.parametrize("batch", [16, 32, 5])
def test_the_gate_is_bit_identical_whatever_the_batch(device: GpuDevice, runtime: ModelRuntime, batch: int) -> None:
    # The flake this pins: a job's chunk order is random, and with input_grad's sums reassociated by
    # lavapipe's compiler about 1 start in 20 left a weight past the fp32-standard tolerance (10 of 200
    # shuffles at batch 16 failed the gate; none was bit-identical). Now every one is bit-identical.
    for seed in range(12):
        weights = runtime.create_initial_weights(seed)
        gate, _, _ = run_gate(runtime, device, ARCHIVE, BACKEND, weights,
                              GpuWork(data=_chunk(), format=FORMAT, seed=seed, settings={"batchSize": batch}),
                              budget_mib=64)
        assert gate.bit_identical, f"seed {seed}, batch {batch}: {gate.detail}"


def test_training_an_assignment_on_the_gpu(device: GpuDevice, runtime: ModelRuntime) -> None:
    weights = runtime.create_initial_weights(11)
    work = GpuWork(data=_chunk(), format=FORMAT, seed=9, settings={"batchSize": 24, "localEpochs": 2})
    runtime.load_model(weights)
    cpu = runtime.train(**work.inputs())
    runtime.load_model(weights)
    gpu = train_on_gpu(runtime, device, ARCHIVE, BACKEND, work, budget_mib=64)
    assert gpu.train.optimizer_steps == cpu.optimizer_steps == gpu.stats.steps
    assert gpu.train.unique_examples == cpu.unique_examples
    a = struct.unpack(f"<{len(weights) // 4}f", cpu.weights)
    b = struct.unpack(f"<{len(weights) // 4}f", gpu.train.weights)
    worst = max(abs(x - y) for x, y in zip(a, b, strict=True))
    print(f"\n{cpu.optimizer_steps} steps, lavapipe vs CPU WASM: max |diff| {worst:.3g}")
    assert worst < 1e-4
    assert abs(gpu.train.metrics["loss"] - cpu.metrics["loss"]) < 1e-4
    assert gpu.train.metrics["accuracy"] == pytest.approx(cpu.metrics["accuracy"], abs=0.02)
    assert gpu.train.weights == cpu.weights and gpu.train.metrics == cpu.metrics  # 10 steps, to the bit


def test_a_forced_gate_failure(device: GpuDevice, runtime: ModelRuntime) -> None:
    # A kernel that compiles and runs but is subtly wrong: the ReLU backward
    # also passes gradients where the unit is exactly zero.
    wrong = dict(SOURCES)
    wrong["matmul.wgsl"] = wrong["matmul.wgsl"].replace("mask[k] > 0.0", "mask[k] >= 0.0")
    assert wrong != SOURCES
    archive = parse_archive(pack_archive(wrong))
    weights = runtime.create_initial_weights(7)
    gate, _, _ = run_gate(runtime, device, archive, BACKEND, weights,
                          GpuWork(data=_chunk(), format=FORMAT, seed=42, settings={"batchSize": 32}), budget_mib=64)
    assert not gate.passed and not gate.bit_identical
    with pytest.raises(GpuError) as info:
        require_pass(gate)
    assert info.value.reason == "gate-mismatch"


@pytest.fixture()
def cartpole() -> ModelRuntime:
    return ModelRuntime.load((CARTPOLE / "model.wasm").read_bytes(), WasmtimeEngine())


def _max_diff(a: bytes, b: bytes) -> tuple[float, int]:
    x = struct.unpack(f"<{len(a) // 4}f", a)
    y = struct.unpack(f"<{len(b) // 4}f", b)
    return max(abs(p - q) for p, q in zip(x, y, strict=True)), sum(p != q for p, q in zip(x, y))


def test_one_hybrid_update_against_the_cpu_wasm(device: GpuDevice, cartpole: ModelRuntime) -> None:
    # The cartpole archive packs the same kernels as digits-mlp's (both programs name the same modules).
    archive = parse_archive((CARTPOLE / "model.wgsl.json").read_bytes())
    assert archive.module_sha256s == ARCHIVE.module_sha256s
    weights = cartpole.create_initial_weights(7)
    work = GpuWork(experience=(0, 40, 5), settings={"learningRate": 0.01})
    assert work.hybrid
    gate, cpu, gpu = run_gate(cartpole, device, archive, BACKEND, weights, work, budget_mib=64)
    worst, differing = _max_diff(cpu.weights, gpu.train.weights)
    print(f"\none cartpole update (16 episodes), lavapipe vs CPU WASM: {gate.detail}; "
          f"bit-identical {gate.bit_identical}; max |diff| {worst:.3g}")
    assert gate.passed, gate.detail
    assert gate.max_abs_diff == worst and gate.differing == differing
    # The same 16 episodes on both sides (the first group plays with the same weights), one update each.
    assert cpu.optimizer_steps == gpu.train.optimizer_steps == gpu.stats.steps == 1
    assert cpu.completed_units == gpu.train.completed_units == 16
    assert gpu.train.metrics == cpu.metrics
    assert weights != gpu.train.weights


def test_a_hybrid_assignment_plays_each_group_with_the_updated_weights(device: GpuDevice,
                                                                       cartpole: ModelRuntime) -> None:
    archive = parse_archive((CARTPOLE / "model.wgsl.json").read_bytes())
    weights = cartpole.create_initial_weights(3)
    work = GpuWork(experience=(16, 40, 9), settings={"learningRate": 0.05})  # groups of 16, 16, 8
    cartpole.load_model(weights)
    cpu = cartpole.train(**work.inputs())
    cartpole.load_model(weights)
    progress: list[int] = []
    cartpole.on_progress = lambda p: progress.append(p.processed_examples)
    gpu = train_on_gpu(cartpole, device, archive, BACKEND, work, budget_mib=64)
    worst, differing = _max_diff(cpu.weights, gpu.train.weights)
    print(f"\n{gpu.stats.steps} cartpole updates, lavapipe vs CPU WASM: {differing} of 114 weights differ, "
          f"max |diff| {worst:.3g}; {gpu.training_ms:.1f} ms")
    assert gpu.train.optimizer_steps == cpu.optimizer_steps == gpu.stats.steps == 3
    assert gpu.train.completed_units == cpu.completed_units == 40
    assert progress and progress[-1] == 40  # gpuNext reports the episodes as it plays them
    # Later groups play with the weights read back from the device: equal episodes need equal weights.
    assert worst < 1e-5
    assert gpu.train.metrics["episodeReturn"] == pytest.approx(cpu.metrics["episodeReturn"])


def test_a_wrong_tanh_backward_fails_the_hybrid_gate(device: GpuDevice, cartpole: ModelRuntime) -> None:
    wrong = dict(SOURCES)
    wrong["matmul.wgsl"] = wrong["matmul.wgsl"].replace("(1.0 - mask[k] * mask[k])", "(1.0 - mask[k])")
    assert wrong != SOURCES
    weights = cartpole.create_initial_weights(7)
    gate, _, _ = run_gate(cartpole, device, parse_archive(pack_archive(wrong)), BACKEND, weights,
                          GpuWork(experience=(0, 16, 5)), budget_mib=64)
    assert not gate.passed and not gate.bit_identical
    with pytest.raises(GpuError) as info:
        require_pass(gate)
    assert info.value.reason == "gate-mismatch"


def test_a_budget_too_small_is_refused_before_anything_runs(device: GpuDevice, runtime: ModelRuntime) -> None:
    runtime.load_model(runtime.create_initial_weights(1))
    with pytest.raises(GpuError) as info:
        train_on_gpu(runtime, device, ARCHIVE, BACKEND, GpuWork(data=_chunk(), format=FORMAT), budget_mib=8)
    assert info.value.reason == "over-memory-budget"


def test_a_module_missing_from_the_archive(device: GpuDevice, runtime: ModelRuntime) -> None:
    archive = parse_archive(pack_archive({k: v for k, v in SOURCES.items() if k != "reduce.wgsl"}))
    runtime.load_model(runtime.create_initial_weights(1))
    with pytest.raises(GpuError) as info:
        train_on_gpu(runtime, device, archive, BACKEND, GpuWork(data=_chunk(), format=FORMAT), budget_mib=64)
    assert info.value.reason == "module-missing"


def test_the_abi_order_of_gpu_calls(runtime: ModelRuntime) -> None:
    from weei.core.errors import ModelError, UsageError

    with pytest.raises(UsageError):
        runtime.gpu_begin(data=_chunk(), format=FORMAT)
    runtime.load_model(runtime.create_initial_weights(1))
    runtime.gpu_begin(data=_chunk(4), format=FORMAT, settings={"batchSize": 4})
    with pytest.raises(ModelError, match="before gpuNext answered done"):
        runtime.gpu_end([b"\0" * 19240], None)
    with pytest.raises(ModelError, match="no step ran"):
        runtime.gpu_next([b"\0" * 32])
    # cartpole-reinforce (an experience model) has them too, and refuses a dataset input.
    cartpole = ModelRuntime.load((ROOT / "app/static/models/cartpole-reinforce/model.wasm").read_bytes(), WasmtimeEngine())
    assert cartpole.has_gpu_operations
    cartpole.load_model(cartpole.create_initial_weights(1))
    with pytest.raises(ModelError, match="experience"):
        cartpole.gpu_begin(data=_chunk(4), format=FORMAT)
