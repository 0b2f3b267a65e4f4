"""The invitations waiting for this device's decision: a bounded list, one per coordinator.

An invitation's coordinator is the peer whose channel it came over: one that
names another peer is refused (``coordinator-mismatch``), or a member of the
room could show any coordinator's name on this device's card. Several
coordinators may invite this device at once, and each invitation stays
reviewable until it is decided, so none hides another: a newer invitation
from the same coordinator replaces its older one (``replaced``), at most
:data:`MAX_PENDING` are kept and the oldest goes when one more comes
(``too-many-pending``), and a job id already pending from another
coordinator is refused (``job-pending-elsewhere``: a peer that learnt the id
cannot take over another coordinator's card). An invitation older than
:data:`INVITATION_TTL_MS` is stale (:meth:`PendingInvitations.expire`): its
coordinator stops waiting for it then too. Every refusal and drop is
returned by name for the debug log.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator

from ..errors import WeeiError
from ..formats.settings import TrainingSettings
from ..privacy.dp_accountant import epsilon_json
from ..wire.messages import Invitation

__all__ = ["MAX_PENDING", "INVITATION_TTL_MS", "Pending", "PendingInvitations"]

MAX_PENDING = 8
# An invitation nobody answered in this long is stale: both sides forget it and the inviter may invite again.
INVITATION_TTL_MS = 10 * 60 * 1000


@dataclass(frozen=True)
class Pending:
    """One invitation waiting for a decision, and the peer it came from."""

    sender: str
    invitation: Invitation
    received_at: float
    #: What ``state.invitations`` shows (built once: a host may compare entries by identity).
    entry: dict[str, Any] = field(init=False, compare=False)

    def __post_init__(self) -> None:
        inv = self.invitation
        object.__setattr__(self, "entry", {"invitation": {
            "coordinator": inv.coordinator, "modelInfo": inv.model_info, "module": inv.module,
            "dataBytes": inv.data_bytes, "settings": inv.settings, "coordinatorName": inv.coordinator_name},
            "receivedAt": self.received_at})
        privacy = planned_privacy(inv.settings)
        if privacy is not None:
            self.entry["privacy"] = privacy


def planned_privacy(settings: Any) -> dict[str, Any] | None:
    """What an invitation's ``privacy`` settings promise, computed here (the planned ε by the participant's own
    accountant, not taken from the coordinator): ``{secureAggregation?: {clip, threshold}, dp?: {plannedEpsilon,
    delta, maxRounds, clip, noiseMultiplier, noiseAt}}``; None without either, or ``{invalid: message}`` when the
    settings do not parse (the window says so; accepting fails anyway)."""
    if not isinstance(settings, dict) or "privacy" not in settings:
        return None
    try:
        privacy = TrainingSettings.from_json(settings).privacy
    except WeeiError as exc:
        return {"invalid": exc.message}
    out: dict[str, Any] = {}
    if privacy.secure_aggregation:
        out["secureAggregation"] = {"clip": privacy.participant_clip, "threshold": privacy.threshold}
    dp = privacy.dp
    if dp is not None:
        out["dp"] = {"plannedEpsilon": epsilon_json(dp.planned_epsilon), "delta": dp.delta,
                     "maxRounds": dp.max_rounds, "clip": dp.clip, "noiseMultiplier": dp.noise_multiplier,
                     "noiseAt": dp.noise_at}
    return out or None


class PendingInvitations:
    """Invitations by job id, oldest first."""

    def __init__(self, limit: int = MAX_PENDING) -> None:
        self.limit = limit
        self._by_job: dict[str, Pending] = {}

    def offer(self, sender: str, invitation: Invitation, now: float) -> list[dict[str, str]]:
        """Keep ``invitation`` from ``sender`` unless it is refused; returns what was refused or dropped,
        each ``{"event": "invitation.refused"|"invitation.dropped", "jobId", "from", "reason"}``."""
        job_id = invitation.job_id

        def note(event: str, pending_job: str, peer: str, reason: str) -> dict[str, str]:
            return {"event": event, "jobId": pending_job[:64], "from": peer[:64], "reason": reason}

        if invitation.coordinator != sender:
            return [note("invitation.refused", job_id, sender, "coordinator-mismatch")]
        held = self._by_job.get(job_id)
        if held is not None and held.sender != sender:
            return [note("invitation.refused", job_id, sender, "job-pending-elsewhere")]
        notes = []
        for other in [p for p in self._by_job.values() if p.sender == sender]:
            del self._by_job[other.invitation.job_id]
            if other.invitation.job_id != job_id:
                notes.append(note("invitation.dropped", other.invitation.job_id, sender, "replaced"))
        while len(self._by_job) >= self.limit:
            oldest = next(iter(self._by_job.values()))
            del self._by_job[oldest.invitation.job_id]
            notes.append(note("invitation.dropped", oldest.invitation.job_id, oldest.sender, "too-many-pending"))
        self._by_job[job_id] = Pending(sender, invitation, now)
        return notes

    def expire(self, now: float) -> list[Pending]:
        """Remove and return the invitations older than ``INVITATION_TTL_MS``, oldest first."""
        stale = [p for p in self._by_job.values() if now - p.received_at >= INVITATION_TTL_MS]
        for p in stale:
            del self._by_job[p.invitation.job_id]
        return stale

    def get(self, job_id: str) -> Pending | None:
        return self._by_job.get(job_id)

    def take(self, job_id: str) -> Pending | None:
        """Remove and return the invitation of ``job_id`` (decided)."""
        return self._by_job.pop(job_id, None)

    def clear(self) -> list[Pending]:
        """Remove and return every invitation, oldest first."""
        out = list(self._by_job.values())
        self._by_job.clear()
        return out

    def entries(self) -> dict[str, dict[str, Any]]:
        """Job id -> what ``state.invitations`` shows, oldest first."""
        return {job_id: p.entry for job_id, p in self._by_job.items()}

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._by_job

    def __iter__(self) -> Iterator[Pending]:
        return iter(list(self._by_job.values()))

    def __len__(self) -> int:
        return len(self._by_job)
