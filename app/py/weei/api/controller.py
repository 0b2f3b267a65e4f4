"""The distributed-training API of one browser: its methods and their role checks.

Theory of operation
-------------------
The controller owns at most one active job, as coordinator (a
``Coordinator`` state machine, plus this device's own ``Participant`` when
``coordinatorParticipates``) or as participant. Every API method checks the
role and state, then turns into calls on those state machines; four parts
do the rest, sharing one ``Session``:

* ``executor.Executor`` drains the state machines' commands: messages,
  checkpoints (durable before anything else happens), training and
  validation on a ``compute.ComputeBackend`` (the seam for a GPU backend),
  timers, the debug log's copy in the key-value store;
* ``job_store.JobStore`` keeps job records, checkpoints and artifacts over
  the Storage port;
* ``state_view.StateView`` builds ``getState()`` and tells subscribers.

A reload finds the job record and its last checkpoint in storage and
continues from there (``Coordinator.continue_from`` in 'resume' mode): the round
that was running is trained again, nothing saved is lost.
"""

from __future__ import annotations

import functools
import hashlib
from typing import Any, Awaitable, Callable, Mapping, NoReturn, TypeVar

from ..core import _check
from ..core.formats.checkpoint import checkpoint_summary, describe, read_checkpoint
from ..core.job.coordinator import Coordinator
from ..core.job.round_rules import Kernel
from ..core.observe.debuglog import DebugLog
from ..core.observe.diagnostics import DiagnosticsRecorder
from ..core.errors import CheckpointError, ManifestError, ModelError, UsageError, WeeiError
from ..core.errors import CheckpointReason, ManifestReason, UsageReason
from ..core.job.spec import JobSpec
from ..core.limits import max_bytes
from ..core.wire.messages import Message
from ..core.job.participant import Participant
from ..core.states import JobStatus, is_engaged, takes_part
from ..core.formats.settings import TrainingSettings
from ..core.privacy.dp_noise import SEED_BYTES
from ..core.job.settings_review import facts_from_job, facts_from_manifest, review_settings
from ..core.verified import VerifiedBlobs
from ..gpu.archive import check_descriptor, parse_archive
from ..gpu.errors import GpuError
from ..prepare import GpuFiles, PreparedJob, prepare_job
from ..runtime.engine import Engine
from .compute import ComputeBackend, CpuWorkerBackend
from .executor import Executor
from .gpu_backend import GpuComputeBackend, GpuHost
from .job_store import PARTICIPATION_KEY, JobStore
from .compression import UpdateCompressor
from .log_writer import DEBUG_LOG_KEY
from .peer_cards import PeerCards
from .retention import Retention, storage_use
from .try_model import Trials
from .peer_events import PeerEvents
from .ports import KeyValue, Storage, StorageError, Transport, WorkerPool
from .session import Session
from .stored import parse_device_settings, parse_participation
from .state_view import StateView, job_module

__all__ = ["TrainingController", "DEBUG_LOG_KEY"]


_T = TypeVar("_T")


def _busy(method: Callable[..., Awaitable[_T]]) -> Callable[..., Awaitable[_T]]:
    """``state.busy`` while this API command runs (its refusals are thrown, not shown)."""
    @functools.wraps(method)
    async def run(self: TrainingController, *args: Any, **kwargs: Any) -> _T:
        async with _BusyScope(self, preparing=False):
            return await method(self, *args, **kwargs)
    return run


