"""The state view: ``getState()`` built from the session, the job store and the backend, and its subscribers."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Callable

from ..core.job.coordinator import Coordinator
from ..core.errors import WeeiError
from ..core.observe.live_progress import estimate_remaining_ms
from ..core.formats.modelinfo import effective_units_per_assignment
from ..core.formats.settings import TrainingSettings
from ..core.states import JobStatus, PeerState, takes_part
from .compute import ComputeBackend
from .job_store import JobStore
from .local_training import effective_workers
from .session import Session

__all__ = ["StateView", "PROGRESS_NOTIFY_MS", "job_settings", "job_module", "requested_workers"]

PROGRESS_NOTIFY_MS = 100

Listener = Callable[[dict[str, Any]], None]


class StateView:
    """Builds the spec's TrainingState and tells subscribers when it changes."""

    def __init__(self, session: Session, store: JobStore, backend: ComputeBackend) -> None:
        self.session = session
        self.store = store
        self.backend = backend
        self.listeners: list[Listener] = []
        #: More of the state from other parts (peer_cards.py: displayName, peerNames), merged in last.
        self.extras: list[Callable[[], dict[str, Any]]] = []
        self._notify_pending: asyncio.TimerHandle | None = None

    # ----------------------------------------------------------- subscribers

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener`` now and after every change; returns the unsubscribe function."""
        self.listeners.append(listener)
        listener(self.get_state())

        def unsubscribe() -> None:
            if listener in self.listeners:
                self.listeners.remove(listener)

        return unsubscribe

    def notify_soon(self) -> None:
        """Progress reports come many times a second: subscribers hear of them at most every
        PROGRESS_NOTIFY_MS (every other change is told at once)."""
        if self._notify_pending is not None or not self.listeners:
            return

        def fire() -> None:
            self._notify_pending = None
            self.notify()

        self._notify_pending = asyncio.get_event_loop().call_later(PROGRESS_NOTIFY_MS / 1000.0, fire)

    def notify(self) -> None:
        if self._notify_pending is not None:
            self._notify_pending.cancel()
            self._notify_pending = None
        if not self.listeners:
            return
        state = self.get_state()
        for listener in list(self.listeners):
            try:
                listener(state)
            except Exception as exc:  # a page's listener must not break the job
                self.session.record("subscriber.failed", {"error": repr(exc)[:200]})

    # ------------------------------------------------------------------ state

    def get_state(self) -> dict[str, Any]:
        """The spec's TrainingState: a fresh copy, no files, data or weights."""
        s = self.session
        now = s.clock()
        coordinator = s.coordinator
        device = s.device
        state: dict[str, Any] = {
            "ready": True,
            "myPeerId": s.renamed_to or s.my_peer_id,
            "busy": s.busy > 0,
            "preparing": s.preparing,
            # The spec: averaging updates into a checkpoint, from a round's last update until the file is written.
            "transitioning": s.saving > 0 or (coordinator is not None and coordinator.transitioning),
            "evaluating": s.evaluating > 0,
            "peers": s.transport.peers() if s.transport is not None else [],
            "invitations": [[job_id, self._invitation(inv)] for job_id, inv in s.invitations.entries().items()],
            "progress": s.live.progress_json(),
            "liveMetrics": s.live.live_metrics_json(),
            **self._transfers(),
            "pausedContribution": s.paused_contribution,
            "activeWorkers": self.backend.active,
            "backendPreference": device.backend_preference,
            "execution": {"requested": device.backend_preference, "actual": s.actual,
                          "phase": s.recorder.stage,
                          "fallback": "none" if s.fallback is None else f"cpu: {s.fallback}",
                          "examplesPerSecond": self._speeds()},
            "maxLocalWorkers": device.max_local_workers,
            "gpuMemoryBudgetMiB": device.gpu_memory_budget_mib,
            "diagnostics": self._diagnostics(now),
            "savedJobs": [self._saved_summary(r) for r in sorted(self.store.saved_jobs.values(),
                                                                  key=lambda r: -r.get("updatedAt", 0))],
        }
        for extra in self.extras:
            state.update(extra())
        if s.error:
            state["error"] = s.error
        if s.renamed_to is not None:
            state["peerIdChanged"] = {"from": s.my_peer_id, "to": s.renamed_to}
            state.setdefault("error", f"this tab's peer ID changed from {s.my_peer_id} to {s.renamed_to} (the "
                             "Weei server restarted with another secret): this job's peers knew the old one; leave "
                             "the job and invite them again")
        participant = s.participant
        if coordinator is not None:
            job = coordinator.view(now)
            job["validationUnavailable"] = s.validation_unavailable
            job["hasModuleFile"] = coordinator.spec.module.sha256 in self.store.artifacts
            history = self.store.history(coordinator.spec.job_id)
            if history:
                job["history"] = json.loads(json.dumps(history))  # the state is the caller's to change
            job["localWorkers"] = self._local_workers(info=coordinator.spec.info.raw,
                                                      settings=coordinator.spec.settings)
            estimate = self._estimate(coordinator)
            if estimate is not None:
                state["estimatedRemainingMs"] = estimate
                if "progress" in job:
                    job["progress"]["estimatedRemainingMs"] = estimate
            if coordinator.error and "error" not in state:
                state["error"] = coordinator.error
            state["job"] = job
        elif participant is not None and participant.job_id is not None and \
                (takes_part(participant.state) or participant.state is PeerState.STOPPED):
            info = participant.model_info or {}
            settings = job_settings(s)
            module = job_module(s) or {}
            state["job"] = {
                "id": participant.job_id, "role": "participant",
                # What this device knows of the job: finished, its own contribution paused, or running.
                "status": JobStatus.COMPLETED if participant.state is PeerState.STOPPED else
                          JobStatus.PAUSED if s.paused_contribution else JobStatus.RUNNING,
                "owner": participant.coordinator, "info": json.loads(json.dumps(info)),
                "settings": settings.to_json() if settings is not None else {},
                "participants": {s.my_peer_id: {"connected": True, "approved": True,
                                                "paused": s.paused_contribution,
                                                "state": participant.state}},
                "queue": [], "slots": [], "incomplete": bool(participant.incomplete),
                # The job's checkpoints as the coordinator's notes told them (summaries, no files).
                "checkpoints": [json.loads(json.dumps(participant.checkpoints[r])) for r in sorted(participant.checkpoints)],
                "shuffled": False, "validationUnavailable": False, "module": module,
                "hasModuleFile": bool(module) and module["sha256"] in self.store.artifacts,
                "localWorkers": self._local_workers(info=info, settings=settings),
            }
            if participant.state is PeerState.DISCONNECTED:
                # The job is not known to run while its coordinator is away: say so, and since when.
                state["job"]["coordinatorOffline"] = {"since": participant.offline_since}
        return state

    def _invitation(self, entry: dict[str, Any]) -> dict[str, Any]:
        """An invitation as ``state.invitations`` shows it; ``replacesFinishedJob``: accepting it puts this
        device's finished job away (to Saved jobs)."""
        out: dict[str, Any] = json.loads(json.dumps(entry))
        replaced = self.session.finished_job()
        if replaced is not None:
            out["replacesFinishedJob"] = replaced
        return out

    def _speeds(self) -> dict[str, float]:
        """This device's last average training speed by mode for the model of the job it takes part in."""
        s = self.session
        info = s.participant.model_info if s.participant is not None else None
        model = (info or {}).get("id")
        return dict(s.speeds.get(model[:256], {})) if isinstance(model, str) else {}

    def _transfers(self) -> dict[str, Any]:
        transport = self.session.transport
        if transport is None:
            return {"transfers": [], "transferErrors": {}}
        return json.loads(json.dumps(transport.transfers_state()))

    def _local_workers(self, *, info: dict[str, Any], settings: TrainingSettings | None) -> dict[str, Any]:
        """localWorkers from the model's raw ModelInfo (a participant's came from its coordinator)
        and the job's settings."""
        device = self.session.device
        requested = requested_workers(settings, device.max_local_workers)
        work_source = info.get("workSource") if isinstance(info.get("workSource"), dict) else None
        experience = work_source is not None
        model_max = _whole(info.get("maxWorkers")) or 1
        capacity = effective_workers(requested=10**6, device_limit=self.backend.device_limit,
                                     model_max=model_max, experience=experience, unit_count=None)
        units = None
        if experience:
            per_assignment = work_source.get("unitsPerAssignment") if work_source is not None else None
            units = settings.experience.units_per_assignment if settings is not None and settings.experience \
                else _whole(per_assignment.get("default")) if isinstance(per_assignment, dict) else None
        effective = effective_workers(requested=min(requested, device.max_local_workers),
                                      device_limit=self.backend.device_limit, model_max=model_max,
                                      experience=experience, unit_count=units)
        return {"requested": requested, "capacity": capacity, "effective": effective, "active": self.backend.active}

    def _estimate(self, coordinator: Coordinator) -> int | None:
        """estimatedRemainingMs of a running job (docs/api.md gives the formula)."""
        dataset = coordinator.dataset
        if coordinator.status != JobStatus.RUNNING:
            return None
        live = self.session.live
        working = [p for p, r in coordinator.peers.items()
                   if r.loaded and r.connected and not r.paused and not r.excluded]
        if dataset is None:
            return self._estimate_experience(coordinator, working)
        if dataset.finished:
            return None
        passes = coordinator.spec.settings.local_epochs  # a chunk's work: its examples, every local epoch
        counts = {c.id: c.example_count * passes for c in coordinator.spec.chunks}
        unassigned = sum(counts.get(c, 0) for c in dataset.queue)
        for attempt in coordinator.attempts.open():  # in flight, no progress heard of it yet
            if attempt.chunk_id is not None and not live.reports(attempt.peer, attempt.attempt_id):
                unassigned += counts.get(attempt.chunk_id, 0)
        unassigned += max(0, dataset.planned_epochs - dataset.epoch - 1) * sum(counts.values())
        # The peers that can train now (loaded, connected, not paused nor excluded) at their last known rates.
        return estimate_remaining_ms(unassigned, live, working)

    def _estimate_experience(self, coordinator: Coordinator, working: list[str]) -> int | None:
        """An experience job: every working peer plays the round's units; rounds after the open one
        count in full, the open one's attempts by what their peers have not reported yet."""
        settings, info = coordinator.spec.settings, coordinator.spec.info
        if info.work_source is None:
            return None
        units = effective_units_per_assignment(settings, info)
        open_attempts = coordinator.attempts.open()
        later = max(0, settings.epochs - coordinator.checkpoint_round - (1 if open_attempts else 0))
        unassigned = later * units * len(working)
        for attempt in open_attempts:
            if not self.session.live.reports(attempt.peer, attempt.attempt_id):
                unassigned += attempt.units.count if attempt.units is not None else units
        return estimate_remaining_ms(unassigned, self.session.live, working)

    def _diagnostics(self, now: float) -> dict[str, Any]:
        s = self.session
        view = s.book.view(now)
        if s.recorder.job_id is not None:
            own = s.recorder.view(now, s.monotonic())
            own.update({"receivedAt": now, "ageMs": 0, "stale": False, "connected": True})
            view[s.my_peer_id] = own
        return view

    @staticmethod
    def _saved_summary(record: dict[str, Any]) -> dict[str, Any]:
        return {"id": record["id"], "model": record["modelInfo"].get("name", record["modelInfo"].get("id")),
                "status": record.get("status", JobStatus.READY), "round": record.get("lastRound", 0),
                "updatedAt": record.get("updatedAt", 0), "active": bool(record.get("active"))}


