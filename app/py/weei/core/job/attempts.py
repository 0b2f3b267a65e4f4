"""Attempt bookkeeping: who holds which work of the round, and which update may count.

Theory of operation
-------------------
Every hand-out of work (a dataset chunk or a range of experience units) to
one participant is an *attempt* with its own id. :class:`RoundAttempts`
keeps one round's attempts (each ``Round`` owns one, ``core/job/round.py``),
the valid updates received for them, and the ids of every attempt of the
job that has closed (carried from round to round, :meth:`RoundAttempts.next_round`), so an update that arrives for
an attempt no longer open (late, stale, duplicate, off-policy) is recognised
by :func:`check_update` and discarded, never averaged. An attempt's status
moves only along ``ATTEMPT_TRANSITIONS`` (``core/states.py``). Nothing here
sends, logs or gives work back: the coordinator does that.

Besides the round's deadline, an attempt of a remote participant has a
*quiet* deadline (``quiet_until``): no word of it (``trainingStarted``,
``progress``) for that long and it is stalled (:meth:`RoundAttempts.stalled`),
so a participant that hangs (an artifact it lacks, a frozen tab) costs minutes,
not the round (issue 24). The coordinator's own participant has none: its
host runs it.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any, Callable, KeysView, Mapping

from .. import verified
from ..floats import BytesLike
from ..formats.qdelta import QDeltaError
from ..wire.messages import Update
from .schedule import UnitWork
from ..states import ATTEMPT_TRANSITIONS, AttemptStatus, is_open, move
from ..verified import is_verified

__all__ = ["Attempt", "RoundAttempts", "Received", "check_update"]


@dataclass
class Attempt:
    """One hand-out of one piece of work to one participant (the spec's RoundSlot)."""

    peer: str
    round: int
    assignment_id: str
    attempt_id: str
    chunk_id: str | None
    units: UnitWork | None
    seed: int
    started_at: float
    deadline: float
    status: AttemptStatus = AttemptStatus.LOADING
    error: str | None = None
    quiet_until: float | None = None  # stalled past this without word of it (None: no such deadline)
    heard_at: float | None = None  # the last word of it (None: none since it was handed out)
    resends: int = 0  # times its Assign was sent again because the participant lacked an artifact it named

    @property
    def due(self) -> float:
        """When the coordinator must next look at this attempt: its quiet deadline or the round's."""
        return self.deadline if self.quiet_until is None else min(self.deadline, self.quiet_until)

    @property
    def open(self) -> bool:
        return is_open(self.status)

    def move(self, event: str) -> None:
        """Raises IllegalTransition when ``ATTEMPT_TRANSITIONS`` has no such move."""
        self.status = move("attempt", ATTEMPT_TRANSITIONS, self.status, event)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "peerId": self.peer,
            "chunkId": (self.chunk_id if self.chunk_id is not None
                        else f"units-{self.units.start}" if self.units is not None else ""),
            "status": str(self.status),
            "startedAt": self.started_at,
        }
        if self.units is not None:  # additive: the window says "32 episodes", not the id "units-64"
            out["units"] = {"start": self.units.start, "count": self.units.count}
        if self.error:
            out["error"] = self.error
        if self.heard_at is not None:
            out["heardAt"] = self.heard_at
        return out


@dataclass(frozen=True)
class Received:
    """A valid update of an attempt, with its weights."""

    attempt: Attempt
    update: Update
    weights: BytesLike  # as received, or as dequantized from a compressed update


