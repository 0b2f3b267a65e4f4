"""Which checkpoint files a job keeps (issue 24, item 15): the last N and the best, by default.

A 1 KiB model once made 333 checkpoints in 25 s, and a few jobs filled 70 MB
of IndexedDB. After each saved checkpoint, the files of the rounds that
:func:`rounds_to_keep` does not name are removed: their entry stays, with
its summary (the charts' history, the Checkpoints table) and an empty file,
and the summary says ``"fileKept": false``. Always kept: the newest
``keep_last`` rounds, the best round by the model's first metric (its
validation value, else its training value), and every round a snapshot slot
may still name (``Coordinator.snapshot_checkpoints``). ``keep_last`` 0 keeps
every file. The setting is this device's (``settings/retention``); its
default is the host's: the browser page keeps ``DEFAULT_KEEP_LAST``, the
command-line hosts (demo, Flower, ``weei train``) keep every file, which they
write out.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from ..core.errors import UsageError, UsageReason
from ..core.job.coordinator import Coordinator
from .job_store import JobStore, checkpoint_key
from .records import record_artifacts
from .stored import stored_checkpoint

__all__ = ["DEFAULT_KEEP_LAST", "MAX_KEEP_LAST", "RETENTION_KEY", "rounds_to_keep", "best_round", "Retention", "storage_use"]

DEFAULT_KEEP_LAST = 5
MAX_KEEP_LAST = 100_000
RETENTION_KEY = "retention"


def best_round(summaries: Sequence[Mapping[str, Any]], metric: str, direction: str) -> int | None:
    """The round whose ``metric`` is best (validation values first; training values when no round was
    validated); None when no round has it."""
    for field in ("validationMetrics", "metrics"):
        scored = []
        for s in summaries:
            values = (s.get(field) or {}).get("values") or {}
            value = values.get(metric)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and s["artifact"]["round"] > 0:
                scored.append((float(value), int(s["artifact"]["round"])))
        if scored:
            pick = min if direction == "minimize" else max
            return pick(scored, key=lambda x: x[0])[1]
    return None


def rounds_to_keep(summaries: Sequence[Mapping[str, Any]], *, keep_last: int, metric: str | None,
                   direction: str, pinned: Iterable[int]) -> set[int]:
    """The rounds whose files stay: every one when ``keep_last`` is 0, else the newest ``keep_last``, the best
    (:func:`best_round`) and the ``pinned`` ones."""
    rounds = sorted(int(s["artifact"]["round"]) for s in summaries)
    if keep_last <= 0:
        return set(rounds)
    keep = set(rounds[-keep_last:]) | set(pinned)
    if metric is not None:
        best = best_round(summaries, metric, direction)
        if best is not None:
            keep.add(best)
    return keep


class Retention:
    """This device's retention setting, and the pruning after each saved checkpoint."""

    def __init__(self, store: JobStore, keep_last: int) -> None:
        self.store = store
        self.keep_last = keep_last

    async def load(self) -> None:
        value = await self.store.read_setting(RETENTION_KEY, _parse)
        if value is not None:
            self.keep_last = value

    async def set_keep_last(self, count: Any) -> None:
        """setCheckpointRetention(keepLast): a whole number from 0 (keep every file) to MAX_KEEP_LAST."""
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= MAX_KEEP_LAST:
            raise UsageError(UsageReason.INVALID_ARGUMENT,
                             f"keepLast must be a whole number from 0 (keep every checkpoint) to {MAX_KEEP_LAST}")
        self.keep_last = count
        await self.store.put_setting(RETENTION_KEY, {"keepLast": count})

    def state(self) -> dict[str, Any]:
        return {"checkpointRetention": {"keepLast": self.keep_last, "keepBest": self.keep_last > 0}}

    async def prune(self, coordinator: Coordinator) -> int:
        """Remove the files of the checkpoints this job no longer keeps; returns how many were removed."""
        info = coordinator.spec.info
        metric = info.metrics[0] if info.metrics else None
        keep = rounds_to_keep(coordinator.checkpoints, keep_last=self.keep_last,
                              metric=metric.id if metric else None,
                              direction=metric.direction if metric else "minimize",
                              pinned=coordinator.snapshot_checkpoints())
        removed = 0
        job_id = coordinator.spec.job_id
        for summary in coordinator.checkpoints:
            round_ = int(summary["artifact"]["round"])
            if round_ in keep or summary.get("fileKept") is False:
                continue
            key = checkpoint_key(job_id, round_)
            stored = await self.store.storage.get("checkpoints", key)
            if stored is None:
                continue
            saved, _file = stored_checkpoint(stored, key)
            summary["fileKept"] = False
            await self.store.storage.put("checkpoints", key, {"summary": {**saved, **summary}, "file": b""})
            removed += 1
        return removed


def _parse(value: Any) -> int | None:
    keep = value.get("keepLast") if isinstance(value, dict) else None
    return keep if isinstance(keep, int) and not isinstance(keep, bool) and 0 <= keep <= MAX_KEEP_LAST else None


async def storage_use(store: JobStore) -> dict[str, Any]:
    """What this device stores, in bytes: per saved job its checkpoint entries (how many keep their file) and
    the artifacts its record names (shared ones counted in each job that names them), and the total."""
    jobs: dict[str, dict[str, int]] = {}
    total = 0
    for key in await store.storage.keys("checkpoints"):
        job_id = key.rsplit("/", 1)[0]
        stored = await store.storage.get("checkpoints", key)
        file = stored.get("file") if isinstance(stored, dict) else None
        size = len(file) if isinstance(file, (bytes, bytearray, memoryview)) else 0
        entry = jobs.setdefault(job_id, {"checkpoints": 0, "files": 0, "checkpointBytes": 0, "artifactBytes": 0})
        entry["checkpoints"] += 1
        entry["files"] += size > 0
        entry["checkpointBytes"] += size
        total += size
    sizes: dict[str, int] = {}
    for sha in await store.storage.keys("artifacts"):
        data = await store.storage.get("artifacts", sha)
        sizes[sha] = len(data) if isinstance(data, (bytes, bytearray, memoryview)) else 0
    total += sum(sizes.values())
    for job_id, record in store.saved_jobs.items():
        entry = jobs.setdefault(job_id, {"checkpoints": 0, "files": 0, "checkpointBytes": 0, "artifactBytes": 0})
        entry["artifactBytes"] = sum(sizes.get(sha, 0) for sha in record_artifacts(record))
    return {"jobs": jobs, "totalBytes": total}
