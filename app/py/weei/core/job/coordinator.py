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

A round closes when every attempt has an outcome, or at its deadline,
into checkpoint ``r`` (``core/job/round_loop.py`` runs the rounds; this module
takes the host's commands and the peers' events). A round with no valid
update keeps the previous checkpoint and tries again; a round that cannot
close (a non-finite aggregate, any error) keeps it too and pauses the job
with the error.

The job's status, each participant's record and each attempt move only
along the transition tables of ``core/states.py``; this class is the only
writer of its fields (the host asks, through methods).

Everything comes in as method calls with ``now`` (ms since epoch) and goes
out as commands (``take_commands``); the host asks ``next_timer()`` when to
call ``handle_timer``. Nothing here reads a clock or does I/O.
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable, Mapping

from ..formats import checkpoint as ckpt
from . import progress
from ..aggregation.aggregate import AggregationState
from .attempts import RoundAttempts
from ..wire.commands import Log
from ..errors import UsageError
from .spec import JobSpec
from .participant import CHECKPOINTS_KEPT
from ..wire.messages import (
    AssignmentFailed, CheckpointNote, Deliver, DiagnosticsReport, Invitation, InvitationDecision, Leave, Message, ModuleStatus,
    PauseContribution, Progress, RelayDone, TrainingStarted, Update,
)
from .peers import PeerRecord, loading
from ..links.relay import Relays
from .round_loop import MAX_EMPTY_ROUNDS, RejectedUpdate, RoundLoop
from .round_rules import Kernel, check_can_validate, check_method, check_units, held_round, snapshot_rounds
from .schedule import DatasetSchedule, ExperienceSchedule
from ..formats.seeds import rounds_to_train
from ..formats.settings import TrainingSettings
from ..states import JobStatus, PeerState

__all__ = ["Coordinator", "RejectedUpdate", "DEFAULT_ROUND_TIMEOUT_MS", "JOIN_GRACE_MS", "MAX_EMPTY_ROUNDS"]

DEFAULT_ROUND_TIMEOUT_MS = 10 * 60 * 1000
# After start(), participants still loading the module get this long to be
# ready, so the first round is not trained by whoever happened to be first.
JOIN_GRACE_MS = 10_000


def _no_stopwatch() -> float:
    """A host that sets no stopwatch gets phases of zero length."""
    return 0.0


