"""``weei.onProgress`` reports of one runtime: checked, and parsed only as often as anyone looks.

A model reports after every batch (digits-mlp: 47 reports in a train call
over 1,500 examples). Parsing and checking each report cost ~66 µs in
CPython, a third of such a call's time in wasmtime (bench/bench_training.py,
digits-merged), while the hosts show progress at most every 100 ms
(the Worker's ``progressIntervalMs``). So a report is *parsed* when at least
:data:`PARSE_INTERVAL_S` has passed since the last parsed one; one in
between is only kept (its bytes, already copied out of the module), and the
newest kept one is parsed when the operation returns (:meth:`flush`), so the
last report, normally ``processedExamples == totalExamples``, always
arrives. The first report of an operation is always parsed at once.

A malformed report is skipped and recorded (``rejections``); one that was
kept and then superseded is never parsed, so it is neither delivered nor
recorded: progress is informational and must never fail training.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable

from weei.core.errors import ModelError, ModelReason

from .results import TrainProgress, field_count, field_metrics, parse_result_json

__all__ = ["PARSE_INTERVAL_S", "ProgressReports"]

log = logging.getLogger(__name__)

#: Seconds between two parsed reports within one operation (a fifth of the Worker's forwarding interval).
PARSE_INTERVAL_S = 0.02
_MAX_REJECTIONS = 32


class ProgressReports:
    """The reports of the operation under way: which to parse now, which to keep for the end."""

    def __init__(self, interval_s: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        # PARSE_INTERVAL_S read now, not at import: a test of what a model reports sets it to 0.
        self.interval_s = PARSE_INTERVAL_S if interval_s is None else interval_s
        self.clock = clock
        self.rejections: deque[str] = deque(maxlen=_MAX_REJECTIONS)
        self._due = -float("inf")  # the clock reading from which the next report is parsed
        self._kept: tuple[str, bytes] | None = None  # the newest report not parsed: (operation, bytes)

    def start(self) -> None:
        """An operation begins: its first report is parsed at once."""
        self._due = -float("inf")
        self._kept = None

    def report(self, op: str, raw: bytes) -> TrainProgress | None:
        """A report of ``op`` (bytes copied out of the module): the TrainProgress to hand on now, or None (kept for
        later, or malformed and recorded)."""
        now = self.clock()
        if now < self._due:
            self._kept = (op, raw)
            return None
        self._kept = None
        self._due = now + self.interval_s
        return self._parse(op, raw)

    def flush(self) -> TrainProgress | None:
        """The operation returned: its newest report not parsed yet, parsed (None: there is none, or it is
        malformed)."""
        kept, self._kept = self._kept, None
        return self._parse(*kept) if kept is not None else None

    def reject(self, op: str, exc: ModelError) -> None:
        note = f"{op}: {exc.message} [{exc.reason}]"
        self.rejections.append(note)
        log.debug("progress report skipped: %s", note)

    def _parse(self, op: str, raw: bytes) -> TrainProgress | None:
        try:
            report = parse_result_json(f"{op} progress", raw)
            processed = field_count(op, report, "processedExamples")
            total = field_count(op, report, "totalExamples")
            metrics = field_metrics(op, report) if "metrics" in report else {}
            assert processed is not None and total is not None
            if processed > total:
                raise ModelError(ModelReason.PROGRESS_INVALID, f"processedExamples {processed} > totalExamples {total}")
        except ModelError as exc:
            self.reject(op, exc)
            return None
        return TrainProgress(processed, total, metrics)
