"""The GPU compute backend: a job's assignments on a WebGPU device, the CPU Workers otherwise.

Theory of operation
-------------------
``GpuComputeBackend`` implements the ``compute.ComputeBackend`` seam around
the CPU backend. For each assignment of a job created with ``executionFiles``
(``prepare.GpuFiles``), when the device's backend preference allows it
(``auto`` a hardware adapter, ``gpu``/``hybrid`` any adapter, ``cpu`` never):

1. the budget (the backend's ``estimatedWorkingBytes`` against
   ``gpuMemoryBudgetMiB``) is checked before anything is allocated;
2. the host (``GpuHost``) runs ``weei.gpu.trainer.GpuTrainer``: it opens the
   device (``weei.gpu.executor.GpuDevice.open``) and compiles the archive
   module by module: stage ``compiling``, whose time is the diagnostics'
   ``compilationMs``;
3. once per job and device, the admission gate (``session.run_gate``);
4. the assignment trains on the GPU (``session.train_on_gpu``). An
   experience assignment runs hybrid: the model's WASM plays the episodes on
   the CPU and the device makes each policy update, so ``execution.actual``
   is ``hybrid`` (``gpu`` for a dataset assignment).

Any ``GpuError`` on the way is a named fallback: ``execution.fallbackReason``
and ``diagnostics.gpu.initializationError`` say why, and the assignment
restarts on the CPU Workers from its checkpoint weights (the package's
``cpuFallback: restart-assignment``): nothing is lost. A reason that would
recur (no adapter, a refused archive, the gate) is remembered for the job
until the preference or the budget changes, so later assignments go to the
CPU at once.

The device work is blocking (wgpu-py's ``*_sync`` calls, the shim's
``run_sync``), so it runs off the event loop: :class:`LocalGpuHost` runs it
in a thread (CPython; its events cross back with ``call_soon_threadsafe``),
the page's ``weei.browser.workers.WorkerGpuHost`` in a training Worker
(``trainGpu``), on the Worker's own ``navigator.gpu`` (docs/gpu.md). Either
way an assignment has a deadline (``deadline_s``): the executor stops
between its submissions once it has passed, and the host stops waiting for
it then (``gpu-timeout``).

Where the archive comes from: the coordinator's own job sets it
(``set_job``, from ``prepare`` or the job store on a reopen); a remote job
announces it in Deliver (``offer``: this device asks for it only when it
would train on a GPU), and it arrives with the first Assign
(``receive_archive``: size and SHA-256 against the announcement, then
module by module). A bad one leaves the job on the CPU with its reason, and
so does one the host does not accept (``accept_archive``: the agent's
``--accept-model`` list, docs/agent.md): that one is never fetched.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol

from ..core.errors import ModelReason, WeeiError
from ..core.job.spec import GpuOffer
from ..core.wire.messages import Assign
from ..core.job.participant import TrainOutcome
from ..gpu.adapter import check_budget
from ..gpu.archive import check_descriptor, parse_archive
from ..gpu.errors import GpuError, GpuReason
from ..gpu.session import GpuBackendSpec, GpuWork
from ..gpu.trainer import GPU_DEADLINE_S, EventSink, GpuAssignment, GpuOutcome, GpuTrainer
from ..prepare import GpuFiles
from ..runtime import Engine, ModelRuntime
from .compute import CpuWorkerBackend
from .local_training import local_epochs
from .ports import TaskCancelled, WorkerResult, WorkerTask
from .session import Session

__all__ = ["GpuComputeBackend", "GpuHost", "LocalGpuHost", "NO_GPU_ARCHIVE"]

# Why an assignment asked to run on the GPU trains on the CPU without trying a device: the job has no
# WGSL archive here. Not a GpuError reason: nothing failed, and nothing restarts.
NO_GPU_ARCHIVE = "no-gpu-archive"


class GpuHost(Protocol):
    """Where a GPU assignment runs: ``gpu.trainer.GpuTrainer`` on some thread or Worker."""

    @property
    def name(self) -> str: ...  # where the device work runs ('thread', 'worker'): the gpu.trained event says

    @property
    def in_pool(self) -> bool: ...  # its tasks are counted by the CPU backend's WorkerPool

    async def train(self, assignment: GpuAssignment, *, module_sha256: str, module: bytes,
                    on_event: EventSink, tag: str) -> GpuOutcome:
        """Train on the device; ``on_event`` gets ``adapter``, ``compiled`` and ``progress`` on the event loop.
        Raises GpuError (a named fallback), TaskCancelled, or WeeiError when the Worker running it failed."""
        ...

    def cancel(self, tag: str) -> None:
        """Interrupt the GPU task of attempt ``tag`` if the host can (its ``train`` raises TaskCancelled)."""
        ...


class LocalGpuHost:
    """The trainer in a thread of this process (CPython: wgpu-py; the agent and the tests).

    The thread stops itself between submissions once the assignment's deadline has passed; what it
    cannot interrupt (one submission on the device, a model call) is waited for only until the
    deadline: ``train`` then fails with ``gpu-timeout`` and leaves the thread to finish by itself (a
    daemon: it never holds up the process's exit). The next assignment waits for that thread until
    the thread's own deadline and is refused by the same name after it, so a device stuck in one
    piece of work holds one thread, never a pile of them, and never two at once on one trainer."""

    name = "thread"
    in_pool = False

    def __init__(self, gpu: Any, engine: Engine) -> None:
        self.trainer = GpuTrainer(gpu)
        self.engine = engine
        self._running: tuple[asyncio.Future[GpuOutcome], float] | None = None  # the last thread's result, deadline

    async def train(self, assignment: GpuAssignment, *, module_sha256: str, module: bytes,
                    on_event: EventSink, tag: str) -> GpuOutcome:
        loop = asyncio.get_running_loop()
        home = threading.get_ident()

        def event(kind: str, payload: dict[str, Any]) -> None:
            if threading.get_ident() == home:
                on_event(kind, payload)
            else:
                loop.call_soon_threadsafe(on_event, kind, payload)

        def run() -> GpuOutcome:
            runtime = ModelRuntime.load(module, self.engine)
            runtime.on_progress = lambda p: event("progress", {"processedExamples": p.processed_examples,
                                                               "metrics": dict(p.metrics)})
            return self.trainer.run(runtime, assignment, event)

        if sys.platform == "emscripten":  # Pyodide has no threads (the page uses WorkerGpuHost, not this)
            return run()
        await self._previous()
        future: asyncio.Future[GpuOutcome] = loop.create_future()
        future.add_done_callback(lambda f: f.cancelled() or f.exception())  # an abandoned one's error is not news
        self._running = (future, time.monotonic() + assignment.deadline_s)

        def settle(result: GpuOutcome | None, error: BaseException | None) -> None:
            if future.done():
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)  # type: ignore[arg-type]

        def target() -> None:
            result, error = None, None
            try:
                result = run()
            except BaseException as exc:  # handed to the event loop, raised there
                error = exc
            try:
                loop.call_soon_threadsafe(settle, result, error)
            except RuntimeError:  # the loop closed while the device worked: nobody waits any more
                pass

        threading.Thread(target=target, name="weei-gpu", daemon=True).start()
        try:
            return await asyncio.wait_for(asyncio.shield(future), assignment.deadline_s)
        except TimeoutError:
            raise GpuError(GpuReason.GPU_TIMEOUT, f"the GPU assignment did not return within its deadline of "
                                          f"{assignment.deadline_s:g} s") from None

    async def _previous(self) -> None:
        """Wait for the previous assignment's thread (a dropped or timed-out one), until its deadline."""
        if self._running is None:
            return
        future, deadline = self._running
        if not future.done():
            try:
                await asyncio.wait_for(asyncio.shield(future), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                raise GpuError(GpuReason.GPU_TIMEOUT, "the previous GPU assignment ran past its deadline and has not "
                                              "returned: this device's GPU takes no work until it does") from None
            except Exception:
                pass  # that assignment's own failure, told when it happened
        self._running = None

    def cancel(self, tag: str) -> None:
        pass  # a GPU step in a thread cannot be interrupted: the dropped attempt's result is thrown away


@dataclass
class _JobGpu:
    files: GpuFiles
    spec: GpuBackendSpec
    key: str  # the trainer's job key: the gate runs once per job and device
    refused: tuple[tuple[str, int], GpuError] | None = None  # (preference, budget) -> the recurring reason


# Reasons that come back on every assignment of the job (the device, the package, the gate).
_STICKY = frozenset({
    "webgpu-unavailable", "no-adapter", "software-adapter", "missing-feature", "adapter-limits", "device-failed",
    "over-memory-budget", "module-compile-failed", "module-missing", "entry-point-missing", "program-invalid",
    "program-over-budget", "program-over-estimate", "program-over-workgroups", "gate-mismatch",
})


class GpuComputeBackend:
    """Trains on the GPU where the job, the preference and the device allow; the CPU Workers otherwise."""

    def __init__(self, cpu: CpuWorkerBackend, *, engine: Engine, session: Session, gpu: Any,
                 host: GpuHost | None = None, accept_archive: Callable[[str], bool] | None = None) -> None:
        """``accept_archive(sha256)``: whether this host runs a remote job's WGSL archive (None: any)."""
        self.cpu = cpu
        self.session = session
        # wgpu.gpu in CPython, weei.browser.webgpu.gpu in the page (whether there is WebGPU), None without
        self.gpu = gpu
        self.host: GpuHost = host or LocalGpuHost(gpu, engine)
        self.accept_archive = accept_archive
        self.deadline_s = GPU_DEADLINE_S  # how long one GPU assignment may take
        self._jobs = 0  # _JobGpu keys
        self.job: _JobGpu | None = None
        self.kind = "cpu"  # what the last assignment trained on (execution.actual: cpu, gpu or hybrid)
        self.id = cpu.id
        self._cpu_id = cpu.id
        self._gpu_attempt: str | None = None
        self._current: str | None = None
        self.wgsl: dict[str, Any] = {"present": False, "sha256": []}  # diagnostics' model.wgsl
        self._offer: GpuOffer | None = None  # a remote job's announced archive
        self._archive_error: GpuError | None = None  # the announced archive arrived bad: the job stays on the CPU
        session.recorder.update_gpu({"webgpu": "available" if gpu is not None else "unavailable",
                                     "memoryBudgetMiB": session.device.gpu_memory_budget_mib})

    # ------------------------------------------------------------ the seam

    @property
    def device_limit(self) -> int:
        return self.cpu.device_limit

    @property
    def active(self) -> int:
        running = self._gpu_attempt is not None and not self.host.in_pool
        return self.cpu.active + (1 if running else 0)

    def set_job(self, files: GpuFiles | None, cpu_backend_id: str | None) -> None:
        """The active job's WGSL archive and GPU backend (None: the job trains on the CPU only)."""
        self._offer, self._archive_error = None, None
        self._use(files, cpu_backend_id)

    def offer(self, offer: Mapping[str, Any] | None, cpu_backend: str | None = None) -> bool:
        """A remote job's Deliver announced ``offer`` (checked JSON, None: no archive) and the package's
        CPU backend id. Returns whether this device fetches the archive: only if it would train on a GPU
        (a WebGPU ``gpu`` object and a preference that allows one)."""
        parsed = GpuOffer.from_json(offer) if offer is not None else None
        cpu_id = cpu_backend or (parsed.cpu_backend if parsed is not None else None)
        if parsed is None or parsed != self._offer:  # the same job delivered again (a reconnect) keeps its archive
            self.set_job(None, cpu_id)
            self._offer = parsed
        wants = parsed is not None and self.gpu is not None and self.session.device.backend_preference != "cpu"
        wants = wants and self.job is None and self._archive_error is None
        if wants and parsed is not None and self.accept_archive is not None \
                and not self.accept_archive(parsed.archive.sha256):
            self._archive_error = GpuError(GpuReason.ARCHIVE_NOT_ACCEPTED, f"this host does not accept the WGSL archive "
                                                                   f"{parsed.archive.sha256}: the job trains on the CPU")
            self.session.record("gpu.archive-refused", {"reason": "archive-not-accepted",
                                                        "sha256": parsed.archive.sha256})
            return False
        return wants

    def receive_archive(self, sha256: str, data: bytes | None) -> None:
        """The announced archive arrived with an Assign: checked against the announcement, then module by
        module, once per job. A bad one is remembered and named when the next assignment falls back."""
        offer = self._offer
        if offer is None or self._archive_error is not None or \
                (self.job is not None and self.job.files.archive_sha256 == sha256):
            return
        try:
            if data is None:
                raise GpuError(GpuReason.ARCHIVE_MALFORMED, "the WGSL archive did not arrive with the assignment")
            check_descriptor(bytes(data), offer.archive.bytes, offer.archive.sha256)
            archive = parse_archive(bytes(data))
        except GpuError as exc:
            self._archive_error = exc
            self.session.record("gpu.archive-refused", {"reason": exc.reason, "error": exc.message[:500]})
            return
        self._use(GpuFiles(offer.archive.sha256, archive, offer.backend), self._cpu_id)
        self.session.record("gpu.archive-received", {"sha256": offer.archive.sha256, "bytes": len(data)})

    def _use(self, files: GpuFiles | None, cpu_backend_id: str | None) -> None:
        self._cpu_id = cpu_backend_id or self.cpu.id
        self.id, self.kind = self._cpu_id, "cpu"
        self._jobs += 1
        self.job = None if files is None else _JobGpu(files, GpuBackendSpec.from_backend(files.backend), str(self._jobs))
        self.session.fallback = None
        self.session.recorder.update_gpu({"initializationError": None})
        self.session.recorder.update_execution({"fallbackReason": None})
        self.wgsl = {"present": files is not None,
                     "sha256": list(files.archive.module_sha256s) if files is not None else []}

    async def train(self, assign: Assign, *, module_sha256: str, module: bytes, weights: bytes,
                    auxiliary: Mapping[str, bytes], chunk: bytes | None, workers: int,
                    working_bytes: int | None = None, parts: int = 1) -> TrainOutcome:
        s = self.session
        preference = s.device.backend_preference
        budget = s.device.gpu_memory_budget_mib
        s.recorder.update_gpu({"memoryBudgetMiB": budget})
        job = self.job
        if job is None and self._archive_error is not None and preference != "cpu":
            self._fell_back(None, preference, budget, self._archive_error)
        elif job is not None and preference != "cpu":
            try:
                outcome = await self._train_gpu(job, assign, preference, budget, module_sha256, module, weights,
                                                auxiliary, chunk)
            except GpuError as exc:
                self._fell_back(job, preference, budget, exc)
            else:
                mode = "hybrid" if assign.experience is not None else "gpu"
                self.kind, self.id = mode, job.spec.id
                s.actual, s.fallback = mode, None
                s.recorder.update_execution({"actual": mode, "backend": job.spec.id, "fallbackReason": None})
                return outcome
        elif job is None and preference in ("gpu", "hybrid"):
            # Asked for the GPU, but this job gives it nothing to run: the CPU is a fallback with a reason
            # (the manual's fallbackReason is null only when the actual mode is the requested one).
            # No device was tried, so initializationError and the gpu.fallback event stay as they were.
            s.fallback = NO_GPU_ARCHIVE
            s.recorder.update_execution({"fallbackReason": f"{NO_GPU_ARCHIVE}: the job has no WGSL archive "
                                                           "(the model package brought none, or it was not fetched)"})
        else:  # nothing to fall back from
            s.fallback = None
            s.recorder.update_execution({"fallbackReason": None})
        self.kind, self.id = "cpu", self._cpu_id
        s.actual = "cpu"
        s.recorder.update_execution({"actual": "cpu", "backend": self._cpu_id})
        return await self.cpu.train(assign, module_sha256=module_sha256, module=module, weights=weights,
                                    auxiliary=auxiliary, chunk=chunk, workers=workers, working_bytes=working_bytes,
                                    parts=parts)

    async def evaluate(self, *, module_sha256: str, module: bytes, task: WorkerTask) -> WorkerResult:
        return await self.cpu.evaluate(module_sha256=module_sha256, module=module, task=task)

    def follow(self, attempt_id: str | None) -> bool:
        # A dropped attempt's GPU task is interrupted where the host can (a Worker is terminated);
        # otherwise its result is discarded when it returns.
        self._current = attempt_id
        stale_gpu = self._gpu_attempt is not None and self._gpu_attempt != attempt_id
        if stale_gpu:
            assert self._gpu_attempt is not None
            self.host.cancel(self._gpu_attempt)
        return self.cpu.follow(attempt_id) or stale_gpu

    def cancel(self) -> None:
        self.cpu.cancel()

    # ------------------------------------------------------------ the GPU path

    async def _train_gpu(self, job: _JobGpu, assign: Assign, preference: str, budget: int, module_sha256: str,
                         module: bytes, weights: bytes, auxiliary: Mapping[str, bytes],
                         chunk: bytes | None) -> TrainOutcome:
        s = self.session
        key = (preference, budget)
        if job.refused is not None and job.refused[0] == key:
            raise job.refused[1]
        if assign.attempt_id != self._current:
            raise TaskCancelled(f"attempt {assign.attempt_id} is no longer the participant's")
        spec = job.spec
        check_budget(spec.estimated_working_bytes, budget)  # before the device and any allocation
        s.recorder.on("compiling", s.monotonic())
        work = _work(assign, chunk)
        tag = assign.attempt_id
        total = assign.chunk.example_count * local_epochs(assign.settings) if assign.chunk is not None \
            else assign.experience.unit_count  # what the model counts (docs/abi.md)

        def on_event(kind: str, payload: dict[str, Any]) -> None:
            if tag != self._gpu_attempt:
                return  # a late report of a dropped attempt
            if kind == "adapter":
                s.recorder.update_gpu({"adapter": payload.get("adapter"), "initializationError": None})
            elif kind == "compiled":
                s.recorder.on("running", s.monotonic())
            elif kind == "progress" and self.cpu.local.on_progress is not None:
                self.cpu.local.on_progress({"processedExamples": payload.get("processedExamples", 0),
                                            "totalExamples": total, "metrics": payload.get("metrics", {})})

        request = GpuAssignment(job.key, job.files.archive, spec, preference, budget, weights, auxiliary, work,
                                self.deadline_s)
        self._gpu_attempt = tag
        try:
            outcome = await self.host.train(request, module_sha256=module_sha256, module=module,
                                            on_event=on_event, tag=tag)
        except (GpuError, TaskCancelled):
            raise
        except WeeiError as exc:  # the Worker ran past its deadline (it was stopped) or died
            reason = GpuReason.GPU_TIMEOUT if exc.reason == ModelReason.DEADLINE_EXCEEDED else GpuReason.GPU_ERROR
            raise GpuError(reason, f"{exc.reason}: {exc.message}"[:500]) from exc
        finally:
            self._gpu_attempt = None
        if tag != self._current:
            raise TaskCancelled(f"attempt {tag} was dropped while it trained on the GPU")
        s.record("gpu.trained", {"attempt": tag, "host": self.host.name, "hybrid": work.hybrid,
                                 "steps": outcome.steps, "trainingMs": round(outcome.training_ms, 1),
                                 "gate": outcome.gate})
        return TrainOutcome(outcome.weights, outcome.metrics, outcome.examples, outcome.optimizer_steps)

    def _fell_back(self, job: _JobGpu | None, preference: str, budget: int, exc: GpuError) -> None:
        s = self.session
        reason = f"{exc.reason}: {exc.message}"[:500]
        if job is not None and exc.reason in _STICKY:
            job.refused = ((preference, budget), exc)
        s.fallback = exc.reason
        s.recorder.update_gpu({"initializationError": reason})
        s.recorder.update_execution({"fallbackReason": reason})
        s.record("gpu.fallback", {"reason": exc.reason, "error": exc.message[:500],
                                  "cpuFallback": "restart-assignment"})
        s.recorder.on("running", s.monotonic())


def _work(assign: Assign, chunk: bytes | None) -> GpuWork:
    """train's input for the assignment (as the CPU Workers get it)."""
    if assign.chunk is not None:
        return GpuWork(data=chunk, format=assign.chunk.format, seed=assign.seed, settings=dict(assign.settings))
    exp = assign.experience
    assert exp is not None
    return GpuWork(experience=(exp.unit_start, exp.unit_count, exp.seed), settings=dict(assign.settings))

