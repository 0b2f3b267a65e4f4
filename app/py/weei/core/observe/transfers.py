"""Transfer progress and the book of transfers a peer shows in ``getState()``.

The spec's ``TransferProgress`` (``state.transfers``) and ``transferErrors``
(last error per artifact). Rates come from ``now`` values passed in (ms):
nothing here reads a clock. The framing layer (the ``framing`` package) produces these
events on both the sending and the receiving side; ``TransferBook`` keeps the
current ones, bounded.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from ..errors import WeeiError

__all__ = [
    "Direction",
    "TransferProgress",
    "TransferDone",
    "TransferFailed",
    "RateMeter",
    "progress_of",
    "TransferBook",
]

Direction = Literal["send", "receive"]


@dataclass(frozen=True)
class TransferProgress:
    """The spec's TransferProgress for one artifact in flight."""

    peer_id: str
    artifact_id: str  # the artifact's SHA-256
    direction: Direction
    bytes: int
    total_bytes: int
    bytes_per_second: float
    remaining_seconds: float | None = None
    job_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The spec's JSON shape (camelCase; absent optional fields omitted)."""
        out: dict[str, Any] = {}
        if self.job_id is not None:
            out["jobId"] = self.job_id
        out.update(peerId=self.peer_id, artifactId=self.artifact_id, direction=self.direction, bytes=self.bytes,
                   totalBytes=self.total_bytes, bytesPerSecond=self.bytes_per_second)
        if self.remaining_seconds is not None:
            out["remainingSeconds"] = self.remaining_seconds
        return out


@dataclass(frozen=True)
class TransferDone:
    """An artifact was fully handed to the channel (send) or received and verified (receive)."""

    peer_id: str
    artifact_id: str
    direction: Direction
    bytes: int
    transfer_id: int


@dataclass(frozen=True)
class TransferFailed:
    """A transfer was dropped; ``artifact_id`` is None for a message transfer without one to blame."""

    peer_id: str
    artifact_id: str | None
    direction: Direction
    error: WeeiError  # a FrameError on the wire side
    transfer_id: int

    @property
    def reason(self) -> str:
        """The error's reason code."""
        return self.error.reason


class RateMeter:
    """Bytes per second over a sliding window of (now, bytes) samples, bounded in size.

    The rate is measured up to ``now`` (not to the last sample), so a stalled
    transfer's rate falls instead of freezing at its last value.
    """

    WINDOW_MS = 5000.0
    STEP_MS = WINDOW_MS / 32  # samples closer than this are merged: at most ~34 kept

    def __init__(self, now: float) -> None:
        self.samples: deque[tuple[float, int]] = deque([(now, 0)])

    def add(self, now: float, count: int) -> None:
        """Record that ``count`` bytes (cumulative) were done at ``now`` (ms)."""
        s = self.samples
        if len(s) >= 2 and now - s[-2][0] < self.STEP_MS:
            s[-1] = (now, count)
        else:
            s.append((now, count))
        while len(s) >= 2 and s[1][0] <= now - self.WINDOW_MS:
            s.popleft()

    def per_second(self, now: float) -> float:
        """Bytes per second from the window's oldest sample up to ``now``; 0 before any time passed."""
        t0, b0 = self.samples[0]
        elapsed = now - t0
        if elapsed <= 0:
            return 0.0
        return (self.samples[-1][1] - b0) * 1000.0 / elapsed


def progress_of(peer: str, job: str | None, sha: str, direction: Direction, done: int, total: int, rate: RateMeter,
                now: float) -> TransferProgress:
    """A TransferProgress as of ``now``; ``remaining_seconds`` is None while the rate is 0."""
    bps = rate.per_second(now)
    remaining = (total - done) / bps if bps > 0 else None
    return TransferProgress(peer, sha, direction, done, total, bps, remaining, job)


_MAX_BOOK_ENTRIES = 256


@dataclass
class TransferBook:
    """Current transfers and the last error per artifact, for ``getState()``.

    Feed it every event from writers and readers (``apply``); both tables
    are bounded (oldest entries go first).
    """

    transfers: OrderedDict[tuple[str, str, str], TransferProgress] = field(default_factory=OrderedDict)
    errors: OrderedDict[str, str] = field(default_factory=OrderedDict)

    def apply(self, event: object) -> None:
        """Record one event; messages and channel events are ignored."""
        if isinstance(event, TransferProgress):
            key = (event.peer_id, event.artifact_id, event.direction)
            self.transfers[key] = event
            self.transfers.move_to_end(key)
            self._trim(self.transfers)
        elif isinstance(event, TransferDone):
            self.transfers.pop((event.peer_id, event.artifact_id, event.direction), None)
            self.errors.pop(event.artifact_id, None)  # it arrived after all
        elif isinstance(event, TransferFailed) and event.artifact_id is not None:
            self.transfers.pop((event.peer_id, event.artifact_id, event.direction), None)
            if event.reason == "missing-attachment" and event.artifact_id in self.errors:
                return  # the artifact's own failure (hash-mismatch, stalled...) is the cause: keep it
            self.errors[event.artifact_id] = f"{event.reason}: {event.error.message}"
            self.errors.move_to_end(event.artifact_id)
            self._trim(self.errors)

    def apply_all(self, events: Iterable[object]) -> None:
        """``apply`` each event in order."""
        for event in events:
            self.apply(event)

    def peer_gone(self, peer_id: str) -> None:
        """Forget a disconnected peer's transfers."""
        for key in [k for k in self.transfers if k[0] == peer_id]:
            del self.transfers[key]

    def state(self) -> dict[str, Any]:
        """``{"transfers": [TransferProgress...], "transferErrors": {artifactId: error}}`` as JSON."""
        return {"transfers": [p.to_json() for p in self.transfers.values()], "transferErrors": dict(self.errors)}

    @staticmethod
    def _trim(table: OrderedDict[Any, Any]) -> None:
        while len(table) > _MAX_BOOK_ENTRIES:
            table.popitem(last=False)
