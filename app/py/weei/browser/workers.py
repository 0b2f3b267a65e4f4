"""The controller's WorkerPool port over module Workers (Pyodide, in the host worker).

Theory of operation
-------------------
Each Worker is a ``WorkerClient`` (``embed/worker_client.js``, nested in the host worker) running
``worker.js`` with its own Pyodide; the pool receives a JS function
``create_worker()`` that starts one, and starts Worker ``i`` on its first
task. A Worker's message loop runs one request at a time, and its model
instance is shared by every request, so the pool queues tasks per Worker
(``weei.adapters.worker_tasks.TaskBook``): the page may ask for validation on
Worker 0 while it trains, and the validation then waits for the training.

Per task: ``loadModel`` when the Worker does not hold this module yet (or
its last task failed: the instance may be broken), then ``train`` or
``evaluate`` with the weights and data transferred as ``ArrayBuffer``s.
The page compiles each (module, memory limit) once, asynchronously, and
sends the ``WebAssembly.Module`` with the bytes in every ``loadModel``: all
Workers then share V8's compiled code, and a function optimized while one
Worker trains is optimized for all of them, for Workers started later (a
cancelled task's replacement) and for the next job with the same module.
V8 compiles lazily, so this compile only validates; the cost of a cold
module (baseline code until V8 has optimized the hot functions) is paid
once per page instead of once per Worker.
Progress messages go to the task's sink as ``(index, {processedExamples,
totalExamples, metrics})``. :attr:`BrowserWorkerPool.active` counts tasks
running now (not waiting in a queue).

Errors: a reply with ``ok: false`` becomes ``ModelError`` (kind 'model'),
``UsageError`` (kind 'usage') or ``WeeiError('worker-failed')``; a Worker
that died (it failed to start, or ``onerror``) is dropped and the next task
starts a new one. Proxies (the progress callback) are destroyed when their
task ends.

Cancelling: a Worker's wasm call is synchronous and cannot be interrupted
from the page, so :meth:`BrowserWorkerPool.cancel` terminates each Worker
running a cancelled task (its pending request rejects at once, and ``run``
raises ``TaskCancelled``) and starts a new one in its place right away, so
Pyodide is loading while the next job is set up; it gets the module again
with its first task. A cancelled task still waiting for its Worker leaves
the queue without running.

GPU assignments: :class:`WorkerGpuHost` (the page's ``GpuHost``) sends
them to Worker 0 as ``trainGpu`` (``weei.gpu.trainer`` runs there, on the
Worker's own ``navigator.gpu``), queued, cancelled and bounded by a
deadline like any task; the Worker's ``adapter`` and ``compiled`` events
arrive as progress messages with an ``event`` field. A GPU failure replies
with kind ``gpu`` and becomes a ``GpuError`` of the same reason.

Deadlines: a request that runs past its deadline (:data:`TASK_DEADLINES_S`;
a hung or hostile module) is treated the same way, the Worker terminated
and replaced, and fails with ``ModelError('deadline-exceeded')``: the
assignment fails like any failure and goes to another participant. A
task's own deadline (``WorkerTask.deadline_s``, from the device's measured
pace: ``weei.runtime.sandbox``) shortens the train and evaluate ones.

Memory: a page cannot put a store limit on a module's own memory, so the
module a Worker loads declares the task's limit as its maximum
(``weei.runtime.sandbox.cap_module_memory``; a larger declared minimum is
refused by name, ``memory-over-limit``, before the Worker sees it): a
``memory.grow`` past it returns -1 inside the module, as under wasmtime.
A Worker holding the module under a smaller limit loads it again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Callable

import js  # type: ignore[import-not-found]
from pyodide.ffi import JsException, create_proxy  # type: ignore[import-not-found]

from weei.api.ports import ProgressSink, WorkerResult, WorkerTask
from weei.adapters.worker_tasks import TaskBook
from weei.core.errors import ModelError, ModelReason, UsageError, UsageReason, WeeiError, WeeiReason, member_of
from weei.core.limits import DEFAULT_MEMORY_CAP
from weei.runtime.sandbox import cap_module_memory, memory_limit
from weei.gpu.archive import dump_archive
from weei.gpu.errors import GpuError
from weei.gpu.trainer import EventSink, GpuAssignment, GpuOutcome

from .convert import from_js_value, is_nullish
from .engine import to_uint8array
from .worker_main import js_object

__all__ = ["BrowserWorkerPool", "WorkerGpuHost", "TASK_DEADLINES_S"]

#: How long one Worker request may take (s): generous, but finite. loadModel includes a new
#: Worker's Pyodide start, which takes minutes on a loaded machine; training and validation
#: match the CPython host's call deadline (the ceiling of weei.runtime.sandbox.operation_deadline_s;
#: a task's own deadline from the measured pace is shorter).
TASK_DEADLINES_S = {"loadModel": 300.0, "train": 900.0, "evaluate": 900.0, "trainGpu": 900.0}
#: Compiled (module, memory limit) pairs the pool keeps for its Workers.
MODULE_CACHE_SIZE = 2


#: The error class of each ``kind`` a Worker's reply names.
_KINDS: dict[str, type[WeeiError]] = {"gpu": GpuError, "model": ModelError, "usage": UsageError}


def _error(exc: JsException) -> WeeiError | GpuError:
    reason = getattr(exc, "reason", None)
    kind = getattr(exc, "kind", None)
    detail = getattr(exc, "weeiMessage", None)
    message = str(detail) if not is_nullish(detail) else str(getattr(exc, "message", exc))
    if is_nullish(reason):
        return WeeiError(WeeiReason.WORKER_FAILED, f"training Worker failed: {message}")
    family = _KINDS.get(str(kind)) if not is_nullish(kind) else None
    if family is not None and (member := member_of(family.reasons, str(reason))) is not None:
        return family(member, message)
    # The Worker's own refusals (worker-start-failed, internal-error) and any code outside its family
    # keep their text; the code is ours to name.
    member = member_of(WeeiError.reasons, str(reason))
    return WeeiError(member or WeeiReason.WORKER_FAILED, f"training Worker failed: {message}" if member else
                     f"training Worker failed ({str(reason)[:100]}): {message}")


def _count(reply: Any, op: str) -> int:
    names = ("uniqueExamples", "completedUnits") if op == "train" else ("examples",)
    for name in names:
        value = getattr(reply, name, None)
        if not is_nullish(value):
            return int(value)
    return 0


class BrowserWorkerPool:
    """:class:`weei.api.ports.WorkerPool` over ``WorkerClient``s made by ``create_worker()``."""

    def __init__(self, create_worker: Callable[[], Any], device_limit: int | None = None,
                 deadlines_ms: Mapping[str, Any] | None = None, memory_cap: int = DEFAULT_MEMORY_CAP) -> None:
        self._create = create_worker
        self._memory_cap = memory_cap  # the device's cap on one module's memory
        # A Worker's synchronous wasm call cannot be interrupted: a request that overruns its deadline
        # terminates the Worker (the next task starts a new one) and fails by name.
        self._deadlines = dict(TASK_DEADLINES_S)
        for op, ms in (deadlines_ms or {}).items():
            if op in self._deadlines and isinstance(ms, (int, float)) and not isinstance(ms, bool) and ms > 0:
                self._deadlines[op] = float(ms) / 1000
        if device_limit is None:
            cores = getattr(js.navigator, "hardwareConcurrency", None)
            device_limit = int(cores) if not is_nullish(cores) and int(cores) > 0 else 1
        self._device_limit = max(1, int(device_limit))
        self._clients: dict[int, Any] = {}
        self._loaded: dict[int, tuple[str, int]] = {}  # index -> (module sha256, memory limit) the Worker holds
        self._compiled: dict[tuple[str, int], tuple[bytes, Any]] = {}  # -> (capped bytes, WebAssembly.Module)
        self._tasks = TaskBook()

    @property
    def device_limit(self) -> int:
        return self._device_limit

    @property
    def active(self) -> int:
        return self._tasks.active

    @property
    def started(self) -> int:
        """Workers started so far."""
        return len(self._clients)

    async def run(self, index: int, module_sha256: str, module: bytes, task: WorkerTask,
                  on_progress: ProgressSink | None = None, *, tag: str = "") -> WorkerResult:
        """Run ``task`` on Worker ``index`` after the tasks queued there. Raises WeeiError, TaskCancelled."""
        if task.op not in ("train", "evaluate"):
            raise UsageError(UsageReason.INVALID_REQUEST, f"unknown Worker task {task.op!r}")
        async with self._tasks.slot(index, tag) as entry:
            sink = None
            if on_progress is not None:
                def sink(worker: int, payload: dict[str, Any]) -> None:
                    if not entry.cancelled:  # nothing from a cancelled task
                        on_progress(worker, payload)
            reply = await entry.outcome(self._run(index, module_sha256, module, task, sink))
        metrics = {str(k): float(v) for k, v in (from_js_value(reply.metrics) or {}).items()}
        if task.op == "evaluate":
            return WorkerResult(None, metrics, _count(reply, "evaluate"))
        steps = getattr(reply, "optimizerSteps", None)
        return WorkerResult(bytes(reply.weights.to_bytes()), metrics, _count(reply, "train"),
                            None if is_nullish(steps) else int(steps))

    async def run_gpu(self, index: int, module_sha256: str, module: bytes, assignment: GpuAssignment,
                      on_event: EventSink, *, tag: str = "") -> GpuOutcome:
        """Train a GPU assignment in Worker ``index`` (``trainGpu``). Raises GpuError (a named fallback),
        TaskCancelled, WeeiError (``deadline-exceeded``: the Worker was stopped; the Worker failed)."""
        work = assignment.work
        task = WorkerTask("trainGpu", assignment.weights, assignment.auxiliary, data=work.data, format=work.format,
                          experience=work.experience, seed=work.seed, settings=work.settings)
        gpu = {"job": assignment.job, "archive": dump_archive(assignment.archive).decode("utf-8"),
               "backend": assignment.spec.to_backend(), "preference": assignment.preference,
               "budgetMiB": assignment.budget_mib}
        async with self._tasks.slot(index, tag) as entry:
            def sink(_worker: int, payload: dict[str, Any]) -> None:
                if not entry.cancelled:
                    kind = payload.pop("event", "progress")
                    on_event(str(kind), payload)
            reply = await entry.outcome(self._run(index, module_sha256, module, task, sink, {"gpu": gpu}))
        steps = getattr(reply, "optimizerSteps", None)
        info = from_js_value(reply.gpu) or {}
        return GpuOutcome(bytes(reply.weights.to_bytes()),
                          {str(k): float(v) for k, v in (from_js_value(reply.metrics) or {}).items()},
                          _count(reply, "train"), None if is_nullish(steps) else int(steps),
                          int(info.get("steps", 0)), float(info.get("trainingMs", 0.0)), str(info.get("gate", "")))

    def cancel(self, tag: str | None = None) -> int:
        """Cancel the tasks of ``tag`` (all when None): terminate and replace the Workers running them."""
        hit = self._tasks.cancel(tag)
        for entry in hit:
            client = self._clients.get(entry.index)
            if entry.running and client is not None:
                self._drop(entry.index, client)
                self._clients[entry.index] = self._create()
        return len(hit)

    def terminate(self) -> None:
        """Stop every Worker (their pending requests fail)."""
        for client in self._clients.values():
            client.terminate()
        self._clients.clear()
        self._loaded.clear()

    async def _request(self, index: int, client: Any, op: str, fields: dict[str, Any], transfer: list[Any],
                       on_progress: ProgressSink | None, deadline_s: float | None = None) -> Any:
        proxy = None
        options: dict[str, Any] = {"transfer": transfer}
        if on_progress is not None:
            def progress(message: Any) -> None:
                event = getattr(message, "event", None)
                if not is_nullish(event):  # a GPU task's adapter / compiled
                    on_progress(index, {**(from_js_value(getattr(message, "detail", None)) or {}), "event": str(event)})
                    return
                on_progress(index, {
                    "processedExamples": int(getattr(message, "processedExamples", 0) or 0),
                    "totalExamples": from_js_value(getattr(message, "totalExamples", None)),
                    "metrics": from_js_value(getattr(message, "metrics", None)) or {},
                })

            proxy = create_proxy(progress)
            options["onProgress"] = proxy
        deadline = min(self._deadlines[op], deadline_s) if deadline_s is not None else self._deadlines[op]
        try:
            return await asyncio.wait_for(client.request(op, js_object(fields), js_object(options)), deadline)
        except asyncio.TimeoutError:
            self._drop(index, client)
            raise ModelError(ModelReason.DEADLINE_EXCEEDED, f"{op} ran past its {deadline:g} s deadline: "
                                                  "the Worker was stopped and is replaced") from None
        except JsException as exc:
            error = _error(exc)
            if error.reason in (WeeiReason.WORKER_FAILED, WeeiReason.WORKER_START_FAILED):
                self._drop(index, client)
            self._loaded.pop(index, None)
            raise error from None
        finally:
            if proxy is not None:
                proxy.destroy()

    def _drop(self, index: int, client: Any) -> None:
        if self._clients.get(index) is client:
            del self._clients[index]
            self._loaded.pop(index, None)
            try:
                client.terminate()
            except JsException:
                pass

    async def _compiled_module(self, module_sha256: str, module: bytes, limit: int) -> tuple[bytes, Any]:
        """The module capped at ``limit`` and its ``WebAssembly.Module`` (None when it does not compile:
        the Worker then compiles the bytes and reports the error by name)."""
        key = (module_sha256, limit)
        held = self._compiled.pop(key, None)
        if held is None:
            capped = cap_module_memory(module, limit)
            try:
                compiled = await js.WebAssembly.compile(to_uint8array(capped))
            except JsException:
                compiled = None
            held = (capped, compiled)
        self._compiled[key] = held  # most recently used last
        while len(self._compiled) > MODULE_CACHE_SIZE:
            del self._compiled[next(iter(self._compiled))]
        return held

    async def _run(self, index: int, module_sha256: str, module: bytes, task: WorkerTask,
                   on_progress: ProgressSink | None, extra: dict[str, Any] | None = None) -> Any:
        client = self._clients.get(index)
        if client is None:
            client = self._create()
            self._clients[index] = client
        limit = memory_limit(task.working_bytes, task.input_bytes, self._memory_cap)
        held = self._loaded.get(index)
        if held is None or held[0] != module_sha256 or held[1] < limit:
            self._loaded.pop(index, None)
            capped, compiled = await self._compiled_module(module_sha256, module, limit)
            wasm = to_uint8array(capped).buffer
            fields = {"wasm": wasm} if compiled is None else {"wasm": wasm, "module": compiled}
            await self._request(index, client, "loadModel", fields, [wasm], None)
            self._loaded[index] = (module_sha256, limit)
        weights = to_uint8array(task.weights).buffer
        fields: dict[str, Any] = {"weights": weights}
        transfer = [weights]
        if task.data is not None:
            data = to_uint8array(task.data).buffer
            fields["data"] = data
            fields["format"] = task.format
            transfer.append(data)
        if task.experience is not None:
            start, count, seed = task.experience
            fields["experience"] = {"unitStart": start, "unitCount": count, "seed": str(seed)}
        if task.auxiliary:
            aux = js.Object.new()
            for slot, value in task.auxiliary.items():
                buffer = to_uint8array(value).buffer
                setattr(aux, slot, buffer)
                transfer.append(buffer)
            fields["auxiliary"] = aux
        if task.op in ("train", "trainGpu"):
            fields["seed"] = str(task.seed)
            fields["settings"] = dict(task.settings or {})
        fields.update(extra or {})
        return await self._request(index, client, task.op, fields, transfer, on_progress, task.deadline_s)


class WorkerGpuHost:
    """The page's ``GpuHost``: GPU assignments train in the pool's Worker 0, not in the page."""

    name = "worker"
    in_pool = True

    def __init__(self, pool: BrowserWorkerPool) -> None:
        self.pool = pool

    async def train(self, assignment: GpuAssignment, *, module_sha256: str, module: bytes,
                    on_event: EventSink, tag: str) -> GpuOutcome:
        return await self.pool.run_gpu(0, module_sha256, module, assignment, on_event, tag=tag)

    def cancel(self, tag: str) -> None:
        self.pool.cancel(tag)
