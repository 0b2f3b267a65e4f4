"""Which received files the agent writes to disk: what the job it accepted asks for, within a budget per peer.

Theory of operation
-------------------
Any peer in the room can open a channel to the agent and send files beside
a message (the frame reader checks each one's hash and size, nothing
more), so writing whatever arrives would let anyone fill the agent's disk.
:class:`DiskClaims` decides, before a byte is written, which of a message's
files the agent keeps, sans-I/O: the agent (``main.py``) asks
:meth:`DiskClaims.judge`, writes what the verdict keeps, deletes what it
says is stale, and reports each refusal.

A file is kept only when all of these hold, else it is refused with a
:class:`KeepReason`:

* its sender is the coordinator of the participation this agent accepted
  and still takes part in (the acceptance came after the coordinator proved
  the room key, ``api/room_check.py``; a restored participation's messages
  reach the agent only once it proved it again, ``core/job/restored_proof.py``),
  and the message is for that job;
* the job asks for it: a ``deliver``'s module is the one the invitation
  showed and its auxiliary files are slots the invitation's model declares;
  an ``assign``'s checkpoint, auxiliary weights, data chunk and WGSL
  archive. Nothing else a participant receives is a job file (an
  ``update``, a relayed piece);
* the sender's files on disk stay within ``budget_bytes``.

Only one participation's files are on disk: when files of another job (or
another coordinator) are kept, the earlier ones are stale. Of the weights,
only the newest checkpoint and the newest snapshot are kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Mapping

from ..core.wire.framing import referenced_artifacts
from ..core.wire.messages import ArtifactRef, Assign, Deliver, Message
from ..core.job.participant import Participant
from ..core.states import takes_part

__all__ = ["DEFAULT_DISK_BUDGET_MIB", "DiskClaims", "KeepReason", "KeepRefusal", "KeepVerdict"]

#: A job's module, data, newest checkpoint and snapshot, and auxiliary weights fit in this for most jobs.
#: A file past it is not written; training goes on from memory.
DEFAULT_DISK_BUDGET_MIB = 4096

_NEWEST_ONLY = ("checkpoint", "snapshot")


class KeepReason(StrEnum):
    """Why a received file was not written to disk."""

    NOT_OUR_COORDINATOR = "disk-not-our-coordinator"  #: the sender coordinates no job this agent takes part in
    UNCLAIMED = "disk-unclaimed"  #: the accepted job does not ask for this file
    BUDGET_EXCEEDED = "disk-budget-exceeded"  #: the file would take its sender's files past the budget


@dataclass(frozen=True)
class KeepRefusal:
    peer: str
    ref: ArtifactRef
    reason: KeepReason
    detail: str
    first: bool  # the first refusal of this peer for this reason: the one worth a line of output


@dataclass(frozen=True)
class KeepVerdict:
    keep: tuple[ArtifactRef, ...] = ()  # write these (their bytes travelled with the message)
    stale: tuple[str, ...] = ()  # delete these, after the writes
    refused: tuple[KeepRefusal, ...] = ()


@dataclass(frozen=True)
class _Kept:
    peer: str
    kind: str
    size: int


class DiskClaims:
    """The ledger of what the agent wrote to disk for its participation, and the rules for what it may write."""

    def __init__(self, budget_bytes: int = DEFAULT_DISK_BUDGET_MIB << 20) -> None:
        self.budget_bytes = budget_bytes
        self._owner: tuple[str, str] | None = None  # (job ID, coordinator) whose files are on disk
        self._kept: dict[str, _Kept] = {}
        self._newest: dict[str, str] = {}  # 'checkpoint' | 'snapshot' -> the SHA-256 kept
        self.refusals: dict[tuple[str, KeepReason], int] = {}  # (peer, reason) -> files refused

    def used(self, peer: str) -> int:
        """Bytes on disk for ``peer``'s files."""
        return sum(k.size for k in self._kept.values() if k.peer == peer)

    def claimed(self, participant: Participant | None) -> frozenset[str]:
        """The files on disk that ``participant`` (this agent's, now) still claims: none once it stopped."""
        if participant is None or not takes_part(participant.state) or self._owner != (
                participant.job_id, participant.coordinator):
            return frozenset()
        return frozenset(self._kept)

    def released(self, sha: str) -> None:
        """A file the verdict kept was not written after all (the write failed) or was deleted."""
        self._kept.pop(sha, None)
        for kind in [k for k, s in self._newest.items() if s == sha]:
            del self._newest[kind]

    def judge(self, participant: Participant | None, peer: str, message: Message,
              blobs: Mapping[str, bytes]) -> KeepVerdict:
        """What to do with the files of ``message`` from ``peer`` (those in ``blobs``, which arrived with it).

        The ledger is updated as if the verdict were carried out; call :meth:`released` for a write that fails.
        """
        refs = list({r.sha256: r for r in referenced_artifacts(message) if r.sha256 in blobs}.values())
        if not refs:
            return KeepVerdict()
        if participant is None or not takes_part(participant.state) or peer != participant.coordinator:
            return KeepVerdict(refused=self._refuse(peer, refs, KeepReason.NOT_OUR_COORDINATOR,
                                                    f"peer {peer[:40]} is not the coordinator of a job this agent "
                                                    "accepted"))
        job_id = getattr(message, "job_id", None)
        if job_id != participant.job_id:
            return KeepVerdict(refused=self._refuse(peer, refs, KeepReason.UNCLAIMED,
                                                    f"a {message.TYPE} for job {str(job_id)[:64]!r}, not the job "
                                                    "this agent takes part in"))
        stale: list[str] = []
        if self._owner != (job_id, peer):
            stale += self._kept
            self._kept.clear()
            self._newest.clear()
            self._owner = (job_id, peer)
        keep: list[ArtifactRef] = []
        refused: list[KeepRefusal] = []
        for ref in refs:
            unclaimed = _unclaimed(participant, message, ref)
            if unclaimed is not None:
                refused += self._refuse(peer, [ref], KeepReason.UNCLAIMED, unclaimed)
                continue
            size = len(blobs[ref.sha256])
            replaces = self._newest.get(ref.kind) if ref.kind in _NEWEST_ONLY else None
            if ref.sha256 in self._kept:
                continue
            freed = self._kept[replaces].size if replaces is not None and replaces in self._kept else 0
            used = self.used(peer)
            if used - freed + size > self.budget_bytes:
                refused += self._refuse(peer, [ref], KeepReason.BUDGET_EXCEEDED,
                                        f"{ref.kind} of {size} bytes would take peer {peer[:40]}'s files on disk "
                                        f"past the budget of {self.budget_bytes} bytes ({used} used)")
                continue
            self._kept[ref.sha256] = _Kept(peer, ref.kind, size)
            keep.append(ref)
            if ref.kind in _NEWEST_ONLY:
                self._newest[ref.kind] = ref.sha256
                # The same weights may be the newest of the other kind too (a snapshot of the initial checkpoint).
                if replaces is not None and replaces not in self._newest.values():
                    self._kept.pop(replaces, None)
                    stale.append(replaces)
        return KeepVerdict(tuple(keep), tuple(stale), tuple(refused))

    def _refuse(self, peer: str, refs: list[ArtifactRef], reason: KeepReason, detail: str) -> tuple[KeepRefusal, ...]:
        out = []
        for ref in refs:
            count = self.refusals.get((peer, reason), 0)
            self.refusals[(peer, reason)] = count + 1
            out.append(KeepRefusal(peer, ref, reason, detail, count == 0))
        return tuple(out)


def _unclaimed(participant: Participant, message: Message, ref: ArtifactRef) -> str | None:
    """Why the accepted job does not ask for ``ref`` (None: it does)."""
    if isinstance(message, Assign):
        return None
    if isinstance(message, Deliver):
        invitation = participant.invitation
        if ref == message.module:
            if invitation is not None and ref.sha256 == invitation.module.get("sha256"):
                return None
            return "the delivered module is not the one in the invitation"
        slot_id = next((k for k, v in message.auxiliary.items() if v == ref), None)
        slot = _declared_slots(invitation.model_info if invitation is not None else {}).get(slot_id)
        if slot is not None and slot.get("sha256") in (None, ref.sha256):
            return None
        return f"auxiliary file {str(slot_id)[:64]!r} is not one the invitation's model declares"
    return f"a {message.TYPE} brings no file of the job"


def _declared_slots(model_info: Mapping[str, Any]) -> dict[Any, Mapping[str, Any]]:
    slots = model_info.get("auxiliaryWeights")
    return {s.get("id"): s for s in slots if isinstance(s, dict)} if isinstance(slots, list) else {}
