"""byte-transformer on a real Vulkan device (lavapipe here and in CI): its
device program (c/models/byte-transformer/gpu.c over wgsl/transformer.wgsl
and the shared kernels) makes the CPU WASM's step, the admission gate
passes with the package's own GPU backend entry, a job through the
controller trains on the GPU to the CPU's very weights, a minibatch above
the CPU's micro-batch of 8 records is summed from micro-batches on the
device as on the CPU, and what the program does not take (a minibatch
above 320 records) is refused by name.

Skipped only when no Vulkan adapter exists (make installs lavapipe:
apt mesa-vulkan-drivers libvulkan1).
"""

from __future__ import annotations

import asyncio
import json
import struct
import time
from pathlib import Path
from typing import Any

import pytest
import wgpu
from test_gpu_controller import train
from test_gpu_lavapipe import _vulkan_adapter

from weei.core.errors import ModelError
from weei.core.formats.jsonfmt import stringify
from weei.gpu import parse_archive, require_pass
from weei.gpu.executor import GpuDevice
from weei.gpu.session import GpuBackendSpec, GpuWork, run_gate, train_on_gpu
from weei.modelkit import model_manifest, probe_model
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


def test_a_minibatch_above_the_micro_batch_is_summed_on_the_device(device: GpuDevice, runtime: ModelRuntime) -> None:
    # 12 records at batchSize 10: the first step sums two micro-batches (8 and 2 records, each weighed by
    # its share), the second (2 records) is one tfm_loss, as model_train does; both steps to the CPU's bits.
    archive = parse_archive((MODEL / "model.wgsl.json").read_bytes())
    weights = runtime.create_initial_weights(5)
    work = GpuWork(data=_records(12), format=FORMAT, seed=3, settings={"batchSize": 10})
    runtime.load_model(weights)
    cpu = runtime.train(**work.inputs())
    runtime.load_model(weights)
    gpu = train_on_gpu(runtime, device, archive, _backend(), work, budget_mib=256)
    assert cpu.optimizer_steps == gpu.train.optimizer_steps == gpu.stats.steps == 2
    assert gpu.train.weights == cpu.weights and gpu.train.metrics == cpu.metrics
    assert gpu.train.weights != weights


def test_a_minibatch_over_320_records_is_refused_by_gpu_begin(runtime: ModelRuntime) -> None:
    # 40 micro-batch slots of 8 fill the program's 4096 steps: a larger batchSize trains on the CPU.
    record = (MODEL / "data" / "training-001.bin").read_bytes()[8 : 8 + 65]
    runtime.load_model(runtime.create_initial_weights(1))
    data = b"WBT1" + struct.pack("<I", 321) + record * 321
    with pytest.raises(ModelError) as info:
        runtime.gpu_begin(data=data, format=FORMAT, seed=1, settings={"batchSize": 321})
    assert "at most 320 records" in str(info.value)
    runtime.load_model(runtime.create_initial_weights(1))
    begun, _, _ = runtime.gpu_begin(data=data, format=FORMAT, seed=1, settings={"batchSize": 320})
    assert len(begun["program"]["steps"]) <= 4096


def _small_package(tmp: Path) -> dict[str, Any]:
    """byte-transformer's package over two chunks of 4 records, manifest written by weei.modelkit as build.py does."""
    data = tmp / "data"
    data.mkdir()
    whole = (MODEL / "data" / "training-001.bin").read_bytes()
    for k in (0, 1):
        (data / f"training-00{k + 1}.bin").write_bytes(b"WBT1" + struct.pack("<I", 4) + whole[8 + 65 * 4 * k : 8 + 65 * 4 * (k + 1)])
    wasm = (MODEL / "model.wasm").read_bytes()
    archive = (MODEL / "model.wgsl.json").read_bytes()
    manifest = model_manifest(wasm, probe_model(wasm, data), archive)
    files = {c["fileName"]: (data / c["fileName"]).read_bytes() for c in manifest["inlineJson"]["dataset-manifest.json"]}
    return {"wasm_name": "model.wasm", "wasm": wasm, "manifest": stringify(manifest).encode(), "files": files,
            "execution_files": {"model.wgsl.json": archive}}


def test_a_transformer_job_trains_on_the_gpu_through_the_controller(tmp_path: Path) -> None:
    pkg = _small_package(tmp_path)
    settings = {"epochs": 1, "localEpochs": 1, "batchSize": 2, "coordinatorParticipates": True}
    on_gpu = asyncio.run(train("gpu", pkg, settings=settings))
    assert on_gpu["job"]["status"] == "completed"
    assert on_gpu["execution"]["actual"] == "gpu" and on_gpu["execution"]["fallback"] == "none"
    assert on_gpu["diagnostics"]["me"]["execution"]["backend"] == "gpu-webgpu"
    trained = [e for e in on_gpu["log"] if e["event"] == "gpu.trained"]
    assert len(trained) == 2 and trained[0]["details"]["gate"] == "bit-identical"  # the gate ran once, passed
    on_cpu = asyncio.run(train("cpu", pkg, settings=settings))
    assert on_cpu["execution"]["actual"] == "cpu"
    # Every step bit-identical: the whole job ends with the CPU's weights.
    assert on_gpu["weights"] == on_cpu["weights"]
