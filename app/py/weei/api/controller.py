"""The distributed-training API: methods, state and persistence of one browser.

Theory of operation
-------------------
The controller owns at most one active job, as coordinator (a
``Coordinator`` state machine, plus this device's own ``Participant`` when
``coordinatorParticipates``) or as participant. Every API method turns into
calls on those state machines; ``_drain`` then carries out their commands:
messages go to the local participant directly or to the transport,
checkpoints and job records go to storage before anything else happens,
training and validation go to the Worker pool as background tasks whose
results come back as events. After every change, subscribers get a fresh
``getState()``.

A reload finds the job record and its last checkpoint in storage and
continues from there (``Coordinator.resume`` in 'resume' mode): the round
that was running is trained again, nothing saved is lost.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from typing import Any, Callable, Mapping

from ..core.checkpoint import read_checkpoint
from ..core.commands import Command, LoadModule, Log, RunValidation, SaveCheckpoint, Send, Train
from ..core.coordinator import Coordinator
from ..core.debuglog import DebugLog
from ..core.diagnostics import DiagnosticsBook, DiagnosticsRecorder
from ..core.errors import CheckpointError, UsageError, WeeiError
from ..core.job import JobSpec
from ..core.messages import DiagnosticsReport, Invitation, Message, decode_message
from ..core.participant import Participant
from ..core.settings import TrainingSettings
from ..prepare import MAX_FILE_BYTES, prepare_job
from .local_training import LocalWorkers, effective_workers
from .ports import KeyValue, Storage, TaskCancelled, Transport, WorkerPool, WorkerTask
from .records import spec_from_record, spec_to_record

__all__ = ["TrainingController", "DEBUG_LOG_KEY"]

DEBUG_LOG_KEY = "weei.debugLog"
PARTICIPATION_KEY = "participation"  # the job this device accepted, in the settings store
_LIVE_METRICS_KEPT = 200
PROGRESS_NOTIFY_MS = 100


class TrainingController:
    """One browser's side of the API. Call ``await init()`` once before use."""

    def __init__(self, *, my_peer_id: str, storage: Storage, kv: KeyValue, pool: WorkerPool, kernel: Any,
                 engine: Any, clock: Callable[[], float], monotonic: Callable[[], float],
                 random_bytes: Callable[[int], bytes], transport: Transport | None = None,
                 environment: Mapping[str, Any] | None = None) -> None:
        self.my_peer_id = my_peer_id
        self.storage = storage
        self.kv = kv
        self.pool = pool
        self.kernel = kernel
        self.engine = engine
        self.clock = clock
        self.monotonic = monotonic
        self.random_bytes = random_bytes
        self.transport = transport
        self.coordinator: Coordinator | None = None
        self.participant: Participant | None = None
        self.job_seed: int | None = None
        self.artifacts: dict[str, bytes] = {}  # in-memory copies of what the job needs now
        self.validation_sha256: str | None = None
        self.validation_unavailable = False
        self.latest_checkpoint: tuple[str, bytes] | None = None
        self.invitations: dict[str, dict[str, Any]] = {}
        self.busy = 0
        self.preparing = False
        self.evaluating = 0
        self._saving = 0  # SaveCheckpoint commands taken and not yet written
        self.error: str | None = None
        self.paused_contribution = False
        self.max_local_workers = 4
        self.gpu_memory_budget_mib = 512
        self.backend_preference = "auto"
        self.progress: dict[str, dict[str, Any]] = {}
        self.live_metrics: dict[str, list[dict[str, Any]]] = {}
        self.saved_jobs: dict[str, dict[str, Any]] = {}
        self.listeners: list[Callable[[dict[str, Any]], None]] = []
        self.debug_log = DebugLog.from_json(kv.get(DEBUG_LOG_KEY), clock())
        # environment: the diagnostics' browser/browserVersion/os/logicalCores (the agent says 'agent').
        self.recorder = DiagnosticsRecorder(sequence_base=int(clock()), environment=environment)
        self.book = DiagnosticsBook()
        self.local = LocalWorkers(pool, kernel, on_progress=self._on_local_progress)
        self._module_sha = ""
        self._notify_pending: asyncio.TimerHandle | None = None
        self._actual = "unknown"  # the mode this device trained in, once it has
        self._diagnostics_task: asyncio.Task[Any] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._timer: asyncio.Task[Any] | None = None

    # ------------------------------------------------------------------ setup

    async def init(self) -> None:
        """Load saved settings and jobs; continue an interrupted job from its last checkpoint."""
        settings = await self.storage.get("settings", "device") or {}
        self.max_local_workers = int(settings.get("maxLocalWorkers", self.pool.device_limit))
        self.gpu_memory_budget_mib = int(settings.get("gpuMemoryBudgetMiB", self.gpu_memory_budget_mib))
        self.backend_preference = str(settings.get("backendPreference", "auto"))
        for key in await self.storage.keys("jobs"):
            record = await self.storage.get("jobs", key)
            if isinstance(record, dict):
                self.saved_jobs[key] = record
        active = [r for r in self.saved_jobs.values() if r.get("active")]
        participation = await self.storage.get("settings", PARTICIPATION_KEY)
        if participation and not active:
            self._rejoin(participation)
        if active:
            latest = max(active, key=lambda r: r.get("updatedAt", 0))
            try:
                await self._reopen(latest["id"], restart=latest.get("status") == "running")
            except WeeiError as exc:
                self.error = f"saved job {latest['id']} could not be reopened: {exc}"
                self._record("job.reopen-failed", {"jobId": latest["id"], "error": str(exc)})
        self._notify()

    # ------------------------------------------------------------ API methods

    async def create_job(self, *, wasm_name: str, wasm: bytes, manifest: bytes, files: Mapping[str, bytes],
                         settings: Any, validation: tuple[str, bytes] | None = None) -> str:
        """createJob(): check everything, save the job and checkpoint 0. Returns the job id."""
        self._require_no_active_job()
        async with self._busy(preparing=True):
            manifest_json = _parse_json(manifest, "manifest")
            job_id = "job-" + self.random_bytes(8).hex()
            prepared = prepare_job(self.engine, job_id=job_id, wasm_name=wasm_name, wasm=wasm,
                                   manifest=manifest_json, files=files, settings=settings,
                                   random_bytes=self.random_bytes(16), validation=validation)
            for sha, data in prepared.artifacts.items():
                await self.storage.put("artifacts", sha, data)
                self.artifacts[sha] = data
            if prepared.validation is not None:
                self.validation_sha256 = hashlib.sha256(prepared.validation).hexdigest()
                await self.storage.put("artifacts", self.validation_sha256, prepared.validation)
                self.artifacts[self.validation_sha256] = prepared.validation
            self.job_seed = prepared.job_seed
            self.coordinator = Coordinator.create(prepared.spec, prepared.initial_weights, my_peer_id=self.my_peer_id,
                                                  kernel=self.kernel, now=self.clock(), job_seed=prepared.job_seed)
            self._setup_local_participant()
            await self._save_job_record(status="ready")
            self._record("job.created", {"jobId": job_id, "model": prepared.spec.info.id})
            await self._drain()
            return job_id

    async def continue_from_checkpoint(self, *, checkpoint: bytes, wasm_name: str, wasm: bytes, manifest: bytes,
                                       files: Mapping[str, bytes], settings: Any, dataset_mode: str,
                                       validation: tuple[str, bytes] | None = None) -> str:
        """continueFromCheckpoint(): a new job that starts from a checkpoint file's weights."""
        self._require_no_active_job()
        if dataset_mode not in ("new", "resume"):
            raise UsageError("bad-dataset-mode", "datasetMode must be 'new' or 'resume'")
        if len(checkpoint) > MAX_FILE_BYTES:
            raise CheckpointError("file-too-large", f"the checkpoint is {len(checkpoint)} bytes, over the 256 MB limit")
        async with self._busy(preparing=True):
            read = read_checkpoint(checkpoint)
            job_id = "job-" + self.random_bytes(8).hex()
            prepared = prepare_job(self.engine, job_id=job_id, wasm_name=wasm_name, wasm=wasm,
                                   manifest=_parse_json(manifest, "manifest"), files=files, settings=settings,
                                   random_bytes=self.random_bytes(16), validation=validation)
            # The module decides compatibility: its loadModel must take the weights.
            prepared.runtime.load_model(read.weights)
            new_seed = prepared.job_seed
            self.coordinator = Coordinator.resume(prepared.spec, read, mode=dataset_mode, my_peer_id=self.my_peer_id,
                                                  kernel=self.kernel, now=self.clock(), new_job_seed=new_seed)
            self.job_seed = self.coordinator.job_seed
            for sha, data in prepared.artifacts.items():
                await self.storage.put("artifacts", sha, data)
                self.artifacts[sha] = data
            weights_sha = self.coordinator.weights_sha256
            await self.storage.put("artifacts", weights_sha, bytes(read.weights))
            self.artifacts[weights_sha] = bytes(read.weights)
            if prepared.validation is not None:
                self.validation_sha256 = hashlib.sha256(prepared.validation).hexdigest()
                await self.storage.put("artifacts", self.validation_sha256, prepared.validation)
                self.artifacts[self.validation_sha256] = prepared.validation
            round_ = read.metadata.round
            await self.storage.put("checkpoints", _ckpt_key(job_id, round_),
                                   {"summary": _summary_of(read, self.clock()), "file": bytes(checkpoint)})
            self.coordinator.checkpoints.append(_summary_of(read, self.clock()))
            self.latest_checkpoint = (read.metadata.to_json()["checkpoint"]["fileName"], bytes(checkpoint))
            self._setup_local_participant()
            await self._save_job_record(status="ready")
            self._record("job.continued", {"jobId": job_id, "fromRound": round_, "datasetMode": dataset_mode})
            await self._drain()
            return job_id

    def invite(self, peer_id: str) -> None:
        coordinator = self._require_coordinator("invite participants")
        if self.transport is None or peer_id not in self.transport.peers():
            raise UsageError("peer-not-connected", f"peer {peer_id} is not connected to you")
        coordinator.invite(peer_id, self.clock())
        self._spawn(self._drain())

    async def decide_invitation(self, job_id: str, accepted: bool) -> None:
        if job_id not in self.invitations or self.participant is None:
            raise UsageError("no-invitation", f"there is no pending invitation for job {job_id}")
        invitation = self.participant.invitation
        self.participant.decide(accepted, self.clock())
        del self.invitations[job_id]
        if accepted and invitation is not None:
            # Kept so a restarted agent or a reloaded page takes part again when the coordinator is back.
            await self.storage.put("settings", PARTICIPATION_KEY, {"invitation": invitation.to_json(),
                                                                   "from": self.participant.coordinator})
        await self._drain()  # the decision must leave before a declined machine is dropped
        if not accepted:
            self.participant = None
            self._notify()

    async def start(self) -> None:
        coordinator = self._require_coordinator("start the job")
        coordinator.start(self.clock())
        await self._save_job_record(status="running")
        await self._drain()

    async def pause(self) -> None:
        coordinator = self._require_coordinator("pause the job")
        coordinator.pause(self.clock())
        await self._save_job_record(status="paused")
        await self._drain()

    async def resume(self) -> None:
        coordinator = self._require_coordinator("resume the job")
        coordinator.resume_running(self.clock())
        await self._save_job_record(status="running")
        await self._drain()

    async def stop(self) -> None:
        coordinator = self._require_coordinator("stop the job")
        coordinator.stop(self.clock())
        await self._drain()

    async def update_settings(self, settings: Any) -> None:
        coordinator = self._require_coordinator("change the settings")
        coordinator.update_settings(TrainingSettings.from_json(settings), self.clock())
        await self._save_job_record()
        await self._drain()

    async def run_validation(self) -> None:
        coordinator = self._require_coordinator("run validation")
        if self.validation_unavailable:
            raise UsageError("validation-unavailable", "the validation file is missing from browser storage")
        coordinator.request_validation(self.clock())
        await self._drain()

    async def shuffle_chunks(self) -> None:
        coordinator = self._require_coordinator("shuffle the chunks")
        coordinator.shuffle_chunks(int.from_bytes(self.random_bytes(8), "little"), self.clock())
        await self._drain()

    def export_checkpoint(self) -> tuple[str, bytes]:
        """exportCheckpoint(): the latest checkpoint as (file name, bytes)."""
        if self.latest_checkpoint is None:
            raise UsageError("no-checkpoint", "there is no checkpoint to export yet")
        return self.latest_checkpoint

    def export_module(self) -> tuple[str, bytes] | None:
        """exportModule(): the job's model module, if this browser keeps it."""
        spec = self._spec()
        if spec is None:
            raise UsageError("no-job", "there is no job")
        data = self.artifacts.get(spec.module.sha256)
        return (spec.module.file_name, data) if data is not None else None

    async def leave(self) -> None:
        """leave(): the job stops here and stays in Saved jobs."""
        if self.coordinator is not None:
            if self.coordinator.status == "running":
                self.coordinator.pause(self.clock())
            await self._drain()
            await self._save_job_record(active=False)
        elif self.participant is not None:
            if self.participant.state not in ("stopped", "declined", "unknown"):
                self.participant.leave(self.clock())
            await self._drain()
            await self.storage.delete("settings", PARTICIPATION_KEY)
        else:
            raise UsageError("no-job", "there is no job to leave")
        self._clear_job()
        self._notify()

    async def open_saved_job(self, job_id: str) -> None:
        """Make a saved job active again (from its last checkpoint)."""
        self._require_no_active_job()
        if job_id not in self.saved_jobs:
            raise UsageError("unknown-job", f"there is no saved job {job_id}")
        await self._reopen(job_id, restart=False)
        await self._save_job_record(active=True)
        self._notify()

    async def delete_saved_job(self, job_id: str) -> None:
        if self.coordinator is not None and self.coordinator.spec.job_id == job_id:
            raise UsageError("job-active", "leave the job before deleting it")
        for key in await self.storage.keys("checkpoints"):
            if key.startswith(job_id + "/"):
                await self.storage.delete("checkpoints", key)
        await self.storage.delete("jobs", job_id)
        self.saved_jobs.pop(job_id, None)
        self._notify()

    def pause_contribution(self, paused: bool) -> None:
        self.paused_contribution = bool(paused)
        if self.participant is not None and self.participant.job_id is not None and \
                self.participant.state not in ("unknown", "invited", "declined", "stopped"):
            self.participant.pause_contribution(self.paused_contribution, self.clock())
            self._spawn(self._drain())
        else:
            self._notify()

    async def set_max_local_workers(self, count: int) -> None:
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 64:
            raise UsageError("bad-worker-count", "the number of local Workers must be a whole number from 1 to 64")
        self.max_local_workers = count
        await self._save_device_settings()

    async def set_gpu_memory_budget_mib(self, mib: int) -> None:
        if isinstance(mib, bool) or not isinstance(mib, int) or not 0 <= mib <= 1 << 20:
            raise UsageError("bad-gpu-budget", "the GPU memory budget must be a whole number of MiB from 0")
        self.gpu_memory_budget_mib = mib
        await self._save_device_settings()

    async def set_backend_preference(self, preference: str) -> None:
        if preference not in ("auto", "cpu", "gpu", "hybrid"):
            raise UsageError("bad-backend", "the backend preference is 'auto', 'cpu', 'gpu' or 'hybrid'")
        self.backend_preference = preference
        await self._save_device_settings()

    def get_debug_log(self) -> dict[str, Any]:
        return self.debug_log.to_file(self.clock())

    def clear_debug_log(self) -> None:
        self.debug_log.clear()
        self.kv.set(DEBUG_LOG_KEY, self.debug_log.to_json())
        self._notify()

    def subscribe(self, listener: Callable[[dict[str, Any]], None]) -> Callable[[], None]:
        """Call ``listener`` now and after every change; returns the unsubscribe function."""
        self.listeners.append(listener)
        listener(self.get_state())

        def unsubscribe() -> None:
            if listener in self.listeners:
                self.listeners.remove(listener)

        return unsubscribe

    # ------------------------------------------------------------------ state

    def get_state(self) -> dict[str, Any]:
        """The spec's TrainingState: a fresh copy, no files, data or weights."""
        now = self.clock()
        coordinator = self.coordinator
        state: dict[str, Any] = {
            "ready": True,
            "myPeerId": self.my_peer_id,
            "busy": self.busy > 0,
            "preparing": self.preparing,
            # A round's checkpoint is being made durable (the spec: averaging into a checkpoint).
            "transitioning": self._saving > 0,
            "evaluating": self.evaluating > 0,
            "peers": self.transport.peers() if self.transport is not None else [],
            "invitations": [[job_id, json.loads(json.dumps(inv))] for job_id, inv in self.invitations.items()],
            "progress": json.loads(json.dumps(self.progress)),
            "liveMetrics": json.loads(json.dumps(self.live_metrics)),
            **self._transfers(),
            "pausedContribution": self.paused_contribution,
            "activeWorkers": self.pool.active,
            "backendPreference": self.backend_preference,
            "execution": {"requested": self.backend_preference, "actual": self._actual,
                          "phase": self.recorder.stage,
                          "fallback": "none" if self.backend_preference in ("auto", "cpu") else
                          "cpu: no GPU backend in this build"},
            "maxLocalWorkers": self.max_local_workers,
            "gpuMemoryBudgetMiB": self.gpu_memory_budget_mib,
            "diagnostics": self._diagnostics(now),
            "savedJobs": [self._saved_summary(r) for r in sorted(self.saved_jobs.values(),
                                                                  key=lambda r: -r.get("updatedAt", 0))],
        }
        if self.error:
            state["error"] = self.error
        if coordinator is not None:
            job = coordinator.view(now)
            job["validationUnavailable"] = self.validation_unavailable
            job["hasModuleFile"] = coordinator.spec.module.sha256 in self.artifacts
            job["localWorkers"] = self._local_workers(coordinator.spec)
            if coordinator.error and "error" not in state:
                state["error"] = coordinator.error
            state["job"] = job
        elif self.participant is not None and self.participant.job_id is not None and \
                self.participant.state not in ("invited", "declined"):
            info = self.participant.model_info or {}
            state["job"] = {
                "id": self.participant.job_id, "role": "participant",
                "status": "completed" if self.participant.state == "stopped" else "running",
                "owner": self.participant.coordinator, "info": info, "settings": {},
                "participants": {self.my_peer_id: {"connected": True, "approved": True,
                                                   "paused": self.paused_contribution,
                                                   "state": self.participant.state}},
                "queue": [], "checkpoints": [], "slots": [], "incomplete": bool(self.participant.incomplete),
                "shuffled": False, "validationUnavailable": False, "module": {}, "hasModuleFile": False,
                "localWorkers": {"requested": self.max_local_workers, "capacity": 1, "effective": 1,
                                 "active": self.pool.active},
            }
        return state

    def changed(self) -> None:
        """Something outside the state machines changed (peers, transfers): tell subscribers."""
        self._notify()

    def _transfers(self) -> dict[str, Any]:
        state = getattr(self.transport, "transfers_state", None) or getattr(self.transport, "state", None)
        if callable(state):
            return json.loads(json.dumps(state()))
        return {"transfers": [], "transferErrors": {}}

    def _local_workers(self, spec: JobSpec) -> dict[str, Any]:
        requested = spec.settings.workers or self.max_local_workers
        experience = spec.is_experience
        capacity = effective_workers(requested=10**6, device_limit=self.pool.device_limit,
                                     model_max=spec.info.max_workers, experience=experience, unit_count=None)
        units = None
        if experience:
            units = spec.settings.experience.units_per_assignment if spec.settings.experience else \
                spec.info.work_source.default_units
        effective = effective_workers(requested=min(requested, self.max_local_workers),
                                      device_limit=self.pool.device_limit, model_max=spec.info.max_workers,
                                      experience=experience, unit_count=units)
        return {"requested": requested, "capacity": capacity, "effective": effective, "active": self.pool.active}

    def _diagnostics(self, now: float) -> dict[str, Any]:
        view = self.book.view(now)
        if self.recorder.job_id is not None:
            own = self.recorder.view(now, self.monotonic())
            own.update({"receivedAt": now, "ageMs": 0, "stale": False, "connected": True})
            view[self.my_peer_id] = own
        return view

    @staticmethod
    def _saved_summary(record: dict[str, Any]) -> dict[str, Any]:
        return {"id": record["id"], "model": record["modelInfo"].get("name", record["modelInfo"].get("id")),
                "status": record.get("status", "ready"), "round": record.get("lastRound", 0),
                "updatedAt": record.get("updatedAt", 0), "active": bool(record.get("active"))}

    # ------------------------------------------------------------- transport

    async def receive(self, peer: str, message: Message, blobs: Mapping[str, bytes]) -> None:
        """A message from another peer, with its verified attachments."""
        now = self.clock()
        for sha, data in blobs.items():
            self.artifacts[sha] = data
        if isinstance(message, Invitation):
            if self.coordinator is not None or (self.participant is not None and self.participant.state not in (
                    "declined", "stopped")):
                self._record("invitation.ignored", {"from": peer, "reason": "busy with another job"})
                return
            self.participant = Participant(self.my_peer_id)
            self.participant.receive(peer, message, now)
            self.invitations[message.job_id] = {"invitation": {
                "coordinator": message.coordinator, "modelInfo": message.model_info, "module": message.module,
                "dataBytes": message.data_bytes, "settings": message.settings}, "receivedAt": now}
        elif self.coordinator is not None and peer != self.my_peer_id and _to_coordinator(message):
            self.coordinator.receive(peer, message, blobs, now)
        elif self.participant is not None:
            self.participant.receive(peer, message, now)
            if self.participant.state == "stopped":
                await self.storage.delete("settings", PARTICIPATION_KEY)
        await self._drain()

    def _rejoin(self, record: Any) -> None:
        try:
            invitation = decode_message(record["invitation"])
            assert isinstance(invitation, Invitation)
            self.participant = Participant.rejoin(self.my_peer_id, record["from"], invitation)
        except (WeeiError, KeyError, TypeError, AssertionError) as exc:
            self._record("participation.unreadable", {"error": str(exc)[:200]})
            return
        self._record("participation.restored", {"jobId": invitation.job_id, "coordinator": record["from"]})

    async def peer_connected(self, peer: str) -> None:
        """A peer's channel opened (again): a returning participant catches up."""
        if self.coordinator is not None:
            self.coordinator.peer_connected(peer, self.clock())
        if self.participant is not None and peer == self.participant.coordinator:
            self.participant.reconnected(self.clock())
            self.recorder.reconnected()
        await self._drain()

    async def peer_disconnected(self, peer: str) -> None:
        if self.coordinator is not None:
            self.coordinator.peer_disconnected(peer, self.clock())
            self.book.mark_disconnected(peer)
        if self.participant is not None and peer == self.participant.coordinator and peer != self.my_peer_id:
            # Our coordinator is gone (for now): on its return we are 'approved' again and
            # take the module it delivers, whatever state the job was in.
            self.participant.disconnected(self.clock())
        await self._drain()

    # -------------------------------------------------------------- commands

    async def _drain(self) -> None:
        """Carry out every pending command of the state machines, persisting first.

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
                    break
                role, command = queue.pop(0)
                await self._carry_out(role, command)
        except BaseException:
            for _, command in queue:  # dropped with the failure: no longer pending
                self._release(command)
            raise
        # Training of an attempt the participant no longer holds (stop, leave, a lost coordinator) ends now.
        current = self.participant.current if self.participant is not None else None
        if self.local.follow(current.attempt_id if current is not None else None):
            self.progress.pop(self.my_peer_id, None)
        if self.coordinator is not None:
            await self._save_job_record()
        self._arm_timer()
        self._report_diagnostics()
        self.kv.set(DEBUG_LOG_KEY, self.debug_log.to_json())
        self._notify()

    def _take_commands(self) -> list[tuple[str, Command]]:
        commands: list[tuple[str, Command]] = []
        if self.coordinator is not None:
            commands += [("coordinator", c) for c in self.coordinator.take_commands()]
        if self.participant is not None:
            commands += [("participant", c) for c in self.participant.take_commands()]
        for _, command in commands:
            if isinstance(command, RunValidation):
                self.evaluating += 1  # released by _validate
            elif isinstance(command, SaveCheckpoint):
                self._saving += 1  # released by _save_checkpoint
        return commands

    def _release(self, command: Command) -> None:
        if isinstance(command, RunValidation):
            self.evaluating -= 1
        elif isinstance(command, SaveCheckpoint):
            self._saving -= 1

    async def _carry_out(self, role: str, command: Command) -> None:
        if isinstance(command, Send):
            for sha, data in command.blobs.items():
                self.artifacts[sha] = data
            if command.peer == self.my_peer_id:
                self._deliver_locally(role, command)
            elif self.transport is not None:
                blobs = {ref.sha256: self._artifact(ref.sha256) for ref in command.attachments}
                self.transport.send(command, blobs)
            else:
                self._record("send.dropped", {"to": command.peer, "type": command.message.TYPE})
        elif isinstance(command, SaveCheckpoint):
            await self._save_checkpoint(command)
        elif isinstance(command, RunValidation):
            self._spawn(self._validate(command))
        elif isinstance(command, Log):
            self._record(command.event, command.details)
        elif isinstance(command, LoadModule):
            self._load_module(command)
        elif isinstance(command, Train):
            self._spawn(self._train(command))

    def _deliver_locally(self, role: str, command: Send) -> None:
        now = self.clock()
        if role == "coordinator":
            assert self.participant is not None
            self.participant.receive(self.my_peer_id, command.message, now)
        else:
            assert self.coordinator is not None
            blobs = {ref.sha256: self._artifact(ref.sha256) for ref in command.attachments}
            self.coordinator.receive(self.my_peer_id, command.message, blobs, now)

    async def _save_checkpoint(self, command: SaveCheckpoint) -> None:
        try:
            await self._write_checkpoint(command)
        finally:
            self._saving -= 1

    async def _write_checkpoint(self, command: SaveCheckpoint) -> None:
        coordinator = self.coordinator
        assert coordinator is not None
        started = self.monotonic()
        await self.storage.put("artifacts", command.weights_sha256, command.weights)
        self.artifacts[command.weights_sha256] = command.weights
        await self.storage.put("checkpoints", _ckpt_key(coordinator.spec.job_id, command.round),
                               {"summary": command.summary, "file": command.file})
        self.debug_log.add_phase("indexeddb.checkpoint-save", self.monotonic() - started, self.clock())
        self.latest_checkpoint = (command.summary["artifact"]["fileName"], command.file)

    async def _validate(self, command: RunValidation) -> None:
        """Run a validation that ``_take_commands`` already counted in ``evaluating``."""
        coordinator = self.coordinator
        if coordinator is None:
            self.evaluating -= 1
            return
        spec = coordinator.spec
        self._notify()
        try:
            aux = {slot: self._artifact(ref.sha256) for slot, ref in command.auxiliary.items()}
            weights = self._artifact(command.weights_sha256)
            if command.experience is not None:
                task = WorkerTask("evaluate", weights, aux, experience=command.experience)
            else:
                if self.validation_sha256 is None or self.validation_sha256 not in self.artifacts:
                    raise UsageError("validation-unavailable", "the validation file is missing from browser storage")
                task = WorkerTask("evaluate", weights, aux, data=self.artifacts[self.validation_sha256],
                                  format=spec.validation_format)
            started = self.monotonic()
            result = await self.pool.run(0, spec.module.sha256, self._artifact(spec.module.sha256), task)
            self.debug_log.add_phase("validation", self.monotonic() - started, self.clock())
            coordinator.validation_finished(command.round, result.metrics, None, self.clock())
        except WeeiError as exc:
            coordinator.validation_finished(command.round, None, str(exc), self.clock())
        finally:
            self.evaluating -= 1
        await self._persist_summary(command.round)
        await self._drain()

    async def _persist_summary(self, round_: int) -> None:
        coordinator = self.coordinator
        if coordinator is None:
            return
        key = _ckpt_key(coordinator.spec.job_id, round_)
        stored = await self.storage.get("checkpoints", key)
        summary = next((c for c in coordinator.checkpoints if c["artifact"]["round"] == round_), None)
        if stored is not None and summary is not None:
            stored["summary"] = summary
            await self.storage.put("checkpoints", key, stored)

    def _load_module(self, command: LoadModule) -> None:
        participant = self.participant
        assert participant is not None
        try:
            module = self._artifact(command.module.sha256)
            for ref in command.auxiliary.values():
                self._artifact(ref.sha256)
        except WeeiError as exc:
            participant.module_failed(str(exc), self.clock())
            return
        info = participant.model_info or {}
        self.recorder.join_job(participant.job_id or "", self.monotonic())
        self.recorder.set_model({"id": info.get("id", "unknown"), "version": info.get("version", "unknown"),
                                 "wasmSha256": command.module.sha256, "wgsl": {"present": False, "sha256": []}})
        self._module_sha = command.module.sha256
        # A remote participant learns the weight size from the first checkpoint it is sent.
        weight_bytes = self.coordinator.spec.weight_bytes if self.coordinator is not None else None
        participant.module_loaded(weight_bytes, tuple(self.artifacts), self.clock())
        del module
        if participant.coordinator != self.my_peer_id and self._diagnostics_task is None:
            self._diagnostics_task = asyncio.ensure_future(self._diagnostics_loop())

    async def _train(self, command: Train) -> None:
        participant = self.participant
        if participant is None:
            return
        assign = command.assign
        now = self.clock()
        try:
            module_sha = self._module_sha
            weights = self._artifact(assign.checkpoint.sha256)
            aux = {slot: self._artifact(ref.sha256) for slot, ref in assign.auxiliary.items()}
            chunk = self._artifact(assign.chunk.data.sha256) if assign.chunk is not None else None
            info = participant.model_info or {}
            units = assign.experience.unit_count if assign.experience is not None else None
            workers = effective_workers(requested=self.max_local_workers, device_limit=self.pool.device_limit,
                                        model_max=int(info.get("maxWorkers", 1)),
                                        experience=assign.experience is not None, unit_count=units)
            self.recorder.start_assignment(self._assignment_record(assign), self.monotonic())
            # This build trains on the CPU only: 'gpu' or 'hybrid' requests fall back, and say so.
            fallback = None if self.backend_preference in ("auto", "cpu") else \
                "no GPU backend in this build: WGSL archives are not supported yet"
            self.recorder.update_execution({"requested": self.backend_preference, "actual": "cpu",
                                            "backend": "cpu-wasm", "fallbackReason": fallback,
                                            "activeWorkers": workers, "workerLimit": self.max_local_workers})
            self.recorder.set_stage("training", self.monotonic())
            self._actual = "cpu"
            participant.training_started(assign.attempt_id, now)
            await self._drain()
            outcome = await self.local.train(assign, module_sha256=module_sha, module=self._artifact(module_sha),
                                             weights=weights, auxiliary=aux, chunk=chunk, workers=workers)
        except TaskCancelled:
            return  # the participant dropped this attempt (see _drain): nothing of it is reported
        except WeeiError as exc:
            self.recorder.set_stage("error", self.monotonic(), str(exc)[:500])
            participant.training_failed(assign.attempt_id, str(exc), self.clock())
        else:
            self.recorder.set_stage("uploading", self.monotonic())
            participant.weight_bytes = participant.weight_bytes or len(weights)
            participant.training_finished(assign.attempt_id, outcome, self.clock())
        self.progress.pop(self.my_peer_id, None)
        self.recorder.update_execution({"activeWorkers": 0})
        await self._drain()
        if self.recorder.stage == "uploading":
            self.recorder.set_stage("awaitingAggregation", self.monotonic())

    def _assignment_record(self, assign: Any) -> dict[str, Any]:
        settings = assign.settings
        return {"jobId": assign.job_id, "round": assign.round, "assignmentId": assign.assignment_id,
                "attemptId": assign.attempt_id,
                "chunkId": assign.chunk.id if assign.chunk is not None else "unknown",
                "bytes": assign.chunk.data.bytes if assign.chunk is not None else 0,
                "exampleCount": assign.chunk.example_count if assign.chunk is not None else assign.experience.unit_count,
                "batchSize": settings.get("batchSize", 1), "localEpochs": settings.get("localEpochs", 1),
                "learningRate": settings.get("learningRate", "unknown")}

    def _on_local_progress(self, payload: dict[str, Any]) -> None:
        now = self.clock()
        processed = int(payload.get("processedExamples", 0))
        total = payload.get("totalExamples")
        metrics = {k: float(v) for k, v in (payload.get("metrics") or {}).items()}
        self.progress[self.my_peer_id] = {"processedExamples": processed, "totalExamples": total,
                                          "metrics": metrics, "updatedAt": now}
        if metrics:
            series = self.live_metrics.setdefault(self.my_peer_id, [])
            series.append({"at": now, "values": metrics})
            del series[:-_LIVE_METRICS_KEPT]
        try:
            self.recorder.progress(processed, now, self.monotonic(), total=total)
        except WeeiError:
            pass  # a progress report outside an assignment carries no figures
        self._notify_soon()

    # ------------------------------------------------------------ diagnostics

    def _accept_diagnostics(self, peer: str, snapshot: dict[str, Any], now: float) -> None:
        coordinator = self.coordinator
        chunk = None
        if coordinator is not None:
            chunk = next((s.chunk_id for s in coordinator.slots if s.peer == peer and s.chunk_id), None)
        try:
            self.book.accept(peer, coordinator.spec.job_id if coordinator else None, snapshot, now, chunk_id=chunk)
        except WeeiError as exc:
            self._record("diagnostics.refused", {"peer": peer, "reason": exc.reason, "error": str(exc)[:200]})

    def _report_diagnostics(self) -> None:
        """Participants send a snapshot every 2 s while they have a job, and at once on a stage change."""
        participant = self.participant
        if participant is None or participant.job_id is None or participant.coordinator in (None, self.my_peer_id) \
                or self.recorder.job_id is None or participant.state in ("stopped", "declined", "disconnected"):
            return
        mono = self.monotonic()
        if not self.recorder.due(mono):
            return
        report = DiagnosticsReport(participant.job_id, self.recorder.snapshot(self.clock(), mono))
        if self.transport is not None:
            self.transport.send(Send(participant.coordinator, report), {})

    async def _diagnostics_loop(self) -> None:
        while self.participant is not None and self.participant.state not in ("stopped", "declined"):
            self._report_diagnostics()
            due = self.recorder.next_due_at()
            wait = 2.0 if due is None else max(0.05, (due - self.monotonic()) / 1000.0)
            await asyncio.sleep(min(wait, 2.0))

    # ---------------------------------------------------------------- helpers

    def _artifact(self, sha: str) -> bytes:
        data = self.artifacts.get(sha)
        if data is None:
            raise WeeiError("missing-artifact", f"artifact {sha[:12]}… is not in this browser")
        return data

    def _spec(self) -> JobSpec | None:
        return self.coordinator.spec if self.coordinator is not None else None

    def _setup_local_participant(self) -> None:
        assert self.coordinator is not None
        self.participant = Participant.local(self.my_peer_id, self.coordinator.spec.job_id) \
            if self.coordinator.spec.settings.coordinator_participates else None
        if self.participant is not None:
            self.participant.paused = self.paused_contribution
        self.book.set_job(self.coordinator.spec.job_id)
        self.coordinator.diagnostics_sink = self._accept_diagnostics

    def _require_coordinator(self, what: str) -> Coordinator:
        if self.coordinator is None:
            if self.participant is not None:
                raise UsageError("not-coordinator", f"only the coordinator can {what}")
            raise UsageError("no-job", f"there is no job to {what.split(' ')[0]}")
        return self.coordinator

    def _require_no_active_job(self) -> None:
        if self.preparing:
            raise UsageError("busy", "a job is being prepared")
        if self.coordinator is not None and self.coordinator.status in ("running", "paused", "ready"):
            raise UsageError("job-active", "leave the current job first (it stays in Saved jobs)")
        if self.participant is not None and self.participant.state not in ("stopped", "declined", "unknown"):
            raise UsageError("job-active", "you take part in another job; leave it first")
        self._clear_job()

    def _clear_job(self) -> None:
        self.local.follow(None)
        self.pool.cancel()  # the job's training and validation, if any still run
        self.coordinator = None
        self.participant = None
        self.job_seed = None
        self.latest_checkpoint = None
        self.validation_sha256 = None
        self.validation_unavailable = False
        self.progress.clear()
        self.live_metrics.clear()
        self.error = None
        self.recorder.leave_job()
        self.book.set_job(None)
        if self._diagnostics_task is not None:
            self._diagnostics_task.cancel()
            self._diagnostics_task = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def _save_job_record(self, *, status: str | None = None, active: bool | None = None) -> None:
        coordinator = self.coordinator
        if coordinator is None:
            return
        record = spec_to_record(coordinator.spec, job_seed=self.job_seed, validation_sha256=self.validation_sha256)
        previous = self.saved_jobs.get(coordinator.spec.job_id, {})
        record["status"] = status or (coordinator.status if coordinator.status != "ready" else previous.get(
            "status", "ready"))
        if coordinator.status == "completed":
            record["status"] = "completed"
        record["active"] = previous.get("active", True) if active is None else active
        record["lastRound"] = coordinator.checkpoint_round
        # Who takes part: after a reload they are waited for, and caught up when their channel opens again.
        record["participants"] = coordinator.remote_participants()
        record["createdAt"] = previous.get("createdAt", self.clock())
        record["updatedAt"] = previous.get("updatedAt")
        if record != previous:
            # Written only when something in it changed: every drain asks, few change it.
            record["updatedAt"] = self.clock()
            # Before the await: a save that interleaves (a validation task's
            # drain during leave()) must build on this record, not the old one.
            self.saved_jobs[coordinator.spec.job_id] = record
            await self.storage.put("jobs", coordinator.spec.job_id, record)

    async def _reopen(self, job_id: str, *, restart: bool) -> None:
        record = self.saved_jobs[job_id]
        spec, job_seed, validation_sha = spec_from_record(record)
        keys = sorted(k for k in await self.storage.keys("checkpoints") if k.startswith(job_id + "/"))
        if not keys:
            raise CheckpointError("no-checkpoint", f"job {job_id} has no saved checkpoint")
        stored = await self.storage.get("checkpoints", keys[-1])
        read = read_checkpoint(stored["file"])
        coordinator = Coordinator.resume(spec, read, mode="resume", my_peer_id=self.my_peer_id, kernel=self.kernel,
                                         now=self.clock(), new_job_seed=job_seed, reopening=True)
        summaries = []
        for key in keys:
            entry = await self.storage.get("checkpoints", key)
            summaries.append(entry["summary"])
        coordinator.checkpoints = summaries
        if record.get("status") == "completed":
            coordinator.status = "completed"
        else:
            coordinator.restore_participants(record.get("participants") or [])
        self.coordinator = coordinator
        self.job_seed = coordinator.job_seed
        self.latest_checkpoint = (summaries[-1]["artifact"]["fileName"], stored["file"])
        self.artifacts[coordinator.weights_sha256] = bytes(read.weights)
        for sha in [spec.module.sha256, *(c.sha256 for c in spec.chunks), *(r.sha256 for r in spec.auxiliary_files.values())]:
            data = await self.storage.get("artifacts", sha)
            if data is not None:
                self.artifacts[sha] = bytes(data)
        self.validation_sha256 = validation_sha
        if validation_sha is not None:
            data = await self.storage.get("artifacts", validation_sha)
            if data is None:
                self.validation_unavailable = True
            else:
                self.artifacts[validation_sha] = bytes(data)
        self._setup_local_participant()
        self._record("job.reopened", {"jobId": job_id, "round": coordinator.checkpoint_round})
        if restart and coordinator.status != "completed":
            coordinator.start(self.clock())
        await self._drain()

    async def _save_device_settings(self) -> None:
        await self.storage.put("settings", "device", {"maxLocalWorkers": self.max_local_workers,
                                                      "gpuMemoryBudgetMiB": self.gpu_memory_budget_mib,
                                                      "backendPreference": self.backend_preference})
        self._notify()

    def _arm_timer(self) -> None:
        coordinator = self.coordinator
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if coordinator is None:
            return
        at = coordinator.next_timer()
        if at is None:
            return

        async def fire() -> None:
            await asyncio.sleep(max(0.0, (at - self.clock()) / 1000.0))
            if self.coordinator is coordinator:
                self._timer = None
                coordinator.handle_timer(self.clock())
                await self._drain()

        self._timer = asyncio.ensure_future(fire())

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            self.error = str(exc)
            self._record("task.failed", {"error": repr(exc)[:500]})
            self._notify()

    async def idle(self) -> None:
        """Wait until no background task (training, validation) is running."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def _record(self, event: str, details: Mapping[str, Any] | None = None) -> None:
        self.debug_log.record(self.clock(), event, dict(details) if details else None)

    def _notify_soon(self) -> None:
        """Progress reports come many times a second: subscribers hear of them at most every
        PROGRESS_NOTIFY_MS (every other change is told at once)."""
        if self._notify_pending is not None or not self.listeners:
            return

        def fire() -> None:
            self._notify_pending = None
            self._notify()

        self._notify_pending = asyncio.get_event_loop().call_later(PROGRESS_NOTIFY_MS / 1000.0, fire)

    def _notify(self) -> None:
        if self._notify_pending is not None:
            self._notify_pending.cancel()
            self._notify_pending = None
        if not self.listeners:
            return
        state = self.get_state()
        for listener in list(self.listeners):
            try:
                listener(state)
            except Exception as exc:  # a page's listener must not break the job
                self._record("subscriber.failed", {"error": repr(exc)[:200]})

    def _busy(self, *, preparing: bool = False) -> "_BusyScope":
        return _BusyScope(self, preparing)


