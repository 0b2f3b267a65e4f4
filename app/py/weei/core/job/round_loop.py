"""The coordinator's round loop: hand work out, collect updates, close the round into a checkpoint.

Theory of operation
-------------------
While the job runs, round ``r`` trains from checkpoint ``r - 1``
(``_maybe_open_round``): every eligible participant (accepted, connected,
module loaded, not paused) gets at most one assignment (``_hand_out``), a
dataset chunk or an experience unit range with its seed. Each hand-out is
an *attempt* (``core/job/attempts.py``), so anything that arrives for an
attempt that is no longer open (late, stale, duplicate, off-policy) is
recognised and discarded, never averaged (``_on_update``).

An attempt ends with a valid update, or without one (``_end_attempt``:
disconnect, deadline, rejected update, model error); then its work goes
back, to an idle participant at once when there is one, otherwise to the
front of the queue for the next round. A round closes (``_close_round``)
when every attempt has an outcome, or at its deadline: the pure
``round_rules.close_round`` aggregates the valid updates (FedAvg in canonical
order, then FedAvgM/FedAdam, and the weighted metrics) into the record of
checkpoint ``r``; ``_closing`` builds and checks that checkpoint's file on a
copy of the schedule, and only then ``_take_round`` writes it all down and
saves it. Closing is all or nothing: any error before the write-down (a
non-finite aggregate, a file that would not pass the reader's checks, a
bug) leaves the round counter, weights and checkpoints as they were, gives
the round's trained work back and pauses the job with the cause
(``_round_failed``: ``round.failed`` and ``job.paused`` reason
``round-failed`` in the log, ``error`` in the state), so the person can fix
it (a lower server learning rate, say) and resume. A round with no valid
update keeps the previous checkpoint and tries again; after
``MAX_EMPTY_ROUNDS`` of them the job pauses too. When the work is done the
job completes (``_finish``) and every participant is told.

:class:`RoundLoop` is the half of :class:`~weei.core.job.coordinator.Coordinator`
that runs rounds; the other half takes the host's commands and the peers'
events. The state both share is declared here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

from ..formats import checkpoint as ckpt
from . import progress
from ..aggregation.aggregate import AggregationState
from .attempts import Attempt, Received, RoundAttempts, check_update
from ..wire.commands import Command, Log, Phase, RunValidation, SaveCheckpoint, Send
from ..errors import WeeiError
from .spec import JobSpec
from ..wire.messages import ArtifactRef, CheckpointNote, JobFinished, Message, Update, UpdateReceipt
from .peers import PeerRecord, available, eligible, loading
from ..links.relay import Broadcast, Relays, relay_assignments
from .round_rules import (
    Kernel, RoundRecord, chunk_seed, close_round, make_assign, validation_command, validation_due,
)
from .schedule import DatasetSchedule, ExperienceSchedule
from ..formats.seeds import assignment_seed
from ..states import JOB_TRANSITIONS, JobStatus, PeerState, is_working, move

__all__ = ["RoundLoop", "RejectedUpdate", "MAX_EMPTY_ROUNDS", "REPEATED_OUTLIER_ROUNDS"]

# Rounds in a row without a single valid update before the job pauses itself:
# retrying forever would only burn the participants' machines.
MAX_EMPTY_ROUNDS = 5

# Rounds in a row whose update was an outlier before a peer is named in the
# debug log (``peer.outlier``): one odd round is noise, three is a pattern.
REPEATED_OUTLIER_ROUNDS = 3


@dataclass(frozen=True)
class _Closing:
    """A closed round, built but not written down yet: its record, the schedule after it, its checkpoint."""

    record: RoundRecord
    dataset: DatasetSchedule | None  # a copy with the round's chunks trained
    epoch_done: bool
    save: SaveCheckpoint
    incomplete: bool  # the checkpoint says the job ended incomplete


@dataclass(frozen=True)
class RejectedUpdate:
    """An update (or attempt) that did not count, and why."""

    round: int
    peer: str
    attempt_id: str
    reason: str
    at: float


class RoundLoop:
    """Rounds of one job: the state they share with the rest of the coordinator, and the loop itself."""

    spec: JobSpec
    my_peer_id: str
    kernel: Kernel
    round_timeout_ms: float
    status: JobStatus
    error: str | None
    incomplete: bool
    weights: bytes
    weights_sha256: str
    checkpoint_round: int
    first_round: int  # rounds before it belong to the checkpoint we continued from
    job_seed: int | None
    aggregation_state: AggregationState | None
    dataset: DatasetSchedule | None
    experience: ExperienceSchedule | None
    checkpoint_hashes: dict[int, str]
    checkpoints: list[dict[str, Any]]
    peers: dict[str, PeerRecord]
    attempts: RoundAttempts
    rejected: list[RejectedUpdate]
    last_contributors: list[str]
    _empty_rounds: int
    # Why the last attempt ended without a valid update: the cause a paused job names in its error.
    _last_failure: str | None = None
    _saved_incomplete: bool
    _grace_until: float | None
    _commands: list[Command]
    # The host's monotonic clock (ms), read only to time phases for the debug log.
    stopwatch: Callable[[], float]
    _round_opened: float | None  # the stopwatch when the open round's work went out
    relays: Relays  # the job's relay policy (core/links/relay.py)
    broadcast: Broadcast | None  # the open round's relayed checkpoint, if it is relayed

    def _job(self, event: str) -> None:
        self.status = move("job", JOB_TRANSITIONS, self.status, event)

    # ---------------------------------------------------------------- rounds

    def _eligible(self) -> list[str]:
        return eligible(self.peers, self.attempts.busy_peers())

    def _maybe_open_round(self, now: float) -> None:
        if self._grace_until is not None and not loading(self.peers):
            self._grace_until = None
        if self.status != JobStatus.RUNNING or self.attempts.round_open() or self._grace_until is not None:
            return
        if self._work_done():
            self._finish(now, incomplete=False)
            return
        peers = self._eligible()
        if not peers:
            return
        self.attempts.clear()
        round_ = self.checkpoint_round + 1
        mark = len(self._commands)
        for peer in peers:
            if not self._hand_out(peer, round_, now):
                break
        # Participants relay the checkpoint to each other rather than each getting it from here.
        ref = ArtifactRef("checkpoint", self.weights_sha256, len(self.weights))
        self._commands[mark:], self.broadcast = relay_assignments(self.relays, self._commands[mark:], ref,
                                                                  self.weights, round_, now)
        self._round_opened = self.stopwatch()
        if not self.attempts.current:
            # Nothing could be handed out: every remaining chunk was dropped.
            self._close_round(now)

    def _relay_likely(self) -> bool:
        """Whether the next round will likely relay its checkpoint: two or more other peers can take work
        (``relay_assignments`` decides by the Sends it is given; a wrong guess costs a hash or saves none)."""
        return sum(1 for p in self._eligible() if p != self.my_peer_id) >= 2

    def _hand_out(self, peer: str, round_: int, now: float) -> bool:
        """Give ``peer`` one assignment of ``round_``; False when no work is left this round."""
        units = None
        if self.dataset is not None:
            chunk_id = self.dataset.take(peer)
            if chunk_id is None:
                return False
            assignment_id = f"r{round_}-{chunk_id}"
            seed = chunk_seed(self.spec.job_id, assignment_id)
        else:
            assert self.experience is not None and self.job_seed is not None
            units = self.experience.take()
            seed = assignment_seed(self.job_seed, units.start)
            assignment_id = f"r{round_}-u{units.start}"
            chunk_id = None
        attempt = self.attempts.new(peer, round_, assignment_id, chunk_id, units, seed, now, self.round_timeout_ms)
        record = self.peers[peer]
        record.move("assign")
        checkpoint_ref = ArtifactRef("checkpoint", self.weights_sha256, len(self.weights))
        assign, attachments = make_assign(self.spec, attempt, checkpoint_ref, self.checkpoint_hashes, self.job_seed,
                                          shader_archive=record.wants_shader_archive)
        needed: list[ArtifactRef] = []
        for a in attachments:
            # Once per version: the checkpoint and a snapshot may be the same bytes.
            if a.kind == "chunk" or a.sha256 not in record.held:
                needed.append(a)
                if a.kind != "chunk":
                    record.held.add(a.sha256)
        self._send(peer, assign, tuple(needed))
        self._log("assignment.sent", peer=peer, round=round_, attempt=attempt.attempt_id)
        return True

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
            if idle:
                self._hand_out(idle[0], attempt.round, now)

    def _on_update(self, peer: str, record: PeerRecord, update: Update, blobs: Mapping[str, bytes],
                   now: float) -> None:
        if record.excluded:  # aggregation.excludeOutliersAfter
            reason: tuple[str, str] | None = ("participant-excluded",
                                              "this participant was excluded from the job as a repeated outlier")
        else:
            reason = check_update(self.attempts, peer, update, blobs, checkpoint_round=self.checkpoint_round,
                                  weights_sha256=self.weights_sha256, weight_bytes=self.spec.weight_bytes,
                                  assigned_count=self._assigned_count, first_non_finite=self.kernel.first_non_finite)
        attempt = self.attempts.open_one(update.attempt_id)
        if reason is not None:
            code, text = reason
            self._reject(peer, update.attempt_id, code, text, now)
            if attempt is not None and attempt.peer == peer:
                self._end_attempt(attempt, f"update rejected: {text}", now, failed=True, reassign=True)
            self._maybe_close_round(now)
            return
        assert attempt is not None
        self.attempts.accept(attempt, update, bytes(blobs[update.weights.sha256]))
        if record.can("update_received"):
            record.move("update_received")
        self._send(peer, UpdateReceipt(self.spec.job_id, update.attempt_id, True))
        self._log("update.accepted", peer=peer, attempt=update.attempt_id, count=update.count)
        self._maybe_close_round(now)

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
        for attempt in self.attempts.open():
            self._end_attempt(attempt, "round closed", now, failed=False, reassign=False)
        received = self.attempts.take_round()
        self.last_contributors = sorted(r.attempt.peer for r in received)
        round_ = self.checkpoint_round + 1
        if not received:
            self._empty_round(now)
            return
        method = self.spec.settings.aggregation.method
        training_ended = self.stopwatch()
        if self._round_opened is not None:
            self._commands.append(Phase(round_, "round.training", self._round_opened, training_ended))
        self._log("aggregation.started", round=round_, method=method, updates=len(received))
        started = self.stopwatch()
        try:
            record = close_round(self.kernel, round_, self.weights, self.aggregation_state, self.spec.settings,
                                 self.spec.info, received,
                                 digest=lambda w: self.relays.digest(w, relayed=self._relay_likely()))
            aggregated = self.stopwatch()
            closing = self._closing(record, now)
        except Exception as exc:  # noqa: BLE001 - whatever fails, the round must not half-close (issue 20)
            self._round_failed(round_, received, exc)
            return
        self._empty_rounds = 0
        self._last_failure = None
        self._commands.append(Phase(round_, method, started, aggregated))
        self._report_robust(record)
        self._take_round(closing, now)

    def _round_failed(self, round_: int, received: list[Received], exc: Exception) -> None:
        """Closing ``round_`` failed before anything was written down: the previous checkpoint stays, the
        round's trained work goes back (not counted as a failure), and the job pauses with the cause."""
        for r in received:
            progress.give_back(self.dataset, self.experience, r.attempt, failed=False)
        reason = exc.reason if isinstance(exc, WeeiError) else type(exc).__name__
        text = (exc.message if isinstance(exc, WeeiError) else str(exc))[:500]
        self._job("fail")
        self.error = (f"round {round_} failed: {text} ({reason}); the checkpoint of round {self.checkpoint_round} "
                      "stays. Fix the cause (a lower server learning rate, for a non-finite aggregate), then Resume")
        self._log("round.failed", round=round_, reason=reason, error=text)
        self._log("job.paused", reason="round-failed")

    def _report_robust(self, record: RoundRecord) -> None:
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
            after = self.spec.settings.aggregation.exclude_outliers_after
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

    def _closing(self, record: RoundRecord, now: float) -> _Closing:
        """Checkpoint ``record.round`` built as it will be written down, the round's chunks marked trained
        on a copy of the schedule: nothing here changes the coordinator, so an error leaves it as it was."""
        dataset = self.dataset.copy() if self.dataset is not None else None
        epoch_done = False
        if dataset is not None:
            epoch_before = dataset.epoch
            for chunk_id in record.trained_chunks:
                dataset.mark_trained(chunk_id)
            dataset.end_round()
            epoch_done = dataset.epoch > epoch_before
        save, incomplete = self._build_checkpoint(
            now, round_=record.round, weights=record.weights, weights_sha256=record.weights_sha256,
            state=record.aggregation_state, dataset=dataset, metrics=record.metrics, examples=record.examples)
        return _Closing(record, dataset, epoch_done, save, incomplete)

    def _take_round(self, closing: _Closing, now: float) -> None:
        """Write down a closed round's checkpoint: schedules, weights, the saved file, validation, what next."""
        record, save = closing.record, closing.save
        self.dataset = closing.dataset
        self.weights = record.weights
        self.weights_sha256 = record.weights_sha256
        self.aggregation_state = record.aggregation_state
        self.checkpoint_round = record.round
        self._record_checkpoint(save, closing.incomplete)
        if validation_due(self.spec, self.checkpoint_round, dataset_epoch=self.dataset.epoch if self.dataset else None,
                          epoch_done=closing.epoch_done, work_done=self._work_done()):
            self._commands.append(self._validation_command())
        if self._work_done():
            self._commands.append(save)
            self._finish(now, incomplete=False)
        else:
            # The next round's work goes out first: writing the file (hashing the state, joining
            # the parts) does not hold up the participants (issue 11, P4). A round that could not
            # open may have ended the job and rewritten this checkpoint: ours goes before that.
            mark = len(self._commands)
            self._maybe_open_round(now)
            later = (i for i in range(mark, len(self._commands)) if isinstance(self._commands[i], SaveCheckpoint))
            self._commands.insert(next(later, len(self._commands)), save)

    def _work_done(self) -> bool:
        return progress.work_done(self.dataset, self.checkpoint_round, self.spec.settings.epochs)

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
            if record.approved:
                # JobFinished stops the participant; training more needs a new invitation.
                record.move("finish")
        self._log("job.completed", round=self.checkpoint_round, incomplete=self.incomplete)

    def _validation_command(self) -> RunValidation:
        return validation_command(self.spec, self.checkpoint_round, self.weights_sha256, self.checkpoint_hashes,
                                  self.job_seed)

    # ------------------------------------------------------------ checkpoints

    def _save_checkpoint(self, now: float, *, metrics: dict[str, float], examples: int,
                         replace_last: bool = False) -> None:
        """Record checkpoint ``checkpoint_round`` of the current weights (its summary, the participants'
        notes) and emit its SaveCheckpoint; ``replace_last`` writes the last one again."""
        save, incomplete = self._build_checkpoint(
            now, round_=self.checkpoint_round, weights=self.weights, weights_sha256=self.weights_sha256,
            state=self.aggregation_state, dataset=self.dataset, metrics=metrics, examples=examples)
        if replace_last:
            save = replace(save, summary={**self.checkpoints.pop(), **save.summary})  # keeps a validation already attached
        self._record_checkpoint(save, incomplete)
        self._commands.append(save)

    def _build_checkpoint(self, now: float, *, round_: int, weights: bytes, weights_sha256: str,
                          state: AggregationState | None, dataset: DatasetSchedule | None,
                          metrics: dict[str, float], examples: int) -> tuple[SaveCheckpoint, bool]:
        """Checkpoint ``round_``'s checked file and summary, and whether it says the job ended incomplete;
        changes nothing. Raises CheckpointError when the file would not pass the reader's checks."""
        incomplete = (progress.work_done(dataset, round_, self.spec.settings.epochs)
                      and progress.dropped_work(dataset, self.experience))
        metadata = progress.checkpoint_metadata(
            self.spec, round_=round_, weights_sha256=weights_sha256, weight_bytes=len(weights),
            metrics=metrics, examples=examples, incomplete=incomplete,
            progress=progress.recorded(dataset, self.experience, self.job_seed),
            aggregation=state)
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

