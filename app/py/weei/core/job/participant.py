"""The participant state machine: invitation, module, assignments, updates.

Theory of operation
-------------------
A participant sees an invitation (descriptions only) and decides. After
acceptance the coordinator delivers the module; the host loads it and says
whether that worked. Each ``Assign`` becomes a ``Train`` command; the host
trains (in Workers, or wasmtime for the agent) and reports the result,
which leaves as an ``Update`` with the weights beside it. The coordinator's
receipt closes the attempt.

The legal moves are the table ``PARTICIPANT_TRANSITIONS`` of
``core/states.py`` (state, event) -> state; any other move raises
``IllegalTransition`` naming role, state and event. An
assignment that arrives while another one trains waits (only the newest is
kept: an older one is stale by then), so a participant never runs two at
once.

A message from the coordinator that names an artifact this device neither
was sent nor holds is refused by the frame reader before it gets here; the
host tells :meth:`Participant.artifact_missing`, which asks the coordinator
for it (``artifactMissing``, at most once per artifact every
``ASK_AGAIN_MS``), so such a refusal never leaves the job waiting in silence.
"""

from __future__ import annotations

import hashlib
import math
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..wire.commands import Command, LoadModule, Log, Send, Train
from ..errors import UsageError, UsageReason, WeeiError
from ..formats.settings import PrivacySettings, TrainingSettings
from ..floats import BytesLike, first_non_finite
from ..privacy.secagg import SecAggError
from ..privacy.x25519 import X25519, x25519
from ..wire.messages import (
    ArtifactMissing, ArtifactRef, Assign, AssignmentFailed, CheckpointNote, Deliver, Invitation, InvitationDecision, JobFinished, Leave,
    Message,
    ModuleStatus, PauseContribution, Progress, SecAggRoster, SecAggSharesFor, SecAggUnmask, TrainingStarted, Update,
    UpdateReceipt,
)
from .secure_round import SecureContribution, SecureTerms
from ..observe.live_progress import ProgressThrottle
from ..states import (
    PARTICIPANT_ANYWHERE, PARTICIPANT_TRANSITIONS, PeerState, allowed, has_job, is_free, is_member, is_working, move,
    takes_part,
)

__all__ = ["Participant", "TrainOutcome", "CHECKPOINTS_KEPT", "ASK_AGAIN_MS"]

P = PeerState

#: Checkpoint summaries a participant keeps for its window (the newest rounds; each is a few hundred bytes).
CHECKPOINTS_KEPT = 1000

#: How soon the same missing artifact is asked for again (the coordinator's answer may be on its way).
ASK_AGAIN_MS = 10_000
_ASKS_KEPT = 64  # missing artifacts remembered (a coordinator's assignment names a handful)


@dataclass(frozen=True)
class TrainOutcome:
    """What the host's training produced for one attempt."""

    weights: bytes
    metrics: dict[str, float]
    count: int  # unique examples, or completed units
    optimizer_steps: int | None = None
    #: The update as it is sent when the job compresses updates (a ``qdelta`` artifact made from ``weights``).
    compressed: bytes | None = None


