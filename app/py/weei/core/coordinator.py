"""The coordinator state machine: rounds, assignments, validation of updates, checkpoints.

Theory of operation
-------------------
A job starts at checkpoint 0. While the job runs, round ``r`` trains from
checkpoint ``r - 1``: every eligible participant (accepted, connected,
module loaded, not paused) gets at most one assignment — a dataset chunk or
an experience unit range with its seed. Each hand-out is an *attempt* with
its own id, so anything that arrives for an attempt that is no longer open
(late, stale, duplicate, off-policy) is recognised and discarded, never
averaged.

A round closes when every attempt has an outcome, or at its deadline.
Attempts that failed (disconnect, deadline, rejected update, model error)
give their work back: to an idle participant at once when there is one,
otherwise to the front of the queue for the next round. Valid updates are
aggregated (FedAvg in canonical order, then FedAvgM/FedAdam) into
checkpoint ``r``; a round with no valid update keeps the previous checkpoint
and tries again. A non-finite aggregate fails the round: the previous
checkpoint stays and the job pauses with the error, so the person can
lower the server learning rate and resume.

Everything comes in as method calls with ``now`` (ms since epoch) and goes
out as commands (``take_commands``); the host asks ``next_timer()`` when to
call ``handle_timer``. Nothing here reads a clock or does I/O.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from . import checkpoint as ckpt
from .aggregate import AggregationState, aggregate_round
from .commands import Command, Log, RunValidation, SaveCheckpoint, Send
from .errors import AggregationError, SettingsError, UsageError
from .job import JobSpec
from .messages import (
    ArtifactRef, Assign, AssignmentFailed, ChunkRef, Deliver, DiagnosticsReport, Invitation, InvitationDecision,
    JobFinished, Leave, Message, ModuleStatus, PauseContribution, TrainingStarted, UnitRange, Update, UpdateReceipt,
)
from .schedule import DatasetSchedule, ExperienceSchedule, UnitWork
from .seeds import assignment_seed, evaluation_seed, rounds_to_train

__all__ = ["Coordinator", "RejectedUpdate", "DEFAULT_ROUND_TIMEOUT_MS", "JOIN_GRACE_MS"]

DEFAULT_ROUND_TIMEOUT_MS = 10 * 60 * 1000
# After start(), participants still loading the module get this long to be
# ready, so the first round is not trained by whoever happened to be first.
JOIN_GRACE_MS = 10_000
# Rounds in a row without a single valid update before the job pauses itself:
# retrying forever would only burn the participants' machines.
MAX_EMPTY_ROUNDS = 5


@dataclass
class _Peer:
    state: str = "unknown"  # spec ParticipantState.state
    connected: bool = True
    approved: bool = False
    paused: bool = False
    loaded: bool = False
    held: set[str] = field(default_factory=set)  # artifact hashes the peer holds

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"connected": self.connected, "approved": self.approved, "state": self.state}
        if self.paused:
            out["paused"] = True
        return out


@dataclass
class _Slot:
    peer: str
    round: int
    assignment_id: str
    attempt_id: str
    chunk_id: str | None
    units: UnitWork | None
    seed: int
    started_at: float
    deadline: float
    status: str = "loading"  # loading | training | received | stopped
    error: str | None = None

    @property
    def open(self) -> bool:
        return self.status in ("loading", "training")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "peerId": self.peer,
            "chunkId": self.chunk_id if self.chunk_id is not None else f"units-{self.units.start}" if self.units else "",
            "status": self.status,
            "startedAt": self.started_at,
        }
        if self.error:
            out["error"] = self.error
        return out


@dataclass(frozen=True)
class RejectedUpdate:
    """An update (or attempt) that did not count, and why."""

    round: int
    peer: str
    attempt_id: str
    reason: str
    at: float


class Coordinator:
    """One job, seen from the browser that coordinates it. Build with ``create`` or ``resume``."""

    def __init__(self, spec: JobSpec, *, my_peer_id: str, kernel: Any, weights: bytes, round_: int,
                 now: float, job_seed: int | None, round_timeout_ms: float, aggregation_state: AggregationState | None,
                 dataset: DatasetSchedule | None, experience: ExperienceSchedule | None,
                 checkpoint_hashes: dict[int, str], first_round: int) -> None:
        self.spec = spec
        self.my_peer_id = my_peer_id
        self.kernel = kernel
        self.round_timeout_ms = round_timeout_ms
        self.status = "ready"
        self.error: str | None = None
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
        self.checkpoints: list[dict[str, Any]] = []
        self.peers: dict[str, _Peer] = {}
        self.slots: list[_Slot] = []
        self.received: dict[str, tuple[_Slot, Update, bytes]] = {}
        self.rejected: list[RejectedUpdate] = []
        self.closed_attempts: set[str] = set()
        self._attempts = 0
        self._empty_rounds = 0
        self.last_contributors: list[str] = []
        self._saved_incomplete = False
        self._grace_until: float | None = None
        self._commands: list[Command] = []
        self.diagnostics_sink: Callable[[str, dict[str, Any], float], None] | None = None
        if spec.settings.coordinator_participates:
            self._add_local_participant()

    # ----------------------------------------------------------------- creation

    @classmethod
    def create(cls, spec: JobSpec, initial_weights: bytes, *, my_peer_id: str, kernel: Any, now: float,
               job_seed: int | None = None, round_timeout_ms: float = DEFAULT_ROUND_TIMEOUT_MS) -> Coordinator:
        """A new job at checkpoint 0; emits SaveCheckpoint for it.

        Raises:
            UsageError: an experience job without ``job_seed``, or weights of the wrong size.
        """
        if len(initial_weights) != spec.weight_bytes:
            raise UsageError("wrong-weight-size", f"initial weights are {len(initial_weights)} bytes, "
                                                  f"the model declares {spec.weight_bytes}")
        dataset, experience = cls._schedules(spec, job_seed)
        self = cls(spec, my_peer_id=my_peer_id, kernel=kernel, weights=bytes(initial_weights), round_=0, now=now,
                   job_seed=job_seed, round_timeout_ms=round_timeout_ms, aggregation_state=None, dataset=dataset,
                   experience=experience, checkpoint_hashes={}, first_round=1)
        self._save_checkpoint(now, metrics={}, examples=0)
        return self

    @classmethod
    def resume(cls, spec: JobSpec, checkpoint: Any, *, mode: str, my_peer_id: str, kernel: Any, now: float,
               new_job_seed: int | None = None, reopening: bool = False,
               round_timeout_ms: float = DEFAULT_ROUND_TIMEOUT_MS) -> Coordinator:
        """Continue from a read checkpoint (``weei.core.checkpoint.Checkpoint``).

        ``mode`` 'resume' restores the dataset queue (or the experience seed
        and next unit); 'new' starts a fresh queue (or draws a new job seed:
        pass ``new_job_seed``). Rounds keep counting from the checkpoint.
        ``reopening`` is the same job found again in storage (after a reload).

        Raises:
            UsageError: bad mode, weights of the wrong size, or an experience
                job whose last round is not above the checkpoint's.
        """
        if mode not in ("new", "resume"):
            raise UsageError("bad-dataset-mode", "datasetMode must be 'new' or 'resume'")
        meta = checkpoint.metadata.to_json()  # CheckpointMetadata: its checked JSON
        round_ = int(meta["round"])
        if len(checkpoint.weights) != spec.weight_bytes:
            raise UsageError("wrong-weight-size", f"the checkpoint holds {len(checkpoint.weights)} bytes of weights, "
                                                  f"the model creates {spec.weight_bytes}")
        # Reopening a saved (possibly completed) job is not a request to train more.
        if spec.is_experience and not reopening:
            rounds_to_train(round_, spec.settings.epochs)
        recorded_aux = meta.get("auxiliaryWeights") or {}
        for slot_id, ref in spec.auxiliary_files.items():
            if slot_id in recorded_aux and recorded_aux[slot_id] != ref.sha256:
                raise UsageError("auxiliary-mismatch", f"auxiliary weights file for slot {slot_id!r} differs from "
                                                       f"the one this checkpoint was trained with")
        job_seed: int | None = None
        next_unit = 0
        if spec.is_experience:
            exp = meta.get("experience") or {}
            if mode == "resume" and exp:
                job_seed = int(exp["jobSeed"])
                next_unit = int(exp["nextUnit"])
            else:
                if new_job_seed is None:
                    raise UsageError("missing-job-seed", "an experience job needs a job seed")
                job_seed = new_job_seed
        dataset, experience = cls._schedules(spec, job_seed, next_unit=next_unit)
        if dataset is not None and mode == "resume" and meta.get("remainingChunkIds") is not None:
            known = {c.id for c in spec.chunks}
            order = [c for c in (meta.get("chunkOrder") or [c.id for c in spec.chunks]) if c in known]
            order += [c for c in (c.id for c in spec.chunks) if c not in set(order)]
            dataset = DatasetSchedule(
                [c.id for c in spec.chunks], planned_epochs=spec.settings.epochs, order=order,
                epoch=int(meta.get("datasetEpoch", 0)), remaining=list(meta["remainingChunkIds"]),
                shuffled=meta.get("chunkOrder") is not None)
            # remaining is empty only after a pass that datasetEpoch already counts.
            dataset.continue_passes()
        state = None
        agg = meta.get("aggregationState")
        if agg is not None and checkpoint.state is not None:
            state = AggregationState(agg["method"], int(agg["step"]), bytes(checkpoint.state))
        self = cls(spec, my_peer_id=my_peer_id, kernel=kernel, weights=bytes(checkpoint.weights), round_=round_,
                   now=now, job_seed=job_seed, round_timeout_ms=round_timeout_ms, aggregation_state=state,
                   dataset=dataset, experience=experience,
                   checkpoint_hashes={round_: hashlib.sha256(checkpoint.weights).hexdigest()},
                   first_round=round_ + 1)
        self._commands.append(Log("job.continued", {"fromRound": round_, "datasetMode": mode}))
        return self

    @staticmethod
    def _schedules(spec: JobSpec, job_seed: int | None, next_unit: int = 0,
                   ) -> tuple[DatasetSchedule | None, ExperienceSchedule | None]:
        if spec.is_experience:
            if job_seed is None:
                raise UsageError("missing-job-seed", "an experience job needs a job seed")
            units = spec.settings.experience.units_per_assignment if spec.settings.experience else \
                spec.info.work_source.default_units
            return None, ExperienceSchedule(units, next_unit)
        if not spec.chunks:
            raise UsageError("no-chunks", "a dataset job needs at least one chunk")
        return DatasetSchedule([c.id for c in spec.chunks], planned_epochs=spec.settings.epochs), None

    # ------------------------------------------------------------ host surface

    def take_commands(self) -> list[Command]:
        """The commands emitted since the last call, in order."""
        out, self._commands = self._commands, []
        return out

    def next_timer(self) -> float | None:
        """When ``handle_timer`` must next be called (ms since epoch), or None."""
        times = [s.deadline for s in self.slots if s.open]
        if self._grace_until is not None:
            times.append(self._grace_until)
        return min(times) if times else None

    def handle_timer(self, now: float) -> None:
        if self._grace_until is not None and now >= self._grace_until:
            self._grace_until = None
            self._maybe_open_round(now)
        late = [s for s in self.slots if s.open and s.deadline <= now]
        for slot in late:
            self._fail_slot(slot, "missed the round deadline", now, failed=False, reassign=False)
        if late:
            self._close_round(now)

    # ---------------------------------------------------------- user commands

    def invite(self, peer: str, now: float) -> None:
        """Send an invitation: only descriptions, nothing is downloaded before acceptance."""
        if self.status == "completed":
            raise UsageError("job-completed", "the job is completed; continue from a checkpoint to train more")
        if peer == self.my_peer_id:
            raise UsageError("invite-self", "the coordinator cannot invite itself")
        record = self.peers.get(peer)
        if record is not None and record.approved and record.state not in ("stopped", "declined"):
            raise UsageError("already-participating", f"peer {peer} already takes part in this job")
        self.peers[peer] = _Peer(state="invited")
        data_bytes = sum(c.bytes for c in self.spec.chunks) + sum(r.bytes for r in self.spec.auxiliary_files.values())
        self._send(peer, Invitation(self.spec.job_id, self.my_peer_id, self.spec.info.raw,
                                    {"fileName": self.spec.module.file_name, "bytes": self.spec.module.bytes,
                                     "sha256": self.spec.module.sha256},
                                    data_bytes, self.spec.settings.to_json()))
        self._log("invitation.sent", peer=peer)

    def start(self, now: float) -> None:
        if self.status == "completed":
            raise UsageError("job-completed", "the job is completed; continue from a checkpoint to train more")
        if self.status == "running":
            raise UsageError("already-running", "the job is already running")
        self.status = "running"
        self.error = None
        self._log("job.started", round=self.checkpoint_round + 1)
        if self._loading_peers():
            self._grace_until = now + JOIN_GRACE_MS
        self._maybe_open_round(now)

    def pause(self, now: float) -> None:
        """Stop handing out work; open attempts finish and the round closes as usual."""
        if self.status != "running":
            raise UsageError("not-running", f"the job is {self.status}, not running")
        self.status = "paused"
        self._log("job.paused")

    def resume_running(self, now: float) -> None:
        if self.status != "paused":
            raise UsageError("not-paused", f"the job is {self.status}, not paused")
        self.start(now)

    def stop(self, now: float) -> None:
        """End the job now: open attempts are discarded; the last checkpoint is the result."""
        if self.status == "completed":
            raise UsageError("job-completed", "the job is already completed")
        for slot in [s for s in self.slots if s.open]:
            self._fail_slot(slot, "the job was stopped", now, failed=False, reassign=False)
        self.slots = []
        self.received = {}
        self._finish(now, incomplete=True)

    def update_settings(self, settings: Any, now: float) -> None:
        """New settings apply from the next round (aggregation method changes restart its state).

        Raises:
            SettingsError: the model does not allow the method, or an
                experience job's last round is not above the current one.
        """
        self._check_method(settings)
        if self.spec.is_experience:
            rounds_to_train(self.checkpoint_round, settings.epochs)
        if self.spec.is_experience and settings.experience is not None:
            self._check_units(settings.experience.units_per_assignment)
            assert self.experience is not None
            self.experience.units_per_assignment = settings.experience.units_per_assignment
        participates = settings.coordinator_participates
        self.spec = self.spec.with_settings(settings)
        me = self.peers.get(self.my_peer_id)
        if participates and (me is None or me.state == "stopped"):
            self._add_local_participant()
        elif not participates and me is not None and me.state != "stopped":
            me.state = "stopped"
            me.approved = False
            for slot in [s for s in self.slots if s.open and s.peer == self.my_peer_id]:
                self._fail_slot(slot, "the coordinator stopped participating", now, failed=False, reassign=True)
            self._maybe_close_round(now)
        if self.dataset is not None:
            self.dataset.planned_epochs = settings.epochs
            self.dataset.continue_passes()  # more epochs after the last one: the queue refills
        self._log("settings.updated", settings=settings.to_json())
        if self.status == "completed" and not self._work_done():
            self.status = "ready"

    def shuffle_chunks(self, seed: int, now: float) -> None:
        if self.dataset is None:
            raise UsageError("not-a-dataset-job", "an experience job has no chunks to shuffle")
        self.dataset.shuffle(seed)
        self._log("chunks.shuffled")

    def request_validation(self, now: float) -> None:
        """runValidation(): evaluate the latest checkpoint now."""
        if self.spec.is_experience:
            if not self.spec.info.capabilities.get("evaluation"):
                raise UsageError("no-evaluation", "this model does not declare the evaluation capability")
        elif not self.spec.has_validation:
            raise UsageError("no-validation-file", "this job has no validation file")
        self._commands.append(self._validation_command(self.checkpoint_round))

    def _check_units(self, units: int) -> None:
        source = self.spec.info.work_source
        if not source.minimum_units <= units <= source.maximum_units:
            raise SettingsError("experience.unitsPerAssignment",
                                f"must be from {source.minimum_units} to {source.maximum_units}")

    def _check_method(self, settings: Any) -> None:
        method = settings.aggregation.method
        if method not in self.spec.info.allowed_methods:
            raise SettingsError("aggregation.method", f"the model does not allow {method!r}; it allows "
                                                      f"{', '.join(self.spec.info.allowed_methods)}",
                                reason="method-not-allowed")

    # ---------------------------------------------------------- peer events

    def remote_participants(self) -> list[str]:
        """The other peers that accepted and still take part (kept in the job record)."""
        return sorted(p for p, r in self.peers.items() if p != self.my_peer_id and r.approved)

    def restore_participants(self, peers: Any) -> None:
        """After a reload: the job's participants, disconnected until their channel opens again
        (``peer_connected`` then delivers the module and they catch up)."""
        for peer in peers:
            if isinstance(peer, str) and peer and peer != self.my_peer_id and peer not in self.peers:
                self.peers[peer] = _Peer(state="disconnected", connected=False, approved=True)

    def peer_connected(self, peer: str, now: float) -> None:
        record = self.peers.get(peer)
        if record is None:
            return
        record.connected = True
        if record.state == "disconnected":
            record.state = "approved" if record.approved else "invited"
            record.loaded = False
            record.held = set()
            if record.approved:
                # A reconnecting participant catches up: module first, then the current checkpoint.
                self._deliver(peer)

    def peer_disconnected(self, peer: str, now: float) -> None:
        record = self.peers.get(peer)
        if record is None:
            return
        record.connected = False
        record.state = "disconnected"
        for slot in [s for s in self.slots if s.open and s.peer == peer]:
            self._fail_slot(slot, "participant disconnected", now, failed=False, reassign=True)
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
        if record is None or record.state == "stopped":
            self._log("message.ignored", peer=peer, reason="not-a-participant", type=message.TYPE)
            return
        if isinstance(message, InvitationDecision):
            self._on_decision(peer, record, message, now)
        elif isinstance(message, ModuleStatus):
            self._on_module_status(peer, record, message, now)
        elif isinstance(message, TrainingStarted):
            slot = self._open_slot(message.attempt_id)
            if slot is not None and slot.peer == peer:
                slot.status = "training"
                record.state = "training"
        elif isinstance(message, Update):
            self._on_update(peer, message, blobs, now)
        elif isinstance(message, AssignmentFailed):
            slot = self._open_slot(message.attempt_id)
            if slot is not None and slot.peer == peer:
                self._fail_slot(slot, message.error, now, failed=True, reassign=True)
                self._maybe_close_round(now)
        elif isinstance(message, PauseContribution):
            record.paused = message.paused
            self._log("participant.paused" if message.paused else "participant.resumed", peer=peer)
            if not message.paused:
                self._maybe_open_round(now)
        elif isinstance(message, Leave):
            record.state = "stopped"
            record.approved = False
            for slot in [s for s in self.slots if s.open and s.peer == peer]:
                self._fail_slot(slot, "participant left", now, failed=False, reassign=True)
            self._log("participant.left", peer=peer)
            self._maybe_close_round(now)
        elif isinstance(message, DiagnosticsReport):
            if self.diagnostics_sink is not None:
                self.diagnostics_sink(peer, message.snapshot, now)
        else:
            self._log("message.ignored", peer=peer, reason="unexpected-type", type=message.TYPE)

    def validation_finished(self, round_: int, metrics: Mapping[str, float] | None, error: str | None,
                            now: float) -> None:
        """The host ran RunValidation; attach the result to that checkpoint's summary."""
        for summary in self.checkpoints:
            if summary["artifact"]["round"] == round_:
                if error is not None:
                    summary["validationError"] = error
                    summary.pop("validationMetrics", None)
                else:
                    summary["validationMetrics"] = {"values": dict(metrics or {}), "examplesProcessed": 0}
                    summary.pop("validationError", None)
                self._log("validation.finished", round=round_, error=error)
                return

    # ------------------------------------------------------- participant flow

    def _on_decision(self, peer: str, record: _Peer, message: InvitationDecision, now: float) -> None:
        if record.state != "invited":
            self._log("message.ignored", peer=peer, reason="no-pending-invitation", type=message.TYPE)
            return
        if not message.accepted:
            record.state = "declined"
            self._log("invitation.declined", peer=peer)
            return
        record.approved = True
        record.state = "approved"
        self._log("invitation.accepted", peer=peer)
        self._deliver(peer)

    def _deliver(self, peer: str) -> None:
        aux = dict(self.spec.auxiliary_files)
        self._send(peer, Deliver(self.spec.job_id, self.spec.module.ref, self.spec.info.raw, aux),
                   (self.spec.module.ref, *aux.values()))

    def _add_local_participant(self) -> None:
        """The coordinator's own participant machine joins without an invitation
        (the host builds it with ``Participant.local``)."""
        self.peers[self.my_peer_id] = _Peer(state="approved", approved=True)
        self._deliver(self.my_peer_id)

    def _on_module_status(self, peer: str, record: _Peer, message: ModuleStatus, now: float) -> None:
        if not record.approved:
            self._log("message.ignored", peer=peer, reason="not-approved", type=message.TYPE)
            return
        if not message.loaded:
            record.state = "modelLoadFailed"
            record.loaded = False
            self._log("participant.model-load-failed", peer=peer, error=message.error)
            return
        record.loaded = True
        record.state = "modelLoaded"
        record.held = set(message.held) | {self.spec.module.sha256, *(r.sha256 for r in self.spec.auxiliary_files.values())}
        self._maybe_open_round(now)

    # ---------------------------------------------------------------- rounds

    def _loading_peers(self) -> list[str]:
        return [p for p, r in self.peers.items()
                if r.approved and r.connected and not r.loaded and r.state != "modelLoadFailed"]

    def _eligible(self) -> list[str]:
        busy = {s.peer for s in self.slots if s.open}
        return sorted(p for p, r in self.peers.items()
                      if r.approved and r.connected and r.loaded and not r.paused and p not in busy)

    def _round_open(self) -> bool:
        return any(s.open for s in self.slots) or bool(self.received)

    def _maybe_open_round(self, now: float) -> None:
        if self._grace_until is not None and not self._loading_peers():
            self._grace_until = None
        if self.status != "running" or self._round_open() or self._grace_until is not None:
            return
        if self._work_done():
            self._finish(now, incomplete=False)
            return
        peers = self._eligible()
        if not peers:
            return
        self.slots = []
        self.received = {}
        round_ = self.checkpoint_round + 1
        for peer in peers:
            if not self._hand_out(peer, round_, now):
                break
        if not self.slots:
            # Nothing could be handed out: every remaining chunk was dropped.
            self._close_round(now)

    def _hand_out(self, peer: str, round_: int, now: float, work: Any = None) -> bool:
        """Give ``peer`` one assignment of ``round_``; False when no work is left this round."""
        chunk_ref = None
        units = None
        if self.dataset is not None:
            chunk_id = work if work is not None else self.dataset.take(peer)
            if chunk_id is None:
                return False
            chunk = self.spec.chunk(chunk_id)
            chunk_ref = ChunkRef(chunk.id, chunk.format, chunk.example_count, chunk.ref)
            assignment_id = f"r{round_}-{chunk.id}"
            seed = int.from_bytes(hashlib.sha256(f"{self.spec.job_id}/{assignment_id}".encode()).digest()[:8], "little")
        else:
            assert self.experience is not None and self.job_seed is not None
            units = work if work is not None else self.experience.take()
            seed = assignment_seed(self.job_seed, units.start)
            assignment_id = f"r{round_}-u{units.start}"
            chunk_id = None
        self._attempts += 1
        attempt_id = f"{assignment_id}-a{self._attempts}"
        slot = _Slot(peer, round_, assignment_id, attempt_id, chunk_id, units, seed, now, now + self.round_timeout_ms)
        self.slots.append(slot)
        record = self.peers[peer]
        record.state = "assigned"
        checkpoint_ref = ArtifactRef("checkpoint", self.weights_sha256, len(self.weights))
        aux = self._auxiliary_for(round_)
        assign = Assign(self.spec.job_id, round_, assignment_id, attempt_id, checkpoint_ref,
                        self._assignment_settings(), seed, chunk_ref,
                        UnitRange(units.start, units.count, seed, self.job_seed or 0) if units is not None else None, aux)
        attachments = [checkpoint_ref, *aux.values()]
        if chunk_ref is not None:
            attachments.append(chunk_ref.data)
        needed: list[ArtifactRef] = []
        for a in attachments:
            # Once per version: the checkpoint and a snapshot may be the same bytes.
            if a.kind == "chunk" or a.sha256 not in record.held:
                needed.append(a)
                if a.kind != "chunk":
                    record.held.add(a.sha256)
        self._send(peer, assign, tuple(needed))
        self._log("assignment.sent", peer=peer, round=round_, attempt=attempt_id)
        return True

    def _assignment_settings(self) -> dict[str, Any]:
        s = self.spec.settings
        out: dict[str, Any] = {"localEpochs": s.local_epochs, "batchSize": s.batch_size}
        if s.learning_rate is not None:
            out["learningRate"] = s.learning_rate
        return out

    def _auxiliary_for(self, round_: int) -> dict[str, ArtifactRef]:
        """Each slot's weights for a round: files, or the snapshot its rule picks.

        A 'checkpoint' rule with roundsAgo k for round r (which trains from
        checkpoint r-1) picks checkpoint max(0, r-1-k), so a retried or
        reassigned attempt of the round plays against the same version.
        """
        out: dict[str, ArtifactRef] = {}
        for slot in self.spec.info.auxiliary_weights:
            if slot.id in self.spec.auxiliary_files:
                out[slot.id] = self.spec.auxiliary_files[slot.id]
                continue
            if slot.source_kind == "initial":
                target = 0
            else:
                target = max(0, round_ - 1 - (slot.rounds_ago or 0))
            sha = self.checkpoint_hashes.get(target)
            if sha is None:  # continued jobs only know checkpoints from where they started
                target = min(self.checkpoint_hashes)
                sha = self.checkpoint_hashes[target]
            out[slot.id] = ArtifactRef("snapshot", sha, self.spec.weight_bytes)
        return out

    def _open_slot(self, attempt_id: str) -> _Slot | None:
        for slot in self.slots:
            if slot.attempt_id == attempt_id and slot.open:
                return slot
        return None

    def _fail_slot(self, slot: _Slot, error: str, now: float, *, failed: bool, reassign: bool) -> None:
        """End an attempt without a valid update; its work goes back (first in line).

        ``failed`` counts against the work itself (the model or the data may
        be at fault), unlike a disconnect or a deadline. With ``reassign``
        an idle participant of this round takes the work at once.
        """
        slot.status = "stopped"
        slot.error = error
        self.closed_attempts.add(slot.attempt_id)
        record = self.peers.get(slot.peer)
        if record is not None and record.state in ("assigned", "training"):
            record.state = "modelLoaded" if record.connected else "disconnected"
        self._log("assignment.stopped", peer=slot.peer, attempt=slot.attempt_id, error=error)
        if self.dataset is not None and slot.chunk_id is not None:
            peers_available = sum(1 for r in self.peers.values() if r.approved and r.connected and r.loaded)
            self.dataset.give_back(slot.chunk_id, failed=failed, peer=slot.peer, peers_available=peers_available)
        elif self.experience is not None and slot.units is not None:
            self.experience.give_back(slot.units, failed=failed)
        if reassign and self.status == "running":
            taken = {s.peer for s in self.slots if s.round == slot.round}
            idle = [p for p in self._eligible() if p not in taken]
            if idle:
                self._hand_out(idle[0], slot.round, now)

    def _on_update(self, peer: str, update: Update, blobs: Mapping[str, bytes], now: float) -> None:
        reason = self._check_update(peer, update, blobs)
        if reason is not None:
            code, text = reason
            self._reject(peer, update.attempt_id, code, text, now)
            slot = self._open_slot(update.attempt_id)
            if slot is not None and slot.peer == peer:
                self._fail_slot(slot, f"update rejected: {text}", now, failed=True, reassign=True)
            self._maybe_close_round(now)
            return
        slot = self._open_slot(update.attempt_id)
        assert slot is not None
        slot.status = "received"
        self.closed_attempts.add(slot.attempt_id)
        self.received[slot.assignment_id] = (slot, update, bytes(blobs[update.weights.sha256]))
        self.peers[peer].state = "resultReceived"
        self._send(peer, UpdateReceipt(self.spec.job_id, update.attempt_id, True))
        self._log("update.accepted", peer=peer, attempt=update.attempt_id, count=update.count)
        self._maybe_close_round(now)

    def _check_update(self, peer: str, update: Update, blobs: Mapping[str, bytes]) -> tuple[str, str] | None:
        """Why an update must not count, or None when it is valid. Cheapest checks first."""
        slot = self._open_slot(update.attempt_id)
        if slot is None:
            if any(s.attempt_id == update.attempt_id for s, _, _ in self.received.values()):
                return "duplicate-update", f"attempt {update.attempt_id} was already received"
            if update.attempt_id in self.closed_attempts or update.round <= self.checkpoint_round:
                return "late-update", f"attempt {update.attempt_id} of round {update.round} is closed"
            return "unknown-attempt", f"no open assignment has attempt id {update.attempt_id!r}"
        if slot.peer != peer:
            return "wrong-peer", f"attempt {update.attempt_id} was assigned to another participant"
        if update.round != slot.round:
            return "stale-round", f"update is for round {update.round}, the attempt belongs to round {slot.round}"
        if update.assignment_id != slot.assignment_id:
            return "wrong-assignment", f"attempt {update.attempt_id} is of assignment {slot.assignment_id}"
        if update.base_checkpoint != self.weights_sha256:
            return "off-policy", "the update was computed from other weights than the round's checkpoint"
        if update.weights.bytes != self.spec.weight_bytes:
            return "wrong-size", f"weights are {update.weights.bytes} bytes, the model has {self.spec.weight_bytes}"
        data = blobs.get(update.weights.sha256)
        if data is None:
            return "missing-weights", "the update's weights did not arrive"
        if len(data) != self.spec.weight_bytes:
            return "wrong-size", f"weights are {len(data)} bytes, the model has {self.spec.weight_bytes}"
        if hashlib.sha256(data).hexdigest() != update.weights.sha256:
            return "hash-mismatch", "the weights do not match their SHA-256"
        bad = self.kernel.first_non_finite(data)
        if bad >= 0:
            return "non-finite-weights", f"weight {bad} is not a finite number"
        assigned = slot.units.count if slot.units is not None else self.spec.chunk(slot.chunk_id).example_count  # type: ignore[arg-type]
        if update.count > assigned:
            return "inflated-count", f"{update.count} examples claimed, {assigned} were assigned"
        if update.count == 0:
            return "no-examples", "the update trained no examples (or finished no units)"
        return None

    def _reject(self, peer: str, attempt_id: str, code: str, text: str, now: float) -> None:
        self.rejected.append(RejectedUpdate(self.checkpoint_round + 1, peer, attempt_id, f"{code}: {text}", now))
        del self.rejected[:-1000]
        self._send(peer, UpdateReceipt(self.spec.job_id, attempt_id, False, f"{code}: {text}"))
        self._log("update.rejected", peer=peer, attempt=attempt_id, reason=code, detail=text)

    def _maybe_close_round(self, now: float) -> None:
        if self.slots and not any(s.open for s in self.slots):
            self._close_round(now)

    def _close_round(self, now: float) -> None:
        for slot in [s for s in self.slots if s.open]:
            self._fail_slot(slot, "round closed", now, failed=False, reassign=False)
        # Canonical order (by assignment id, as FedAvg sorts), so the metrics' float
        # sums and thus the checkpoint file do not depend on the arrival order.
        received = sorted(self.received.values(), key=lambda item: item[0].assignment_id)
        self.last_contributors = sorted(slot.peer for slot, _, _ in received)
        self.slots = []
        self.received = {}
        if not received:
            self._empty_rounds += 1
            self._log("round.empty", round=self.checkpoint_round + 1)
            if self.dataset is not None:
                self.dataset.end_round()
            if self._empty_rounds >= MAX_EMPTY_ROUNDS:
                self.status = "paused"
                self.error = (f"no valid update in {self._empty_rounds} attempts at round "
                              f"{self.checkpoint_round + 1}; the checkpoint of round {self.checkpoint_round} stays")
                self._log("job.paused", reason="empty-rounds")
                return
            self._maybe_open_round(now)
            return
        self._empty_rounds = 0
        contributions = [(slot.assignment_id, update.count, data) for slot, update, data in received]
        try:
            self._check_method(self.spec.settings)
            result = aggregate_round(self.kernel, self.weights, contributions, self.spec.settings.aggregation,
                                     self.aggregation_state, self.spec.info.raw.get("aggregation"))
        except (AggregationError, SettingsError) as exc:
            for slot, _, _ in received:
                self._give_back_trained(slot)
            self.status = "paused"
            self.error = f"round {self.checkpoint_round + 1} failed: {exc.message}"
            self._log("round.failed", round=self.checkpoint_round + 1, error=exc.message)
            return
        total = sum(u.count for _, u, _ in received)
        metric_ids = [m.id for m in self.spec.info.metrics]
        metrics = {}
        for mid in metric_ids:
            pairs = [(u.metrics[mid], u.count) for _, u, _ in received if mid in u.metrics]
            if pairs:
                metrics[mid] = sum(v * c for v, c in pairs) / sum(c for _, c in pairs)
        for slot, _, _ in received:
            if self.dataset is not None and slot.chunk_id is not None:
                self.dataset.mark_trained(slot.chunk_id)
        epoch_before = self.dataset.epoch if self.dataset is not None else 0
        if self.dataset is not None:
            self.dataset.end_round()
        self.weights = result.weights
        self.weights_sha256 = hashlib.sha256(result.weights).hexdigest()
        self.aggregation_state = result.state
        self.checkpoint_round += 1
        self._save_checkpoint(now, metrics=metrics, examples=total)
        self._schedule_validation(epoch_done=self.dataset is not None and self.dataset.epoch > epoch_before)
        if self._work_done():
            self._finish(now, incomplete=False)
        else:
            self._maybe_open_round(now)

    def _give_back_trained(self, slot: _Slot) -> None:
        if self.dataset is not None and slot.chunk_id is not None:
            self.dataset.give_back(slot.chunk_id, failed=False)
        elif self.experience is not None and slot.units is not None:
            self.experience.give_back(slot.units, failed=False)

    def _work_done(self) -> bool:
        if self.dataset is not None:
            return self.dataset.finished
        return self.checkpoint_round >= self.spec.settings.epochs

    def _dropped_work(self) -> bool:
        if self.dataset is not None:
            return bool(self.dataset.dropped)
        return bool(self.experience is not None and self.experience.dropped)

    def _finish(self, now: float, *, incomplete: bool) -> None:
        self.incomplete = incomplete or self._dropped_work()
        if self._dropped_work() and self._work_done() and not self._saved_incomplete and self.checkpoints:
            # Work was dropped after the last checkpoint: write that checkpoint again (same round,
            # same weights) so its file says the job ended incomplete and which chunks were trained.
            last = self.checkpoints[-1]
            self._save_checkpoint(now, metrics=dict(last["metrics"]["values"]),
                                  examples=last["metrics"]["examplesProcessed"], replace=True)
        self.status = "completed"
        self._grace_until = None
        for peer, record in self.peers.items():
            if record.approved and record.connected:
                self._send(peer, JobFinished(self.spec.job_id, self.incomplete))
            if record.approved:
                # JobFinished stops the participant; training more needs a new invitation.
                record.state = "stopped"
                record.approved = False
                record.loaded = False
        self._log("job.completed", round=self.checkpoint_round, incomplete=self.incomplete)

    def _schedule_validation(self, *, epoch_done: bool) -> None:
        schedule = self.spec.settings.validation_schedule
        if schedule is None or not schedule.enabled:
            return
        if self.spec.is_experience:
            if not self.spec.info.capabilities.get("evaluation"):
                return
        elif not self.spec.has_validation:
            return
        if schedule.unit == "round":
            due = self.checkpoint_round % schedule.every == 0
        else:
            due = epoch_done and self.dataset is not None and self.dataset.epoch % schedule.every == 0
        if due or self._work_done():
            self._commands.append(self._validation_command(self.checkpoint_round))

    def _validation_command(self, round_: int) -> RunValidation:
        experience = None
        if self.spec.is_experience:
            assert self.job_seed is not None
            units = self.spec.info.work_source.evaluation_units or self.spec.info.work_source.default_units
            experience = (0, units, evaluation_seed(self.job_seed))
        return RunValidation(round_, self.weights_sha256, experience, self._auxiliary_for(round_ + 1))

    # ------------------------------------------------------------ checkpoints

    def _save_checkpoint(self, now: float, *, metrics: dict[str, float], examples: int,
                         replace: bool = False) -> None:
        round_ = self.checkpoint_round
        self.checkpoint_hashes[round_] = self.weights_sha256
        file_name = f"{self.spec.info.id}-round-{round_:04d}.weei-checkpoint"
        metadata: dict[str, Any] = {
            "version": 2 if self.aggregation_state is not None else 1,
            "jobId": self.spec.job_id,
            "module": self.spec.module.to_json(),
            "modelInfo": self.spec.info.raw,
            "settings": self.spec.settings.to_json(),
            "round": round_,
            "checkpoint": {"artifactId": f"checkpoint-{self.weights_sha256[:16]}", "kind": "checkpoint",
                           "fileName": file_name, "format": "float32-le", "bytes": len(self.weights),
                           "sha256": self.weights_sha256, "round": round_},
            "metrics": {"values": metrics, "examplesProcessed": examples},
            "incomplete": self._work_done() and self._dropped_work(),
        }
        self._saved_incomplete = metadata["incomplete"]
        if self.dataset is not None:
            if self.dataset.shuffled:
                metadata["chunkOrder"] = list(self.dataset.order)
            remaining = self.dataset.remaining if not self.dataset.finished else []
            # A dropped chunk was never trained: it is neither trained nor remaining.
            untrained = set(remaining) | set(self.dataset.dropped)
            metadata["trainedChunkIds"] = [c for c in self.dataset.order if c not in untrained]
            metadata["remainingChunkIds"] = remaining
            metadata["datasetEpoch"] = self.dataset.epoch
        if self.experience is not None:
            metadata["experience"] = {"jobSeed": str(self.job_seed), "nextUnit": self.experience.next_unit}
        if self.spec.auxiliary_files:
            metadata["auxiliaryWeights"] = {k: v.sha256 for k, v in self.spec.auxiliary_files.items()}
        state = self.aggregation_state
        if state is not None:
            metadata["aggregationState"] = {"method": state.method, "step": state.step, "bytes": len(state.data)}
        # Aggregation already refused non-finite results; checkpoint 0 and continued weights are checked here.
        file = ckpt.write_checkpoint(metadata, self.weights, state.data if state is not None else None,
                                     weights_sha256=self.weights_sha256, finite_checked=round_ > self.first_round - 1)
        summary: dict[str, Any] = {
            "artifact": {"round": round_, "sha256": self.weights_sha256, "bytes": len(self.weights),
                         "fileName": file_name},
            "metrics": metadata["metrics"],
            "remaining": list(metadata.get("remainingChunkIds", [])),
            "settings": metadata["settings"],
            "createdAt": now,
        }
        if self.dataset is not None:
            summary["datasetEpoch"] = self.dataset.epoch
            summary["datasetProgress"] = self.dataset.progress
        if state is not None:
            summary["aggregation"] = {"method": state.method, "step": state.step, "bytes": len(state.data)}
        if replace:
            summary = {**self.checkpoints.pop(), **summary}  # keeps a validation already attached
        self.checkpoints.append(summary)
        self._commands.append(SaveCheckpoint(round_, file, self.weights, self.weights_sha256, summary,
                                             state.data if state is not None else None))
        self._log("checkpoint.saved", round=round_, sha256=self.weights_sha256)

    # ------------------------------------------------------------------ view

    def view(self, now: float) -> dict[str, Any]:
        """The spec's TrainingJob for this job (a fresh dict, no weights or data)."""
        out: dict[str, Any] = {
            "id": self.spec.job_id,
            "role": "coordinator",
            "status": self.status,
            "owner": self.my_peer_id,
            "info": self.spec.info.raw,
            "settings": self.spec.settings.to_json(),
            "participants": {p: r.to_json() for p, r in self.peers.items()},
            "queue": list(self.dataset.queue) if self.dataset is not None else [],
            "checkpoints": [dict(c) for c in self.checkpoints],
            "slots": [s.to_json() for s in self.slots],
            "incomplete": self.incomplete,
            "shuffled": bool(self.dataset and self.dataset.shuffled),
            "validationUnavailable": False,
            "module": {"fileName": self.spec.module.file_name, "bytes": self.spec.module.bytes,
                       "sha256": self.spec.module.sha256},
        }
        if self.dataset is not None:
            out["datasetEpoch"] = self.dataset.epoch
            out["progress"] = {
                "datasetEpoch": self.dataset.epoch,
                "plannedEpochs": self.spec.settings.epochs,
                "remainingChunks": len(self.dataset.remaining),
                "totalChunks": len(self.spec.chunks),
                "running": self.status == "running",
            }
        if self.error:
            out["error"] = self.error
        return out

    # --------------------------------------------------------------- helpers

    def _send(self, peer: str, message: Message, attachments: tuple[ArtifactRef, ...] = ()) -> None:
        self._commands.append(Send(peer, message, attachments))

    def _log(self, event: str, **details: Any) -> None:
        self._commands.append(Log(event, details))
