"""The executor: carries out the state machines' commands.

Theory of operation
-------------------
``drain()`` takes every pending command of the coordinator and the local
participant and carries it out: messages go to the local participant
directly or to the transport, checkpoints go to the job store before
anything else happens, training and validation go to the compute backend
(``compute.ComputeBackend``) as background tasks whose results come back as
events on the state machines, timers fire ``handle_timer``. After a drain,
the job record is saved if it changed, in-memory artifacts nothing refers to
any more are evicted, the debug log is written (at most every
``log_writer.LOG_WRITE_MS``) and subscribers hear of the change.

A write that storage refuses (``StorageError``, out of room) does not stop
the page: the error names the reason in ``state.error`` and the debug log,
and a running job pauses, its checkpoints already saved untouched.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any, Callable, Coroutine, Mapping

from ..core.wire.commands import Command, LoadModule, Log, RoundPhase, RunValidation, SaveCheckpoint, Send, Train
from ..core.errors import UsageError, WeeiError, UsageReason
from ..core.wire.messages import Assign, Progress
from ..core.job.spec import JobSpec
from ..core.formats.modelinfo import ModelInfo
from ..core.privacy.dp_noise import assigned_clip, clip_to_norm
from ..core.privacy.x25519 import X25519, x25519
from ..core.job.secure_round import ASSIGN_KEY as SECURE_KEY
from ..core.verified import VerifiedBlobs
from ..core.states import JobStatus, PeerState
from .compression import UpdateCompressor
from .compute import ComputeBackend
from .job_store import JobStore
from .local_training import effective_workers, experience_parts
from .log_writer import DebugLogWriter
from .peer_diagnostics import DiagnosticsLink
from .ports import KeyValue, StorageError, TaskCancelled, WorkerTask
from .residency import Residency, assign_refs
from .session import Session
from .state_view import StateView, job_settings, requested_workers

__all__ = ["Executor"]

class Executor:
    """Drains commands, runs training and validation on a backend, keeps timers and the debug log's copy."""

    def __init__(self, session: Session, store: JobStore, backend: ComputeBackend, kv: KeyValue,
                 view: StateView, compressor: UpdateCompressor, x25519: X25519 = x25519) -> None:
        self.session = session
        self.x25519 = x25519  # the kernel's: this device's key agreement under secure aggregation
        self.store = store
        self.backend = backend
        self.compressor = compressor
        self.kv = kv
        self.view = view
        self.module_sha = ""  # the module this device's participant loaded
        self.residency = Residency()
        self.diagnostics = DiagnosticsLink(session, self._settle_stage)
        self.log_writer = DebugLogWriter(session.debug_log, kv, session.monotonic)
        # Whether a Send waits (the participation's coordinator has not proved the room key yet):
        # PeerEvents decides, and sends what waited once the proof is in.
        self.holds_back: Callable[[Send], bool] = lambda send: False
        self.tasks: set[asyncio.Task[Any]] = set()
        self.timer: asyncio.Task[Any] | None = None
        self._armed: tuple[Coordinator | None, float, float] = (None, 0.0, 0.0)  # what ``timer`` waits for, and the offset
        self.refused_error: str | None = None  # state.error set by the last refused write
        #: Called after every drain, before subscribers hear of it (peer_cards.py tells the room what changed).
        self.after_drain: list[Callable[[], None]] = []
        #: Removes the checkpoint files a job no longer keeps, after each save (retention.py; the controller sets it).
        self.prune: Callable[[Coordinator], Awaitable[int]] | None = None

    # ---------------------------------------------------------------- drain

    async def drain(self, *, quiet: bool = False) -> None:
        """Carry out every pending command of the state machines, persisting first.

        ``quiet`` (after a peer's progress report): subscribers hear of it at most every
        PROGRESS_NOTIFY_MS, so a flood of reports does not build a state for each.

        Commands are taken again after each one is carried out (in the same
        order as batch by batch): a command that changes a state machine
        synchronously (a local Send) makes its follow-ups visible to
        ``getState()`` (``transitioning``, ``evaluating``) before the next await.
        """
        queue: list[tuple[str, Command]] = []
        try:
            while True:
                queue += self._take_commands()
                if not queue:
                    if self.session.coordinator is not None:
                        await self.save_job_record()
                    # A refused record write pauses the job: carry out what that said, too.
                    queue += self._take_commands()
                    if not queue:
                        break
                role, command = queue.pop(0)
                await self._carry_out(role, command)
        except BaseException:
            for _, command in queue:  # dropped with the failure: no longer pending
                self._release(command)
            raise
        # Training of an attempt the participant no longer holds (stop, leave, a lost coordinator) ends now.
        participant = self.session.participant
        current = participant.current if participant is not None else None
        if self.backend.follow(current.attempt_id if current is not None else None):
            self.session.live.drop(self.session.my_peer_id)
        self._settle_stage()
        kept = self.residency.referenced(self.session)
        self.store.evict(kept.rest, kept.fixed)
        if self.session.coordinator is not None:  # progress of attempts that ended goes
            self.session.live.retain(self.session.coordinator.attempts.open_ids())
        self.arm_timer()
        self.diagnostics.report()
        self.log_writer.write()
        for hook in self.after_drain:
            hook()
        if quiet:
            self.view.notify_soon()
        else:
            self.view.notify()

    def _take_commands(self) -> list[tuple[str, Command]]:
        s = self.session
        commands: list[tuple[str, Command]] = []
        if s.coordinator is not None:
            commands += [("coordinator", c) for c in s.coordinator.take_commands()]
        if s.participant is not None:
            commands += [("participant", c) for c in s.participant.take_commands()]
        if s.relay is not None:
            commands += [("relay", c) for c in s.relay.take_commands()]
        for _, command in commands:
            if isinstance(command, RunValidation):
                s.evaluating += 1  # released by _validate
            elif isinstance(command, SaveCheckpoint):
                s.saving += 1  # released by _save_checkpoint
                # The next round's Assigns come before it (their checkpoint's file is written after them).
                # The coordinator named the weights by hashing them.
                self.store.remember(VerifiedBlobs({command.weights_sha256: command.weights}))
        return commands

    def send(self, command: Send) -> None:
        """``command`` to its (remote) peer, with the attachments it names, now."""
        s = self.session
        if s.transport is None:
            s.record("send.dropped", {"to": command.peer, "type": command.message.TYPE})
            return
        s.transport.send(command, {ref.sha256: self.store.artifact(ref.sha256) for ref in command.attachments})

    def _release(self, command: Command) -> None:
        if isinstance(command, RunValidation):
            self.session.evaluating -= 1
        elif isinstance(command, SaveCheckpoint):
            self.session.saving -= 1

    async def _carry_out(self, role: str, command: Command) -> None:
        s = self.session
        if isinstance(command, Send):
            # This machine's own bytes, named by hashing them (an update's weights, a broadcast's pieces) or
            # a relayed piece the node took verified.
            self.store.remember(VerifiedBlobs(command.blobs))
            if command.peer == s.my_peer_id:
                self._deliver_locally(role, command)
            elif self.holds_back(command):
                s.record("send.held", {"to": command.peer, "type": command.message.TYPE})
            else:
                self.send(command)
        elif isinstance(command, SaveCheckpoint):
            await self._save_checkpoint(command)
        elif isinstance(command, RunValidation):
            self.residency.pin({command.weights_sha256, *(ref.sha256 for ref in command.auxiliary.values())})
            self.spawn(self._validate(command))
        elif isinstance(command, Log):
            s.record(command.event, command.details)
        elif isinstance(command, RoundPhase):
            s.debug_log.round_phase(command.round, command.name, command.started, command.finished, s.clock())
        elif isinstance(command, LoadModule):
            self._load_module(command)
        elif isinstance(command, Train):
            self.residency.assignment_taken(command.assign)
            self.spawn(self._train(command))

    def _deliver_locally(self, role: str, command: Send) -> None:
        s = self.session
        now = s.clock()
        if role == "coordinator":
            assert s.participant is not None
            s.participant.on_message(s.my_peer_id, command.message, now)
        else:
            assert s.coordinator is not None
            # The local participant named its trained weights by hashing them: not hashed again.
            blobs = VerifiedBlobs({ref.sha256: self.store.artifact(ref.sha256) for ref in command.attachments})
            s.coordinator.receive(s.my_peer_id, command.message, blobs, now)

    # ---------------------------------------------------------- persistence

    async def save_job_record(self, *, status: str | None = None, active: bool | None = None) -> None:
        """Save the active job's record if it changed; a refused write is reported, not raised."""
        s = self.session
        if s.coordinator is None:
            return
        try:
            await self.store.save_job_record(s.coordinator, job_seed=s.job_seed,
                                             validation_sha256=s.validation_sha256, now=s.clock(),
                                             status=status, active=active)
        except StorageError as exc:
            self.storage_refused(exc, "the job record")

    def storage_refused(self, exc: StorageError, what: str) -> None:
        """Storage refused a write: say so by reason, and pause a running job (what is saved stays)."""
        s = self.session
        s.error = self.refused_error = f"{what} could not be saved: {exc}"
        s.record("storage.refused", {"what": what, "reason": exc.reason, "error": str(exc)[:500]})
        coordinator = s.coordinator
        if coordinator is not None and coordinator.status is JobStatus.RUNNING:
            coordinator.pause(s.clock())

    async def _save_checkpoint(self, command: SaveCheckpoint) -> None:
        s = self.session
        try:
            coordinator = s.coordinator
            assert coordinator is not None
            started = s.monotonic()
            await self.store.save_checkpoint(coordinator.spec.job_id, command)
            if self.prune is not None and (removed := await self.prune(coordinator)):
                s.record("checkpoints.pruned", {"round": command.round, "files": removed})
            finished = s.monotonic()
            # The round's last phase (after its training and aggregation): the round ends with it.
            s.debug_log.round_phase(command.round, "indexeddb.checkpoint-save", started, finished, s.clock())
            s.debug_log.round_finished(finished, command.round)
        except StorageError as exc:
            self.storage_refused(exc, f"the checkpoint of round {command.round}")
        finally:
            s.saving -= 1

    async def _persist_summary(self, round_: int) -> None:
        coordinator = self.session.coordinator
        if coordinator is None:
            return
        summary = next((c for c in coordinator.checkpoints if c["artifact"]["round"] == round_), None)
        if summary is not None:
            try:
                await self.store.update_summary(coordinator.spec.job_id, round_, summary)
            except StorageError as exc:
                self.storage_refused(exc, f"the validation metrics of round {round_}")

    # -------------------------------------------------- training, validation

    async def _validate(self, command: RunValidation) -> None:
        """Run a validation that ``_take_commands`` already counted in ``evaluating``."""
        s = self.session
        pinned = {command.weights_sha256, *(ref.sha256 for ref in command.auxiliary.values())}
        coordinator = s.coordinator
        if coordinator is None:
            self.residency.unpin(pinned)
            s.evaluating -= 1
            return
        spec = coordinator.spec
        self.view.notify()
        try:
            aux = {slot: self.store.artifact(ref.sha256) for slot, ref in command.auxiliary.items()}
            weights = self.store.artifact(command.weights_sha256)
            self.residency.unpin(pinned)
            pinned = set()
            if command.experience is not None:
                task = WorkerTask("evaluate", weights, aux, experience=command.experience,
                                  working_bytes=spec.working_bytes)
            else:
                if s.validation_sha256 is None or s.validation_sha256 not in self.store.artifacts:
                    raise UsageError(UsageReason.VALIDATION_UNAVAILABLE, "the validation file is missing from browser storage")
                task = WorkerTask("evaluate", weights, aux, data=self.store.artifacts[s.validation_sha256],
                                  format=spec.validation_format, working_bytes=spec.working_bytes)
            started = s.monotonic()
            result = await self.backend.evaluate(module_sha256=spec.module.sha256,
                                                 module=self.store.module(spec.module.sha256), task=task)
            s.debug_log.add_phase("validation", s.monotonic() - started, s.clock())
            coordinator.validation_finished(command.round, result.metrics, None, s.clock(), examples=result.count)
        except WeeiError as exc:
            coordinator.validation_finished(command.round, None, str(exc), s.clock())
        finally:
            self.residency.unpin(pinned)
            s.evaluating -= 1
        await self._persist_summary(command.round)
        await self.drain()

    def _load_module(self, command: LoadModule) -> None:
        s = self.session
        participant = s.participant
        assert participant is not None
        try:
            self.store.module(command.module.sha256)
            for ref in command.auxiliary.values():
                self.store.artifact(ref.sha256)
        except WeeiError as exc:
            participant.module_failed(str(exc), s.clock())
            return
        # A remote job's WGSL archive: the backend says whether this device will train on its GPU
        # (and so fetches the archive); our own job's archive the controller set already.
        remote = participant.coordinator != s.my_peer_id
        fetch = remote and self.backend.offer(participant.gpu_offer, participant.cpu_backend)
        s.recorder.join_job(participant.job_id or "", s.monotonic())
        self.module_sha = command.module.sha256
        self._set_model()
        self.residency.module_refs = {command.module.sha256, *(ref.sha256 for ref in command.auxiliary.values())}
        # A remote participant learns the weight size from the first checkpoint it is sent.
        weight_bytes = s.coordinator.spec.weight_bytes if s.coordinator is not None else None
        participant.module_loaded(weight_bytes, tuple(self.store.artifacts), s.clock(), fetch_shader_archive=fetch)
        if participant.coordinator != s.my_peer_id:
            self.diagnostics.start()

    def coordinate(self, spec: JobSpec) -> None:
        """This device coordinates ``spec`` and trains none of it: it still has its own diagnostics entry
        (the manual: "every peer has its own entry"), with its browser, Workers, GPU and the job's model,
        stage ``waiting`` and no assignment, and ``actual`` unknown until it computes (a validation)."""
        s = self.session
        s.recorder.join_job(spec.job_id, s.monotonic())
        s.recorder.update_execution({"requested": s.device.backend_preference,
                                     "workerLimit": s.device.max_local_workers})
        info = spec.info.raw
        s.recorder.set_model({"id": info.get("id", "unknown"), "version": info.get("version", "unknown"),
                              "wasmSha256": spec.module.sha256,
                              "wgsl": getattr(self.backend, "wgsl", {"present": False, "sha256": []})})

    def _set_model(self) -> None:
        """The diagnostics' model: the participant's module and the WGSL archive the backend holds."""
        s = self.session
        info = (s.participant.model_info if s.participant is not None else None) or {}
        s.recorder.set_model({"id": info.get("id", "unknown"), "version": info.get("version", "unknown"),
                              "wasmSha256": self.module_sha,
                              "wgsl": self.backend.wgsl})

    async def _train(self, command: Train) -> None:
        s = self.session
        assign = command.assign
        pinned = assign_refs(assign)
        participant = s.participant
        if participant is None:
            self.residency.unpin(pinned)
            return
        now = s.clock()
        device = s.device
        try:
            try:
                module_sha = self.module_sha
                weights = self.store.artifact(assign.checkpoint.sha256)
                aux = {slot: self.store.artifact(ref.sha256) for slot, ref in assign.auxiliary.items()}
                chunk = self.store.artifact(assign.chunk.data.sha256) if assign.chunk is not None else None
                if assign.shader_archive is not None:
                    # Checked (size, SHA-256, module by module) once per job; a bad one is a named fallback.
                    self.backend.receive_archive(assign.shader_archive.sha256, self.store.artifacts.get(assign.shader_archive.sha256))
                    self._set_model()
            finally:
                self.residency.unpin(pinned)
            info = participant.model_info or {}
            units = assign.experience.unit_count if assign.experience is not None else None
            # settings.workers asks, this device's setMaxLocalWorkers() caps it.
            requested = min(requested_workers(job_settings(s), device.max_local_workers), device.max_local_workers)
            model_max = int(info.get("maxWorkers", 1))
            workers = effective_workers(requested=requested, device_limit=self.backend.device_limit,
                                        model_max=model_max, experience=assign.experience is not None,
                                        unit_count=units)
            settings = job_settings(s)
            parts = experience_parts(job_workers=settings.workers if settings is not None else None,
                                     model_max=model_max, unit_count=units) if units is not None else 1
            s.recorder.start_assignment(_assignment_record(assign), s.monotonic())
            # The backend says where the assignment trains (and why not on the GPU, if so).
            s.recorder.update_execution({"requested": device.backend_preference, "actual": self.backend.kind,
                                         "backend": self.backend.id, "activeWorkers": workers, "workerLimit": device.max_local_workers})
            # Preparing lasts until the first progress report: the Worker instantiates the module and
            # loads the weights first, which trainingMs must not count (the spec's measuring rules).
            s.recorder.on("assigned", s.monotonic())
            s.actual = self.backend.kind
            participant.training_started(assign.attempt_id, now)
            await self.drain()
            started = s.monotonic()
            outcome = await self.backend.train(assign, module_sha256=module_sha,
                                               module=self.store.module(module_sha), weights=weights,
                                               auxiliary=aux, chunk=chunk, workers=workers,
                                               working_bytes=participant.working_bytes, parts=parts)
            trained_ms = s.monotonic() - started
            # The clip comes first: what leaves (compressed or not) is the clipped update.
            clip = assigned_clip(assign.settings)
            if clip is not None and len(outcome.weights) == len(weights):
                outcome = replace(outcome, weights=clip_to_norm(weights, outcome.weights, clip))
            if settings is not None and settings.compression is not None:
                aggregation = (s.coordinator.spec.info.aggregation if s.coordinator is not None
                               else ModelInfo.from_json(info).aggregation)
                outcome = await self.compressor.compress(assign, settings.compression, aggregation, weights, outcome)
        except TaskCancelled:
            return  # the participant dropped this attempt (see drain): nothing of it is reported
        except WeeiError as exc:
            s.recorder.on("failed", s.monotonic(), str(exc)[:500])
            participant.training_failed(assign.attempt_id, str(exc), s.clock())
        else:
            s.actual = self.backend.kind
            if outcome.optimizer_steps is not None:
                s.recorder.optimizer_steps_taken(outcome.optimizer_steps)
            s.recorder.on("trained", s.monotonic())
            self._note_speed(participant.model_info, outcome.count, trained_ms)
            s.last_trained = {"attemptId": assign.attempt_id, "round": assign.round,
                              "chunkId": assign.chunk.id if assign.chunk is not None else None,
                              "examples": outcome.count, "ms": max(0.0, s.clock() - now),
                              "metrics": {k: v for k, v in list(outcome.metrics.items())[:8]}}
            s.record("assignment.trained", s.last_trained)
            # else no update leaves: the result is refused, or masked under secure aggregation (no update at all)
            if len(outcome.weights) == assign.checkpoint.bytes and SECURE_KEY not in assign.settings:
                s.recorder.update_sent(len(outcome.compressed if outcome.compressed is not None else outcome.weights))
            participant.training_finished(assign.attempt_id, outcome, s.clock(), start=weights, x25519=self.x25519)
        s.live.drop(s.my_peer_id)
        s.recorder.update_execution({"activeWorkers": 0})
        await self.drain()
        s.recorder.on("sent", s.monotonic())

    def _settle_stage(self) -> None:
        """The stages between assignments, from what the participant holds and what is arriving.

        ``awaitingAggregation`` lasts until the round's outcome reaches this
        peer: a next assignment (Train starts it over) or the job's end, after
        which the assignment is cleared and the stage is ``waiting``. Without
        an assignment, ``receiving`` shows while the coordinator's files for
        this job are on their way here.
        """
        s = self.session
        participant, recorder = s.participant, s.recorder
        if participant is None or recorder.job_id is None or participant.current is not None:
            return
        mono = s.monotonic()
        if participant.state is PeerState.STOPPED:
            had_assignment = recorder.has_assignment
            recorder.finish_assignment()
            if recorder.on("ended", mono) or had_assignment:
                self.diagnostics.report(final=True)  # the coordinator sees the end, not a stale stage
            return
        recorder.on("files_arriving" if self._receiving_from(participant.coordinator) else "files_idle", mono)

    def _receiving_from(self, coordinator: str | None) -> bool:
        s = self.session
        if s.transport is None or coordinator in (None, s.my_peer_id):
            return False
        return any(t.get("peerId") == coordinator and t.get("direction") == "receive"
                   for t in s.transport.transfers_state().get("transfers", []))

    def on_local_progress(self, payload: dict[str, Any]) -> None:
        """A Worker's progress report (many a second)."""
        s = self.session
        now = s.clock()
        processed = int(payload.get("processedExamples", 0))
        total = payload.get("totalExamples")
        metrics = {k: float(v) for k, v in (payload.get("metrics") or {}).items()}
        current = s.participant.current if s.participant is not None else None
        s.live.report(s.my_peer_id, processed, total, metrics, now,
                      attempt_id=current.attempt_id if current is not None else None,
                      elapsed_ms=s.participant.training_elapsed_ms(now) if s.participant is not None else None)
        model, rate = (s.participant.model_info or {}).get("id") if s.participant else None, \
            s.live.records_per_second([s.my_peer_id])
        if isinstance(model, str) and rate:  # a few models at most: the oldest goes past 64
            s.measured.pop(model[:256], None)
            s.measured[model[:256]] = rate
            if len(s.measured) > 64:
                s.measured.pop(next(iter(s.measured)))
        if s.participant is not None and total is not None and \
                s.participant.report_progress(processed, int(total), metrics, now):
            self.spawn(self.drain())  # the Progress message leaves (the participant rate-limits it)
        if current is not None:
            s.recorder.on("running", s.monotonic())
        try:
            s.recorder.progress(processed, now, s.monotonic(), total=total)
        except WeeiError:
            pass  # a progress report outside an assignment carries no figures
        self.view.notify_soon()

    def _note_speed(self, info: Mapping[str, Any] | None, examples: int, ms: float) -> None:
        """Keep the assignment's speed by model and mode (its examples or units over the backend's whole
        train call, the same span in both modes): after a GPU round the window compares it with the CPU's."""
        s = self.session
        model = (info or {}).get("id")
        if not isinstance(model, str) or examples <= 0 or ms <= 0:
            return
        rate = examples * 1000.0 / ms
        by_mode = s.speeds.pop(model[:256], {})
        by_mode[self.backend.kind] = float(rate)
        s.speeds[model[:256]] = by_mode
        if len(s.speeds) > 64:  # a few models at most: the oldest goes
            s.speeds.pop(next(iter(s.speeds)))

    def on_peer_progress(self, peer: str, message: Progress, now: float) -> bool:
        """The coordinator accepted ``peer``'s Progress for an open attempt: keep it (bounded)."""
        kept = self.session.live.report(peer, message.processed_examples, message.total_examples,
                                        message.metrics, now, attempt_id=message.attempt_id,
                                        elapsed_ms=message.elapsed_ms)
        self.view.notify_soon()
        return kept

    # ------------------------------------------------------- timers and tasks

    def arm_timer(self) -> None:
        s = self.session
        coordinator = s.coordinator
        at = coordinator.next_timer() if coordinator is not None else None
        # The clock against the loop's: the timer sleeps loop time, and a clock that moved apart from it (a
        # step of the wall clock, a test's simulated jump) needs the sleep worked out again.
        offset = s.clock() - asyncio.get_running_loop().time() * 1000.0 if at is not None else 0.0
        if self.timer is not None:
            armed = self._armed
            # The same deadline asked for again after most drains: a new task each time was ~5% of a
            # coordinator's CPU a message (at 1,000 peers, 12 drains a client message).
            if at is not None and armed[0] is coordinator and armed[1] == at and abs(armed[2] - offset) < 50.0:
                return
            self.timer.cancel()
            self.timer = None
        if coordinator is None or at is None:
            return

        async def fire() -> None:
            await asyncio.sleep(max(0.0, (at - s.clock()) / 1000.0))
            if s.coordinator is coordinator:
                self.timer = None
                coordinator.handle_timer(s.clock())
                await self.drain()

        self.timer = asyncio.ensure_future(fire())
        self._armed = (coordinator, at, offset)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            self.session.error = str(exc)
            self.session.record("task.failed", {"error": repr(exc)[:500]})
            self.view.notify()

    async def idle(self) -> None:
        """Wait until no background task (training, validation) is running."""
        while self.tasks:
            await asyncio.gather(*list(self.tasks), return_exceptions=True)

    def job_cleared(self) -> None:
        """The active job is gone: interrupt its tasks, stop its timer and diagnostics, forget its
        assignments and bytes."""
        self.backend.follow(None)
        self.backend.cancel()
        self.diagnostics.stop()
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.module_sha = ""
        self.session.relay = None
        self.residency.forget_job()
        self.store.evict(set(self.residency.pinned))


def _assignment_record(assign: Assign) -> dict[str, Any]:
    settings = assign.settings
    return {"jobId": assign.job_id, "round": assign.round, "assignmentId": assign.assignment_id,
            "attemptId": assign.attempt_id,
            "chunkId": assign.chunk.id if assign.chunk is not None else "unknown",
            "bytes": assign.chunk.data.bytes if assign.chunk is not None else 0,
            "exampleCount": assign.chunk.example_count if assign.chunk is not None else assign.experience.unit_count,
            "batchSize": settings.get("batchSize", 1), "localEpochs": settings.get("localEpochs", 1),
            "learningRate": settings.get("learningRate", "unknown")}