def _whole(value: Any) -> int | None:
    """A whole number ≥ 1 from a peer's JSON, or None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 2**53 - 1 else None


def job_settings(session: Session) -> TrainingSettings | None:
    """The active job's settings: the coordinator's, or those the invitation showed a participant
    (checked as the coordinator checks them; None when they do not parse)."""
    if session.coordinator is not None:
        return session.coordinator.spec.settings
    participant = session.participant
    if participant is None or participant.invitation is None:
        return None
    try:
        return TrainingSettings.from_json(participant.invitation.settings)
    except WeeiError:
        return None


def job_module(session: Session) -> dict[str, Any] | None:
    """The active job's module {fileName, bytes, sha256} (a participant's from its invitation)."""
    if session.coordinator is not None:
        return session.coordinator.spec.module.descriptor()
    participant = session.participant
    if participant is None or participant.invitation is None or participant.job_id is None:
        return None
    module = participant.invitation.module  # sha256 and bytes were checked when it arrived
    name = module.get("fileName")
    return {"fileName": name if isinstance(name, str) and 0 < len(name) <= 256 else "model.wasm",
            "bytes": module["bytes"], "sha256": module["sha256"]}


def requested_workers(settings: TrainingSettings | None, device_max: int) -> int:
    """localWorkers.requested: settings.workers, or this device's maximum when the job sets none."""
    return settings.workers if settings is not None and settings.workers is not None else device_max
