"""Running one assignment on this device's Workers.

Assignments over input records (dataset chunks) run on one Worker. An
experience assignment of a model with ``maxWorkers`` above 1 is split into
``parts`` contiguous unit ranges (``experience_parts``: what the job and the
model allow, never this device's Worker count), each seeded as an
assignment that starts at its first unit; the device's Workers play the
ranges (one Worker plays several in turn), and the ranges' weights are
averaged by units played, in range order, with the same FedAvg as the
coordinator's. So the result is the same bits on 1, 2 or 3 Workers, and
whichever Worker finished first.

Cancelling: the host tells :meth:`LocalWorkers.follow` which attempt its
participant holds after every change. Tasks of any other attempt are
cancelled on the pool (tagged with their attempt id), an attempt no longer
held is refused before it starts, and progress of a cancelled attempt is
dropped, so it never shows in the state of the job that follows.

Deadlines: every task carries one from :class:`weei.runtime.sandbox.SpeedMeter`
(its units × the slowest seconds per unit this device has taken so far ×
a generous factor, within a floor and a ceiling; the ceiling before any
task finished), and every finished task is measured with ``monotonic``.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

from ..core.aggregation.aggregate import AggregationKernel, fedavg
from ..core.errors import ModelError, ModelReason
from ..core.wire.messages import Assign
from ..core.job.participant import TrainOutcome
from ..runtime.sandbox import SpeedMeter
from ..core.formats.seeds import split_assignment
from .ports import ProgressSink, TaskCancelled, WorkerPool, WorkerResult, WorkerTask

__all__ = ["LocalWorkers", "effective_workers", "experience_parts", "local_epochs"]


def experience_parts(*, job_workers: int | None, model_max: int, unit_count: int) -> int:
    """How many unit ranges an experience assignment is split into: the job's ``settings.workers`` (the
    same for every device), else the model's ``maxWorkers``, at most the units. A device's own Worker
    limit is left out on purpose: it decides how many ranges run at once, not which ranges there are."""
    wanted = job_workers if job_workers is not None else model_max
    return max(1, min(wanted, model_max, unit_count))


def effective_workers(*, requested: int, device_limit: int, model_max: int, experience: bool,
                      unit_count: int | None) -> int:
    """How many Workers an assignment uses: the setting, the device and the model allow."""
    if not experience:
        return 1
    limit = max(1, min(requested, device_limit, model_max))
    return min(limit, unit_count) if unit_count else limit


@dataclass
class LocalWorkers:
    """Trains assignments for this device's participant on a WorkerPool."""

    pool: WorkerPool
    kernel: AggregationKernel
    on_progress: Callable[[dict[str, Any]], None] | None = None
    current: str | None = None  # the attempt the participant holds (see follow)
    monotonic: Callable[[], float] = time.monotonic  # measures tasks (tests pass a simulated clock)
    speed: SpeedMeter = field(default_factory=SpeedMeter)
    _running: set[str] = field(default_factory=set)

    async def run(self, index: int, module_sha256: str, module: bytes, task: WorkerTask, units: int,
                  on_progress: ProgressSink | None = None, *, tag: str = "") -> WorkerResult:
        """Run ``task`` over ``units`` examples (or episodes) on Worker ``index`` with its deadline; measure it."""
        op = f"{task.op}/{'experience' if task.experience is not None else 'data'}"  # units differ: one pace each
        task = replace(task, deadline_s=self.speed.deadline_s(op, units))
        started = self.monotonic()
        result = await self.pool.run(index, module_sha256, module, task, on_progress, tag=tag)
        self.speed.observe(op, units, self.monotonic() - started)
        return result

    async def evaluate(self, module_sha256: str, module: bytes, task: WorkerTask) -> WorkerResult:
        """Run an 'evaluate' task on Worker 0. Its units are the experience's episodes, or the validation
        file's bytes: its example count is known only once the model has read it, and the same file
        comes back every round, so seconds per byte is the pace that predicts the next evaluation."""
        units = task.experience[1] if task.experience is not None else len(task.data or b"")
        return await self.run(0, module_sha256, module, task, units)

    def follow(self, attempt_id: str | None) -> bool:
        """The participant now holds ``attempt_id`` (None: no attempt); cancel the training of any other.

        Returns True when a running attempt was cancelled.
        """
        self.current = attempt_id
        stale = [a for a in self._running if a != attempt_id]
        for attempt in stale:
            self._running.discard(attempt)
            self.pool.cancel(attempt)
        return bool(stale)

    async def train(self, assign: Assign, *, module_sha256: str, module: bytes, weights: bytes,
                    auxiliary: Mapping[str, bytes], chunk: bytes | None, workers: int,
                    working_bytes: int | None = None, parts: int = 1) -> TrainOutcome:
        """Train ``assign`` from ``weights`` on ``workers`` Workers, an experience assignment in
        ``parts`` ranges (:func:`experience_parts`); raises WeeiError when the model fails, TaskCancelled
        when the attempt is not (or no longer) the one :meth:`follow` named."""
        attempt = assign.attempt_id
        if attempt != self.current:
            raise TaskCancelled(f"attempt {attempt} is no longer the participant's")
        self._running.add(attempt)
        try:
            return await self._train(assign, module_sha256, module, weights, auxiliary, chunk, workers, working_bytes,
                                     parts)
        finally:
            self._running.discard(attempt)

    async def _train(self, assign: Assign, module_sha256: str, module: bytes, weights: bytes,
                     auxiliary: Mapping[str, bytes], chunk: bytes | None, workers: int,
                     working_bytes: int | None, parts: int) -> TrainOutcome:
        settings = dict(assign.settings)
        tag = assign.attempt_id
        if assign.chunk is not None:
            assert chunk is not None
            task = WorkerTask("train", weights, auxiliary, data=chunk, format=assign.chunk.format,
                              seed=assign.seed, settings=settings, working_bytes=working_bytes)
            # The model counts every local epoch's examples (docs/abi.md): so does the total.
            examples = assign.chunk.example_count * local_epochs(settings)
            result = await self.run(0, module_sha256, module, task, examples,
                                    self._progress(tag, 1, examples), tag=tag)
            assert result.weights is not None
            return TrainOutcome(result.weights, result.metrics, result.count, result.optimizer_steps)

        exp = assign.experience
        assert exp is not None
        ranges = split_assignment(exp.job_seed, exp.unit_start, exp.unit_count, parts) if parts > 1 else ()
        if len(ranges) <= 1:
            task = WorkerTask("train", weights, auxiliary, experience=(exp.unit_start, exp.unit_count, exp.seed),
                              settings=settings, working_bytes=working_bytes)
            result = await self.run(0, module_sha256, module, task, exp.unit_count,
                                    self._progress(tag, 1, exp.unit_count), tag=tag)
            assert result.weights is not None
            return TrainOutcome(result.weights, result.metrics, result.count, result.optimizer_steps)

        progress = self._progress(tag, len(ranges), exp.unit_count)
        found: list[WorkerResult | None] = [None] * len(ranges)
        used = max(1, min(workers, len(ranges)))

        async def play(worker: int) -> None:
            # Worker ``worker`` plays ranges worker, worker + used, ...: which one plays a range changes
            # nothing in its result, which depends on its units, seed and the checkpoint alone.
            for i in range(worker, len(ranges), used):
                if tag not in self._running:
                    raise TaskCancelled(f"attempt {tag} was dropped")
                r = ranges[i]
                sink = None if progress is None else (lambda _worker, payload, i=i: progress(i, payload))
                found[i] = await self.run(
                    worker, module_sha256, module,
                    WorkerTask("train", weights, auxiliary, experience=(r.unit_start, r.unit_count, r.seed),
                               settings=settings, working_bytes=working_bytes), r.unit_count, sink, tag=tag)

        await asyncio.gather(*(play(w) for w in range(used)))
        results = [res for res in found if res is not None]
        assert len(results) == len(ranges)
        played = [(f"r{r.worker:04d}", res.count, res.weights) for r, res in zip(ranges, results, strict=True)
                  if res.count > 0]
        if not played:
            raise ModelError(ModelReason.NO_UNITS_COMPLETED, "train: no range completed a unit")
        total = sum(count for _, count, _ in played)
        averaged = fedavg(self.kernel, played, len(weights))
        metrics: dict[str, float] = {}
        for res in results:
            for key, value in res.metrics.items():
                metrics[key] = metrics.get(key, 0.0) + value * res.count / total
        steps = [res.optimizer_steps for res in results]
        return TrainOutcome(averaged, metrics, total, sum(s for s in steps if s is not None) if any(
            s is not None for s in steps) else None)

    def _progress(self, attempt: str, workers: int, total: int) -> Callable[[int, dict[str, Any]], None] | None:
        if self.on_progress is None:
            return None
        done = [0] * max(workers, 1)
        sink = self.on_progress

        def report(index: int, payload: dict[str, Any]) -> None:
            if attempt not in self._running:
                return  # a report of a cancelled attempt, already on its way
            if 0 <= index < len(done):
                done[index] = int(payload.get("processedExamples", 0))
            sink({"processedExamples": sum(done), "totalExamples": total, "metrics": payload.get("metrics", {})})

        return report


def local_epochs(settings: Mapping[str, Any]) -> int:
    """Passes over the chunk an assignment asks for (``localEpochs``, 1 when absent or odd)."""
    epochs = settings.get("localEpochs", 1)
    return epochs if isinstance(epochs, int) and not isinstance(epochs, bool) and epochs > 0 else 1
