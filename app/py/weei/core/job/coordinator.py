"""The coordinator state machine: rounds, assignments, validation of updates, checkpoints.

Theory of operation
-------------------
A job starts at checkpoint 0. While the job runs, round ``r`` trains from
checkpoint ``r - 1``: every eligible participant (accepted, connected,
module loaded, not paused) gets at most one assignment — a dataset chunk or
an experience unit range with its seed. Each hand-out is an *attempt* with
its own id (``core/job/attempts.py``), so anything that arrives for an attempt
that is no longer open (late, stale, duplicate, off-policy) is recognised
and discarded, never averaged.

Each round is a :class:`~weei.core.job.round.Round` (``core/job/round.py``):
it opens with the job's settings as they are then, owns its attempts and
its relayed checkpoint, and closes to an outcome. An attempt ends with a
valid update, or without one (``_end_attempt``: disconnect, deadline,
rejected update, model error); then its work goes back, to an idle
participant at once when there is one, otherwise to the front of the queue
for the next round. An attempt of a remote participant also ends when no
word of it (``trainingStarted``, ``progress``) came for ``stall_timeout_ms``
(``STALL_TIMEOUT_MS``): its work is reassigned at once and its peer's record
says it is stuck and why (``stuck``), as it does when the participant reports
with ``artifactMissing`` that a message named an artifact it lacks; then the
assignment is sent again with that artifact (at most ``MAX_RESENDS`` times).
An invitation with no answer for ``INVITATION_TTL_MS`` expires: the peer's
record says so (``declined``) and it can be invited again; a declining peer's
reason (it is busy with another job, say) is kept there too.
A round closes when every attempt has an outcome, or at
its deadline (``_close_round``): it turns *closing* (``transitioning``; the
host's ``closing_sink`` hears of it before the averaging starts), the pure
``round_rules.close_round`` aggregates its valid updates under the round's
settings into the record of checkpoint ``r``, and ``_closing`` builds and
checks that checkpoint's file on a copy of the schedule; only then does
``_take_round`` write it all down. Closing is all or nothing: any error
before the write-down (a non-finite aggregate, a file that would not pass
the reader's checks, a bug) leaves the round counter, weights and
checkpoints as they were, gives the round's trained work back and pauses
the job with the cause (``round.failed`` and ``job.paused`` reason
``round-failed`` in the log, ``error`` in the state), so the person can fix
it (a lower server learning rate, say) and resume. A round with no valid
update keeps the previous checkpoint and tries again; after
``MAX_EMPTY_ROUNDS`` of them the job pauses too. When the work is done the
job completes (``_finish``) and every participant is told.

Under ``privacy.secureAggregation`` participants send keys instead of
updates, and a round whose attempts have all ended runs the protocol before
it closes: the round's :class:`~weei.core.job.secure_aggregator.SecureAggregator`
(``Round.secure``) holds the keys and the protocol and answers with Sends and,
at the end, the round's record; this class ends the attempts, gives work
back, excludes a peer that broke the protocol and closes the round
(``_begin_secure``, ``_maybe_secure_done``, ``_secure_failed``).

Commands only append (:class:`~weei.core.wire.commands.Outbox`): a round's
opening is planned (relays included) before any of it is emitted, and a
closed round's SaveCheckpoint goes out at one point, after the next round's
work (writing the file does not hold up the participants, issue 11, P4)
and before anything the next round's own closing emits.

The job's status, each participant's record and each attempt move only
along the transition tables of ``core/states.py``; this class is the only
writer of its fields (the host asks, through methods).

Everything comes in as method calls with ``now`` (ms since epoch) and goes
out as commands (``take_commands``); the host asks ``next_timer()`` when to
call ``handle_timer``. Nothing here reads a clock or does I/O.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_left
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Mapping

from ..formats import checkpoint as ckpt
from . import progress
from ..aggregation.aggregate import AggregationState, DpRound
from ..aggregation.compression import decompress_update, layout
from ..floats import BytesLike
from ..privacy.dp_accountant import DpLedger, epsilon_json
from ..privacy.dp_noise import SEED_BYTES, noise_key
from ..privacy.secagg import SecAggError, SecAggReason
from .attempts import Attempt, RoundAttempts, check_update
from ..wire.commands import Command, Log, Outbox, RoundPhase, RunValidation, SaveCheckpoint, Send
from ..errors import SettingsError, SettingsReason, UsageError, WeeiError, UsageReason
from .spec import JobSpec
from .participant import CHECKPOINTS_KEPT
from ..wire.messages import (
    ArtifactMissing, ArtifactRef, Assign, AssignmentFailed, CheckpointNote, Deliver, DiagnosticsReport, Invitation, InvitationDecision,
    MAX_SECAGG_PEERS, JobFinished, Leave, Message, ModuleStatus, PauseContribution, Progress, RelayDone, SecAggKeys, SecAggMasked,
    SecAggReveal, SecAggShares, TrainingStarted, Update, UpdateReceipt,
)
from .invitations import INVITATION_TTL_MS
from .peers import PeerBook, PeerRecord, available, eligible, loading
from ..links.relay import Broadcast, Relays
from .round import Round, RoundClosed, RoundEmpty, RoundFailed
from .secure_round import SECAGG_PHASE_TIMEOUT_MS
from .round_rules import (
    Kernel, RoundRecord, check_can_validate, check_method, check_units, chunk_seed, held_round, make_assign,
    snapshot_rounds, validating, validation_command, validation_due,
)
from .schedule import DatasetSchedule, ExperienceSchedule
from ..formats.seeds import assignment_seed, rounds_to_train
from ..formats.settings import TrainingSettings
from ..states import JOB_TRANSITIONS, AttemptStatus, JobStatus, PeerState, is_working, move

__all__ = ["Coordinator", "RejectedUpdate", "DEFAULT_ROUND_TIMEOUT_MS", "JOIN_GRACE_MS", "MAX_EMPTY_ROUNDS",
           "REPEATED_OUTLIER_ROUNDS", "STALL_TIMEOUT_MS", "MAX_RESENDS", "INVITATION_TTL_MS"]

DEFAULT_ROUND_TIMEOUT_MS = 10 * 60 * 1000
# A remote attempt with no word of it (trainingStarted, progress) for this long is stalled: its work goes to
# another participant. Loading a module, receiving a checkpoint and compiling shaders fit well inside it.
STALL_TIMEOUT_MS = 3 * 60 * 1000
# Times one assignment is sent again to a participant that says it lacks an artifact the Assign named: a
# participant cannot make the coordinator send the same bytes without end.
MAX_RESENDS = 2

# After start(), participants still loading the module get this long to be
# ready, so the first round is not trained by whoever happened to be first.
JOIN_GRACE_MS = 10_000

# Rounds in a row without a single valid update before the job pauses itself:
# retrying forever would only burn the participants' machines.
MAX_EMPTY_ROUNDS = 5

# Rounds in a row whose update was an outlier before a peer is named in the
# debug log (``peer.outlier``): one odd round is noise, three is a pattern.
REPEATED_OUTLIER_ROUNDS = 3


@dataclass(frozen=True)
class RejectedUpdate:
    """An update (or attempt) that did not count, and why."""

    round: int
    peer: str
    attempt_id: str
    reason: str
    at: float


def _no_stopwatch() -> float:
    """A host that sets no stopwatch gets phases of zero length."""
    return 0.0


class Coordinator:
    """One job, seen from the browser that coordinates it. Build with ``create`` or ``continue_from``."""

    def __init__(self, spec: JobSpec, *, my_peer_id: str, kernel: Kernel, weights: bytes, round_: int,
                 now: float, job_seed: int | None, round_timeout_ms: float, aggregation_state: AggregationState | None,
                 dataset: DatasetSchedule | None, experience: ExperienceSchedule | None,
                 checkpoint_hashes: dict[int, str], first_round: int,
                 dp_noise_seed: bytes | None = None, dp_ledger: DpLedger = DpLedger()) -> None:
        if spec.settings.privacy.dp is not None and (dp_noise_seed is None or len(dp_noise_seed) != SEED_BYTES):
            raise UsageError(UsageReason.INVALID_ARGUMENT,
                             f"a job with privacy.dp needs a noise seed of {SEED_BYTES} secret bytes")
        self.spec = spec
        self.my_peer_id = my_peer_id
        #: This device's display name, which invitations carry (the host sets it; core/observe/peer_names.py).
        self.display_name: str | None = None
        self.kernel = kernel
        self.round_timeout_ms = round_timeout_ms
        self.stall_timeout_ms: float = STALL_TIMEOUT_MS
        self.secagg_phase_timeout_ms: float = SECAGG_PHASE_TIMEOUT_MS  # one stage of secure aggregation
        self.status = JobStatus.READY
        self.error: str | None = None
        self.incomplete = False
        self.weights = weights
        self.weights_sha256 = hashlib.sha256(weights).hexdigest()
        self.checkpoint_round = round_
        self.first_round = first_round  # rounds before it belong to the checkpoint we continued from
        # The checkpoint the job starts from is validated at the first Start (round 0 of a new job): every
        # chart and the demo's verdict compare with it. A reopened job that trained already has its own.
        self._baseline_pending = True
        self._validating: set[int] = set()  # rounds whose RunValidation went out and has not come back
        self.job_seed = job_seed
        # DP's noise seed: the coordinator's secret (docs/privacy.md); no message, checkpoint or view holds it.
        self._dp_noise_seed = dp_noise_seed
        self.dp_ledger = dp_ledger
        self.aggregation_state = aggregation_state
        self.dataset = dataset
        self.experience = experience
        self.checkpoint_hashes = dict(checkpoint_hashes)
        self.checkpoints: list[dict[str, Any]] = []
        self.peers = PeerBook()
        # What the job record keeps of the peers, updated for the peers the book says changed: the other
        # members, sorted, and the robust state of those that have one.
        self._members: list[str] = []
        self._robust: dict[str, dict[str, Any]] = {}
        self._members_version = 0  # moves when either changes: a saver that saw this number need not look again
        self.round: Round | None = None  # the open round, or the last one, closed
        self._no_round = RoundAttempts()  # the attempts' ledger before the first round
        self.rejected: list[RejectedUpdate] = []
        self._empty_rounds = 0
        # Why the last attempt ended without a valid update: the cause a paused job names in its error.
        self._last_failure: str | None = None
        self.last_contributors: list[str] = []
        self._saved_incomplete = False
        self._grace_until: float | None = None
        self._invited_at: dict[str, float] = {}  # peers whose invitation waits for an answer, and since when
        self._commands = Outbox()
        self.diagnostics_sink: Callable[[str, dict[str, Any], float], None] | None = None
        # The host's monotonic clock (ms), read only to time phases for the debug log.
        self.stopwatch: Callable[[], float] = _no_stopwatch
        # Told (with the round) when a round's last needed update is in, before its averaging starts:
        # the host publishes ``transitioning`` then, not only once the checkpoint is being saved.
        self.closing_sink: Callable[[int], None] | None = None
        self.relays = Relays(my_peer_id, spec.job_id, sha256_many=kernel.sha256_many)  # core/links/relay.py
        # Live progress of an open attempt goes to the host's LiveProgress book (bounded per peer);
        # it answers False for a report older than the one it holds.
        self.progress_sink: Callable[[str, Progress, float], bool] | None = None
        if spec.settings.coordinator_participates:
            self._add_local_participant()

    # ----------------------------------------------------------------- creation

    @classmethod
    def create(cls, spec: JobSpec, initial_weights: bytes, *, my_peer_id: str, kernel: Kernel, now: float,
               job_seed: int | None = None, round_timeout_ms: float = DEFAULT_ROUND_TIMEOUT_MS,
               dp_noise_seed: bytes | None = None) -> Coordinator:
        """A new job at checkpoint 0; emits SaveCheckpoint for it. A job with ``privacy.dp`` needs
        ``dp_noise_seed`` (32 secret bytes: the same seed gives the same noise, round after round).

        Raises:
            UsageError: an experience job without ``job_seed``, or weights of the wrong size.
        """
        if len(initial_weights) != spec.weight_bytes:
            raise UsageError(UsageReason.WRONG_WEIGHT_SIZE, f"initial weights are {len(initial_weights)} bytes, "
                                                  f"the model declares {spec.weight_bytes}")
        dataset, experience = progress.new_schedules(spec, job_seed)
        self = cls(spec, my_peer_id=my_peer_id, kernel=kernel, weights=bytes(initial_weights), round_=0, now=now,
                   job_seed=job_seed, round_timeout_ms=round_timeout_ms, aggregation_state=None, dataset=dataset,
                   experience=experience, checkpoint_hashes={}, first_round=1, dp_noise_seed=dp_noise_seed)
        self._save_checkpoint(now, metrics={}, examples=0)
        return self

    @classmethod
    def continue_from(cls, spec: JobSpec, checkpoint: ckpt.Checkpoint, *, mode: str, my_peer_id: str, kernel: Kernel,
               now: float,
               new_job_seed: int | None = None, reopening: bool = False,
               round_timeout_ms: float = DEFAULT_ROUND_TIMEOUT_MS,
               dp_noise_seed: bytes | None = None) -> Coordinator:
        """Continue from a read checkpoint (``weei.core.formats.checkpoint.Checkpoint``).

        ``mode`` 'resume' restores the dataset queue (or the experience seed
        and next unit); 'new' starts a fresh queue (or draws a new job seed:
        pass ``new_job_seed``). Rounds keep counting from the checkpoint.
        ``reopening`` is the same job found again in storage (after a reload).

        Raises:
            UsageError: bad mode, weights of the wrong size, or an experience
                job whose last round is not above the checkpoint's.
        """
        restored = progress.restore(spec, checkpoint, mode=mode, new_job_seed=new_job_seed, reopening=reopening)
        round_ = restored.round
        self = cls(spec, my_peer_id=my_peer_id, kernel=kernel, weights=bytes(checkpoint.weights), round_=round_,
                   now=now, job_seed=restored.job_seed, round_timeout_ms=round_timeout_ms,
                   aggregation_state=restored.aggregation_state, dataset=restored.dataset,
                   experience=restored.experience,
                   checkpoint_hashes={round_: hashlib.sha256(checkpoint.weights).hexdigest()},
                   first_round=round_ + 1, dp_noise_seed=dp_noise_seed, dp_ledger=checkpoint.metadata.dp_ledger)
        self._baseline_pending = not reopening or round_ == 0
        self._commands.append(Log("job.continued", {"fromRound": round_, "datasetMode": mode}))
        return self

    # ------------------------------------------------------------ host surface

    def take_commands(self) -> list[Command]:
        """The commands emitted since the last call, in order."""
        return self._commands.take()

    @property
    def attempts(self) -> RoundAttempts:
        """The open round's attempts (the last round's, closed, or none before the first)."""
        return self.round.attempts if self.round is not None else self._no_round

    @property
    def broadcast(self) -> Broadcast | None:
        """The relayed checkpoint of the last round that opened, if it was relayed."""
        return self.round.broadcast if self.round is not None else None

    @property
    def transitioning(self) -> bool:
        """A round's last needed update is in and its checkpoint has not gone to the host yet:
        the updates are being averaged into it (the host's save follows)."""
        return self.round is not None and self.round.closing

    @property
    def securing(self) -> bool:
        """The open round is in its secure aggregation: training ended, the protocol's steps are under way, and
        nothing the window shows changes until the round closes or fails."""
        return self.round is not None and self.round.securing

    def next_timer(self) -> float | None:
        """When ``handle_timer`` must next be called (ms since epoch), or None."""
        times = [t for t in (self.attempts.next_deadline(), self._grace_until) if t is not None]
        if self._invited_at:
            times.append(min(self._invited_at.values()) + INVITATION_TTL_MS)
        relay_due = self.broadcast.next_timer() if self.broadcast is not None else None
        if relay_due is not None:
            times.append(relay_due)
        secure_due = self.round.secure.deadline if self.round is not None and self.round.securing and \
            self.round.secure is not None else None
        if secure_due is not None:
            times.append(secure_due)
        return min(times) if times else None

    def handle_timer(self, now: float) -> None:
        for peer in [p for p, at in self._invited_at.items() if at + INVITATION_TTL_MS <= now]:
            del self._invited_at[peer]
            record = self.peers[peer]
            if record.state == PeerState.INVITED:
                record.move("decline")
                record.expired = True
                record.declined = f"no answer in {INVITATION_TTL_MS // 60_000} min: the invitation expired"
                self._log("invitation.expired", peer=peer)
        if self._grace_until is not None and now >= self._grace_until:
            self._grace_until = None
            self._maybe_open_round(now)
        if self.broadcast is not None:
            self.broadcast.handle_timer(now)
            self._commands.extend(self.broadcast.take_commands())
        round_ = self.round
        if round_ is not None and round_.securing and round_.secure is not None:
            self._commands.extend(round_.secure.handle_timer(now))
            self._maybe_secure_done(round_, now)
        stalled = self.attempts.stalled(now)
        for attempt in stalled:
            self._stalled(attempt, now)
        late = self.attempts.late(now)
        for attempt in late:
            self._end_attempt(attempt, "missed the round deadline", now, failed=False, reassign=False)
        if late:
            self._close_round(now)
        elif stalled:
            self._maybe_close_round(now)

    def _stalled(self, attempt: Attempt, now: float) -> None:
        """No word of ``attempt`` for the stall timeout: its peer is stuck; the work goes to another peer."""
        quiet_s = round((now - (attempt.heard_at if attempt.heard_at is not None else attempt.started_at)) / 1000)
        phase = "loading (the assignment or an artifact it names never arrived, or the module hangs)" \
            if attempt.status is AttemptStatus.LOADING else "training"
        reason = f"no word for {quiet_s} s while {phase}"
        record = self.peers.get(attempt.peer)
        if record is not None:
            record.stuck = {"since": attempt.heard_at or attempt.started_at, "reason": reason}
            record.held = set()  # whatever it lacks comes with its next assignment
        self._log("assignment.stalled", peer=attempt.peer, attempt=attempt.attempt_id, reason=reason)
        self._end_attempt(attempt, f"stalled: {reason}", now, failed=False, reassign=True)

    # ---------------------------------------------------------- user commands

    def check_invite(self, peer: str) -> None:
        """Raise the UsageError ``invite(peer)`` would raise; change nothing (the page answers invite() from it)."""
        if self.status == JobStatus.COMPLETED:
            raise UsageError(UsageReason.JOB_COMPLETED, "the job is completed; continue from a checkpoint to train more")
        if peer == self.my_peer_id:
            raise UsageError(UsageReason.INVITE_SELF, "the coordinator cannot invite itself")
        record = self.peers.get(peer)
        if record is not None and record.approved:  # a stopped or declined peer may be invited again
            raise UsageError(UsageReason.ALREADY_PARTICIPATING, f"peer {peer} already takes part in this job")

    def invite(self, peer: str, now: float) -> None:
        """Send an invitation: only descriptions, nothing is downloaded before acceptance."""
        self.check_invite(peer)
        record = self.peers[peer] = PeerRecord()  # a new invitation starts a new record
        record.move("invite")
        self._invited_at[peer] = now
        self._send_invitation(peer)
        self._log("invitation.sent", peer=peer)

    def _send_invitation(self, peer: str) -> None:
        self._send(peer, Invitation(self.spec.job_id, self.my_peer_id, self.spec.info.raw,
                                    self.spec.module.descriptor(), self.spec.data_bytes, self.spec.settings.to_json(),
                                    self.display_name))

    def start(self, now: float) -> None:
        if self.status == JobStatus.COMPLETED:
            raise UsageError(UsageReason.JOB_COMPLETED, "the job is completed; continue from a checkpoint to train more")
        if self.status == JobStatus.RUNNING:
            raise UsageError(UsageReason.ALREADY_RUNNING, "the job is already running")
        self._job("start")
        self.error = None
        self._log("job.started", round=self.checkpoint_round + 1)
        if self._baseline_pending:
            self._baseline_pending = False
            if validating(self.spec) and not self._validated(self.checkpoint_round):
                self._commands.append(self._validation_command())
        if loading(self.peers):
            self._grace_until = now + JOIN_GRACE_MS
        self._maybe_open_round(now)

    def pause(self, now: float) -> None:
        """Stop handing out work; open attempts finish and the round closes as usual."""
        if self.status != JobStatus.RUNNING:
            raise UsageError(UsageReason.NOT_RUNNING, f"the job is {self.status}, not running")
        self._job("pause")
        self._log("job.paused")

    def resume_running(self, now: float) -> None:
        if self.status != JobStatus.PAUSED:
            raise UsageError(UsageReason.NOT_PAUSED, f"the job is {self.status}, not paused")
        self.start(now)

    def stop(self, now: float) -> None:
        """End the job now: open attempts are discarded; the last checkpoint is the result."""
        if self.status == JobStatus.COMPLETED:
            raise UsageError(UsageReason.JOB_COMPLETED, "the job is already completed")
        for attempt in self.attempts.open():
            self._end_attempt(attempt, "the job was stopped", now, failed=False, reassign=False)
        self.attempts.clear()
        if self.securing:
            assert self.round is not None
            self.round.end(RoundEmpty(self.round.number))  # its secure aggregation is abandoned
        self._finish(now, incomplete=True)

    def reopened_completed(self) -> None:
        """The host reopened a job its record says is completed: it stays completed."""
        self._job("reopen_completed")

    def restore_checkpoints(self, summaries: list[dict[str, Any]]) -> None:
        """The summaries of checkpoints saved before this coordinator existed, oldest first
        (a reopened job's history, or the checkpoint a new job continues from).

        Their weight hashes come back too: snapshot slots (``initial``,
        ``roundsAgo``) name earlier checkpoints by rule.
        """
        self.checkpoints = [dict(s) for s in summaries]
        for summary in self.checkpoints:
            artifact = summary["artifact"]
            self.checkpoint_hashes.setdefault(int(artifact["round"]), str(artifact["sha256"]))

    def snapshot_checkpoints(self) -> dict[int, str]:
        """The checkpoints (round -> weights SHA-256) a snapshot slot may still name: the host keeps their weights."""
        if not self.checkpoint_hashes:
            return {}
        rounds = snapshot_rounds(self.spec, min(self.checkpoint_hashes), self.checkpoint_round)
        held = sorted({held_round(self.checkpoint_hashes, r) for r in rounds})
        return {r: self.checkpoint_hashes[r] for r in held}

    def update_settings(self, settings: TrainingSettings, now: float) -> None:
        """New settings apply from the next round (aggregation method changes restart its state).

        Raises:
            SettingsError: the model does not allow the method, or an
                experience job's last round is not above the current one.
        """
        check_method(self.spec.info, settings)
        if settings.privacy != self.spec.settings.privacy:
            # Participants accepted the job under its privacy: a change needs a new job (continue from a checkpoint).
            raise SettingsError("privacy", "cannot change while the job runs; continue from a checkpoint with "
                                "the new settings", SettingsReason.CONFLICTING_SETTING)
        if self.spec.is_experience:
            rounds_to_train(self.checkpoint_round, settings.epochs)
        if self.spec.is_experience and settings.experience is not None:
            check_units(self.spec.info, settings.experience.units_per_assignment)
            assert self.experience is not None
            self.experience.units_per_assignment = settings.experience.units_per_assignment
        participates = settings.coordinator_participates
        self.spec = self.spec.with_settings(settings)
        me = self.peers.get(self.my_peer_id)
        if participates and (me is None or me.state == PeerState.STOPPED):
            self._add_local_participant()
        elif not participates and me is not None and me.state != PeerState.STOPPED:
            me.move("withdraw")
            for attempt in self.attempts.open_of(self.my_peer_id):
                self._end_attempt(attempt, "the coordinator stopped participating", now, failed=False, reassign=True)
            self._maybe_close_round(now)
        if self.dataset is not None:
            self.dataset.planned_epochs = settings.epochs
            self.dataset.continue_passes()  # more epochs after the last one: the queue refills
        self._log("settings.updated", settings=settings.to_json())
        if self.status == JobStatus.COMPLETED and not self._work_done():
            self._job("more_work")

    def shuffle_chunks(self, seed: int, now: float) -> None:
        if self.dataset is None:
            raise UsageError(UsageReason.NOT_A_DATASET_JOB, "an experience job has no chunks to shuffle")
        self.dataset.shuffle(seed)
        self._log("chunks.shuffled")

    def request_validation(self, now: float) -> None:
        """runValidation(): evaluate the latest checkpoint now."""
        check_can_validate(self.spec)
        self._commands.append(self._validation_command())

    # ---------------------------------------------------------- peer events

    def remote_participants(self) -> list[str]:
        """The other peers that accepted and still take part (kept in the job record), sorted."""
        self._note_changed_peers()
        return list(self._members)

    def robust_records(self) -> dict[str, dict[str, Any]]:
        """Outlier counts and exclusions of the remote participants (kept in the job record)."""
        self._note_changed_peers()
        return {p: dict(state) for p, state in sorted(self._robust.items())}

    def members_version(self) -> int:
        """A number that moves whenever :meth:`remote_participants` or :meth:`robust_records` would answer
        differently: the job record, asked after every drain, is compared only when it moved."""
        self._note_changed_peers()
        return self._members_version

    def _note_changed_peers(self) -> None:
        # Asked after every drain: the work is the changed peers', not every peer's.
        members = self._members
        for peer in self.peers.changed:
            record = self.peers.get(peer)
            member = record is not None and peer != self.my_peer_id and record.approved
            i = bisect_left(members, peer)
            if member != (i < len(members) and members[i] == peer):
                self._members_version += 1
                if member:
                    members.insert(i, peer)
                else:
                    del members[i]
            state = record.robust_state() if member and record is not None else None
            if state != self._robust.get(peer):
                self._members_version += 1
            if state is None:
                self._robust.pop(peer, None)
            else:
                self._robust[peer] = state
        self.peers.changed.clear()

    def restore_participants(self, peers: Any, robust: Any = None) -> list[str]:
        """After a reload: the job's participants, disconnected until their channel opens again
        (``peer_connected`` then delivers the module and they catch up), with what robust aggregation
        knew of them, so an excluded participant stays excluded. Returns the peers whose saved robust
        state was not one (left at zero)."""
        saved = robust if isinstance(robust, dict) else {}
        refused = []
        for peer in peers:
            if isinstance(peer, str) and peer and peer != self.my_peer_id and peer not in self.peers:
                record = self.peers[peer] = PeerRecord(connected=False)
                record.move("restore")
                if peer in saved and not record.restore_robust(saved[peer]):
                    refused.append(peer)
        return refused

    def peer_connected(self, peer: str, now: float) -> None:
        record = self.peers.get(peer)
        if record is None:
            return
        record.connected = True
        if record.missed_end:
            record.missed_end = False
            self._send(peer, JobFinished(self.spec.job_id, self.incomplete))
            self._log("job.finished-told", peer=peer)
        if record.state == PeerState.DISCONNECTED:
            rejoins = record.rejoins
            record.move("rejoin" if rejoins else "reconnect")
            record.held = set()
            if rejoins:
                # A reconnecting participant catches up: module first, then the current checkpoint.
                self._deliver(peer)
            elif peer in self._invited_at:
                # The invitation, or the answer to it, may have been lost with the old channel (a channel
                # loses what it still held when it closes): asked again, the peer shows it or answers again.
                self._send_invitation(peer)
                self._log("invitation.resent", peer=peer)

    def peer_disconnected(self, peer: str, now: float) -> None:
        record = self.peers.get(peer)
        if record is None:
            return
        record.connected = False
        record.move("disconnect")
        if self.broadcast is not None:
            self.broadcast.peer_left(peer, now)
            self._commands.extend(self.broadcast.take_commands())
        for attempt in self.attempts.open_of(peer):
            self._end_attempt(attempt, "participant disconnected", now, failed=False, reassign=True)
        self._log("peer.disconnected", peer=peer)
        self._secure_drop(peer, now)
        self._maybe_close_round(now)

    def receive(self, peer: str, message: Message, blobs: Mapping[str, bytes], now: float) -> None:
        """A message from ``peer`` with the artifact bytes that came with it (by SHA-256)."""
        if message.job_id != self.spec.job_id:
            if isinstance(message, Update):
                self._reject(peer, message.attempt_id, "wrong-job", f"update for job {message.job_id!r}", now)
            else:
                self._log("message.ignored", peer=peer, reason="wrong-job", type=message.TYPE)
            return
        record = self.peers.get(peer)
        if record is not None and isinstance(message, DiagnosticsReport):
            # Also from a stopped peer: its last snapshot says its assignment ended with the job.
            if self.diagnostics_sink is not None:
                self.diagnostics_sink(peer, message.snapshot, now)
            return
        if record is None or record.state == PeerState.STOPPED:
            self._log("message.ignored", peer=peer, reason="not-a-participant", type=message.TYPE)
            return
        if isinstance(message, InvitationDecision):
            self._on_decision(peer, record, message, now)
        elif isinstance(message, ModuleStatus):
            self._on_module_status(peer, record, message, now)
        elif isinstance(message, TrainingStarted):
            attempt = self.attempts.open_one(message.attempt_id)
            if attempt is not None and attempt.peer == peer:
                attempt.move("started")
                self.attempts.heard(attempt, now, self.stall_timeout_ms)
                record.stuck = None
                if record.can("training_started"):
                    record.move("training_started")
        elif isinstance(message, Update):
            self._on_update(peer, record, message, blobs, now)
        elif isinstance(message, AssignmentFailed):
            attempt = self.attempts.open_one(message.attempt_id)
            if attempt is not None and attempt.peer == peer:
                self._end_attempt(attempt, message.error, now, failed=True, reassign=True)
                self._maybe_close_round(now)
        elif isinstance(message, PauseContribution):
            record.paused = message.paused
            self._log("participant.paused" if message.paused else "participant.resumed", peer=peer)
            if not message.paused:
                self._maybe_open_round(now)
        elif isinstance(message, Leave):
            record.move("leave")
            if self.broadcast is not None:  # what it was to relay goes direct
                self.broadcast.peer_left(peer, now)
                self._commands.extend(self.broadcast.take_commands())
            for attempt in self.attempts.open_of(peer):
                self._end_attempt(attempt, "participant left", now, failed=False, reassign=True)
            self._log("participant.left", peer=peer)
            self._secure_drop(peer, now)
            self._maybe_close_round(now)
        elif isinstance(message, RelayDone):
            if self.broadcast is not None:
                self.broadcast.relay_done(peer, message, now)
                self._commands.extend(self.broadcast.take_commands())
        elif isinstance(message, Progress):
            attempt = self.attempts.open_one(message.attempt_id)
            if attempt is None or attempt.peer != peer:
                self._log("message.ignored", peer=peer, reason="stale-attempt", type=message.TYPE)
            elif self.progress_sink is not None and not self.progress_sink(peer, message, now):
                self._log("message.ignored", peer=peer, reason="stale-progress", type=message.TYPE)
            else:
                self.attempts.heard(attempt, now, self.stall_timeout_ms)
        elif isinstance(message, ArtifactMissing):
            self._on_artifact_missing(peer, record, message.artifact, now)
        elif isinstance(message, SecAggKeys):
            self._on_keys(peer, record, message, now)
        elif isinstance(message, (SecAggShares, SecAggMasked, SecAggReveal)):
            self._on_secagg(peer, message, blobs, now)
        else:
            self._log("message.ignored", peer=peer, reason="unexpected-type", type=message.TYPE)

    def validation_finished(self, round_: int, metrics: Mapping[str, float] | None, error: str | None,
                            now: float, *, examples: int = 0) -> None:
        """The host ran RunValidation (over ``examples`` examples or units); attach the result
        to that checkpoint's summary."""
        self._validating.discard(round_)
        for summary in self.checkpoints:
            if summary["artifact"]["round"] == round_:
                if error is not None:
                    summary["validationError"] = error
                    summary.pop("validationMetrics", None)
                else:
                    summary["validationMetrics"] = {"values": dict(metrics or {}), "examplesProcessed": examples}
                    summary.pop("validationError", None)
                self._log("validation.finished", round=round_, error=error)
                self._tell_checkpoint(summary)
                return

    # ------------------------------------------------------- participant flow

    def _on_decision(self, peer: str, record: PeerRecord, message: InvitationDecision, now: float) -> None:
        if message.accepted and record.state == PeerState.DECLINED and record.expired \
                and self.status != JobStatus.COMPLETED:
            # Accepted just as it expired here (the two clocks differ): the peer waits for its module.
            record = self.peers[peer] = PeerRecord()
            record.move("invite")
        if record.state != PeerState.INVITED:
            self._log("message.ignored", peer=peer, reason="no-pending-invitation", type=message.TYPE)
            return
        self._invited_at.pop(peer, None)
        if not message.accepted:
            record.move("decline")
            record.declined = message.reason or "declined"
            self._log("invitation.declined", peer=peer, reason=record.declined)
            return
        record.move("accept")
        self._log("invitation.accepted", peer=peer)
        self._deliver(peer)

    def _deliver(self, peer: str) -> None:
        aux = dict(self.spec.auxiliary_files)
        gpu = self.spec.gpu.to_json() if self.spec.gpu is not None else None  # announced, not sent
        self._send(peer, Deliver(self.spec.job_id, self.spec.module.ref, self.spec.info.raw, aux, gpu,
                                 self.spec.working_bytes, self.spec.cpu_backend),
                   (self.spec.module.ref, *aux.values()))
        if peer != self.my_peer_id:  # the checkpoints saved before it joined, for its window
            for summary in self.checkpoints[-CHECKPOINTS_KEPT:]:
                self._send(peer, CheckpointNote.of(self.spec.job_id, summary))

    def _add_local_participant(self) -> None:
        """The coordinator's own participant machine joins without an invitation
        (the host builds it with ``Participant.local``)."""
        record = self.peers[self.my_peer_id] = PeerRecord()
        record.move("join_local")
        self._deliver(self.my_peer_id)

    def _on_module_status(self, peer: str, record: PeerRecord, message: ModuleStatus, now: float) -> None:
        event = "module_loaded" if message.loaded else "module_failed"
        if not record.approved or not record.can(event):
            self._log("message.ignored", peer=peer, reason="not-approved", type=message.TYPE)
            return
        record.move(event)
        if not message.loaded:
            self._log("participant.model-load-failed", peer=peer, error=message.error)
            return
        files = {self.spec.module.sha256, *(r.sha256 for r in self.spec.auxiliary_files.values())}
        record.held = set(message.held) | files
        # Only a participant that will train on its GPU asks for the WGSL archive: it comes with its next Assign.
        record.wants_shader_archive = message.fetch_shader_archive and self.spec.gpu is not None
        self._maybe_open_round(now)

    # ---------------------------------------------------------------- rounds

    def _job(self, event: str) -> None:
        self.status = move("job", JOB_TRANSITIONS, self.status, event)

    def _eligible(self) -> list[str]:
        return eligible(self.peers, self.attempts.busy_peers())

    def _maybe_open_round(self, now: float) -> None:
        opened = self._plan_round(now)
        if opened is not None:
            round_, planned = opened
            self._commands.extend(planned)
            self._after_opening(round_, now)

    def _plan_round(self, now: float) -> tuple[Round, list[Command]] | None:
        """Open the next round when the job can: the round and its commands (the Assigns, the relay's plans),
        not emitted yet. None when no round opens (the job may have completed instead)."""
        if self._grace_until is not None and not loading(self.peers):
            self._grace_until = None
        if self.status != JobStatus.RUNNING or self.attempts.round_open() or self._grace_until is not None \
                or self.securing:
            return None
        if self._work_done():
            self._finish(now, incomplete=False)
            return None
        peers = self._eligible()
        if not peers:
            return None
        number, last = self.checkpoint_round + 1, self.round
        opening = last.opening + 1 if last is not None and last.number == number else 1
        round_ = self.round = Round(number, self.spec, self.attempts.next_round(), self.stopwatch(), opening)
        if round_.terms is not None:
            peers = peers[:MAX_SECAGG_PEERS]  # the most a secure-aggregation roster lists
        planned: list[Command] = []
        for peer in peers:
            sent = self._hand_out(round_, peer, now)
            if sent is None:
                break
            planned += sent
        ref = ArtifactRef("checkpoint", self.weights_sha256, len(self.weights))
        return round_, round_.plan_relay(self.relays, planned, ref, self.weights, now)

    def _after_opening(self, round_: Round, now: float) -> None:
        if not round_.attempts.current:
            # Nothing could be handed out: every remaining chunk was dropped.
            self._close_round(now)

    def _relay_likely(self) -> bool:
        """Whether the next round will likely relay its checkpoint: two or more other peers can take work
        (``relay_assignments`` decides by the Sends it is given; a wrong guess costs a hash or saves none)."""
        return sum(1 for p in self._eligible() if p != self.my_peer_id) >= 2

    def _hand_out(self, round_: Round, peer: str, now: float) -> list[Command] | None:
        """The commands that give ``peer`` one assignment of ``round_``; None when no work is left this round."""
        units = None
        number = round_.number
        if self.dataset is not None:
            chunk_id = self.dataset.take(peer)
            if chunk_id is None:
                return None
            assignment_id = f"r{number}-{chunk_id}"
            seed = chunk_seed(self.spec.job_id, assignment_id)
        else:
            assert self.experience is not None and self.job_seed is not None
            units = self.experience.take()
            seed = assignment_seed(self.job_seed, units.start)
            assignment_id = f"r{number}-u{units.start}"
            chunk_id = None
        quiet = None if peer == self.my_peer_id else self.stall_timeout_ms
        attempt = round_.attempts.new(peer, number, assignment_id, chunk_id, units, seed, now, self.round_timeout_ms,
                                      quiet)
        record = self.peers[peer]
        record.move("assign")
        return [self._assign_send(round_, attempt, record),
                Log("assignment.sent", {"peer": peer, "round": number, "attempt": attempt.attempt_id})]

    def _assign_send(self, round_: Round, attempt: Attempt, record: PeerRecord, *, again: bool = False) -> Send:
        """The Assign of ``attempt``, with the artifacts ``record`` does not hold attached. ``again``: the
        first one was refused on arrival, and with it everything attached to it."""
        checkpoint_ref = ArtifactRef("checkpoint", self.weights_sha256, len(self.weights))
        assign, attachments = make_assign(round_.spec, attempt, checkpoint_ref, self.checkpoint_hashes,
                                          self.job_seed, shader_archive=record.wants_shader_archive,
                                          secure=round_.terms)
        if again:
            record.held -= {a.sha256 for a in attachments}
        needed: list[ArtifactRef] = []
        for a in attachments:
            # Once per version: the checkpoint and a snapshot may be the same bytes.
            if a.kind == "chunk" or a.sha256 not in record.held:
                needed.append(a)
                if a.kind != "chunk":
                    record.held.add(a.sha256)
        return Send(attempt.peer, assign, tuple(needed))

    def _on_artifact_missing(self, peer: str, record: PeerRecord, artifact: str, now: float) -> None:
        """``peer``'s frame reader refused a message of ours that named ``artifact`` as held: it is not.
        Its open assignment that names it goes again with it attached (bounded); later ones attach it anyway."""
        record.held.discard(artifact)
        round_ = self.round
        for attempt in self.attempts.open_of(peer):
            if round_ is None or attempt.round != round_.number or attempt.status is not AttemptStatus.LOADING:
                continue
            checkpoint_ref = ArtifactRef("checkpoint", self.weights_sha256, len(self.weights))
            assign, _ = make_assign(round_.spec, attempt, checkpoint_ref, self.checkpoint_hashes, self.job_seed,
                                    shader_archive=record.wants_shader_archive, secure=round_.terms)
            if artifact not in assign.artifacts():
                continue
            self.attempts.heard(attempt, now, self.stall_timeout_ms)
            if attempt.resends >= MAX_RESENDS:
                record.stuck = {"since": now, "reason": f"still lacks artifact {artifact[:12]}… after "
                                                        f"{MAX_RESENDS} resends"}
                self._end_attempt(attempt, f"lacks artifact {artifact[:12]}… after {MAX_RESENDS} resends", now,
                                  failed=False, reassign=True)
                self._maybe_close_round(now)
                return
            attempt.resends += 1
            record.stuck = {"since": now, "reason": f"lacked artifact {artifact[:12]}…; sent again"}
            self._commands.append(self._assign_send(round_, attempt, record, again=True))
            self._log("assignment.resent", peer=peer, attempt=attempt.attempt_id, artifact=artifact)
            return
        self._log("artifact.missing", peer=peer, artifact=artifact)

    def _end_attempt(self, attempt: Attempt, error: str, now: float, *, failed: bool, reassign: bool) -> None:
        """End an attempt without a valid update; its work goes back (first in line).

        ``failed`` counts against the work itself (the model or the data may
        be at fault), unlike a disconnect or a deadline. With ``reassign``
        an idle participant of this round takes the work at once.
        """
        self.attempts.stop(attempt, error)
        self._last_failure = f"{attempt.peer[:12]}: {error[:300]}"
        record = self.peers.get(attempt.peer)
        if record is not None and is_working(record.state):
            record.move("attempt_ended")
        self._log("assignment.stopped", peer=attempt.peer, attempt=attempt.attempt_id, error=error)
        progress.give_back(self.dataset, self.experience, attempt, failed=failed,
                           peers_available=available(self.peers))
        if reassign and self.status == JobStatus.RUNNING:
            taken = self.attempts.peers_of_round(attempt.round)
            idle = [p for p in self._eligible() if p not in taken]
            if idle and self.round is not None and self.round.number == attempt.round:
                self._commands.extend(self._hand_out(self.round, idle[0], now) or ())

    def _on_update(self, peer: str, record: PeerRecord, update: Update, blobs: Mapping[str, bytes],
                   now: float) -> None:
        checked: tuple[str, str] | BytesLike
        if record.excluded:  # aggregation.excludeOutliersAfter, or a bad share under secure aggregation
            checked = ("participant-excluded", "this participant was excluded from the job")
        elif self.spec.settings.privacy.secure_aggregation:
            # The job promised masked updates: one in the clear is not looked at, let alone averaged.
            checked = ("secure-aggregation", "this job's updates are securely aggregated, never sent in the clear")
        else:
            checked = check_update(self.attempts, peer, update, blobs, checkpoint_round=self.checkpoint_round,
                                   weights_sha256=self.weights_sha256, weight_bytes=self.spec.weight_bytes,
                                   assigned_count=self._assigned_count, first_non_finite=self.kernel.first_non_finite,
                                   decode=self._decoder())
        reason = checked if isinstance(checked, tuple) else None
        attempt = self.attempts.open_one(update.attempt_id)
        if reason is not None:
            code, text = reason
            self._reject(peer, update.attempt_id, code, text, now)
            if attempt is not None and attempt.peer == peer:
                self._end_attempt(attempt, f"update rejected: {text}", now, failed=True, reassign=True)
            self._maybe_close_round(now)
            return
        assert attempt is not None and not isinstance(checked, tuple)
        record.stuck = None
        self.attempts.accept(attempt, update, checked)
        if record.can("update_received"):
            record.move("update_received")
        self._send(peer, UpdateReceipt(self.spec.job_id, update.attempt_id, True))
        # What arrived: a compressed update's kind and size are the bytes that peer actually uploaded.
        self._log("update.accepted", peer=peer, attempt=update.attempt_id, count=update.count,
                  artifact=update.weights.kind, bytes=update.weights.bytes)
        self._maybe_close_round(now)

    def _decoder(self) -> Callable[[BytesLike], BytesLike] | None:
        """How a compressed update of this round becomes weights (None: the job sends float32 weights)."""
        compression = self.spec.settings.compression
        if compression is None:
            return None
        shape = layout(self.spec.weight_bytes, [(r.offset, r.bytes) for r in self.spec.info.average_only])
        start = self.weights
        return lambda data: decompress_update(self.kernel, start, data, compression, shape)

    def _assigned_count(self, attempt: Attempt) -> int:
        if attempt.units is not None:
            return attempt.units.count
        assert attempt.chunk_id is not None
        return self.spec.chunk(attempt.chunk_id).example_count

    def _reject(self, peer: str, attempt_id: str, code: str, text: str, now: float) -> None:
        self.rejected.append(RejectedUpdate(self.checkpoint_round + 1, peer, attempt_id, f"{code}: {text}", now))
        del self.rejected[:-1000]
        self._send(peer, UpdateReceipt(self.spec.job_id, attempt_id, False, f"{code}: {text}"))
        self._log("update.rejected", peer=peer, attempt=attempt_id, reason=code, detail=text)

    def _maybe_close_round(self, now: float) -> None:
        if self.attempts.all_ended():
            self._close_round(now)

    def _close_round(self, now: float) -> None:
        round_ = self.round
        assert round_ is not None
        for attempt in round_.attempts.open():
            self._end_attempt(attempt, "round closed", now, failed=False, reassign=False)
        received = round_.begin_closing()
        if round_.terms is not None:
            self._begin_secure(round_, now)
            return
        self.last_contributors = sorted(r.attempt.peer for r in received)
        if not received:
            round_.end(RoundEmpty(round_.number))
            self._empty_round(now)
            return
        if self.closing_sink is not None:
            self.closing_sink(round_.number)
        method = round_.spec.settings.aggregation.method
        self._commands.append(RoundPhase(round_.number, "round.training", round_.opened_at, self.stopwatch()))
        self._log("aggregation.started", round=round_.number, method=method, updates=len(received))
        started = self.stopwatch()
        try:
            record = round_.aggregate(self.kernel, self.weights, self.aggregation_state, received,
                                      digest=lambda w: self.relays.digest(w, relayed=self._relay_likely()),
                                      dp=self._dp_round(round_))
            aggregated = self.stopwatch()
            closed = self._closing(round_, record, now)
        except Exception as exc:  # noqa: BLE001 - whatever fails, the round must not half-close (issue 20)
            self._round_failed(round_, [r.attempt for r in received], exc)
            return
        self._empty_rounds = 0
        self._last_failure = None
        self._commands.append(RoundPhase(round_.number, method, started, aggregated))
        self._report_robust(round_, record)
        self._take_round(round_, closed, now)

    @property
    def dp_noise_seed(self) -> bytes | None:
        """The DP noise seed, for the owner's own job record (api/job_store.py) and nothing else."""
        return self._dp_noise_seed

    def _dp_round(self, round_: Round) -> DpRound | None:
        dp = round_.spec.settings.privacy.dp
        if dp is None:
            return None
        assert self._dp_noise_seed is not None  # __init__ refused a DP job without one
        return DpRound(dp, noise_key(self._dp_noise_seed, self.spec.job_id, round_.number))

    def _round_failed(self, round_: Round, trained: Iterable[Attempt], exc: Exception) -> None:
        """Closing ``round_`` raised ``exc`` before anything was written down: the previous checkpoint stays, the
        round's ``trained`` work goes back (not counted as a failure), and the job pauses with the cause."""
        reason = exc.reason if isinstance(exc, WeeiError) else type(exc).__name__
        text = (exc.message if isinstance(exc, WeeiError) else str(exc))[:500]
        round_.end(RoundFailed(round_.number, reason, text))
        for attempt in trained:
            progress.give_back(self.dataset, self.experience, attempt, failed=False)
        self._job("fail")
        self.error = (f"round {round_.number} failed: {text} ({reason}); the checkpoint of round "
                      f"{self.checkpoint_round} stays. Fix the cause (a lower server learning rate, for a non-finite "
                      "aggregate), then Resume")
        self._log("round.failed", round=round_.number, reason=reason, error=text)
        self._log("job.paused", reason="round-failed")

    # ------------------------------------------------------ secure aggregation

    def _on_keys(self, peer: str, record: PeerRecord, message: SecAggKeys, now: float) -> None:
        """A participant trained under secure aggregation and holds its update: its keys end its attempt."""
        round_ = self.round
        secure = round_.secure if round_ is not None else None
        attempts = [a for a in self.attempts.open_of(peer) if round_ is not None and a.round == round_.number]
        if secure is None or not secure.takes_keys(message) or not attempts:
            self._log("message.ignored", peer=peer, reason="no-open-secure-attempt", type=message.TYPE)
            return
        attempt = attempts[0]
        try:
            secure.add_keys(peer, attempt, message.keys, self.kernel.x25519)
        except SecAggError as exc:
            self._log("secagg.refused", peer=peer, reason=exc.reason, error=exc.message)
            self._end_attempt(attempt, f"secure aggregation: {exc.message}", now, failed=True, reassign=True)
            self._maybe_close_round(now)
            return
        record.stuck = None
        self.attempts.end_keyed(attempt)
        if record.can("update_received"):
            record.move("update_received")
        self._send(peer, UpdateReceipt(self.spec.job_id, attempt.attempt_id, True))
        self._log("update.keyed", peer=peer, attempt=attempt.attempt_id)
        self._maybe_close_round(now)

    def _on_secagg(self, peer: str, message: SecAggShares | SecAggMasked | SecAggReveal, blobs: Mapping[str, bytes],
                   now: float) -> None:
        round_ = self.round
        if round_ is None or not round_.securing or round_.secure is None:
            self._log("message.ignored", peer=peer, reason="no-secure-round", type=message.TYPE)
            return
        try:
            sends = round_.secure.receive(peer, message, blobs, now)
        except SecAggError as exc:  # dropped, named: the round goes on without this message
            self._log("secagg.refused", peer=peer, reason=exc.reason, error=exc.message)
            return
        self._commands.extend(sends)
        self._maybe_secure_done(round_, now)

    def _secure_drop(self, peer: str, now: float) -> None:
        round_ = self.round
        if round_ is not None and round_.securing and round_.secure is not None:
            self._commands.extend(round_.secure.drop(peer, now))
            self._maybe_secure_done(round_, now)

    def _begin_secure(self, round_: Round, now: float) -> None:
        """Every attempt of ``round_`` ended: secure aggregation runs among those that trained (they sent keys)."""
        secure = round_.secure
        assert secure is not None and round_.terms is not None
        keyed = secure.keyed
        self.last_contributors = []
        if not keyed:
            round_.end(RoundEmpty(round_.number))
            self._empty_round(now)
            return
        round_.closing = True
        if self.closing_sink is not None:
            self.closing_sink(round_.number)
        self._commands.append(RoundPhase(round_.number, "round.training", round_.opened_at, self.stopwatch()))
        self._log("secagg.started", round=round_.number, opening=round_.terms.opening, participants=sorted(keyed))
        gone = {peer for peer in keyed if (record := self.peers.get(peer)) is None or not record.connected
                or record.state == PeerState.STOPPED}
        self._commands.extend(secure.start(now, gone, self.secagg_phase_timeout_ms, self.kernel.x25519,
                                           self.stopwatch))
        self._maybe_secure_done(round_, now)

    def _maybe_secure_done(self, round_: Round, now: float) -> None:
        """A step of ``round_``'s secure aggregation may have concluded it: the round closes with what came."""
        secure = round_.secure
        if secure is None or not secure.done or round_.outcome is not None:
            return
        for peer in secure.bad_peers:
            self._exclude(peer, round_.number, SecAggReason.BAD_SHARE, "sent a share that fails its commitment")
        failure = secure.failure
        if failure is not None:
            self._secure_failed(round_, failure, now)
            return
        dropped = secure.dropped()
        # They trained, but vanished before their masked vector came: their work goes back.
        for attempt in secure.attempts_of(dropped):
            progress.give_back(self.dataset, self.experience, attempt, failed=False)
        try:
            record = secure.record(self.weights, self.kernel, self._dp_round(round_),
                                   digest=lambda w: self.relays.digest(w, relayed=self._relay_likely()),
                                   assigned_count=self._assigned_count)
            closed = self._closing(round_, record, now)
        except Exception as exc:  # noqa: BLE001 - as _close_round: the round must not half-close
            self._round_failed(round_, secure.attempts_of(secure.contributors), exc)
            return
        self.last_contributors = list(record.contributors)
        self._empty_rounds = 0
        self._last_failure = None
        self._commands.append(RoundPhase(round_.number, "secagg", secure.started_at, self.stopwatch()))
        self._log("secagg.finished", round=round_.number, opening=secure.terms.opening,
                  contributors=list(record.contributors), dropped=dropped)
        self._take_round(round_, closed, now)

    def _secure_failed(self, round_: Round, failure: SecAggError, now: float) -> None:
        """Secure aggregation of ``round_`` failed (fewer than t left, a bad dealer): nothing is written down, the
        trained work goes back, and the round opens again with fresh keys (an empty round, as far as pausing
        after MAX_EMPTY_ROUNDS goes)."""
        assert round_.secure is not None
        for attempt in round_.secure.attempts_of(round_.secure.keyed):
            progress.give_back(self.dataset, self.experience, attempt, failed=False)
        round_.end(RoundFailed(round_.number, failure.reason, failure.message))
        self._last_failure = f"secure aggregation: {failure.message[:300]}"
        self._log("secagg.failed", round=round_.number, opening=round_.opening, reason=failure.reason,
                  error=failure.message, peer=failure.peer)
        if failure.peer is not None and failure.reason in (SecAggReason.BAD_SHARE, SecAggReason.BAD_DEALER):
            self._exclude(failure.peer, round_.number, failure.reason, failure.message)
        self._empty_round(now)

    def _exclude(self, peer: str, round_: int, reason: str, why: str) -> None:
        """``peer`` broke the protocol: named in the log, and left out of the job's next rounds."""
        record = self.peers.get(peer)
        self._log("secagg.bad-peer", peer=peer, round=round_, reason=reason, error=why)
        if record is not None and not record.excluded:
            record.excluded = True  # eligible() skips it from now on
            self._log("peer.excluded", peer=peer, round=round_, reason=reason)

    def _report_robust(self, round_: Round, record: RoundRecord) -> None:
        """Log what robust aggregation did and name peers that are outliers round after round."""
        report = record.robust
        if report is None:
            return
        self._log("aggregation.robust", round=record.round, medianNorm=report.median_norm,
                  clipped=record.clipped, outliers=record.outliers, trimmed=report.trimmed)
        for peer in sorted(set(record.contributors)):
            peer_record = self.peers.get(peer)
            if peer_record is None:
                continue
            peer_record.note_round(peer in record.outliers)
            if peer_record.outlier_rounds >= REPEATED_OUTLIER_ROUNDS:
                self._log("peer.outlier", peer=peer, round=record.round, rounds=peer_record.outlier_rounds,
                          outliers=peer_record.outliers, clipped=peer in record.clipped)
            after = round_.spec.settings.aggregation.exclude_outliers_after
            if after is not None and peer_record.outlier_rounds >= after and not peer_record.excluded:
                peer_record.excluded = True  # eligible() skips it from now on; _on_update refuses its updates
                self._log("peer.excluded", peer=peer, round=record.round, rounds=peer_record.outlier_rounds,
                          outliers=peer_record.outliers)

    def _empty_round(self, now: float) -> None:
        self._empty_rounds += 1
        self._log("round.empty", round=self.checkpoint_round + 1)
        if self.dataset is not None:
            self.dataset.end_round()
        if self._empty_rounds >= MAX_EMPTY_ROUNDS:
            self._job("fail")
            cause = f" (last failure from {self._last_failure})" if self._last_failure else ""
            self.error = (f"no valid update in {self._empty_rounds} attempts at round "
                          f"{self.checkpoint_round + 1}{cause}; the checkpoint of round {self.checkpoint_round} stays. "
                          "Fix the cause (a learning rate or batch size far from the model's defaults is a common "
                          "one: Apply settings to job), then Resume")
            self._log("job.paused", reason="empty-rounds")
            return
        self._maybe_open_round(now)

    def _closing(self, round_: Round, record: RoundRecord, now: float) -> RoundClosed:
        """Checkpoint ``record.round`` built as it will be written down (recording the round's settings), the
        round's chunks marked trained on a copy of the schedule: nothing here changes the coordinator, so an
        error leaves it as it was."""
        dataset = self.dataset.copy() if self.dataset is not None else None
        epoch_done = False
        if dataset is not None:
            epoch_before = dataset.epoch
            for chunk_id in record.trained_chunks:
                dataset.mark_trained(chunk_id)
            dataset.end_round()
            epoch_done = dataset.epoch > epoch_before
        dp = round_.spec.settings.privacy.dp
        ledger = self.dp_ledger.after_round(dp.noise_multiplier) if dp is not None else None
        save, incomplete = self._build_checkpoint(
            now, round_=record.round, weights=record.weights, weights_sha256=record.weights_sha256,
            state=record.aggregation_state, dataset=dataset, metrics=record.metrics, examples=record.examples,
            spec=round_.spec, dp_ledger=ledger)
        return RoundClosed(record, dataset, epoch_done, save, incomplete, ledger)

    def _take_round(self, round_: Round, closed: RoundClosed, now: float) -> None:
        """Write down a closed round's checkpoint: schedules, weights, the saved file, validation, what next."""
        record, save = closed.record, closed.save
        self.dataset = closed.dataset
        self.weights = record.weights
        self.weights_sha256 = record.weights_sha256
        self.aggregation_state = record.aggregation_state
        self.checkpoint_round = record.round
        if closed.dp_ledger is not None:
            self.dp_ledger = closed.dp_ledger
            self._log("privacy.spent", round=record.round, **self._dp_view())
        self._record_checkpoint(save, closed.incomplete)
        work_done = self._work_done()
        if validation_due(self.spec, self.checkpoint_round, dataset_epoch=self.dataset.epoch if self.dataset else None,
                          epoch_done=closed.epoch_done, work_done=work_done):
            self._commands.append(self._validation_command())
        # The next round's work goes out first: writing the file (hashing the state, joining the parts)
        # does not hold up the participants (issue 11, P4). Then the save, the one place it is emitted,
        # before whatever the next round's own closing emits (a round that could not hand anything out
        # closes at once, and may end the job and write this checkpoint again).
        opened = None if work_done else self._plan_round(now)
        if opened is not None:
            self._commands.extend(opened[1])
        self._commands.append(save)
        round_.end(closed)
        if work_done:
            self._finish(now, incomplete=False)
        elif opened is not None:
            self._after_opening(opened[0], now)

    def _work_done(self) -> bool:
        return (progress.work_done(self.dataset, self.checkpoint_round, self.spec.settings.epochs)
                or self._dp_rounds_spent())

    def _dp_rounds_spent(self) -> bool:
        """privacy.dp.maxRounds rounds have run under DP: the planned ε is spent, the job ends."""
        dp = self.spec.settings.privacy.dp
        return dp is not None and self.dp_ledger.rounds >= dp.max_rounds

    def _dp_metadata(self, ledger: DpLedger | None, spec: JobSpec) -> dict[str, Any] | None:
        """A checkpoint's ``privacy``: the ledger after its round, or the one it continues."""
        dp = spec.settings.privacy.dp
        # Settings without DP record nothing: their rounds add unbounded loss, which no ε states.
        return None if dp is None else {"dp": dp.ledger_json(ledger or self.dp_ledger)}

    def _dp_view(self) -> dict[str, Any]:
        """ε spent so far and planned, at the job's δ (the state's ``privacy.dp``)."""
        dp = self.spec.settings.privacy.dp
        assert dp is not None
        return {**dp.ledger_json(self.dp_ledger), "maxRounds": dp.max_rounds,
                "plannedEpsilon": epsilon_json(dp.planned_epsilon)}

    def _dropped_work(self) -> bool:
        return progress.dropped_work(self.dataset, self.experience)

    def _finish(self, now: float, *, incomplete: bool) -> None:
        self.incomplete = incomplete or self._dropped_work()
        if self._dropped_work() and self._work_done() and not self._saved_incomplete and self.checkpoints:
            # Work was dropped after the last checkpoint: write that checkpoint again (same round,
            # same weights) so its file says the job ended incomplete and which chunks were trained.
            last = self.checkpoints[-1]
            self._save_checkpoint(now, metrics=dict(last["metrics"]["values"]),
                                  examples=last["metrics"]["examplesProcessed"], replace_last=True)
        self._job("complete")
        self._grace_until = None
        for peer, record in self.peers.items():
            if record.approved and record.connected:
                self._send(peer, JobFinished(self.spec.job_id, self.incomplete))
            elif record.approved and peer != self.my_peer_id:
                record.missed_end = True  # told when its channel opens again (peer_connected)
            if record.approved:
                # JobFinished stops the participant; training more needs a new invitation.
                record.move("finish")
        self._log("job.completed", round=self.checkpoint_round, incomplete=self.incomplete)

    def _validated(self, round_: int) -> bool:
        """Checkpoint ``round_`` has a validation result, or one is on its way (runValidation before Start)."""
        return any(c["artifact"]["round"] == round_ and ("validationMetrics" in c or "validationError" in c)
                   for c in self.checkpoints) or round_ in self._validating

    def _validation_command(self) -> RunValidation:
        self._validating.add(self.checkpoint_round)
        return validation_command(self.spec, self.checkpoint_round, self.weights_sha256, self.checkpoint_hashes,
                                  self.job_seed)

    # ------------------------------------------------------------ checkpoints

    def _save_checkpoint(self, now: float, *, metrics: dict[str, float], examples: int,
                         replace_last: bool = False) -> None:
        """Record checkpoint ``checkpoint_round`` of the current weights (its summary, the participants'
        notes) and emit its SaveCheckpoint; ``replace_last`` writes the last one again."""
        last = self.round
        save, incomplete = self._build_checkpoint(
            now, round_=self.checkpoint_round, weights=self.weights, weights_sha256=self.weights_sha256,
            state=self.aggregation_state, dataset=self.dataset, metrics=metrics, examples=examples,
            spec=last.spec if replace_last and last is not None and last.number == self.checkpoint_round else None)
        if replace_last:
            save = replace(save, summary={**self.checkpoints.pop(), **save.summary})  # keeps a validation already attached
        self._record_checkpoint(save, incomplete)
        self._commands.append(save)

    def _build_checkpoint(self, now: float, *, round_: int, weights: bytes, weights_sha256: str,
                          state: AggregationState | None, dataset: DatasetSchedule | None,
                          metrics: dict[str, float], examples: int,
                          spec: JobSpec | None = None, dp_ledger: DpLedger | None = None) -> tuple[SaveCheckpoint, bool]:
        """Checkpoint ``round_``'s checked file and summary (recording ``spec``'s settings: the round's; by
        default the job's), and whether it says the job ended incomplete; changes nothing. Raises
        CheckpointError when the file would not pass the reader's checks."""
        incomplete = (progress.work_done(dataset, round_, self.spec.settings.epochs)
                      and progress.dropped_work(dataset, self.experience))
        metadata = progress.checkpoint_metadata(
            spec or self.spec, round_=round_, weights_sha256=weights_sha256, weight_bytes=len(weights),
            metrics=metrics, examples=examples, incomplete=incomplete,
            progress=progress.recorded(dataset, self.experience, self.job_seed),
            aggregation=state, privacy=self._dp_metadata(dp_ledger, spec or self.spec))
        # Aggregation already refused non-finite results; checkpoint 0 and continued weights are checked here.
        checked = ckpt.prepare_checkpoint(metadata, weights, state.data if state is not None else None,
                                          weights_sha256=weights_sha256,
                                          finite_checked=round_ > self.first_round - 1)
        summary = ckpt.checkpoint_summary(metadata, now, dataset_progress=(
            dataset.progress if dataset is not None else None))
        return SaveCheckpoint(round_, checked, weights_sha256, summary), incomplete

    def _record_checkpoint(self, save: SaveCheckpoint, incomplete: bool) -> None:
        """Write down a built checkpoint (its hash, summary and the participants' notes); cannot fail."""
        self.checkpoint_hashes[save.round] = save.weights_sha256
        self._saved_incomplete = incomplete
        self.checkpoints.append(save.summary)
        self._log("checkpoint.saved", round=save.round, sha256=save.weights_sha256)
        self._tell_checkpoint(save.summary)

    def _tell_checkpoint(self, summary: dict[str, Any]) -> None:
        """The participants' windows list the checkpoints too: a note (no weights) to each one taking part."""
        note = CheckpointNote.of(self.spec.job_id, summary)
        for peer, record in self.peers.items():
            # Stopped: the job finished and a validation result came after (former members only).
            if peer != self.my_peer_id and record.connected and (record.approved or record.state == PeerState.STOPPED):
                self._send(peer, note)

    # --------------------------------------------------------------- helpers

    def _send(self, peer: str, message: Message, attachments: tuple[ArtifactRef, ...] = ()) -> None:
        self._commands.append(Send(peer, message, attachments))

    def _log(self, event: str, **details: Any) -> None:
        self._commands.append(Log(event, details))

    # ------------------------------------------------------------------ view

    def view(self, now: float) -> dict[str, Any]:
        """The spec's TrainingJob for this job (a fresh dict, no weights or data)."""
        out: dict[str, Any] = {
            "id": self.spec.job_id,
            "role": "coordinator",
            "status": str(self.status),
            "owner": self.my_peer_id,
            "info": self.spec.info.raw,
            "settings": self.spec.settings.to_json(),
            "participants": {p: r.to_json() for p, r in self.peers.items()},
            "queue": list(self.dataset.queue) if self.dataset is not None else [],
            "checkpoints": [dict(c) for c in self.checkpoints],
            "slots": [a.to_json() for a in self.attempts.current],
            "incomplete": self.incomplete,
            "shuffled": bool(self.dataset and self.dataset.shuffled),
            "validationUnavailable": False,
            "module": self.spec.module.descriptor(),
        }
        if self.dataset is not None:
            out["datasetEpoch"] = self.dataset.epoch
            out["progress"] = {
                "datasetEpoch": self.dataset.epoch,
                "plannedEpochs": self.spec.settings.epochs,
                "remainingChunks": len(self.dataset.remaining),
                "totalChunks": len(self.spec.chunks),
                "running": self.status == JobStatus.RUNNING,
            }
        if self.spec.settings.privacy.dp is not None:
            out["privacy"] = {"dp": self._dp_view()}
        if self.error:
            out["error"] = self.error
        return out
