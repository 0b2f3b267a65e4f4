"""A WorkerPool for CPython: one wasmtime model runtime per Worker, run in threads.

wasmtime releases the GIL while wasm runs, so the Workers of a split
experience assignment train in parallel, as Web Workers do in a browser.

Cancelling: each Worker has its own fork of the engine (its own epoch), so
:meth:`ThreadWorkerPool.cancel` interrupts exactly the Workers running a
cancelled task (``WasmtimeEngine.interrupt('cancelled')``): the model call
traps within moments, the thread returns, ``run`` raises TaskCancelled, and
the Worker's broken runtime is loaded again for its next task.

Bounds: ``engine.memory_limit_bytes`` and ``engine.call_deadline_s`` are
the device's caps; each task's limit (:func:`weei.runtime.sandbox.memory_limit`,
from the task's ``working_bytes`` and inputs) and deadline
(``task.deadline_s``, at most the cap) are set on the Worker's fork before
its runtime is loaded and its calls run.
"""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any

from ..api.ports import ProgressSink, WorkerResult, WorkerTask
from ..adapters.worker_tasks import TaskBook
from ..runtime.sandbox import memory_limit
from ..runtime import ModelRuntime

__all__ = ["ThreadWorkerPool"]


class ThreadWorkerPool:
    """Runtimes by Worker index, created (and the module loaded) on first use.

    ``engine`` is a ``WasmtimeEngine`` (anything with ``fork()``, ``interrupt()``
    and ``resume()``); each Worker uses a fork of it, never ``engine`` itself.
    """

    def __init__(self, engine: Any, device_limit: int | None = None) -> None:
        self.engine = engine
        self._device_limit = device_limit or os.cpu_count() or 1
        self._engines: dict[int, Any] = {}
        self._runtimes: dict[int, tuple[str, ModelRuntime, int]] = {}  # module, runtime, memory limit
        self._lock = threading.Lock()
        self._tasks = TaskBook()

    @property
    def device_limit(self) -> int:
        return self._device_limit

    @property
    def active(self) -> int:
        return self._tasks.active

    async def run(self, index: int, module_sha256: str, module: bytes, task: WorkerTask,
                  on_progress: ProgressSink | None = None, *, tag: str = "") -> WorkerResult:
        loop = asyncio.get_running_loop()
        async with self._tasks.slot(index, tag) as entry:

            def report(payload: dict[str, Any]) -> None:
                if on_progress is not None and not entry.cancelled:  # nothing from a cancelled task
                    on_progress(index, payload)

            def progress(progress: Any) -> None:
                payload = {"processedExamples": progress.processed_examples, "totalExamples": progress.total_examples,
                           "metrics": dict(progress.metrics)}
                loop.call_soon_threadsafe(report, payload)

            engine = self._engines.get(index)
            if engine is None:
                engine = self._engines[index] = self.engine.fork()
            # Here, in the loop's thread, not in the Worker's: a cancel() after this line interrupts the task.
            engine.resume()
            return await entry.outcome(
                asyncio.to_thread(self._run, index, engine, module_sha256, module, task, progress))

    def cancel(self, tag: str | None = None) -> int:
        hit = self._tasks.cancel(tag)
        for entry in hit:
            if entry.running:
                self._engines[entry.index].interrupt("cancelled")
        return len(hit)

    def _runtime(self, index: int, engine: Any, module_sha256: str, module: bytes, limit: int) -> ModelRuntime:
        with self._lock:
            held = self._runtimes.get(index)
            # A runtime made under a smaller memory limit than this task's is made again (a larger one serves).
            if held is None or held[0] != module_sha256 or held[1].broken is not None or held[2] < limit:
                engine.memory_limit_bytes = limit
                held = (module_sha256, ModelRuntime.load(module, engine), limit)
                self._runtimes[index] = held
            return held[1]

    def _run(self, index: int, engine: Any, module_sha256: str, module: bytes, task: WorkerTask,
             progress: Any) -> WorkerResult:
        # The sandbox's bounds for this task (weei.runtime.sandbox): the parent engine's limit is the device's cap.
        limit = memory_limit(task.working_bytes, task.input_bytes, self.engine.memory_limit_bytes)
        ceiling = self.engine.call_deadline_s  # the parent's deadline bounds every task's, as in the browser
        engine.call_deadline_s = min(task.deadline_s, ceiling) if task.deadline_s is not None else ceiling
        runtime = self._runtime(index, engine, module_sha256, module, limit)
        runtime.on_progress = progress
        runtime.load_model(task.weights)
        if task.auxiliary or runtime.model_info().get("auxiliaryWeights"):
            runtime.load_auxiliary(dict(task.auxiliary))
        if task.op == "evaluate":
            result = runtime.evaluate(data=task.data, format=task.format, experience=task.experience)
            return WorkerResult(None, result.metrics, result.examples)
        trained = runtime.train(data=task.data, format=task.format, experience=task.experience, seed=task.seed,
                                settings=dict(task.settings or {}))
        return WorkerResult(trained.weights, trained.metrics, trained.examples, trained.optimizer_steps)
