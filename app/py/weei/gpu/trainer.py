"""One GPU assignment on a host's device: open it, compile, gate once per job and device, train.

Both hosts of ``weei.api.gpu_backend.GpuComputeBackend`` run this: CPython
in a thread (wgpu-py), the browser inside a training Worker
(``weei.browser.worker_main``'s ``trainGpu``, on the Worker's own
``navigator.gpu``), where the shim's ``run_sync`` can wait on WebGPU's
promises without blocking the page. :class:`GpuTrainer` keeps the device
between assignments: a new job, preference or budget opens a new one (and
so runs the gate again), and so does a lost device, a timeout or an
unnamed failure.

What happens on the way is told through ``on_event(kind, payload)`` as it
happens: ``adapter`` (``{"adapter": diagnostics.gpu.adapter}``, once the
device is open) and ``compiled`` (``{"compilationMs": ms}``). Failures are
``GpuError``s with a named reason; any other exception of the device path
becomes ``device-failed`` (opening) or ``gpu-error``. An assignment has a
deadline (``GpuAssignment.deadline_s``, from when ``run`` starts), looked at
before each step and between its submissions (``gpu-timeout``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable

from weei.runtime.sandbox import DEADLINE_CEILING_S
from weei.runtime import ModelRuntime

from .adapter import check_budget
from .archive import ShaderArchive
from .errors import GpuError, GpuReason
from .executor import GpuDevice
from .gate import GateResult, require_pass
from .session import GpuBackendSpec, GpuWork, run_gate, train_on_gpu

__all__ = ["GpuAssignment", "GpuOutcome", "GpuTrainer", "EventSink", "GPU_DEADLINE_S"]

EventSink = Callable[[str, dict[str, Any]], None]

# After these the device is not trusted again: the next assignment opens a fresh one.
_RESET = frozenset({"device-lost", "gpu-timeout"})
#: How long one GPU assignment (device, compilation, gate, training) may take: a CPU operation's
#: ceiling, and the page's trainGpu deadline (weei.browser.workers.TASK_DEADLINES_S).
GPU_DEADLINE_S = DEADLINE_CEILING_S


@dataclass(frozen=True)
class GpuAssignment:
    """What one GPU assignment needs, besides the model."""

    job: str  # the gate runs once per job and device
    archive: ShaderArchive
    spec: GpuBackendSpec
    preference: str
    budget_mib: int
    weights: bytes = field(repr=False)
    auxiliary: Mapping[str, bytes]
    work: GpuWork
    deadline_s: float = GPU_DEADLINE_S  # from when the trainer starts it


@dataclass(frozen=True)
class GpuOutcome:
    """train's result of the assignment, and how the device got it."""

    weights: bytes = field(repr=False)
    metrics: dict[str, float]
    examples: int  # unique examples or completed units
    optimizer_steps: int | None
    steps: int  # device program steps run
    training_ms: float
    gate: str  # the gate's result (docs/gpu.md), as the gpu.trained log event shows it


class GpuTrainer:
    """A host's device for GPU assignments (``gpu``: ``wgpu.gpu``, the browser shim, or None)."""

    def __init__(self, gpu: Any) -> None:
        self.gpu = gpu
        self._device: GpuDevice | None = None
        self._key: tuple[str, str, int] | None = None
        self._gate: GateResult | None = None

    def run(self, runtime: ModelRuntime, a: GpuAssignment, on_event: EventSink) -> GpuOutcome:
        """Train ``a`` with the model ``runtime`` (loaded; its weights are replaced)."""
        deadline = time.monotonic() + a.deadline_s
        check_budget(a.spec.estimated_working_bytes, a.budget_mib)  # before the device and any allocation
        key = (a.job, a.preference, a.budget_mib)
        if self._device is None or self._key != key:
            self._device, self._key, self._gate = None, None, None
            try:
                self._device = GpuDevice.open(self.gpu, preference=a.preference,
                                              required_features=a.spec.required_features,
                                              minimum_limits=a.spec.minimum_device_limits)
            except GpuError:
                raise
            except Exception as exc:  # the host's WebGPU failed in a way it does not name
                raise GpuError(GpuReason.DEVICE_FAILED, f"{type(exc).__name__}: {exc}"[:500]) from exc
            self._key = key
        device = self._device
        on_event("adapter", {"adapter": device.facts.as_diagnostics()})
        try:
            on_event("compiled", {"compilationMs": device.compile(a.archive)})
            gate = self._gate
            if gate is None:
                progress, runtime.on_progress = runtime.on_progress, None  # the gate's steps are not progress
                try:
                    gate, _, _ = run_gate(runtime, device, a.archive, a.spec, a.weights, a.work,
                                          budget_mib=a.budget_mib, deadline=deadline, auxiliary=a.auxiliary)
                finally:
                    runtime.on_progress = progress
            require_pass(gate)
            self._gate = gate
            runtime.load_model(a.weights)
            if a.auxiliary:
                runtime.load_auxiliary(a.auxiliary)
            result = train_on_gpu(runtime, device, a.archive, a.spec, a.work, budget_mib=a.budget_mib,
                                  deadline=deadline)
        except GpuError as exc:
            if exc.reason in _RESET:
                self._device = None
            raise
        except Exception as exc:  # the host's WebGPU or the model's GPU operations: still the CPU's turn
            self._device = None
            raise GpuError(GpuReason.GPU_ERROR, f"{type(exc).__name__}: {exc}"[:500]) from exc
        trained = result.train
        return GpuOutcome(trained.weights, dict(trained.metrics), trained.examples, trained.optimizer_steps,
                          result.stats.steps, result.training_ms, gate.detail)