class Participant:
    """This browser's (or agent's) side of one job it was invited to."""

    def __init__(self, my_peer_id: str, *, weight_bytes: int | None = None,
                 random_bytes: Callable[[int], bytes] = secrets.token_bytes) -> None:
        """``random_bytes``: where this device's secrets under secure aggregation come from (its keys, seeds,
        shares and salts, and its DP noise seeds); a test seeds it to replay a round exactly."""
        self.my_peer_id = my_peer_id
        self.random_bytes = random_bytes
        self.state = P.UNKNOWN
        self.invitation: Invitation | None = None
        self.job_id: str | None = None
        self.coordinator: str | None = None
        self.model_info: dict[str, Any] | None = None
        self.gpu_offer: dict[str, Any] | None = None  # Deliver's WGSL archive announcement (checked JSON)
        self.working_bytes: int | None = None  # Deliver's estimatedWorkingBytes (weei.runtime.sandbox)
        self.cpu_backend: str | None = None  # Deliver's: the package's CPU backend id
        self._weight_bytes = weight_bytes
        self._paused = False
        self.current: Assign | None = None
        self.pending: Assign | None = None
        self.incomplete: bool | None = None
        self.last_error: str | None = None
        self._throttle = ProgressThrottle()
        self.checkpoints: dict[int, dict[str, Any]] = {}  # round -> CheckpointSummary (CheckpointNote)
        self._training_since: float | None = None  # when the current attempt started training
        self._asked: dict[str, float] = {}  # missing artifact -> when it was last asked for
        # When our coordinator's channel closed (None: connected, or restored before this device heard from it).
        self.offline_since: float | None = None
        # Under secure aggregation: the trained update of the last round, held until it leaves masked.
        self._secure: SecureContribution | None = None
        self._commands: list[Command] = []

    @property
    def weight_bytes(self) -> int | None:
        """The size every result must have: the job's, or learned from the first checkpoint assigned."""
        return self._weight_bytes

    @property
    def paused(self) -> bool:
        """Whether this device's contribution is paused (pause_contribution)."""
        return self._paused

    @classmethod
    def local(cls, my_peer_id: str, job_id: str, *, paused: bool = False) -> Participant:
        """The coordinator's own participant: approved without an invitation; ``paused``: this device's
        contribution was paused before the job existed (its coordinator reads that from the device)."""
        self = cls(my_peer_id)
        self._paused = paused
        self.job_id = job_id
        self.coordinator = my_peer_id
        self.state = P.APPROVED
        return self

    @classmethod
    def rejoin(cls, my_peer_id: str, coordinator: str, invitation: Invitation) -> Participant:
        """This device accepted ``invitation`` before it restarted: it waits, disconnected,
        for its coordinator, which delivers the module again when the channel reopens."""
        self = cls(my_peer_id)
        self.invitation = invitation
        self.job_id = invitation.job_id
        self.coordinator = coordinator
        self.model_info = invitation.model_info
        self.state = P.DISCONNECTED
        return self

    # ----------------------------------------------------------- transitions

    def _anywhere(self) -> dict[str, PeerState] | None:
        return PARTICIPANT_ANYWHERE if self.job_id else None  # only a participant with a job can leave one

    def _allowed(self, event: str) -> bool:
        return allowed(PARTICIPANT_TRANSITIONS, self.state, event, self._anywhere()) is not None

    def _move(self, event: str) -> None:
        """Raises IllegalTransition when the table has no such move."""
        self.state = move("participant", PARTICIPANT_TRANSITIONS, self.state, event, self._anywhere())

    def take_commands(self) -> list[Command]:
        out, self._commands = self._commands, []
        return out

    # -------------------------------------------------------------- messages

    def on_message(self, sender: str, message: Message, now: float) -> None:
        """A message from a coordinator. Messages of other jobs or senders are ignored (logged)."""
        if isinstance(message, Invitation):
            if self.state == P.APPROVED and sender == self.coordinator and message.job_id == self.job_id \
                    and self.invitation is not None:
                # Our coordinator asks again: our acceptance was lost with a channel (it would deliver the
                # module otherwise), so it is said again.
                self._send(InvitationDecision(message.job_id, True))
                self._log("decision.resent", job=message.job_id)
                return
            if self.job_id is not None and not is_free(self.state):
                self._log("invitation.ignored", reason="already-in-a-job", job=message.job_id)
                return
            self._move("invited")
            self.invitation = message
            self.job_id = message.job_id
            self.coordinator = sender
            self.model_info = message.model_info
            return
        if sender != self.coordinator or getattr(message, "job_id", None) != self.job_id:
            self._log("message.ignored", reason="not-from-our-coordinator", type=message.TYPE)
            return
        if isinstance(message, Deliver):
            if not self._allowed("deliver"):
                self._log("message.ignored", reason=f"unexpected-in-{self.state}", type=message.TYPE)
                return
            refusal = self._check_delivery(message)
            if refusal is not None:
                self._log("deliver.refused", reason=refusal)
                self.last_error = refusal
                self._send(ModuleStatus(message.job_id, False, refusal))
                return
            self._move("deliver")
            self.model_info = message.model_info
            self.gpu_offer = message.gpu
            self.working_bytes = message.working_bytes
            self.cpu_backend = message.cpu_backend
            self._commands.append(LoadModule(message.module, dict(message.auxiliary)))
        elif isinstance(message, Assign):
            self._on_assign(message)
        elif isinstance(message, UpdateReceipt):
            if self._allowed("receipt"):
                self._move("receipt")
            if not message.accepted:
                self.last_error = message.reason
                self._log("update.rejected", attempt=message.attempt_id, reason=message.reason)
        elif isinstance(message, CheckpointNote):
            # The job's checkpoints, as the coordinator saved them (a validation result replaces its round's).
            self.checkpoints[message.round] = message.summary()
            while len(self.checkpoints) > CHECKPOINTS_KEPT:
                del self.checkpoints[min(self.checkpoints)]
        elif isinstance(message, JobFinished):
            self.incomplete = message.incomplete
            self.current = self.pending = None
            self._secure = None
            self._move("finished")
        elif isinstance(message, (SecAggRoster, SecAggSharesFor, SecAggUnmask)):
            self._on_secagg(message)
        else:
            self._log("message.ignored", reason="unexpected-type", type=message.TYPE)

    def _check_delivery(self, deliver: Deliver) -> str | None:
        """We agreed to one module and its declared files: anything else is refused, not loaded."""
        if self.invitation is not None and deliver.module.sha256 != self.invitation.module.get("sha256"):
            return "the delivered module is not the one in the invitation (SHA-256 differs)"
        # What the invitation showed is what counts; the coordinator's own participant has no invitation.
        info = self.invitation.model_info if self.invitation is not None else deliver.model_info
        declared = {slot.get("id"): slot for slot in info.get("auxiliaryWeights", []) if isinstance(slot, dict)}
        for slot_id, ref in deliver.auxiliary.items():
            slot = declared.get(slot_id)
            if slot is None:
                return f"auxiliary file {slot_id!r} is not declared by the model"
            if slot.get("sha256") is not None and slot["sha256"] != ref.sha256:
                return f"auxiliary file {slot_id!r} is not the one the model declares (SHA-256 differs)"
        return None

    def artifact_missing(self, sender: str, sha256: str, now: float) -> None:
        """The frame reader refused a message from ``sender`` naming artifact ``sha256``, which this device
        neither was sent nor holds: ask our coordinator to send it."""
        if sender != self.coordinator or self.job_id is None or not takes_part(self.state):
            return
        last = self._asked.get(sha256)
        if last is not None and now - last < ASK_AGAIN_MS:
            return
        self._asked[sha256] = now
        while len(self._asked) > _ASKS_KEPT:
            del self._asked[next(iter(self._asked))]
        self._log("artifact.missing", artifact=sha256)
        self._send(ArtifactMissing(self.job_id, sha256))

    def _on_assign(self, assign: Assign) -> None:
        if any(a is not None and a.attempt_id == assign.attempt_id for a in (self.current, self.pending)):
            return  # sent again after we asked for an artifact another message named: we have this one
        if is_working(self.state) and self.current is not None:
            self.pending = assign  # the newest assignment waits for the one running
            return
        if not self._allowed("assign"):
            # A coordinator's message is a peer's input, never a reason to raise.
            self._log("message.ignored", reason=f"unexpected-in-{self.state}", type=assign.TYPE)
            return
        self._move("assign")
        self.current = assign
        refusal = self._check_assign_auxiliary(assign)
        if refusal is not None:
            self._log("assign.refused", attempt=assign.attempt_id, reason=refusal)
            self._finish_attempt(assign.attempt_id)
            self._fail(assign, refusal)
            self._next()
            return
        self._commands.append(Train(assign))

    def _check_assign_auxiliary(self, assign: Assign) -> str | None:
        """An assignment fills exactly the slots the model declares: a file slot with the declared file,
        a snapshot slot with weights of the declared size, which is the weight size."""
        info = self.invitation.model_info if self.invitation is not None else (self.model_info or {})
        declared = {slot.get("id"): slot for slot in info.get("auxiliaryWeights", []) if isinstance(slot, dict)}
        if set(assign.auxiliary) != set(declared):
            return (f"the assignment fills auxiliary slots {sorted(assign.auxiliary)}, "
                    f"the model declares {sorted(map(str, declared))}")
        for slot_id, ref in assign.auxiliary.items():
            slot = declared[slot_id]
            if ref.bytes != slot.get("bytes"):
                return f"auxiliary slot {slot_id!r}: {ref.bytes} bytes, the model declares {slot.get('bytes')}"
            if slot.get("sha256") is not None and ref.sha256 != slot["sha256"]:
                return f"auxiliary slot {slot_id!r} is not the file the model declares (SHA-256 differs)"
            if slot.get("sha256") is None and ref.bytes != assign.checkpoint.bytes:
                return f"auxiliary slot {slot_id!r}: a snapshot of {ref.bytes} bytes, the weights are {assign.checkpoint.bytes}"
        return None

    # ------------------------------------------------------- user decisions

    def decide(self, accepted: bool, now: float) -> None:
        """decideInvitation(jobId, accepted)."""
        if self.state != P.INVITED or self.invitation is None:
            raise UsageError(UsageReason.NO_INVITATION, "there is no invitation waiting for a decision")
        self._move("accept" if accepted else "decline")
        self._send(InvitationDecision(self.invitation.job_id, accepted))

    def pause_contribution(self, paused: bool, now: float) -> None:
        if self.job_id is None or not takes_part(self.state):
            raise UsageError(UsageReason.NOT_PARTICIPATING, "pausing needs a job you take part in")
        self._paused = paused
        self._send(PauseContribution(self.job_id, paused))

    def leave(self, now: float) -> None:
        if self.job_id is None or not has_job(self.state):
            raise UsageError(UsageReason.NOT_PARTICIPATING, "there is no job to leave")
        self._send(Leave(self.job_id))
        self.current = self.pending = None
        self._move("leave")

    # ----------------------------------------------------------- host events

    def module_loaded(self, weight_bytes: int | None, held: tuple[str, ...], now: float, *,
                      fetch_shader_archive: bool = False) -> None:
        """The host loaded the module; ``fetch_shader_archive``: it will train on its GPU and asks for the
        announced WGSL archive (a host that will not never downloads it)."""
        self._weight_bytes = weight_bytes
        self._move("module_loaded")
        assert self.job_id is not None
        self._send(ModuleStatus(self.job_id, True, None, held, fetch_shader_archive and self.gpu_offer is not None))

    def module_failed(self, error: str, now: float) -> None:
        self._move("module_failed")
        self.last_error = error
        assert self.job_id is not None
        self._send(ModuleStatus(self.job_id, False, error[:2000]))

    def training_started(self, attempt_id: str, now: float) -> None:
        if self.current is None or self.current.attempt_id != attempt_id:
            return
        self._move("train_started")
        self._training_since = now
        assert self.job_id is not None
        self._send(TrainingStarted(self.job_id, attempt_id))

    def report_progress(self, processed: int, total: int, metrics: dict[str, float], now: float) -> bool:
        """The host's progress on the current attempt: it goes to a remote coordinator at most every
        PROGRESS_INTERVAL_MS, and once on completion (our own coordinator reads the host directly).
        Returns whether a Progress message was queued."""
        if self.current is None or self.job_id is None or self.coordinator in (None, self.my_peer_id) \
                or self.state != P.TRAINING:
            return False
        processed = max(0, min(int(processed), int(total)))
        if not self._throttle.due(self.current.attempt_id, processed, total, now):
            return False
        finite = {k[:64]: float(v) for k, v in list(metrics.items())[:64] if math.isfinite(v)}
        self._send(Progress(self.job_id, self.current.attempt_id, processed, int(total),
                            self.training_elapsed_ms(now) or 0, finite))
        return True

    def training_elapsed_ms(self, now: float) -> int | None:
        """How long the current attempt has trained (None when none trains)."""
        if self.current is None or self._training_since is None or self.state != P.TRAINING:
            return None
        return max(0, round(now - self._training_since))

    def training_finished(self, attempt_id: str, outcome: TrainOutcome, now: float, *,
                          start: BytesLike | None = None, x25519: X25519 = x25519) -> None:
        """The host trained ``attempt_id``; send the update (or say why it cannot count). ``start``: the
        weights it trained from, which a securely aggregated round needs (the update is masked as a delta);
        ``x25519``: the host's X25519 (its kernel's), which that round's key agreement computes with."""
        assign = self._finish_attempt(attempt_id)
        if assign is None:
            return
        if self._weight_bytes is None:
            # A remote participant learns the size from its first checkpoint: the host trained from those
            # bytes, hashed against this reference, so a result of another size is the model's fault.
            self._weight_bytes = assign.checkpoint.bytes
        problem = self._check_outcome(outcome)
        try:
            terms = SecureTerms.from_settings(assign.settings)
        except SecAggError as exc:
            problem = problem or exc.message
            terms = None
        problem = problem or self._check_terms(terms)
        if problem is None and terms is not None and (start is None or len(start) != len(outcome.weights)):
            problem = "secure aggregation needs the weights the update was trained from (a host bug)"
        if problem is not None:
            self._fail(assign, problem)
        elif terms is not None:
            assert start is not None
            # Nothing leaves in the clear: the keys say the update is ready, the masked vector follows.
            self._secure = SecureContribution(self.my_peer_id, assign.job_id, assign.round, terms, start,
                                              outcome.weights, outcome.count, self.random_bytes, x25519)
            self._move("trained")
            self._send(self._secure.keys())
        else:
            sent = outcome.compressed if outcome.compressed is not None else outcome.weights
            sha = hashlib.sha256(sent).hexdigest()
            ref = ArtifactRef("update" if outcome.compressed is None else "qdelta", sha, len(sent))
            update = Update(assign.job_id, assign.round, assign.assignment_id, assign.attempt_id,
                            assign.checkpoint.sha256, ref, dict(outcome.metrics), outcome.count,
                            outcome.optimizer_steps)
            self._move("trained")
            self._commands.append(Send(self.coordinator or "", update, (ref,), {sha: bytes(sent)}))
        self._next()

    def _invited_privacy(self) -> PrivacySettings | None:
        """The privacy the invitation promised (None: no invitation, as for the coordinator's own participant)."""
        if self.invitation is None:
            return None
        try:
            return TrainingSettings.from_json(self.invitation.settings).privacy
        except WeeiError:
            return None  # accepting such an invitation failed already; nothing to hold the coordinator to

    def _check_terms(self, terms: SecureTerms | None) -> str | None:
        """Why an assignment's secure-aggregation terms break the invitation's promise, or None. What this
        participant agreed to decides, not the coordinator's later word: an update never leaves in the clear
        under an invitation that said it would be masked, nor clipped more loosely than it said, nor with less
        noise of its own than it said (``privacy.dp.noiseAt: "participants"``)."""
        invited = self._invited_privacy()
        if invited is None or not invited.secure_aggregation:
            return None
        if terms is None:
            return "the invitation promised secure aggregation; this assignment asks for the update in the clear"
        if invited.participant_clip is not None and terms.clip > invited.participant_clip:
            return (f"the assignment's clip {terms.clip:g} is above the invitation's {invited.participant_clip:g}")
        dp = invited.dp
        if dp is not None and dp.participants_noise and (terms.noise < dp.noise_multiplier or terms.weighted):
            return (f"the invitation said participants add noise of multiplier {dp.noise_multiplier:g}; this "
                    f"assignment asks for {terms.noise:g}" + (" on weighted updates" if terms.weighted else ""))
        return None

    def _on_secagg(self, message: SecAggRoster | SecAggSharesFor | SecAggUnmask) -> None:
        """A step of secure aggregation for the update this participant holds; a step it refuses ends its part."""
        contribution = self._secure
        if contribution is None or not contribution.matches(message):
            self._log("message.ignored", reason="no-secure-contribution", type=message.TYPE)
            return
        try:
            if isinstance(message, SecAggRoster):
                self._send(contribution.on_roster(message))
            elif isinstance(message, SecAggSharesFor):
                masked, data = contribution.on_shares_for(message)
                self._commands.append(Send(self.coordinator or "", masked, (masked.masked,), {masked.masked.sha256: data}))
            else:
                self._secure = None  # shares are revealed once
                self._send(contribution.on_unmask(message))
        except SecAggError as exc:
            self._secure = None
            self.last_error = f"secure aggregation: {exc.message}"
            self._log("secagg.refused", reason=exc.reason, peer=exc.peer, error=exc.message)

    def training_failed(self, attempt_id: str, error: str, now: float) -> None:
        assign = self._finish_attempt(attempt_id)
        if assign is None:
            return
        self._fail(assign, error)
        self._next()

    def _finish_attempt(self, attempt_id: str) -> Assign | None:
        if self.current is None or self.current.attempt_id != attempt_id:
            self._log("training.ignored", attempt=attempt_id, reason="not-the-current-attempt")
            return None
        assign, self.current = self.current, None
        if self.state == P.ASSIGNED:
            self._move("train_started")
        return assign

    def _fail(self, assign: Assign, error: str) -> None:
        self.last_error = error
        self._move("train_failed")
        self._send(AssignmentFailed(assign.job_id, assign.attempt_id, error[:2000]))

    def _next(self) -> None:
        if self.pending is not None and is_member(self.state):
            assign, self.pending = self.pending, None
            self._on_assign(assign)

    def _check_outcome(self, outcome: TrainOutcome) -> str | None:
        """Our own result is checked before it leaves: a diverged model is reported, not sent."""
        if self._weight_bytes is not None and len(outcome.weights) != self._weight_bytes:
            return f"the model returned {len(outcome.weights)} bytes of weights, expected {self._weight_bytes}"
        bad = first_non_finite(outcome.weights)
        if bad is not None:
            return f"training diverged: weight {bad} is not finite"
        if any(not math.isfinite(v) for v in outcome.metrics.values()):
            return "training diverged: a metric is not finite"
        return None

    def disconnected(self, now: float) -> None:
        if self.job_id is not None and takes_part(self.state):
            self.current = self.pending = None
            self._secure = None
            if self.state != P.DISCONNECTED:
                self.offline_since = now
            self._move("disconnected")

    def reconnected(self, now: float) -> None:
        """Back online: the coordinator delivers the module again and we catch up."""
        if self.state == P.DISCONNECTED:
            self.offline_since = None
            self._move("reconnected")

    # ------------------------------------------------------------------ view

    def view(self) -> dict[str, Any]:
        return {
            "jobId": self.job_id,
            "state": str(self.state),
            "paused": self._paused,
            "currentAttempt": self.current.attempt_id if self.current else None,
            "error": self.last_error,
        }

    def _send(self, message: Message) -> None:
        self._commands.append(Send(self.coordinator or "", message))

    def _log(self, event: str, **details: Any) -> None:
        self._commands.append(Log(event, details))
