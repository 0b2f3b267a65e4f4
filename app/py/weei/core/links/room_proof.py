"""A coordinator proves the room key to a participant (docs/agent.md, "The coordinator proves the room key").

The signaling server checks the room key at every join, but a participant
that trusts "anyone in my room" (``weei agent --trust-room``) should not
have to trust the server's gatekeeping for it: before it accepts, it asks
the coordinator itself to prove that it holds the key.

* ``RoomChallenge`` (participant -> coordinator): the job and a fresh
  nonce of 32 random bytes, once per invitation.
* ``RoomProof`` (coordinator -> participant):
  ``HMAC-SHA256(proof_key, [label, jobId, coordinator, participant, nonce])``
  in hex, or no ``proof`` when the coordinator holds no room key.

``proof_key`` is derived from the room key with its own label, so the key
itself never travels in these messages and a proof is no room code. The
peer IDs are the two ends of the data channel the messages travel on (the
coordinator's from the participant's side and the other way round), never
fields of the message, so a proof made for another participant, another
coordinator, another job or another nonce does not verify.

:class:`CoordinatorProofs` is the participant's side, sans-I/O: time comes
in as ``now``, the nonce from the caller, the challenge goes out as a
``Send`` and every outcome is a :class:`ProofVerdict` with a named reason.
A challenge moves by the table :data:`PROOF_TRANSITIONS` and is answered
once: the first proof from its coordinator decides it.

The two messages are defined with every other message, in
:mod:`weei.core.wire.messages`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from enum import StrEnum

from ..states import move
from ..wire.commands import Send
from ..wire.messages import RoomChallenge, RoomProof

__all__ = [
    "NONCE_BYTES", "PROOF_TIMEOUT_MS", "PROOF_TRANSITIONS", "RoomProofReason", "ProofState",
    "ProofVerdict", "ProofIgnored", "CoordinatorProofs", "proof_key", "room_proof", "answer_challenge",
]

#: Random bytes in a challenge's nonce.
NONCE_BYTES = 32
#: How long a coordinator has to answer (generous: the answer is one message on an open data channel).
PROOF_TIMEOUT_MS = 30_000.0
_KEY_LABEL = b"weei-room-proof-key/1"
_PROOF_LABEL = "weei-coordinator-proof/1"


class RoomProofReason(StrEnum):
    """Why a coordinator's proof was not accepted."""

    MISMATCH = "room-proof-mismatch"
    """The proof does not verify: another key, or made for another nonce, peer or job."""
    MISSING = "room-proof-missing"
    """The coordinator answered without a proof: it holds no room key."""
    TIMEOUT = "room-proof-timeout"
    """No answer from the coordinator within ``PROOF_TIMEOUT_MS``."""
    UNSOLICITED = "room-proof-unsolicited"
    """A proof for no open challenge (another job, or not from the challenged peer): ignored, it decides nothing."""


class ProofState(StrEnum):
    CHALLENGED = "challenged"  #: the challenge is out, no answer yet
    PROVEN = "proven"  #: the coordinator's proof verified
    REFUSED = "refused"  #: wrong proof, no proof or no answer in time


#: state -> event -> state (events: ``valid-proof``, ``wrong-proof``, ``no-proof``, ``deadline``).
PROOF_TRANSITIONS: dict[ProofState, dict[str, ProofState]] = {
    ProofState.CHALLENGED: {"valid-proof": ProofState.PROVEN, "wrong-proof": ProofState.REFUSED,
                            "no-proof": ProofState.REFUSED, "deadline": ProofState.REFUSED},
}
_REASONS = {"wrong-proof": RoomProofReason.MISMATCH, "no-proof": RoomProofReason.MISSING,
            "deadline": RoomProofReason.TIMEOUT}


def proof_key(room_key: str) -> bytes:
    """The key proofs are made with: ``HMAC-SHA256(room key, "weei-room-proof-key/1")``."""
    return hmac.new(room_key.encode("utf-8"), _KEY_LABEL, hashlib.sha256).digest()


def room_proof(key: bytes, *, job_id: str, coordinator: str, participant: str, nonce: str) -> str:
    """The proof for one challenge, 64 hex digits. The fields are a JSON array, so no two
    different tuples of them give the same text."""
    text = json.dumps([_PROOF_LABEL, job_id, coordinator, participant, nonce], separators=(",", ":"))
    return hmac.new(key, text.encode("utf-8"), hashlib.sha256).hexdigest()