@dataclass
class RoundAttempts:
    """The current round's attempts, the updates received for them, and every closed attempt id."""

    current: list[Attempt] = field(default_factory=list)  # the current round's, in hand-out order
    received: dict[str, Received] = field(default_factory=dict)  # by assignment id
    closed: set[str] = field(default_factory=set)
    issued: int = 0  # attempts ever handed out: numbers each attempt id
    # The open attempts by id, in hand-out order: with 1,000 peers, a lookup per update must not scan the round.
    # An attempt closes only through stop() and accept(), which take it out.
    _open: dict[str, Attempt] = field(default_factory=dict, repr=False)
    # (deadline, attempt id) of every attempt handed out this round; closed ones are dropped when they surface.
    _deadlines: list[tuple[float, str]] = field(default_factory=list, repr=False)
    # Each peer's first chunk of this round (hand-out order): asked for every diagnostics report, which a scan
    # of the round made O(peers) a message.
    _first_chunk: dict[str, str] = field(default_factory=dict, repr=False)

    def new(self, peer: str, round_: int, assignment_id: str, chunk_id: str | None, units: UnitWork | None,
            seed: int, now: float, timeout_ms: float, quiet_ms: float | None = None) -> Attempt:
        """A fresh open attempt of ``round_`` for ``peer``; stalled after ``quiet_ms`` without word of it."""
        self.issued += 1
        attempt = Attempt(peer, round_, assignment_id, f"{assignment_id}-a{self.issued}", chunk_id, units, seed, now,
                          now + timeout_ms, quiet_until=now + quiet_ms if quiet_ms is not None else None)
        self.current.append(attempt)
        self._open[attempt.attempt_id] = attempt
        if chunk_id:
            self._first_chunk.setdefault(peer, chunk_id)
        heapq.heappush(self._deadlines, (attempt.due, attempt.attempt_id))
        return attempt

    def heard(self, attempt: Attempt, now: float, quiet_ms: float) -> None:
        """Word of ``attempt`` came: its quiet deadline moves to ``now + quiet_ms``."""
        attempt.heard_at = now
        if attempt.quiet_until is not None:
            attempt.quiet_until = now + quiet_ms
            heapq.heappush(self._deadlines, (attempt.due, attempt.attempt_id))

    def open(self) -> list[Attempt]:
        return list(self._open.values())

    def open_ids(self) -> KeysView[str]:
        """The ids of the open attempts, a live view (no copy: the host asks after every event)."""
        return self._open.keys()

    def open_one(self, attempt_id: str) -> Attempt | None:
        return self._open.get(attempt_id)

    def open_of(self, peer: str) -> list[Attempt]:
        return [a for a in self._open.values() if a.peer == peer]

    def first_chunk_of(self, peer: str) -> str | None:
        """The chunk of ``peer``'s first attempt of this round that has one."""
        return self._first_chunk.get(peer)

    def busy_peers(self) -> set[str]:
        return {a.peer for a in self._open.values()}

    def peers_of_round(self, round_: int) -> set[str]:
        return {a.peer for a in self.current if a.round == round_}

    def any_open(self) -> bool:
        return bool(self._open)

    def round_open(self) -> bool:
        """Some attempt is out, or some update waits for the round to close."""
        return self.any_open() or bool(self.received)

    def all_ended(self) -> bool:
        """Every attempt of a round with attempts has an outcome: the round can close."""
        return bool(self.current) and not self.any_open()

    def next_deadline(self) -> float | None:
        """The earliest deadline of an open attempt, or None (amortized O(log n): the host asks after every event)."""
        heap = self._deadlines
        # An entry is current while its attempt is open and still due then (word of it moves the quiet deadline).
        while heap and (heap[0][1] not in self._open or self._open[heap[0][1]].due != heap[0][0]):
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def late(self, now: float) -> list[Attempt]:
        return [a for a in self._open.values() if a.deadline <= now]

    def stalled(self, now: float) -> list[Attempt]:
        """Open attempts past their quiet deadline (and not their round's)."""
        return [a for a in self._open.values()
                if a.quiet_until is not None and a.quiet_until <= now < a.deadline]

    def stop(self, attempt: Attempt, error: str) -> None:
        attempt.move("stopped")
        attempt.error = error
        self.closed.add(attempt.attempt_id)
        self._open.pop(attempt.attempt_id, None)

    def accept(self, attempt: Attempt, update: Update, weights: BytesLike) -> None:
        attempt.move("received")
        self.closed.add(attempt.attempt_id)
        self._open.pop(attempt.attempt_id, None)
        self.received[attempt.assignment_id] = Received(attempt, update, weights)

    def end_keyed(self, attempt: Attempt) -> None:
        """``attempt`` trained and its participant holds its update for secure aggregation (it sent its keys):
        the attempt has its outcome, though no update is received in the clear."""
        attempt.move("received")
        self.closed.add(attempt.attempt_id)
        self._open.pop(attempt.attempt_id, None)

    def take_round(self) -> list[Received]:
        """End the round: its valid updates in canonical order (by assignment id, as FedAvg
        sorts, so float sums and the checkpoint file do not depend on arrival order)."""
        out = sorted(self.received.values(), key=lambda r: r.attempt.assignment_id)
        self.clear()
        return out

    def next_round(self) -> RoundAttempts:
        """The next round's attempts: none yet, with the job's closed attempt ids and numbering carried on."""
        return RoundAttempts(closed=self.closed, issued=self.issued)

    def clear(self) -> None:
        self.current = []
        self.received = {}
        self._open = {}
        self._deadlines = []
        self._first_chunk = {}


