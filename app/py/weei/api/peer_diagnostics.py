"""Diagnostics between peers: a participant's snapshots to its coordinator, and the coordinator's book."""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from ..core.wire.commands import Send
from ..core.errors import WeeiError
from ..core.wire.messages import DiagnosticsReport
from ..core.states import PeerState, is_engaged
from .session import Session

__all__ = ["DiagnosticsLink"]


class DiagnosticsLink:
    def __init__(self, session: Session, settle: Callable[[], None] = lambda: None) -> None:
        self.session = session
        self.settle = settle  # brings the stage up to date (receiving shows between messages)
        self.task: asyncio.Task[Any] | None = None
        # A stage change is reported when it happens; the loop below only keeps the 2-second period.
        session.recorder.on_due = self.report

    def accept(self, peer: str, snapshot: dict[str, Any], now: float) -> None:
        """The coordinator's sink for a participant's snapshot; a bad one is refused and logged."""
        s = self.session
        coordinator = s.coordinator
        chunk = coordinator.attempts.first_chunk_of(peer) if coordinator is not None else None
        try:
            s.book.accept(peer, coordinator.spec.job_id if coordinator else None, snapshot, now, chunk_id=chunk)
        except WeeiError as exc:
            s.record("diagnostics.refused", {"peer": peer, "reason": exc.reason, "error": str(exc)[:200]})

    def report(self, *, final: bool = False) -> None:
        """Participants send a snapshot every 2 s while they have a job, and at once on a stage change;
        ``final``: the one snapshot that tells the coordinator this peer's job ended."""
        s = self.session
        participant = s.participant
        if participant is None or participant.job_id is None or participant.coordinator in (None, s.my_peer_id) \
                or s.recorder.job_id is None:
            return
        # Connected and engaged, or the final snapshot of one whose job ended; a disconnected one waits.
        state = participant.state
        if not (is_engaged(state) and state is not PeerState.DISCONNECTED or final and state is PeerState.STOPPED):
            return
        mono = s.monotonic()
        if not s.recorder.due(mono):
            return
        report = DiagnosticsReport(participant.job_id, s.recorder.snapshot(s.clock(), mono))
        if s.transport is not None:
            s.transport.send(Send(participant.coordinator, report), {})

    def start(self) -> None:
        """Report on a timer while this device takes part in a remote job."""
        if self.task is None:
            self.task = asyncio.ensure_future(self._loop())

    def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            self.task = None

    async def _loop(self) -> None:
        s = self.session
        while s.participant is not None and is_engaged(s.participant.state):
            self.settle()
            self.report()
            due = s.recorder.next_due_at()
            wait = 2.0 if due is None else max(0.05, (due - s.monotonic()) / 1000.0)
            await asyncio.sleep(min(wait, 0.5))  # a transfer of a few hundred ms still shows as receiving
