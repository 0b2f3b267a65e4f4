"""A WorkerPool for CPython: one wasmtime model runtime per Worker, run in threads.

wasmtime releases the GIL while wasm runs, so the Workers of a split
experience assignment train in parallel, as Web Workers do in a browser.
"""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any

from ..api.ports import ProgressSink, WorkerResult, WorkerTask
from ..runtime import ModelRuntime

__all__ = ["ThreadWorkerPool"]


class ThreadWorkerPool:
    """Runtimes by Worker index, created (and the module loaded) on first use."""

    def __init__(self, engine: Any, device_limit: int | None = None) -> None:
        self.engine = engine
        self._device_limit = device_limit or os.cpu_count() or 1
        self._runtimes: dict[int, tuple[str, ModelRuntime]] = {}
        self._active = 0
        self._lock = threading.Lock()
        # A Worker runs one task at a time, as a Web Worker's message loop does.
        self._busy: dict[int, asyncio.Lock] = {}

    @property
    def device_limit(self) -> int:
        return self._device_limit

    @property
    def active(self) -> int:
        return self._active

    async def run(self, index: int, module_sha256: str, module: bytes, task: WorkerTask,
                  on_progress: ProgressSink | None = None) -> WorkerResult:
        loop = asyncio.get_running_loop()

        def progress(report: Any) -> None:
            if on_progress is not None:
                payload = {"processedExamples": report.processed_examples, "totalExamples": report.total_examples,
                           "metrics": dict(report.metrics)}
                loop.call_soon_threadsafe(on_progress, index, payload)

        async with self._busy.setdefault(index, asyncio.Lock()):
            self._active += 1
            try:
                return await asyncio.to_thread(self._run, index, module_sha256, module, task, progress)
            finally:
                self._active -= 1

    def _runtime(self, index: int, module_sha256: str, module: bytes) -> ModelRuntime:
        with self._lock:
            held = self._runtimes.get(index)
            if held is None or held[0] != module_sha256 or held[1].broken is not None:
                held = (module_sha256, ModelRuntime.load(module, self.engine))
                self._runtimes[index] = held
            return held[1]

    def _run(self, index: int, module_sha256: str, module: bytes, task: WorkerTask, progress: Any) -> WorkerResult:
        runtime = self._runtime(index, module_sha256, module)
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
