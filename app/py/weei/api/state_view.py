"""The state view: ``getState()`` built from the session, the job store and the backend, and its subscribers."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Callable

from ..core.job import JobSpec
from .compute import ComputeBackend
from .job_store import JobStore
from .local_training import effective_workers
from .session import Session

__all__ = ["StateView", "PROGRESS_NOTIFY_MS"]

PROGRESS_NOTIFY_MS = 100

Listener = Callable[[dict[str, Any]], None]


class StateView:
    """Builds the spec's TrainingState and tells subscribers when it changes."""

    def __init__(self, session: Session, store: JobStore, backend: ComputeBackend) -> None:
        self.session = session
        self.store = store
        self.backend = backend
        self.listeners: list[Listener] = []
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
            "myPeerId": s.my_peer_id,
            "busy": s.busy > 0,
            "preparing": s.preparing,
            # A round's checkpoint is being made durable (the spec: averaging into a checkpoint).
            "transitioning": s.saving > 0,
            "evaluating": s.evaluating > 0,
            "peers": s.transport.peers() if s.transport is not None else [],
            "invitations": [[job_id, json.loads(json.dumps(inv))] for job_id, inv in s.invitations.items()],
            "progress": json.loads(json.dumps(s.progress)),
            "liveMetrics": json.loads(json.dumps(s.live_metrics)),
            **self._transfers(),
            "pausedContribution": s.paused_contribution,
            "activeWorkers": self.backend.active,
            "backendPreference": device.backend_preference,
            "execution": {"requested": device.backend_preference, "actual": s.actual,
                          "phase": s.recorder.stage,
                          "fallback": "none" if s.fallback is None else f"cpu: {s.fallback}"},
            "maxLocalWorkers": device.max_local_workers,
            "gpuMemoryBudgetMiB": device.gpu_memory_budget_mib,
            "diagnostics": self._diagnostics(now),
            "savedJobs": [self._saved_summary(r) for r in sorted(self.store.saved_jobs.values(),
                                                                  key=lambda r: -r.get("updatedAt", 0))],
        }
        if s.error:
            state["error"] = s.error
        participant = s.participant
        if coordinator is not None:
            job = coordinator.view(now)
            job["validationUnavailable"] = s.validation_unavailable
            job["hasModuleFile"] = coordinator.spec.module.sha256 in self.store.artifacts
            job["localWorkers"] = self._local_workers(coordinator.spec)
            if coordinator.error and "error" not in state:
                state["error"] = coordinator.error
            state["job"] = job
        elif participant is not None and participant.job_id is not None and \
                participant.state not in ("invited", "declined"):
            info = participant.model_info or {}
            state["job"] = {
                "id": participant.job_id, "role": "participant",
                "status": "completed" if participant.state == "stopped" else "running",
                "owner": participant.coordinator, "info": info, "settings": {},
                "participants": {s.my_peer_id: {"connected": True, "approved": True,
                                                "paused": s.paused_contribution,
                                                "state": participant.state}},
                "queue": [], "checkpoints": [], "slots": [], "incomplete": bool(participant.incomplete),
                "shuffled": False, "validationUnavailable": False, "module": {}, "hasModuleFile": False,
                "localWorkers": {"requested": device.max_local_workers, "capacity": 1, "effective": 1,
                                 "active": self.backend.active},
            }
        return state

    def _transfers(self) -> dict[str, Any]:
        transport = self.session.transport
        if transport is None:
            return {"transfers": [], "transferErrors": {}}
        return json.loads(json.dumps(transport.transfers_state()))

    def _local_workers(self, spec: JobSpec) -> dict[str, Any]:
        device = self.session.device
        requested = spec.settings.workers or device.max_local_workers
        experience = spec.is_experience
        capacity = effective_workers(requested=10**6, device_limit=self.backend.device_limit,
                                     model_max=spec.info.max_workers, experience=experience, unit_count=None)
        units = None
        if experience:
            units = spec.settings.experience.units_per_assignment if spec.settings.experience else \
                spec.info.work_source.default_units
        effective = effective_workers(requested=min(requested, device.max_local_workers),
                                      device_limit=self.backend.device_limit, model_max=spec.info.max_workers,
                                      experience=experience, unit_count=units)
        return {"requested": requested, "capacity": capacity, "effective": effective, "active": self.backend.active}

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
                "status": record.get("status", "ready"), "round": record.get("lastRound", 0),
                "updatedAt": record.get("updatedAt", 0), "active": bool(record.get("active"))}