class TrainingController:
    """One browser's side of the API. Call ``await init()`` once before use.

    ``backend`` is where training and validation run; by default the CPU
    Worker pool ``pool`` (``compute.CpuWorkerBackend``). ``room_key``: the room's key; a coordinator proves it.
    """

    def __init__(self, *, my_peer_id: str, storage: Storage, kv: KeyValue, pool: WorkerPool,
                 kernel: Kernel, engine: Engine, clock: Callable[[], float],
                 monotonic: Callable[[], float], random_bytes: Callable[[int], bytes],
                 transport: Transport | None = None, environment: Mapping[str, Any] | None = None,
                 backend: ComputeBackend | None = None, gpu: Any = None, gpu_host: GpuHost | None = None,
                 room_key: str | None = None, accept_archive: Callable[[str], bool] | None = None,
                 keep_checkpoints: int = 0) -> None:
        self.pool = pool
        self.kernel = kernel
        self.engine = engine
        self.clock = clock
        self.random_bytes = random_bytes
        # environment: the diagnostics' browser/browserVersion/os/logicalCores (the agent says 'agent').
        self.session = Session(my_peer_id=my_peer_id, clock=clock, monotonic=monotonic, transport=transport,
                               debug_log=DebugLog.from_json(kv.get(DEBUG_LOG_KEY), clock(), own_peer=my_peer_id),
                               recorder=DiagnosticsRecorder(sequence_base=int(clock()), environment=environment))
        self.store = JobStore(storage)
        # The GPU backend trains jobs created with executionFiles on ``gpu`` (wgpu.gpu, the browser shim;
        # None: no WebGPU), in ``gpu_host`` (the page's training Workers; default a thread), and everything
        # else on the CPU Workers. ``accept_archive(sha256)`` says which remote WGSL archives may run.
        self.backend: ComputeBackend = backend or GpuComputeBackend(
            CpuWorkerBackend(pool, kernel, on_progress=self._on_local_progress), engine=engine,
            session=self.session, gpu=gpu, host=gpu_host, accept_archive=accept_archive)
        self.view = StateView(self.session, self.store, self.backend)
        self.executor = Executor(self.session, self.store, self.backend, kv, self.view,
                                 UpdateCompressor(self.store, kernel), x25519=kernel.x25519)
        self.peer_events = PeerEvents(self.session, self.store, self.executor, room_key, random_bytes)
        self.peer_events.replace_finished = self._put_finished_job_away
        self.trials = Trials(self.session, self.store, engine)
        # keep_checkpoints: how many newest checkpoint files a job keeps besides the best (0: all; retention.py).
        self.retention = Retention(self.store, keep_checkpoints)
        self.executor.prune = self.retention.prune
        self.view.extras.append(self.retention.state)
        self.peer_cards = PeerCards(self.session, self.store, environment)
        self.peer_events.cards = self.peer_cards
        self.executor.after_drain.append(self.peer_cards.sync)
        self.view.extras.append(self.peer_cards.state)
        self.kv = kv

    # What hosts read (the agent, the transports' dedupe, the demo network).

    @property
    def my_peer_id(self) -> str:
        return self.session.my_peer_id

    @property
    def participant(self) -> Participant | None:
        return self.session.participant

    @property
    def coordinator(self) -> Coordinator | None:
        return self.session.coordinator

    @property
    def invitations(self) -> dict[str, dict[str, Any]]:
        """Job id -> the pending invitation as ``state.invitations`` shows it (core/job/invitations.py)."""
        return self.session.invitations.entries()

    @property
    def artifacts(self) -> Mapping[str, bytes]:
        """The artifacts held in memory now (read-only use: ``sha in controller.artifacts``)."""
        return self.store.artifacts

    def holds(self, sha256: str, size: int) -> bool:
        """Whether this device holds ``size`` bytes under ``sha256`` (the transport's ``has``: a message may
        name such an artifact without attaching it)."""
        data = self.store.artifacts.get(sha256)
        return data is not None and len(data) == size

    def job_with(self, peer: str) -> str | None:
        """The job this device shares with ``peer``, if any (the transport's ``job_of``: the jobId of
        transfers from it, which arrive before the message that names the job)."""
        s = self.session
        if s.coordinator is not None:
            return s.coordinator.spec.job_id
        if s.participant is not None and s.participant.job_id is not None and s.participant.coordinator == peer:
            return s.participant.job_id
        return next((p.invitation.job_id for p in s.invitations if p.sender == peer), None)

    @property
    def storage(self) -> Storage:
        return self.store.storage

    # ------------------------------------------------------------------ setup

    async def init(self) -> None:
        """Load saved settings and jobs; continue an interrupted job from its last checkpoint."""
        s = self.session
        # Every record read back is parsed like wire input (stored.py): one that does not parse is set
        # aside by name and Weei starts without it.
        limit = self.backend.device_limit
        s.device = await self.store.read_setting(
            "device", lambda v: parse_device_settings(v, default_workers=limit)) or \
            parse_device_settings({}, default_workers=limit)
        await self.peer_cards.load()
        await self.retention.load()
        removed = await self.store.load()
        if removed:
            s.record("storage.collected", {"entries": removed})
        active = [r for r in self.store.saved_jobs.values() if r.get("active")]
        participation = await self.store.read_setting(PARTICIPATION_KEY, parse_participation)
        if participation is not None and not active:
            self.peer_events.rejoin(*participation)
        for notice in self.store.set_aside_now:
            s.record("storage.set-aside", notice)
        if self.store.set_aside_now:
            s.error = "stored records that could not be read were set aside: " + ", ".join(
                f"{n['store']}/{n['key']} ({n['message']})" for n in self.store.set_aside_now[:3])[:600]
        if active:
            latest = max(active, key=lambda r: r.get("updatedAt", 0))
            try:
                await self._reopen(latest["id"], restart=latest.get("status") == JobStatus.RUNNING)
            except WeeiError as exc:
                s.error = f"saved job {latest['id']} could not be reopened: {exc}"
                s.record("job.reopen-failed", {"jobId": latest["id"], "error": str(exc)})
        self.peer_cards.sync()
        self.view.notify()

    # ------------------------------------------------------------ API methods

    async def create_job(self, *, wasm_name: str, wasm: bytes, manifest: bytes, files: Mapping[str, bytes],
                         settings: Mapping[str, Any], validation: tuple[str, bytes] | None = None,
                         execution_files: Mapping[str, bytes] | None = None) -> str:
        """createJob(): check everything, save the job and checkpoint 0. Returns the job id.

        ``execution_files``: the package's WGSL archive (name -> bytes), to train on the GPU."""
        self._require_no_active_job()
        s = self.session
        async with _BusyScope(self, preparing=True):
            manifest_json = _parse_json(manifest, "manifest")
            job_id = "job-" + self.random_bytes(8).hex()
            prepared = prepare_job(self.engine, job_id=job_id, wasm_name=wasm_name, wasm=wasm,
                                   manifest=manifest_json, files=files, settings=settings,
                                   random_bytes=self.random_bytes(16), validation=validation,
                                   execution_files=execution_files)
            async with _NewJobScope(self):
                await self._put_job_files(prepared.artifacts, prepared.validation)
                self._set_backend_job(prepared)
                s.job_seed = prepared.job_seed
                s.coordinator = Coordinator.create(prepared.spec, prepared.initial_weights, my_peer_id=s.my_peer_id,
                                                   kernel=self.kernel, now=self.clock(), job_seed=prepared.job_seed,
                                                   dp_noise_seed=self._dp_noise_seed(prepared.spec.settings))
                self._setup_local_participant()
                await self.store.save_job_record(s.coordinator, job_seed=s.job_seed,
                                                 validation_sha256=s.validation_sha256, now=self.clock(),
                                                 status=JobStatus.READY)
            s.record("job.created", {"jobId": job_id, "model": prepared.spec.info.id})
            await self._drain()
            return job_id

    async def continue_from_checkpoint(self, *, checkpoint: bytes, wasm_name: str, wasm: bytes, manifest: bytes,
                                       files: Mapping[str, bytes], settings: Mapping[str, Any], dataset_mode: str,
                                       validation: tuple[str, bytes] | None = None,
                                       execution_files: Mapping[str, bytes] | None = None) -> str:
        """continueFromCheckpoint(): a new job that starts from a checkpoint file's weights."""
        self._require_no_active_job()
        if dataset_mode not in ("new", "resume"):
            raise UsageError(UsageReason.BAD_DATASET_MODE, "datasetMode must be 'new' or 'resume'")
        if len(checkpoint) > max_bytes("checkpoint"):
            raise CheckpointError(CheckpointReason.FILE_TOO_LARGE, f"the checkpoint is {len(checkpoint)} bytes, over the 256 MB limit")
        s = self.session
        async with _BusyScope(self, preparing=True):
            read = read_checkpoint(checkpoint)
            job_id = "job-" + self.random_bytes(8).hex()
            prepared = prepare_job(self.engine, job_id=job_id, wasm_name=wasm_name, wasm=wasm,
                                   manifest=_parse_json(manifest, "manifest"), files=files, settings=settings,
                                   random_bytes=self.random_bytes(16), validation=validation,
                                   execution_files=execution_files)
            # The module decides compatibility: its loadModel (and loadAuxiliary) must take the weights.
            try:
                prepared.load_checkpoint(read.weights)
            except ModelError as exc:
                info = prepared.spec.info
                raise CheckpointError(CheckpointReason.OTHER_MODEL, (
                    f"this checkpoint is {describe(read.metadata)} ({len(read.weights)} bytes of weights); the chosen "
                    f"model {info.id} {info.version} does not load it: {exc.message}")) from None
            # The charts keep the rounds before the checkpoint when its job is saved here (metric_history.py).
            history = await self.store.history_before(read.metadata.job_id, read.metadata.round)
            async with _NewJobScope(self):
                if history:
                    self.store.histories[job_id] = history
                coordinator = Coordinator.continue_from(prepared.spec, read, mode=dataset_mode, my_peer_id=s.my_peer_id,
                                                 kernel=self.kernel, now=self.clock(),
                                                 new_job_seed=prepared.job_seed,
                                                 dp_noise_seed=self._dp_noise_seed(prepared.spec.settings))
                await self._put_job_files(prepared.artifacts, prepared.validation)
                self._set_backend_job(prepared)
                s.coordinator = coordinator
                s.job_seed = coordinator.job_seed
                summary = checkpoint_summary(read.metadata.to_json(), self.clock())
                await self.store.save_imported_checkpoint(job_id, read, checkpoint, summary,
                                                          coordinator.weights_sha256)
                coordinator.restore_checkpoints([summary])
                self._setup_local_participant()
                await self.store.save_job_record(coordinator, job_seed=s.job_seed,
                                                 validation_sha256=s.validation_sha256, now=self.clock(),
                                                 status=JobStatus.READY)
            s.record("job.continued", {"jobId": job_id, "fromRound": read.metadata.round,
                                       "datasetMode": dataset_mode})
            await self._drain()
            return job_id

    def check_invite(self, peer_id: str) -> Coordinator:
        """Raise the UsageError ``invite(peer_id)`` would raise; change nothing."""
        coordinator = self._require_coordinator("invite participants")
        transport = self.session.transport
        if transport is None or peer_id not in transport.peers():
            raise UsageError(UsageReason.PEER_NOT_CONNECTED, f"peer {peer_id} is not connected to you")
        coordinator.check_invite(peer_id)
        return coordinator

    def invite(self, peer_id: str) -> None:
        coordinator = self.check_invite(peer_id)
        coordinator.display_name = self.peer_cards.name
        coordinator.invite(peer_id, self.clock())
        self.executor.spawn(self._drain())

    @_busy
    async def decide_invitation(self, job_id: str, accepted: bool, reason: str | None = None) -> None:
        """In a keyed room, accepting needs the coordinator's proof of the room key (peer_events.py);
        a decline tells the coordinator ``reason``."""
        await self.peer_events.decide_invitation(job_id, accepted, self.clock, reason)

    @_busy
    async def start(self) -> None:
        coordinator = self._require_coordinator("start the job")
        coordinator.start(self.clock())
        await self.executor.save_job_record(status=JobStatus.RUNNING)
        await self._drain()

    @_busy
    async def pause(self) -> None:
        coordinator = self._require_coordinator("pause the job")
        coordinator.pause(self.clock())
        await self.executor.save_job_record(status=JobStatus.PAUSED)
        await self._drain()

    @_busy
    async def resume(self) -> None:
        coordinator = self._require_coordinator("resume the job")
        coordinator.resume_running(self.clock())
        if self.session.error is not None and self.session.error == self.executor.refused_error:
            self.session.error = None  # a storage refusal paused the job: resuming tries again
        await self.executor.save_job_record(status=JobStatus.RUNNING)
        await self._drain()

    @_busy
    async def stop(self) -> None:
        coordinator = self._require_coordinator("stop the job")
        coordinator.stop(self.clock())
        await self._drain()

    @_busy
    async def update_settings(self, settings: Mapping[str, Any]) -> None:
        coordinator = self._require_coordinator("change the settings")
        coordinator.update_settings(TrainingSettings.from_json(settings), self.clock())
        await self.executor.save_job_record()
        await self._drain()

    def review_settings(self, settings: Mapping[str, Any], manifest: Any = None) -> dict[str, Any]:
        """reviewSettings(settings, manifest?): legal settings that are likely mistakes (docs/api.md);
        the active job's facts unless a manifest is given. Invalid settings raise SettingsError."""
        parsed, s = TrainingSettings.from_json(settings), self.session
        facts = facts_from_manifest(manifest, s.measured) if manifest is not None or s.coordinator is None \
            else facts_from_job(s.coordinator, s.live)
        return review_settings(parsed, facts).to_json()

    @_busy
    async def run_validation(self) -> None:
        coordinator = self._require_coordinator("run validation")
        if self.session.validation_unavailable:
            raise UsageError(UsageReason.VALIDATION_UNAVAILABLE, "the validation file is missing from browser storage")
        coordinator.request_validation(self.clock())
        await self._drain()

    @_busy
    async def shuffle_chunks(self) -> None:
        coordinator = self._require_coordinator("shuffle the chunks")
        coordinator.shuffle_chunks(int.from_bytes(self.random_bytes(8), "little"), self.clock())
        await self._drain()

    def export_checkpoint(self) -> tuple[str, bytes]:
        """exportCheckpoint(): the latest checkpoint as (file name, bytes)."""
        if self.store.latest_checkpoint is None:
            raise UsageError(UsageReason.NO_CHECKPOINT, "there is no checkpoint to export yet")
        return self.store.latest_checkpoint

    def export_module(self) -> tuple[str, bytes] | None:
        """exportModule(): the job's model module, if this browser keeps it (a participant
        keeps the one its coordinator delivered)."""
        module = job_module(self.session)
        if module is None:
            raise UsageError(UsageReason.NO_JOB, "there is no job")
        data = self.store.artifacts.get(module["sha256"])
        return (module["fileName"], data) if data is not None else None

    @_busy
    async def leave(self) -> None:
        """leave(): the job stops here and stays in Saved jobs."""
        s = self.session
        if s.coordinator is not None:
            if s.coordinator.status is JobStatus.RUNNING:
                s.coordinator.pause(self.clock())
            await self._drain()
            await self.executor.save_job_record(active=False)
        elif s.participant is not None:
            if is_engaged(s.participant.state):
                s.participant.leave(self.clock())
            await self._drain()
            await self.store.delete_setting(PARTICIPATION_KEY)
        else:
            raise UsageError(UsageReason.NO_JOB, "there is no job to leave")
        self._clear_job()
        self.executor.log_writer.write(now=True)
        self.view.notify()

    @_busy
    async def open_saved_job(self, job_id: str) -> None:
        """Make a saved job active again (from its last checkpoint)."""
        self._require_no_active_job()
        if job_id not in self.store.saved_jobs:
            raise UsageError(UsageReason.UNKNOWN_JOB, f"there is no saved job {job_id}")
        await self._reopen(job_id, restart=False)
        await self.executor.save_job_record(active=True)
        self.view.notify()

    @_busy
    async def delete_saved_job(self, job_id: str) -> None:
        """deleteSavedJob(): the job's record, checkpoints and the files no other job names go."""
        coordinator = self.session.coordinator
        if coordinator is not None and coordinator.spec.job_id == job_id:
            raise UsageError(UsageReason.JOB_ACTIVE, "leave the job before deleting it")
        await self.store.delete_job(job_id)
        self.view.notify()

    def pause_contribution(self, paused: bool) -> None:
        s = self.session
        s.paused_contribution = bool(paused)
        if s.participant is not None and s.participant.job_id is not None and \
                takes_part(s.participant.state):
            s.participant.pause_contribution(s.paused_contribution, self.clock())
            self.executor.spawn(self._drain())
        else:
            self.view.notify()

    @_busy
    async def set_max_local_workers(self, count: int) -> None:
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 64:
            raise UsageError(UsageReason.BAD_WORKER_COUNT, "the number of local Workers must be a whole number from 1 to 64")
        self.session.device.max_local_workers = count
        await self._save_device_settings()

    @_busy
    async def set_gpu_memory_budget_mib(self, mib: int) -> None:
        if isinstance(mib, bool) or not isinstance(mib, int) or not 0 <= mib <= 1 << 20:
            raise UsageError(UsageReason.BAD_GPU_BUDGET, "the GPU memory budget must be a whole number of MiB from 0")
        self.session.device.gpu_memory_budget_mib = mib
        self.session.recorder.update_gpu({"memoryBudgetMiB": mib})
        await self._save_device_settings()

    @_busy
    async def set_backend_preference(self, preference: str) -> None:
        if preference not in ("auto", "cpu", "gpu", "hybrid"):
            raise UsageError(UsageReason.BAD_BACKEND, "the backend preference is 'auto', 'cpu', 'gpu' or 'hybrid'")
        self.session.device.backend_preference = preference
        await self._save_device_settings()

    async def try_checkpoint(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """tryCheckpoint(request): what the latest checkpoint says about one input (try_model.py)."""
        return await self.trials.run(request)

    async def set_checkpoint_retention(self, keep_last: int) -> None:
        """setCheckpointRetention(keepLast): keep the newest ``keep_last`` checkpoint files and the best (0: all)."""
        await self.retention.set_keep_last(keep_last)
        coordinator = self.session.coordinator
        if coordinator is not None and await self.retention.prune(coordinator):
            await self._drain()
        self.view.notify()

    async def storage_use(self) -> dict[str, Any]:
        """getStorageUse(): bytes this device stores, per saved job (retention.py)."""
        return await storage_use(self.store)

    async def set_display_name(self, name: str) -> None:
        """setDisplayName(name): what the other peers and invitations call this device (peer_cards.py)."""
        await self.peer_cards.set_name(name)
        self.view.notify()

    def get_debug_log(self) -> dict[str, Any]:
        return self.session.debug_log.to_file(self.clock())

    def clear_debug_log(self) -> None:
        self.session.debug_log.clear()
        self.executor.log_writer.write(now=True)
        self.view.notify()

    def subscribe(self, listener: Callable[[dict[str, Any]], None]) -> Callable[[], None]:
        """Call ``listener`` now and after every change; returns the unsubscribe function."""
        return self.view.subscribe(listener)

    def get_state(self) -> dict[str, Any]:
        """The spec's TrainingState: a fresh copy, no files, data or weights."""
        return self.view.get_state()

    def changed(self) -> None:
        """Something outside the state machines changed (peers, transfers): tell subscribers."""
        self.view.notify()

    async def idle(self) -> None:
        """Wait until no background task (training, validation) is running."""
        await self.executor.idle()

    # ------------------------------------------------------------- transport

    async def on_peer_message(self, peer: str, message: Message, blobs: Mapping[str, bytes]) -> None:
        """A message from another peer, with its verified attachments."""
        await self.peer_events.on_peer_message(peer, message, blobs)

    async def peer_connected(self, peer: str) -> None:
        """A peer's channel opened (again): a returning participant catches up."""
        await self.peer_events.peer_connected(peer)

    async def peer_disconnected(self, peer: str) -> None:
        await self.peer_events.peer_disconnected(peer)

    def peer_id_changed(self, peer_id: str) -> None:
        """Signaling gave this device another peer ID (the server restarted with another secret): without a
        job it is taken on now; a job's peers know the old one, so it is shown at once and taken on when the
        job is left."""
        s = self.session
        if peer_id == s.my_peer_id and s.renamed_to is None:
            return
        s.record("peer.id-changed", {"from": s.my_peer_id, "to": peer_id})
        s.renamed_to = peer_id
        if s.coordinator is None and s.participant is None:
            self._take_new_peer_id()
        self.view.notify()

    def _take_new_peer_id(self) -> None:
        s = self.session
        if s.renamed_to is not None:
            s.my_peer_id, s.renamed_to = s.renamed_to, None
            s.debug_log.own_peer = s.my_peer_id
            self.peer_events.renamed()

    async def transfer_failed(self, peer: str, reason: str, artifact: str = "") -> None:
        """The frame reader refused an artifact from ``peer`` (``reason``, e.g. ``hash-mismatch``; ``artifact``:
        its SHA-256)."""
        await self.peer_events.transfer_failed(peer, reason, artifact)

    # ---------------------------------------------------------------- helpers

    async def _drain(self) -> None:
        await self.executor.drain()

    def _on_local_progress(self, payload: dict[str, Any]) -> None:
        self.executor.on_local_progress(payload)

    async def _put_job_files(self, artifacts: Mapping[str, bytes], validation: bytes | None) -> None:
        files = dict(artifacts)
        if validation is not None:
            self.session.validation_sha256 = hashlib.sha256(validation).hexdigest()
            files[self.session.validation_sha256] = validation
        # prepare() checked every file against the SHA-256 that names it; the validation file is hashed above.
        await self.store.put_artifacts(VerifiedBlobs(files))

    def _set_backend_job(self, prepared: PreparedJob | None) -> None:
        """Tell the GPU backend the job's archive and the package's CPU backend id (None: no job)."""
        package = prepared.package if prepared is not None else None
        cpu_id = next((b.id for b in package.backends if b.kind == "cpu"), None) if package is not None else None
        self.backend.set_job(prepared.gpu if prepared is not None else None, cpu_id)

    def _set_reopened_backend_job(self, spec: JobSpec) -> None:
        """A saved job reopened: its WGSL archive comes back from the job store (checked again)."""
        offer = spec.gpu
        data = self.store.artifacts.get(offer.archive.sha256) if offer is not None else None
        files = None
        if offer is not None and data is not None:
            try:
                check_descriptor(data, offer.archive.bytes, offer.archive.sha256)
                files = GpuFiles(offer.archive.sha256, parse_archive(data), offer.backend)
            except GpuError as exc:  # storage gave back other bytes: the job trains on the CPU
                self.session.record("gpu.archive-refused", {"reason": exc.reason, "error": exc.message[:500]})
        elif offer is not None:
            self.session.record("gpu.archive-refused", {"reason": "archive-malformed",
                                                        "error": "the WGSL archive is not in storage"})
        self.backend.set_job(files, spec.cpu_backend or (offer.cpu_backend if offer is not None else None))

    def _setup_local_participant(self) -> None:
        s = self.session
        assert s.coordinator is not None
        s.participant = Participant.local(s.my_peer_id, s.coordinator.spec.job_id, paused=s.paused_contribution) \
            if s.coordinator.spec.settings.coordinator_participates else None
        s.book.set_job(s.coordinator.spec.job_id)
        if s.participant is None:
            self.executor.coordinate(s.coordinator.spec)
        s.coordinator.diagnostics_sink = self.executor.diagnostics.accept
        s.coordinator.stopwatch = s.monotonic  # times the rounds' phases for the debug log
        s.coordinator.progress_sink = self.executor.on_peer_progress
        # A round's last update is in: subscribers hear `transitioning` before the averaging holds the thread.
        s.coordinator.closing_sink = lambda round_: self.view.notify()

    def _require_coordinator(self, what: str) -> Coordinator:
        s = self.session
        if s.coordinator is None:
            if s.participant is not None:
                raise UsageError(UsageReason.NOT_COORDINATOR, f"only the coordinator can {what}")
            raise UsageError(UsageReason.NO_JOB, f"there is no job to {what.split(' ')[0]}")
        return s.coordinator

    def _dp_noise_seed(self, settings: TrainingSettings) -> bytes | None:
        """A DP job's noise seed: secret bytes from this host's random source (drawn only for DP,
        so a job without DP draws what it always drew)."""
        return self.random_bytes(SEED_BYTES) if settings.privacy.dp is not None else None

    def _require_no_active_job(self) -> None:
        s = self.session
        if s.preparing:
            raise UsageError(UsageReason.BUSY, "a job is being prepared")
        if s.coordinator is not None and s.coordinator.status is not JobStatus.COMPLETED:
            raise UsageError(UsageReason.JOB_ACTIVE, "leave the current job first (it stays in Saved jobs)")
        if s.participant is not None and is_engaged(s.participant.state):
            raise UsageError(UsageReason.JOB_ACTIVE, "you take part in another job; leave it first")
        self._clear_job()

    def _clear_job(self) -> None:
        s = self.session
        s.coordinator = None
        s.participant = None
        s.job_seed = None
        self.store.latest_checkpoint = None
        s.validation_sha256 = None
        s.validation_unavailable = False
        s.live.clear()
        s.error = None
        s.recorder.leave_job()
        s.book.set_job(None)
        self.executor.job_cleared()
        self._set_backend_job(None)
        self._take_new_peer_id()

    async def _put_finished_job_away(self) -> None:
        """An accepted invitation replaces this device's finished job: it leaves the window, stays in Saved jobs."""
        s = self.session
        job_id = s.coordinator.spec.job_id if s.coordinator is not None else \
            s.participant.job_id if s.participant is not None else None
        if s.coordinator is not None:
            await self.executor.save_job_record(active=False)
        else:
            await self.store.delete_setting(PARTICIPATION_KEY)
        s.record("job.replaced", {"jobId": job_id})
        self._clear_job()

    async def _reopen(self, job_id: str, *, restart: bool) -> None:
        s = self.session
        reopened = await self.store.reopen(job_id, my_peer_id=s.my_peer_id, kernel=self.kernel, now=self.clock())
        s.coordinator = coordinator = reopened.coordinator
        s.job_seed = coordinator.job_seed
        s.validation_sha256 = reopened.validation_sha256
        s.validation_unavailable = reopened.validation_unavailable
        self._set_reopened_backend_job(coordinator.spec)
        self._setup_local_participant()
        s.record("job.reopened", {"jobId": job_id, "round": coordinator.checkpoint_round})
        if restart and coordinator.status is not JobStatus.COMPLETED:
            coordinator.start(self.clock())
        await self._drain()

    async def _save_device_settings(self) -> None:
        await self.store.put_setting("device", self.session.device.to_json())
        self.view.notify()


class _BusyScope:
    """``busy`` (and ``preparing``) while an API method works; a WeeiError that preparing a job
    raises becomes state.error."""

    def __init__(self, controller: TrainingController, preparing: bool) -> None:
        self.session = controller.session
        self.view = controller.view
        self.preparing = preparing

    async def __aenter__(self) -> None:
        self.session.busy += 1
        if self.preparing:
            self.session.preparing = True
        self.view.notify()

    async def __aexit__(self, *exc: Any) -> None:
        self.session.busy -= 1
        if self.preparing:
            self.session.preparing = False
        if self.preparing and exc[1] is not None and isinstance(exc[1], WeeiError):
            self.session.error = str(exc[1])
        self.view.notify()


class _NewJobScope:
    """A new job's first writes: if storage refuses one, the job is not created and what it wrote goes."""

    def __init__(self, controller: TrainingController) -> None:
        self.controller = controller

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *exc: Any) -> None:
        if isinstance(exc[1], StorageError):
            controller = self.controller
            controller.session.record("storage.refused", {"what": "the new job", "reason": exc[1].reason,
                                                          "error": str(exc[1])[:500]})
            controller._clear_job()
            await controller.store.collect_garbage()


def _parse_json(data: bytes, what: str) -> Any:
    def fail(message: str) -> NoReturn:
        raise ManifestError(ManifestReason.INVALID_JSON, f"{what}: {message}")

    return _check.parse_json(data, fail)