def check_update(attempts: RoundAttempts, peer: str, update: Update, blobs: Mapping[str, bytes], *,
                 checkpoint_round: int, weights_sha256: str, weight_bytes: int,
                 assigned_count: Callable[[Attempt], int],
                 first_non_finite: Callable[[BytesLike], int],
                 decode: Callable[[BytesLike], BytesLike] | None = None) -> tuple[str, str] | BytesLike:
    """The float32 weights an update contributes when it is valid, else why it must not count
    (reason code, text). Cheapest checks first.

    ``assigned_count(attempt)`` is how many examples (or units) the attempt
    was given; ``first_non_finite(weights)`` is the kernel's scan (-1: all finite).
    ``decode``: the job compresses updates (``settings.compression``): the
    artifact must be a ``qdelta``, which ``decode`` turns into weights or
    refuses with a QDeltaError, whose reason is the rejection's; then the
    weights are checked as an uncompressed update's.
    """
    attempt = attempts.open_one(update.attempt_id)
    if attempt is None:
        if any(r.attempt.attempt_id == update.attempt_id for r in attempts.received.values()):
            return "duplicate-update", f"attempt {update.attempt_id} was already received"
        if update.attempt_id in attempts.closed or update.round <= checkpoint_round:
            return "late-update", f"attempt {update.attempt_id} of round {update.round} is closed"
        return "unknown-attempt", f"no open assignment has attempt id {update.attempt_id!r}"
    if attempt.peer != peer:
        return "wrong-peer", f"attempt {update.attempt_id} was assigned to another participant"
    if update.round != attempt.round:
        return "stale-round", f"update is for round {update.round}, the attempt belongs to round {attempt.round}"
    if update.assignment_id != attempt.assignment_id:
        return "wrong-assignment", f"attempt {update.attempt_id} is of assignment {attempt.assignment_id}"
    if update.base_checkpoint != weights_sha256:
        return "off-policy", "the update was computed from other weights than the round's checkpoint"
    kind = "update" if decode is None else "qdelta"
    if update.weights.kind != kind:
        return "wrong-kind", f"the update is a {update.weights.kind!r} artifact, this job's updates are {kind!r}"
    if decode is None and update.weights.bytes != weight_bytes:
        return "wrong-size", f"weights are {update.weights.bytes} bytes, the model has {weight_bytes}"
    data: BytesLike | None = blobs.get(update.weights.sha256)
    if data is None:
        return "missing-weights", "the update's weights did not arrive"
    if len(data) != update.weights.bytes:
        return "wrong-size", f"weights are {len(data)} bytes, the update says {update.weights.bytes}"
    # Hashed once: a receiver that hashed the bytes on arrival hands them over as VerifiedBlobs.
    if not is_verified(blobs) and verified.sha256_hex(data) != update.weights.sha256:
        return "hash-mismatch", "the weights do not match their SHA-256"
    if decode is not None:
        try:
            data = decode(data)
        except QDeltaError as exc:
            return str(exc.reason), str(exc)
    bad = first_non_finite(data)
    if bad >= 0:
        return "non-finite-weights", f"weight {bad} is not a finite number"
    assigned = assigned_count(attempt)
    if update.count > assigned:
        return "inflated-count", f"{update.count} examples claimed, {assigned} were assigned"
    if update.count == 0:
        return "no-examples", "the update trained no examples (or finished no units)"
    return data
