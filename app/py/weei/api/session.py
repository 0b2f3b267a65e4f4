"""What the controller's parts share: this device's job, its counters and its device settings.

The API front (``controller``), the executor, the job store and the state
view each hold the one ``Session``; the front and the executor change it,
the view only reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from ..core.job.coordinator import Coordinator
from ..core.observe.debuglog import DebugLog
from ..core.observe.diagnostics import DiagnosticsBook, DiagnosticsRecorder
from ..core.job.invitations import PendingInvitations
from ..core.observe.live_progress import LiveProgress
from ..core.job.participant import Participant
from ..core.links.relay import RelayNode
from ..core.states import JobStatus, PeerState
from .ports import Transport

__all__ = ["Session", "DeviceSettings"]


@dataclass
class DeviceSettings:
    """The device's own settings (``settings/device`` in storage)."""

    max_local_workers: int = 4
    gpu_memory_budget_mib: int = 512
    backend_preference: str = "auto"

    def to_json(self) -> dict[str, Any]:
        return {"maxLocalWorkers": self.max_local_workers, "gpuMemoryBudgetMiB": self.gpu_memory_budget_mib,
                "backendPreference": self.backend_preference}


@dataclass
class Session:
    my_peer_id: str
    clock: Callable[[], float]  # wall-clock ms
    monotonic: Callable[[], float]  # monotonic ms
    transport: Transport | None
    debug_log: DebugLog
    recorder: DiagnosticsRecorder
    book: DiagnosticsBook = field(default_factory=DiagnosticsBook)
    device: DeviceSettings = field(default_factory=DeviceSettings)
    coordinator: Coordinator | None = None
    participant: Participant | None = None
    job_seed: int | None = None
    validation_sha256: str | None = None
    validation_unavailable: bool = False
    invitations: PendingInvitations = field(default_factory=PendingInvitations)  # waiting for a decision
    busy: int = 0
    preparing: bool = False
    evaluating: int = 0
    saving: int = 0  # SaveCheckpoint commands taken and not yet written
    error: str | None = None
    paused_contribution: bool = False
    live: LiveProgress = field(default_factory=LiveProgress)  # state.progress and liveMetrics
    actual: str = "unknown"  # the mode this device trained in, once it has
    fallback: str | None = None  # the GpuError reason the last assignment fell back to the CPU with
    # Model id -> this device's last measured training speed (records/s): reviewSettings estimates a new job with it.
    measured: dict[str, float] = field(default_factory=dict)
    # Model id -> mode ('cpu', 'gpu', 'hybrid') -> this device's last assignment's speed (examples or units a
    # second over the backend's whole train call): the window compares the GPU with the CPU.
    speeds: dict[str, dict[str, float]] = field(default_factory=dict)
    relay: RelayNode | None = None  # this device's part in relaying checkpoints to the job's other participants
    # This device's last trained assignment (the debug log's assignment.trained): what `weei agent` prints.
    last_trained: dict[str, Any] | None = None

    # The peer ID signaling gave this device after its job began (the job's peers know ``my_peer_id``): shown at
    # once, taken on when the job is cleared (issue 24).
    renamed_to: str | None = None

    def finished_job(self) -> str | None:
        """The finished job this device still shows (coordinated to the end, or taken part in until its end):
        accepting an invitation replaces it."""
        if self.coordinator is not None:
            return self.coordinator.spec.job_id if self.coordinator.status is JobStatus.COMPLETED else None
        p = self.participant
        return p.job_id if p is not None and p.state is PeerState.STOPPED else None

    def record(self, event: str, details: Mapping[str, Any] | None = None) -> None:
        """Add an event to the debug log, stamped now."""
        self.debug_log.record(self.clock(), event, dict(details) if details else None)