class Coordinator(RoundLoop):
    """One job, seen from the browser that coordinates it. Build with ``create`` or ``resume``."""

    def __init__(self, spec: JobSpec, *, my_peer_id: str, kernel: Kernel, weights: bytes, round_: int,
                 now: float, job_seed: int | None, round_timeout_ms: float, aggregation_state: AggregationState | None,
                 dataset: DatasetSchedule | None, experience: ExperienceSchedule | None,
                 checkpoint_hashes: dict[int, str], first_round: int) -> None:
        self.spec = spec
        self.my_peer_id = my_peer_id
        self.kernel = kernel
        self.round_timeout_ms = round_timeout_ms
        self.status = JobStatus.READY
        self.error = None
        self.incomplete = False
        self.weights = weights
        self.weights_sha256 = hashlib.sha256(weights).hexdigest()
        self.checkpoint_round = round_
        self.first_round = first_round  # rounds before it belong to the checkpoint we continued from
        self.job_seed = job_seed
        self.aggregation_state = aggregation_state
        self.dataset = dataset
        self.experience = experience
        self.checkpoint_hashes = dict(checkpoint_hashes)
        self.checkpoints = []
        self.peers = {}
        self.attempts = RoundAttempts()
        self.rejected = []
        self._empty_rounds = 0
        self.last_contributors = []
        self._saved_incomplete = False
        self._grace_until = None
        self._commands = []
        self.diagnostics_sink: Callable[[str, dict[str, Any], float], None] | None = None
        self.stopwatch = _no_stopwatch  # the host sets its monotonic clock: phases get their durations
        self._round_opened = None
        self.relays = Relays(my_peer_id, spec.job_id, sha256_many=kernel.sha256_many)
        self.broadcast = None
        # Live progress of an open attempt goes to the host's LiveProgress book (bounded per peer);
        # it answers False for a report older than the one it holds.
        self.progress_sink: Callable[[str, Progress, float], bool] | None = None
        if spec.settings.coordinator_participates:
            self._add_local_participant()

    # ----------------------------------------------------------------- creation

    @classmethod
    def create(cls, spec: JobSpec, initial_weights: bytes, *, my_peer_id: str, kernel: Kernel, now: float,
               job_seed: int | None = None, round_timeout_ms: float = DEFAULT_ROUND_TIMEOUT_MS) -> Coordinator:
        """A new job at checkpoint 0; emits SaveCheckpoint for it.

        Raises:
            UsageError: an experience job without ``job_seed``, or weights of the wrong size.
        """
        if len(initial_weights) != spec.weight_bytes:
            raise UsageError("wrong-weight-size", f"initial weights are {len(initial_weights)} bytes, "
                                                  f"the model declares {spec.weight_bytes}")
        dataset, experience = progress.new_schedules(spec, job_seed)
        self = cls(spec, my_peer_id=my_peer_id, kernel=kernel, weights=bytes(initial_weights), round_=0, now=now,
                   job_seed=job_seed, round_timeout_ms=round_timeout_ms, aggregation_state=None, dataset=dataset,
                   experience=experience, checkpoint_hashes={}, first_round=1)
        self._save_checkpoint(now, metrics={}, examples=0)
        return self

    @classmethod
    def resume(cls, spec: JobSpec, checkpoint: ckpt.Checkpoint, *, mode: str, my_peer_id: str, kernel: Kernel,
               now: float,
               new_job_seed: int | None = None, reopening: bool = False,
               round_timeout_ms: float = DEFAULT_ROUND_TIMEOUT_MS) -> Coordinator:
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
                   first_round=round_ + 1)
        self._commands.append(Log("job.continued", {"fromRound": round_, "datasetMode": mode}))
        return self

    # ------------------------------------------------------------ host surface

    def take_commands(self) -> list[Command]:
        """The commands emitted since the last call, in order."""
        out, self._commands = self._commands, []
        return out

    def next_timer(self) -> float | None:
        """When ``handle_timer`` must next be called (ms since epoch), or None."""
        times = [t for t in (self.attempts.next_deadline(), self._grace_until) if t is not None]
        relay_due = self.broadcast.next_timer() if self.broadcast is not None else None
        if relay_due is not None:
            times.append(relay_due)
        return min(times) if times else None

    def handle_timer(self, now: float) -> None:
        if self._grace_until is not None and now >= self._grace_until:
            self._grace_until = None
            self._maybe_open_round(now)
        if self.broadcast is not None:
            self.broadcast.handle_timer(now)
            self._commands += self.broadcast.take_commands()
        late = self.attempts.late(now)
        for attempt in late:
            self._end_attempt(attempt, "missed the round deadline", now, failed=False, reassign=False)
        if late:
            self._close_round(now)

    # ---------------------------------------------------------- user commands

    def check_invite(self, peer: str) -> None:
        """Raise the UsageError ``invite(peer)`` would raise; change nothing (the page answers invite() from it)."""
        if self.status == JobStatus.COMPLETED:
            raise UsageError("job-completed", "the job is completed; continue from a checkpoint to train more")
        if peer == self.my_peer_id:
            raise UsageError("invite-self", "the coordinator cannot invite itself")
        record = self.peers.get(peer)
        if record is not None and record.approved:  # a stopped or declined peer may be invited again
            raise UsageError("already-participating", f"peer {peer} already takes part in this job")

    def invite(self, peer: str, now: float) -> None:
        """Send an invitation: only descriptions, nothing is downloaded before acceptance."""
        self.check_invite(peer)
        record = self.peers[peer] = PeerRecord()  # a new invitation starts a new record
        record.move("invite")
        self._send(peer, Invitation(self.spec.job_id, self.my_peer_id, self.spec.info.raw,
                                    self.spec.module.descriptor(), self.spec.data_bytes, self.spec.settings.to_json()))
        self._log("invitation.sent", peer=peer)

    def start(self, now: float) -> None:
        if self.status == JobStatus.COMPLETED:
            raise UsageError("job-completed", "the job is completed; continue from a checkpoint to train more")
        if self.status == JobStatus.RUNNING:
            raise UsageError("already-running", "the job is already running")
        self._job("start")
        self.error = None
        self._log("job.started", round=self.checkpoint_round + 1)
        if loading(self.peers):
            self._grace_until = now + JOIN_GRACE_MS
        self._maybe_open_round(now)

    def pause(self, now: float) -> None:
        """Stop handing out work; open attempts finish and the round closes as usual."""
        if self.status != JobStatus.RUNNING:
            raise UsageError("not-running", f"the job is {self.status}, not running")
        self._job("pause")
        self._log("job.paused")

    def resume_running(self, now: float) -> None:
        if self.status != JobStatus.PAUSED:
            raise UsageError("not-paused", f"the job is {self.status}, not paused")
        self.start(now)

    def stop(self, now: float) -> None:
        """End the job now: open attempts are discarded; the last checkpoint is the result."""
        if self.status == JobStatus.COMPLETED:
            raise UsageError("job-completed", "the job is already completed")
        for attempt in self.attempts.open():
            self._end_attempt(attempt, "the job was stopped", now, failed=False, reassign=False)
        self.attempts.clear()
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
            raise UsageError("not-a-dataset-job", "an experience job has no chunks to shuffle")
        self.dataset.shuffle(seed)
        self._log("chunks.shuffled")

    def request_validation(self, now: float) -> None:
        """runValidation(): evaluate the latest checkpoint now."""
        check_can_validate(self.spec)
        self._commands.append(self._validation_command())

    # ---------------------------------------------------------- peer events

    def remote_participants(self) -> list[str]:
        """The other peers that accepted and still take part (kept in the job record)."""
        return sorted(p for p, r in self.peers.items() if p != self.my_peer_id and r.approved)

    def robust_records(self) -> dict[str, dict[str, Any]]:
        """Outlier counts and exclusions of the remote participants (kept in the job record)."""
        return {p: state for p, r in sorted(self.peers.items())
                if p != self.my_peer_id and r.approved and (state := r.robust_state()) is not None}

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
        if record.state == PeerState.DISCONNECTED:
            rejoins = record.rejoins
            record.move("rejoin" if rejoins else "reconnect")
            record.held = set()
            if rejoins:
                # A reconnecting participant catches up: module first, then the current checkpoint.
                self._deliver(peer)

    def peer_disconnected(self, peer: str, now: float) -> None:
        record = self.peers.get(peer)
        if record is None:
            return
        record.connected = False
        record.move("disconnect")
        if self.broadcast is not None:
            self.broadcast.peer_left(peer, now)
            self._commands += self.broadcast.take_commands()
        for attempt in self.attempts.open_of(peer):
            self._end_attempt(attempt, "participant disconnected", now, failed=False, reassign=True)
        self._log("peer.disconnected", peer=peer)
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
                self._commands += self.broadcast.take_commands()
            for attempt in self.attempts.open_of(peer):
                self._end_attempt(attempt, "participant left", now, failed=False, reassign=True)
            self._log("participant.left", peer=peer)
            self._maybe_close_round(now)
        elif isinstance(message, RelayDone):
            if self.broadcast is not None:
                self.broadcast.relay_done(peer, message, now)
                self._commands += self.broadcast.take_commands()
        elif isinstance(message, Progress):
            attempt = self.attempts.open_one(message.attempt_id)
            if attempt is None or attempt.peer != peer:
                self._log("message.ignored", peer=peer, reason="stale-attempt", type=message.TYPE)
            elif self.progress_sink is not None and not self.progress_sink(peer, message, now):
                self._log("message.ignored", peer=peer, reason="stale-progress", type=message.TYPE)
        else:
            self._log("message.ignored", peer=peer, reason="unexpected-type", type=message.TYPE)

    def validation_finished(self, round_: int, metrics: Mapping[str, float] | None, error: str | None,
                            now: float, *, examples: int = 0) -> None:
        """The host ran RunValidation (over ``examples`` examples or units); attach the result
        to that checkpoint's summary."""
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
        if record.state != PeerState.INVITED:
            self._log("message.ignored", peer=peer, reason="no-pending-invitation", type=message.TYPE)
            return
        if not message.accepted:
            record.move("decline")
            self._log("invitation.declined", peer=peer)
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
        if self.error:
            out["error"] = self.error
        return out
