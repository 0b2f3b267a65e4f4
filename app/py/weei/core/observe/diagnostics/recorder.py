"""``DiagnosticsRecorder``: one training peer's own diagnostics, and its snapshots.

The adapter tells it what happened (events that move the stage by the table
of ``stages.py``), about assignments and progress, with a
monotonic clock for durations; it answers ``due(now_mono)`` /
``next_due_at()`` (every 2 s while the peer has a job, at once after a stage
change or a reconnection, which ``on_due`` announces) and produces the record with
``snapshot(now_wall, now_mono)``. Every snapshot is complete, so "a complete
snapshot after reconnection" only means "one at once".
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from ..._check import Where
from ...jsonclone import clone_json
from ...errors import UsageError, UsageReason
from .records import (MAX_TEXT, SCHEMA_VERSION, SNAPSHOT_INTERVAL_MS, SPEED_WINDOW_MS, TIMED_STAGES, UNKNOWN,
                      check_assignment, check_count, check_environment, check_execution, check_gpu,
                      check_model, check_text)
from .stages import Stage, next_stage

__all__ = ["DiagnosticsRecorder"]

# Progress reports can come thousands of times a second; keep the window bounded.
_MAX_SPEED_SAMPLES = 512
# The recorder's inputs come from our own adapter: a bad value is our bug, not a peer's.
_OWN_INPUT = Where(UsageError, UsageReason.BAD_DIAGNOSTICS, "diagnostics")


def _merge(current: Mapping[str, Any], changes: Mapping[str, Any], section: str) -> dict[str, Any]:
    unknown_keys = [k for k in changes if k not in current]
    if unknown_keys:
        raise UsageError(UsageReason.BAD_DIAGNOSTICS, f"{section} has no field {unknown_keys[0]!r}")
    return {**current, **changes}


class DiagnosticsRecorder:
    """Collects one peer's execution diagnostics and produces its snapshots.

    ``now_mono`` arguments are monotonic milliseconds (``performance.now()``),
    used for durations and for the snapshot period; ``now_wall`` arguments are
    wall-clock milliseconds since the epoch, used only for ``measuredAt`` and
    ``lastProgressAt``.
    """

    # _reset_assignment_figures sets these; declared here because progress(),
    # earlier in the class, assigns them first.
    _total: int | None
    _optimizer_steps: int | None
    _last_progress_at: float | None
    _upload_bytes: int | None

    def __init__(
        self,
        *,
        environment: Mapping[str, Any] | None = None,
        execution: Mapping[str, Any] | None = None,
        gpu: Mapping[str, Any] | None = None,
        sequence_base: int = 0,
    ) -> None:
        """Start a recorder with what the adapter knows of this browser.

        ``sequence_base``: the first snapshot gets ``sequence_base + 1``. A
        browser adapter should pass the wall-clock ms at start-up, so that a
        reloaded page keeps sending higher sequences than before and its
        snapshots are not ignored as old. Raises ``UsageError`` for an
        invalid section.
        """
        self._environment: dict[str, Any] = {"browser": UNKNOWN, "browserVersion": UNKNOWN, "os": UNKNOWN, "logicalCores": UNKNOWN}
        self._execution: dict[str, Any] = {
            "requested": "auto",
            "actual": UNKNOWN,
            "backend": UNKNOWN,
            "fallbackReason": None,
            "activeWorkers": 0,
            "workerLimit": 1,
        }
        self._gpu: dict[str, Any] = {"webgpu": "unavailable", "adapter": UNKNOWN, "memoryBudgetMiB": 0, "initializationError": UNKNOWN}
        if environment is not None:
            self.update_environment(environment)
        if execution is not None:
            self.update_execution(execution)
        if gpu is not None:
            self.update_gpu(gpu)
        self._sequence = check_count(sequence_base, _OWN_INPUT.at("sequence_base"))
        self._model: dict[str, Any] | str = UNKNOWN
        self._job_id: str | None = None
        self._assignment: dict[str, Any] | None = None
        self._stage = Stage.WAITING
        self._stage_since: float = 0.0
        self._error: str | None = None
        self._last_snapshot_at: float | None = None
        self._snapshot_now = False
        # Called when a snapshot falls due at once on a stage change or a reconnection, so the
        # adapter sends it then rather than at its next poll.
        self.on_due: Callable[[], None] | None = None
        self._reset_assignment_figures()

    # -- what the peer is -------------------------------------------------------------

    def update_environment(self, changes: Mapping[str, Any]) -> None:
        """Merge spec-named fields into ``environment``; raises ``UsageError`` if invalid."""
        merged = _merge(self._environment, changes, "environment")
        self._environment = check_environment(merged, _OWN_INPUT.at("environment"))

    def update_execution(self, changes: Mapping[str, Any]) -> None:
        """Merge spec-named fields (``activeWorkers``, ``actual``, ...) into ``execution``.

        Raises ``UsageError`` if the result is invalid.
        """
        merged = _merge(self._execution, changes, "execution")
        self._execution = check_execution(merged, _OWN_INPUT.at("execution"))

    def update_gpu(self, changes: Mapping[str, Any]) -> None:
        """Merge spec-named fields into ``gpu``; raises ``UsageError`` if invalid."""
        self._gpu = check_gpu(_merge(self._gpu, changes, "gpu"), _OWN_INPUT.at("gpu"))

    def set_model(self, model: Mapping[str, Any] | str) -> None:
        """Set the loaded model (``{id, version, wasmSha256, wgsl}``) or ``'unknown'``.

        Raises ``UsageError`` if invalid.
        """
        self._model = UNKNOWN if model == UNKNOWN else check_model(model, _OWN_INPUT.at("model"))

    # -- job, assignment, stage -------------------------------------------------------

    @property
    def job_id(self) -> str | None:
        """The job this peer takes part in, or None."""
        return self._job_id

    @property
    def has_assignment(self) -> bool:
        """Whether an assignment is shown (set by start_assignment, cleared by finish_assignment)."""
        return self._assignment is not None

    @property
    def stage(self) -> Stage:
        """The current stage."""
        return self._stage

    def join_job(self, job_id: str, now_mono: float) -> None:
        """Start periodic snapshots for ``job_id``; the first one is due at once."""
        if not isinstance(job_id, str) or not job_id:
            raise UsageError(UsageReason.BAD_DIAGNOSTICS, f"job_id must be a non-empty string, got {job_id!r}")
        self._job_id = job_id
        self._assignment = None
        self._reset_assignment_figures()
        self._stage, self._stage_since, self._error = Stage.WAITING, now_mono, None
        self._snapshot_now = True  # not announced: the adapter sets the model first, then reports

    def leave_job(self) -> None:
        """Stop snapshots: a peer without a job sends none."""
        self._job_id = None
        self._assignment = None
        self._reset_assignment_figures()
        self._stage, self._error = Stage.WAITING, None
        self._snapshot_now = False

    def reconnected(self) -> None:
        """Ask for a complete snapshot at once, as the spec wants after a reconnection."""
        self._due_now()

    def start_assignment(self, assignment: Mapping[str, Any], now_mono: float) -> None:
        """Begin a new assignment: timings and performance start again from zero.

        ``assignment`` has the spec's fields (``chunkId`` may be ``'unknown'``;
        the coordinator fills it in). The stage is left as it is; its time
        before this call belongs to the previous assignment and is dropped.
        Raises ``UsageError`` without a job, if invalid, or for another job.
        """
        if self._job_id is None:
            raise UsageError(UsageReason.NO_JOB, "start_assignment needs join_job first")
        record = check_assignment(dict(assignment), _OWN_INPUT.at("assignment"))
        if record["jobId"] != self._job_id:
            raise UsageError(UsageReason.BAD_DIAGNOSTICS,
                             f"assignment of job {record['jobId']!r} while in job {self._job_id!r}")
        self._assignment = record
        self._reset_assignment_figures()
        self._stage_since = now_mono

    def finish_assignment(self) -> None:
        """End the assignment: ``assignment`` becomes null. Its timings and performance stay on
        show: the spec resets them "when the next assignment starts"."""
        self._assignment = None

    def on(self, event: str, now_mono: float, error: str | None = None) -> bool:
        """``event`` happened: enter the stage the table (``stages.py``) gives; ``failed`` needs a message.

        A real change makes a snapshot due at once and returns True. The
        time spent in the stage being left is added to its total, so a
        stage entered twice is summed; staying changes nothing. Raises
        ``IllegalTransition`` for a move the table does not list and
        ``UsageError`` for a missing or superfluous ``error``.
        """
        stage = next_stage(self._stage, event)
        if (stage is Stage.ERROR and stage is not self._stage) and error is None or \
                error is not None and stage is not Stage.ERROR:
            raise UsageError(UsageReason.BAD_DIAGNOSTICS, "an error message goes with stage 'error' and only with it")
        if error is None:
            error = self._error if stage is self._stage else None  # staying in 'error' keeps its message
        else:
            error = check_text(error, _OWN_INPUT.at("error"), MAX_TEXT)
        if stage is self._stage and error == self._error:
            return False
        self._close_stage(now_mono)
        self._stage, self._stage_since, self._error = stage, now_mono, error
        self._due_now()
        return True

    def progress(
        self,
        processed: int,
        now_wall: float,
        now_mono: float,
        *,
        total: int | None = None,
        optimizer_steps: int | None = None,
    ) -> None:
        """Record a progress report (cumulative examples or units of the assignment).

        A count lower than the previous one starts a new series for the
        current speed (a restarted attempt), rather than showing a negative
        speed. Raises ``UsageError`` for negative or non-integer counts.
        """
        processed = check_count(processed, _OWN_INPUT.at("processed"))
        if total is not None:
            self._total = check_count(total, _OWN_INPUT.at("total"))
        if optimizer_steps is not None:
            self._optimizer_steps = check_count(optimizer_steps, _OWN_INPUT.at("optimizer_steps"))
        if self._samples and processed < self._samples[-1][1]:
            self._samples.clear()
        self._samples.append((now_mono, processed))
        self._processed = processed
        self._last_progress_at = now_wall

    def optimizer_steps_taken(self, steps: int) -> None:
        """The assignment's optimizer steps, as the model counted them when it finished."""
        self._optimizer_steps = check_count(steps, _OWN_INPUT.at("optimizer_steps"))

    def update_sent(self, size: int) -> None:
        """The bytes of the update this assignment sends (compressed when the job compresses updates)."""
        self._upload_bytes = check_count(size, _OWN_INPUT.at("upload_bytes"))

    # -- snapshots --------------------------------------------------------------------

    def next_due_at(self) -> float | None:
        """Monotonic ms when the next snapshot is due, or None without a job.

        Returns ``-inf`` when one is due at once (stage change, join,
        reconnection), so ``now >= next_due_at()`` always works.
        """
        if self._job_id is None:
            return None
        if self._snapshot_now or self._last_snapshot_at is None:
            return -math.inf
        return self._last_snapshot_at + SNAPSHOT_INTERVAL_MS

    def due(self, now_mono: float) -> bool:
        """Whether a snapshot should be sent now."""
        due_at = self.next_due_at()
        return due_at is not None and now_mono >= due_at

    def snapshot(self, now_wall: float, now_mono: float) -> dict[str, Any]:
        """Produce the next complete record and restart the 2-second period.

        The record is this peer's own entry: ``receivedAt`` is ``now_wall``,
        ``connected`` true. Works without a job too (``assignment`` null).
        """
        self._sequence += 1
        self._last_snapshot_at = now_mono
        self._snapshot_now = False
        return self.view(now_wall, now_mono)

    def view(self, now_wall: float, now_mono: float) -> dict[str, Any]:
        """This peer's own entry as it is now, for its own getState(): no sequence is used up
        and the 2-second reporting period is left alone."""
        totals = dict(self._finished)
        training_ms = totals.get("training", 0.0)
        if self._stage is Stage.TRAINING:
            training_ms += max(0.0, now_mono - self._stage_since)
        average = self._processed / (training_ms / 1000) if training_ms > 0 else None
        return {
            "schemaVersion": SCHEMA_VERSION,
            "sequence": self._sequence,
            "measuredAt": now_wall,
            "receivedAt": now_wall,
            "ageMs": 0,
            "stale": False,
            "connected": True,
            "environment": dict(self._environment),
            "execution": dict(self._execution),
            "gpu": clone_json(self._gpu),
            "model": clone_json(self._model),
            "assignment": clone_json(self._assignment),
            "stage": str(self._stage),
            "error": self._error,
            # "null until the stage has finished": only closed intervals count here.
            "timings": {name: totals.get(stage) for stage, name in TIMED_STAGES.items()},
            "performance": {
                "processedExamples": self._processed,
                "totalExamples": self._total if self._total is not None else UNKNOWN,
                "optimizerSteps": self._optimizer_steps if self._optimizer_steps is not None else UNKNOWN,
                "currentExamplesPerSecond": self._current_speed(now_mono),
                "averageExamplesPerSecond": average,
                "lastProgressAt": self._last_progress_at,
                "uploadBytes": self._upload_bytes,
            },
        }

    # -- internals --------------------------------------------------------------------

    def _due_now(self) -> None:
        self._snapshot_now = True
        if self.on_due is not None:
            self.on_due()

    def _reset_assignment_figures(self) -> None:
        self._finished: dict[str, float] = {}
        self._processed = 0
        self._total = None
        self._optimizer_steps = None
        self._samples: deque[tuple[float, int]] = deque(maxlen=_MAX_SPEED_SAMPLES)
        self._last_progress_at = None
        self._upload_bytes = None

    def _close_stage(self, now_mono: float) -> None:
        if self._stage in TIMED_STAGES and self._assignment is not None:
            # A monotonic clock never goes back, but a buggy adapter must not make totals shrink.
            elapsed = max(0.0, now_mono - self._stage_since)
            self._finished[self._stage] = self._finished.get(self._stage, 0.0) + elapsed

    def _current_speed(self, now_mono: float) -> float | None:
        while self._samples and now_mono - self._samples[0][0] > SPEED_WINDOW_MS:
            self._samples.popleft()
        if len(self._samples) < 2:
            return None
        (t0, n0), (t1, n1) = self._samples[0], self._samples[-1]
        if t1 <= t0:
            return None
        return (n1 - n0) / ((t1 - t0) / 1000)


# --- the receiving side --------------------------------------------------------------
