"""byte-transformer on a real Vulkan device (lavapipe here and in CI): its
device program (c/models/byte-transformer/gpu.c over wgsl/transformer.wgsl
and the shared kernels) makes the CPU WASM's step, the admission gate
passes with the package's own GPU backend entry, and what the program does
not take (a minibatch above 8 records) is refused by name.

Skipped only when no Vulkan adapter exists (make installs lavapipe:
apt mesa-vulkan-drivers libvulkan1).
"""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import pytest
import wgpu
from test_gpu_lavapipe import _vulkan_adapter

from weei.core.errors import ModelError
from weei.gpu import parse_archive, require_pass
from weei.gpu.executor import GpuDevice
from weei.gpu.session import GpuBackendSpec, GpuWork, run_gate
from weei.runtime import ModelRuntime, WasmtimeEngine

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "app" / "static" / "models" / "byte-transformer"
FORMAT = "weei-bytes-v1"

pytestmark = pytest.mark.skipif(
    _vulkan_adapter() is None,
    reason="no Vulkan adapter (install lavapipe: apt mesa-vulkan-drivers libvulkan1, as make does)",
)


def _backend() -> GpuBackendSpec:
    manifest = json.loads((MODEL / "manifest.json").read_text(encoding="utf-8"))
    (gpu,) = [b for b in manifest["execution"]["backends"] if b["kind"] == "gpu"]
    return GpuBackendSpec(gpu["id"], gpu["estimatedWorkingBytes"], gpu["numericalMode"])


@pytest.fixture(scope="module")
def device() -> GpuDevice:
    return GpuDevice.open(wgpu.gpu, preference="gpu")


@pytest.fixture()
def runtime() -> ModelRuntime:
    return ModelRuntime.load((MODEL / "model.wasm").read_bytes(), WasmtimeEngine())


def _records(n: int) -> bytes:
    data = (MODEL / "data" / "training-001.bin").read_bytes()
    return b"WBT1" + struct.pack("<I", n) + data[8 : 8 + 65 * n]


@pytest.mark.parametrize("batch", [1, 2])
def test_a_transformer_step_on_the_gpu_passes_the_gate(device: GpuDevice, runtime: ModelRuntime, batch: int) -> None:
    archive = parse_archive((MODEL / "model.wgsl.json").read_bytes())
    backend = _backend()
    assert backend.numerical_mode == "fp32-standard"
    weights = runtime.create_initial_weights(7)
    work = GpuWork(data=_records(24), format=FORMAT, seed=42, settings={"batchSize": batch})
    started = time.monotonic()
    gate, cpu, gpu = run_gate(runtime, device, archive, backend, weights, work, budget_mib=256)
    elapsed = time.monotonic() - started
    print(f"\none byte-transformer step (batch {batch}), lavapipe vs CPU WASM: {gate.detail}; "
          f"bit-identical {gate.bit_identical}; gate {elapsed:.1f} s (both steps)")
    assert gate.passed, gate.detail
    require_pass(gate)
    assert cpu.optimizer_steps == gpu.train.optimizer_steps == gpu.stats.steps == 1
    assert cpu.unique_examples == gpu.train.unique_examples == batch
    assert gpu.train.metrics == cpu.metrics  # forward pass and loss exact: the metrics are the CPU's
    assert gate.max_abs_diff <= 1e-6
    assert gpu.train.weights != weights  # the step moved the weights


def test_a_minibatch_over_eight_records_is_refused_by_gpu_begin(runtime: ModelRuntime) -> None:
    runtime.load_model(runtime.create_initial_weights(1))
    with pytest.raises(ModelError) as info:
        runtime.gpu_begin(data=_records(24), format=FORMAT, seed=1, settings={"batchSize": 16})
    assert "at most 8 records" in str(info.value)