def answer_challenge(key: bytes | None, *, coordinator: str, participant: str,
                     challenge: RoomChallenge) -> RoomProof:
    """The coordinator's answer to ``challenge`` from ``participant`` (no proof without a key)."""
    if key is None:
        return RoomProof(challenge.job_id)
    return RoomProof(challenge.job_id, room_proof(key, job_id=challenge.job_id, coordinator=coordinator,
                                                  participant=participant, nonce=challenge.nonce))


@dataclass(frozen=True)
class ProofVerdict:
    """How a challenge ended."""

    job_id: str
    coordinator: str
    state: ProofState  # PROVEN or REFUSED
    reason: RoomProofReason | None  # None when proven
    message: str

    @property
    def proven(self) -> bool:
        return self.state is ProofState.PROVEN


@dataclass(frozen=True)
class ProofIgnored:
    """A proof that decided nothing (reason ``room-proof-unsolicited``)."""

    sender: str
    job_id: str
    reason: RoomProofReason = RoomProofReason.UNSOLICITED


@dataclass
class _Challenge:
    coordinator: str
    nonce: str
    deadline: float


class CoordinatorProofs:
    """A participant's open challenges, one per job: ``challenge``, then ``on_proof`` or ``expire``.

    ``key`` is :func:`proof_key` of the room key, ``me`` this participant's peer ID.
    """

    def __init__(self, key: bytes, me: str, *, timeout_ms: float = PROOF_TIMEOUT_MS) -> None:
        self._key = key
        self.me = me
        self.timeout_ms = timeout_ms
        self._open: dict[str, _Challenge] = {}

    def challenge(self, job_id: str, coordinator: str, nonce: bytes, now: float) -> Send:
        """Ask ``coordinator`` to prove the key for ``job_id``; a new challenge replaces an open one.

        ``nonce``: NONCE_BYTES fresh random bytes, never used before.
        """
        if len(nonce) != NONCE_BYTES:
            raise ValueError(f"a challenge needs {NONCE_BYTES} random bytes, not {len(nonce)}")
        self._open[job_id] = _Challenge(coordinator, nonce.hex(), now + self.timeout_ms)
        return Send(coordinator, RoomChallenge(job_id, nonce.hex()))

    def on_proof(self, sender: str, message: RoomProof, now: float) -> ProofVerdict | ProofIgnored:
        """A proof from peer ``sender``: the verdict of the challenge it answers, or ignored."""
        open_ = self._open.get(message.job_id)
        if open_ is None or sender != open_.coordinator:
            return ProofIgnored(sender, message.job_id)
        if now > open_.deadline:
            return self._end(message.job_id, "deadline")
        if message.proof is None:
            return self._end(message.job_id, "no-proof")
        want = room_proof(self._key, job_id=message.job_id, coordinator=open_.coordinator, participant=self.me,
                          nonce=open_.nonce)
        # Constant time: how much of a guess matched must not show in when the answer comes.
        return self._end(message.job_id, "valid-proof" if hmac.compare_digest(want, message.proof) else "wrong-proof")

    def expire(self, now: float) -> list[ProofVerdict]:
        """Every challenge whose deadline has passed, refused as ``room-proof-timeout``."""
        return [self._end(job_id, "deadline") for job_id, c in list(self._open.items()) if now > c.deadline]

    def deadline(self, job_id: str) -> float | None:
        """When the open challenge of ``job_id`` times out (None: none open)."""
        open_ = self._open.get(job_id)
        return open_.deadline if open_ is not None else None

    def pending(self) -> list[str]:
        """The jobs with an open challenge."""
        return list(self._open)

    def _end(self, job_id: str, event: str) -> ProofVerdict:
        c = self._open.pop(job_id)  # a nonce is answered once: the challenge is closed whatever came
        state = move("room proof", PROOF_TRANSITIONS, ProofState.CHALLENGED, event)
        reason = _REASONS.get(event)
        text = {
            None: f"coordinator {c.coordinator} proved the room key",
            RoomProofReason.MISMATCH: f"coordinator {c.coordinator} answered with a proof that does not verify "
                                      "(another room key, or a proof made for another nonce, peer or job)",
            RoomProofReason.MISSING: f"coordinator {c.coordinator} holds no room key to prove",
            RoomProofReason.TIMEOUT: f"coordinator {c.coordinator} did not prove the room key within "
                                     f"{self.timeout_ms / 1000:.0f} s",
        }[reason]
        return ProofVerdict(job_id, c.coordinator, state, reason, text)
