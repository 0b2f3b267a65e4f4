"""GPU training of one assignment through the model ABI, and the admission gate.

The WASM stays the model: ``gpuBegin`` emits the program, each ``gpuNext``
packs the next step's batch (and reads the previous step's results), and
``gpuEnd`` turns the final readback (the weights) into train's result. This
module only moves bytes between the model and the executor.

An experience model runs hybrid (docs/gpu.md): its ``gpuNext`` plays the
episodes in the WASM, on the CPU, with the weights the previous update read
back, so the same loop serves both kinds of work.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from weei.runtime import ModelRuntime, TrainResult

from .adapter import check_budget
from .archive import ShaderArchive
from .errors import GpuError, GpuReason
from .executor import GpuDevice, ProgramRun, RunStats
from .gate import GateResult, compare_step
from .program import parse_program

__all__ = ["GpuBackendSpec", "GpuWork", "GpuTrainResult", "train_on_gpu", "run_gate", "MAX_GPU_STEPS"]

MAX_GPU_STEPS = 1_000_000


@dataclass(frozen=True)
class GpuBackendSpec:
    """What the executor needs from the package's GPU backend entry."""

    id: str
    estimated_working_bytes: int
    numerical_mode: str
    required_features: tuple[str, ...] = ()
    minimum_device_limits: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_backend(cls, backend: Mapping[str, Any]) -> GpuBackendSpec:
        """From a manifest backend object (already checked by weei.core.formats.manifest)."""
        return cls(
            str(backend["id"]),
            int(backend["estimatedWorkingBytes"]),
            str(backend["numericalMode"]),
            tuple(backend.get("requiredFeatures", ())),
            dict(backend.get("minimumDeviceLimits", {})),
        )

    def to_backend(self) -> dict[str, Any]:
        """The fields :meth:`from_backend` reads (what the page sends a training Worker)."""
        return {"id": self.id, "estimatedWorkingBytes": self.estimated_working_bytes,
                "numericalMode": self.numerical_mode, "requiredFeatures": list(self.required_features),
                "minimumDeviceLimits": dict(self.minimum_device_limits)}


@dataclass(frozen=True)
class GpuWork:
    """train's input for one assignment: a chunk (``data`` + ``format``,
    shuffled by ``seed``) or ``experience`` = (unit_start, unit_count, seed)."""

    data: bytes | None = None
    format: str | None = None
    experience: tuple[int, int, int] | None = None
    seed: int = 0
    settings: Mapping[str, Any] = field(default_factory=dict)

    @property
    def hybrid(self) -> bool:
        """Experience work: episodes on the CPU, the updates on the device."""
        return self.experience is not None

    def inputs(self) -> dict[str, Any]:
        """The keyword arguments of ``train`` / ``gpu_begin``."""
        return {"data": self.data, "format": self.format, "experience": self.experience, "seed": self.seed,
                "settings": dict(self.settings)}


@dataclass(frozen=True)
class GpuTrainResult:
    train: TrainResult
    stats: RunStats
    training_ms: float


def train_on_gpu(
    runtime: ModelRuntime,
    gpu: GpuDevice,
    archive: ShaderArchive,
    backend: GpuBackendSpec,
    work: GpuWork,
    *,
    budget_mib: float,
    step_limit: int | None = None,
    max_steps: int = MAX_GPU_STEPS,
    deadline: float | None = None,
) -> GpuTrainResult:
    """Train one assignment on the GPU from the runtime's loaded weights; ``deadline`` (on the
    ``time.monotonic()`` clock) is checked before each step and between its submissions (``gpu-timeout``)."""
    check_budget(backend.estimated_working_bytes, budget_mib)
    begin, weights, unit_count = runtime.gpu_begin(**work.inputs(), step_limit=step_limit)
    unsupported = begin.get("unsupported")
    if unsupported is not None:  # the model has no device program for this work (an imported graph's operator)
        raise GpuError(GpuReason.GRAPH_NOT_ON_GPU, str(unsupported)[:500])
    program = parse_program(
        begin.get("program"),
        archive=archive,
        limits=gpu.limits,
        weight_bytes=len(weights),
        budget_bytes=int(budget_mib * (1 << 20)),
        estimated_working_bytes=backend.estimated_working_bytes,
    )
    run = ProgramRun(gpu, archive, program, weights, deadline=deadline)
    try:
        start = time.perf_counter()
        readback: Sequence[bytes] = []
        for _ in range(max_steps + 1):
            result, uploads = runtime.gpu_next(readback)
            if result.get("done") is True:
                break
            if run.stats.steps >= max_steps:
                raise GpuError(GpuReason.GPU_STEP_LIMIT, f"gpuNext asked for more than {max_steps} steps")
            run.upload(uploads)
            readback = run.run_steps()
        final = run.read(program.final_readback)
        trained = runtime.gpu_end(final, unit_count)
        return GpuTrainResult(trained, run.stats, (time.perf_counter() - start) * 1000.0)
    finally:
        run.release()


def run_gate(
    runtime: ModelRuntime,
    gpu: GpuDevice,
    archive: ShaderArchive,
    backend: GpuBackendSpec,
    weights: bytes,
    work: GpuWork,
    *,
    budget_mib: float,
    deadline: float | None = None,
    auxiliary: Mapping[str, bytes] | None = None,
) -> tuple[GateResult, TrainResult, GpuTrainResult]:
    """The admission gate: the first step (for experience work, the first
    update, from the same episodes) in the CPU WASM and on the GPU from the
    same weights and ``auxiliary`` slots (loaded after every load_model, as
    the model ABI requires), compared (docs/gpu.md). Leaves the runtime
    needing a fresh load_model, as train does."""
    runtime.load_model(weights)
    if auxiliary:
        runtime.load_auxiliary(auxiliary)
    cpu = runtime.train(**work.inputs(), step_limit=1)
    runtime.load_model(weights)
    if auxiliary:
        runtime.load_auxiliary(auxiliary)
    on_gpu = train_on_gpu(runtime, gpu, archive, backend, work, budget_mib=budget_mib, step_limit=1, deadline=deadline)
    return compare_step(cpu.weights, on_gpu.train.weights, backend.numerical_mode), cpu, on_gpu
