"""A restored participation re-proves its coordinator before it takes anything from it (docs/agent.md,
"The coordinator proves the room key").

A participant that accepted an invitation keeps the participation (a
restarted agent, a reloaded page) and waits, disconnected, for its
coordinator's peer ID to come back. Whoever answers under that peer ID then
may be someone else, so the first acceptance's proof is not enough: when the
channel to the coordinator opens, the participant challenges it again (a
fresh nonce, ``core/links/room_proof.py``), and until the proof verifies it acts on
nothing the coordinator sends.

The coordinator delivers the module as soon as the channel opens, before it
can have seen the challenge; so :class:`RestoredProof` *holds* what arrives
from it, in memory and unread, and hands it on in arrival order once the
proof verifies (``take_held``), or drops it when the proof is refused.
Nothing held is stored, loaded or answered, and nothing goes back but the
challenge: what this participant sends meanwhile (a leave, a pause) waits
too (``hold_outgoing``), and goes out after the proof (``take_outgoing``)
or never. The same gate closes behind a coordinator whose channel drops
during a session: whoever comes back under its peer ID proves the key
again. What is held is bounded: only the delivery (the first ``deliver``,
the one message an honest coordinator attaches files to before the proof)
keeps its attachments, other messages with attachments are dropped, and at
most :data:`MAX_HELD` messages wait (and as many of our own).

Sans-I/O: the challenge and its verdict are :class:`CoordinatorProofs`' (the
caller passes the verdict in); the states move by :data:`RESTORED_TRANSITIONS`.
A room without a key has nothing to prove: as at a first acceptance, a
restored participation there asks nothing (the caller makes no gate).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from enum import StrEnum
from typing import Mapping

from ..wire.commands import Send
from ..wire.messages import Deliver, Message, RoomChallenge, RoomProof
from .participant import CHECKPOINTS_KEPT
from ..links.room_proof import ProofVerdict
from ..states import move

__all__ = ["MAX_HELD", "RESTORED_TRANSITIONS", "RestoredState", "Hold", "RestoredProof"]

#: Messages held while the proof is out: a delivery, the checkpoint notes that follow it, and some room.
MAX_HELD = CHECKPOINTS_KEPT + 64


class RestoredState(StrEnum):
    WAITING = "waiting"  #: restored; the channel to the coordinator is not open
    PROVING = "proving"  #: a challenge is out on the open channel; what the coordinator sends is held
    PROVEN = "proven"  #: the proof verified; what was held is handed on, in order, before anything newer
    RELEASED = "released"  #: everything held was handed on: the participation goes on as any other
    REFUSED = "refused"  #: wrong proof, no proof or none in time: the participation ends, what was held is dropped


S = RestoredState
#: state -> event -> state (events: ``connected``, ``disconnected``, ``proven``, ``refused``, ``released``).
RESTORED_TRANSITIONS: dict[RestoredState, dict[str, RestoredState]] = {
    S.WAITING: {"connected": S.PROVING, "disconnected": S.WAITING},
    # A channel that opens again brings a new delivery, and the caller a new challenge.
    S.PROVING: {"connected": S.PROVING, "disconnected": S.WAITING, "proven": S.PROVEN, "refused": S.REFUSED},
    S.PROVEN: {"released": S.RELEASED},
}


class Hold(StrEnum):
    """What :meth:`RestoredProof.hold` did with a message."""

    PASS = "pass"  #: not the gate's: handle it as usual
    HELD = "held"  #: kept, unread, for ``take_held``
    DROPPED = "dropped"  #: from the coordinator, but not kept (see ``dropped``)


@dataclass(frozen=True)
class _Held:
    message: Message
    blobs: Mapping[str, bytes]


class RestoredProof:
    """The gate of one restored participation: job ``job_id`` under ``coordinator``."""

    def __init__(self, job_id: str, coordinator: str, *, max_held: int = MAX_HELD) -> None:
        self.job_id = job_id
        self.coordinator = coordinator
        self.state = S.WAITING
        self.max_held = max_held
        self.dropped: dict[str, int] = {}  # reason -> messages dropped for it
        self.last_dropped: str | None = None  # the reason of the latest DROPPED
        self._held: deque[_Held] = deque()
        self._delivered = False
        self._outgoing: deque[Send] = deque()  # what this participant said meanwhile, for after the proof

    @property
    def deciding(self) -> bool:
        """The proof is not in yet: the coordinator's messages are not acted on."""
        return self.state in (S.WAITING, S.PROVING)

    @property
    def closed(self) -> bool:
        """The gate has nothing more to do (released, or refused)."""
        return self.state in (S.RELEASED, S.REFUSED)

    def connected(self) -> bool:
        """The channel to the coordinator opened (again). True: the proof is not in, challenge it now
        (False: proven already, the participation goes on as any other)."""
        if not self.deciding:
            return False
        self._move("connected")
        self._clear()  # what came on an older channel is delivered again on this one
        return True

    def disconnected(self) -> None:
        """The channel closed before the proof was in: wait for the next one."""
        if self.deciding:
            self._move("disconnected")
            self._clear()

    def hold(self, sender: str, message: Message, blobs: Mapping[str, bytes]) -> Hold:
        """A message that arrived from ``sender``: PASS (not the gate's), HELD or DROPPED."""
        if sender != self.coordinator or self.state is S.RELEASED or isinstance(message, (RoomProof, RoomChallenge)):
            return Hold.PASS  # the proof itself goes to the check
        if self.state is S.PROVEN:
            self._held.append(_Held(message, blobs))  # after what was held before, never ahead of it
            return Hold.HELD
        if self.state is not S.PROVING:
            return self._drop("refused" if self.state is S.REFUSED else "channel-not-open")
        if len(self._held) >= self.max_held:
            return self._drop("too-many-before-the-proof")
        if blobs:
            if not isinstance(message, Deliver) or self._delivered:
                return self._drop("attachments-before-the-proof")
            self._delivered = True
        self._held.append(_Held(message, blobs))
        return Hold.HELD

    def hold_outgoing(self, send: Send) -> bool:
        """A message this participant is sending: True when it waits for the proof (the coordinator's peer
        ID is not proven, so it learns nothing, not even a leave or a pause); the oldest beyond
        ``max_held`` go."""
        if send.peer != self.coordinator or not self.deciding or isinstance(send.message, (RoomProof, RoomChallenge)):
            return False
        self._outgoing.append(send)
        while len(self._outgoing) > self.max_held:
            self._outgoing.popleft()
            self._drop("outgoing-too-many-before-the-proof")
        return True

    def take_outgoing(self) -> list[Send]:
        """After the proof: what this participant said while it was out, in order (once)."""
        if self.state not in (S.PROVEN, S.RELEASED):
            return []
        out = list(self._outgoing)
        self._outgoing.clear()
        return out

    def decide(self, verdict: ProofVerdict) -> bool:
        """The verdict of the challenge made at the last ``connected``; False: not this gate's, or too late."""
        if self.state is not S.PROVING or (verdict.job_id, verdict.coordinator) != (self.job_id, self.coordinator):
            return False
        self._move("proven" if verdict.proven else "refused")
        if not verdict.proven:
            self._clear()
            self._outgoing.clear()
        return True

    def take_held(self) -> tuple[Message, Mapping[str, bytes]] | None:
        """After the proof: the oldest held message, or None (and the gate opens for good) when none is left."""
        if self.state is not S.PROVEN:
            return None
        if not self._held:
            self._move("released")
            return None
        item = self._held.popleft()
        return item.message, item.blobs

    def held(self) -> int:
        return len(self._held)

    def _drop(self, reason: str) -> Hold:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1
        self.last_dropped = reason
        return Hold.DROPPED

    def _clear(self) -> None:
        self._held.clear()
        self._delivered = False

    def _move(self, event: str) -> None:
        self.state = move("restored participation", RESTORED_TRANSITIONS, self.state, event)