class _BusyScope:
    def __init__(self, controller: TrainingController, preparing: bool) -> None:
        self.controller = controller
        self.preparing = preparing

    async def __aenter__(self) -> None:
        self.controller.busy += 1
        if self.preparing:
            self.controller.preparing = True
        self.controller._notify()

    async def __aexit__(self, *exc: Any) -> None:
        self.controller.busy -= 1
        if self.preparing:
            self.controller.preparing = False
        if exc[1] is not None and isinstance(exc[1], WeeiError):
            self.controller.error = str(exc[1])
        self.controller._notify()


def _ckpt_key(job_id: str, round_: int) -> str:
    return f"{job_id}/{round_:08d}"


def _parse_json(data: bytes, what: str) -> Any:
    from ..core.errors import ManifestError

    try:
        return json.loads(bytes(data).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ManifestError("invalid-json", f"{what}: not valid JSON ({exc})") from None


def _summary_of(read: Any, now: float) -> dict[str, Any]:
    meta = read.metadata.to_json()
    summary: dict[str, Any] = {
        "artifact": {"round": meta["round"], "sha256": meta["checkpoint"]["sha256"],
                     "bytes": meta["checkpoint"]["bytes"], "fileName": meta["checkpoint"]["fileName"]},
        "metrics": meta.get("metrics", {"values": {}, "examplesProcessed": 0}),
        "remaining": list(meta.get("remainingChunkIds") or []),
        "settings": meta["settings"],
        "createdAt": now,
    }
    if meta.get("aggregationState"):
        agg = meta["aggregationState"]
        summary["aggregation"] = {"method": agg["method"], "step": agg["step"], "bytes": agg["bytes"]}
    return summary


def _to_coordinator(message: Message) -> bool:
    from ..core.messages import Assign, Deliver, JobFinished, UpdateReceipt

    return not isinstance(message, (Invitation, Deliver, Assign, UpdateReceipt, JobFinished))
