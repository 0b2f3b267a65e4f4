"""Compute backends: where this device trains assignments and runs validations.

The executor hands every training and validation to one ``ComputeBackend``.
:class:`CpuWorkerBackend` runs the model's WebAssembly module in a pool of
Workers (threads in CPython); ``gpu_backend.GpuComputeBackend`` wraps it and
trains a job's assignments on a WebGPU device when the job has a WGSL
archive and the device's backend preference allows, falling back to it.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Protocol

from ..core.aggregation.aggregate import AggregationKernel
from ..core.wire.messages import Assign
from ..core.job.participant import TrainOutcome
from ..prepare import GpuFiles
from .local_training import LocalWorkers
from .ports import WorkerPool, WorkerResult, WorkerTask

__all__ = ["ComputeBackend", "CpuWorkerBackend", "CPU_BACKEND_ID"]

CPU_BACKEND_ID = "cpu-wasm"


class ComputeBackend(Protocol):
    """Trains assignments and evaluates weights with a model module."""

    @property
    def id(self) -> str: ...  # diagnostics' execution.backend

    @property
    def kind(self) -> str: ...  # 'cpu' | 'gpu' | 'hybrid': what execution.actual reports

    @property
    def device_limit(self) -> int: ...  # how many tasks can run at once on this device

    @property
    def active(self) -> int: ...  # tasks running now

    @property
    def wgsl(self) -> dict[str, Any]: ...  # diagnostics' model.wgsl: the WGSL archive this backend holds

    def set_job(self, files: GpuFiles | None, cpu_backend_id: str | None) -> None:
        """The active job's checked WGSL archive (None: none) and the package's CPU backend id (None: no job)."""
        ...

    def offer(self, offer: Mapping[str, Any] | None, cpu_backend: str | None = None) -> bool:
        """A remote job's Deliver announced ``offer`` (checked JSON, None: no archive) and the package's CPU
        backend id. Returns whether this device fetches the archive (it would train on its GPU)."""
        ...

    def receive_archive(self, sha256: str, data: bytes | None) -> None:
        """The announced archive arrived with an Assign (``data`` None: it did not); a bad one is a named
        fallback, never an error."""
        ...

    async def train(self, assign: Assign, *, module_sha256: str, module: bytes, weights: bytes,
                    auxiliary: Mapping[str, bytes], chunk: bytes | None, workers: int,
                    working_bytes: int | None = None, parts: int = 1) -> TrainOutcome:
        """Train ``assign`` from ``weights`` on ``workers`` Workers; raises WeeiError when the model fails.
        ``working_bytes``: the package's estimatedWorkingBytes, when known (weei.runtime.sandbox);
        ``parts``: the unit ranges of an experience assignment (``local_training.experience_parts``)."""
        ...

    async def evaluate(self, *, module_sha256: str, module: bytes, task: WorkerTask) -> WorkerResult:
        """Run an 'evaluate' task; raises WeeiError when the model fails."""
        ...

    def follow(self, attempt_id: str | None) -> bool:
        """The participant now holds ``attempt_id`` (None: none): interrupt training of any other
        attempt, whose ``train`` then raises TaskCancelled. True when a running attempt was interrupted."""
        ...

    def cancel(self) -> None:
        """Interrupt every task (training and validation) of the job being cleared."""
        ...


class CpuWorkerBackend:
    """The WebAssembly module on the device's Worker pool: it never uses a WGSL archive."""

    id = CPU_BACKEND_ID
    kind = "cpu"

    def __init__(self, pool: WorkerPool, kernel: AggregationKernel,
                 on_progress: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.pool = pool
        self.local = LocalWorkers(pool, kernel, on_progress=on_progress)

    @property
    def device_limit(self) -> int:
        return self.pool.device_limit

    @property
    def active(self) -> int:
        return self.pool.active

    @property
    def wgsl(self) -> dict[str, Any]:
        return {"present": False, "sha256": []}

    def set_job(self, files: GpuFiles | None, cpu_backend_id: str | None) -> None:
        pass

    def offer(self, offer: Mapping[str, Any] | None, cpu_backend: str | None = None) -> bool:
        return False

    def receive_archive(self, sha256: str, data: bytes | None) -> None:
        pass

    async def train(self, assign: Assign, *, module_sha256: str, module: bytes, weights: bytes,
                    auxiliary: Mapping[str, bytes], chunk: bytes | None, workers: int,
                    working_bytes: int | None = None, parts: int = 1) -> TrainOutcome:
        return await self.local.train(assign, module_sha256=module_sha256, module=module, weights=weights,
                                      auxiliary=auxiliary, chunk=chunk, workers=workers, working_bytes=working_bytes,
                                    parts=parts)

    async def evaluate(self, *, module_sha256: str, module: bytes, task: WorkerTask) -> WorkerResult:
        return await self.local.evaluate(module_sha256, module, task)

    def follow(self, attempt_id: str | None) -> bool:
        return self.local.follow(attempt_id)

    def cancel(self) -> None:
        self.pool.cancel()
