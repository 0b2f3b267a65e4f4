"""Execution diagnostics: where, how and how fast each peer trains.

Theory of operation
-------------------
A record is the spec's ``PeerExecutionDiagnostics`` as plain JSON data (a
``dict`` with exactly the spec's field names), because it goes straight onto
the wire and into ``state.diagnostics``.

* ``DiagnosticsRecorder`` lives on every peer that trains. The adapter tells
  it about stage changes, assignments and progress, with a monotonic clock
  for durations; it answers ``due(now_mono)`` / ``next_due_at()`` (every 2 s
  while the peer has a job, at once after a stage change or a reconnection)
  and produces the record with ``snapshot(now_wall, now_mono)``. Every
  snapshot is complete, so "a complete snapshot after reconnection" only
  means "one at once".
* ``DiagnosticsBook`` lives on the coordinator (one entry per participant)
  and on every peer (its own entry). ``accept`` validates an untrusted
  snapshot with ``parse_diagnostics`` and keeps it unless it belongs to
  another job or is not newer than the one held; ``view(now)`` adds the
  local fields ``ageMs`` and ``stale``.

``receivedAt``, ``ageMs``, ``stale`` and ``connected`` are judged by the
receiver, so whatever a peer puts there is ignored. A peer learns nothing
from another peer's clock except ``measuredAt`` and ``lastProgressAt``,
shown as they are.
"""

from __future__ import annotations

import copy
import math
from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Mapping

from .errors import UsageError, WeeiError

__all__ = [
    "SCHEMA_VERSION",
    "UNKNOWN",
    "STAGES",
    "SNAPSHOT_INTERVAL_MS",
    "SPEED_WINDOW_MS",
    "STALE_AFTER_MS",
    "parse_diagnostics",
    "DiagnosticsRecorder",
    "DiagnosticsBook",
    "AcceptResult",
    "Difference",
    "Uniformity",
    "uniformity",
]

SCHEMA_VERSION = 1
UNKNOWN = "unknown"
STAGES = (
    "waiting",
    "receiving",
    "preparing",
    "compiling",
    "training",
    "uploading",
    "awaitingAggregation",
    "error",
)
SNAPSHOT_INTERVAL_MS = 2_000
SPEED_WINDOW_MS = 5_000
STALE_AFTER_MS = 10_000

# Stages whose durations the record reports, and the timing field of each.
_TIMED_STAGES = {
    "preparing": "preparationMs",
    "compiling": "compilationMs",
    "training": "trainingMs",
    "uploading": "uploadMs",
}
# JavaScript numbers are exact up to here; larger counts would not survive the trip.
_MAX_SAFE_INT = 2**53 - 1
_MAX_NAME = 256  # browser, backend, IDs: short strings
_MAX_TEXT = 2_000  # error messages and fallback reasons
_MAX_WGSL = 64
# Progress reports can come thousands of times a second; keep the window bounded.
_MAX_SPEED_SAMPLES = 512

_HEX = frozenset("0123456789abcdef")


# --- validation of untrusted records -------------------------------------------------


def _bad(path: str, problem: str) -> WeeiError:
    return WeeiError("bad-diagnostics", f"diagnostics.{path}: {problem}")


def _obj(value: object, path: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise _bad(path, f"must be an object, got {type(value).__name__}")
    return value


def _get(obj: Mapping[str, Any], key: str, path: str) -> Any:
    if key not in obj:
        raise _bad(f"{path}.{key}" if path else key, "is missing")
    return obj[key]


def _str(value: object, path: str, limit: int = _MAX_NAME) -> str:
    if not isinstance(value, str):
        raise _bad(path, f"must be a string, got {type(value).__name__}")
    if len(value) > limit:
        raise _bad(path, f"must be at most {limit} characters, got {len(value)}")
    return value


def _num(value: object, path: str, minimum: float = 0.0) -> float | int:
    # bool is an int in Python; a JSON true is never a number.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(path, f"must be a number, got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise _bad(path, "must be finite")
    if value < minimum or value > 1e300:
        raise _bad(path, f"must be from {minimum:g}, got {value!r}")
    return value


def _int(value: object, path: str, minimum: int = 0) -> int:
    number = _num(value, path, minimum)
    # Pyodide and JSON may hand a whole number over as a float; accept it as an int.
    if isinstance(number, float):
        if not number.is_integer():
            raise _bad(path, f"must be a whole number, got {number!r}")
        number = int(number)
    if number > _MAX_SAFE_INT:
        raise _bad(path, f"must be at most 2**53-1, got {number}")
    return number


def _enum(value: object, path: str, allowed: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in allowed:
        shown = value if isinstance(value, str) else type(value).__name__
        raise _bad(path, f"must be one of {', '.join(allowed)}, got {str(shown)[:40]!r}")
    return value


def _or_unknown(value: object, path: str, read: Callable[[object, str], Any]) -> Any:
    return UNKNOWN if isinstance(value, str) and value == UNKNOWN else read(value, path)


def _or_none(value: object, path: str, read: Callable[[object, str], Any]) -> Any:
    return None if value is None else read(value, path)


def _sha256(value: object, path: str) -> str:
    text = _str(value, path)
    if len(text) != 64 or not set(text) <= _HEX:
        raise _bad(path, "must be 64 lowercase hex digits")
    return text


def _environment(value: object) -> dict[str, Any]:
    p = "environment"
    o = _obj(value, p)
    return {
        "browser": _str(_get(o, "browser", p), f"{p}.browser"),
        "browserVersion": _str(_get(o, "browserVersion", p), f"{p}.browserVersion"),
        "os": _str(_get(o, "os", p), f"{p}.os"),
        "logicalCores": _or_unknown(_get(o, "logicalCores", p), f"{p}.logicalCores", lambda v, q: _int(v, q, 1)),
    }


def _execution(value: object) -> dict[str, Any]:
    p = "execution"
    o = _obj(value, p)
    return {
        "requested": _enum(_get(o, "requested", p), f"{p}.requested", ("auto", "cpu", "gpu", "hybrid")),
        "actual": _enum(_get(o, "actual", p), f"{p}.actual", ("cpu", "gpu", "hybrid", UNKNOWN)),
        "backend": _str(_get(o, "backend", p), f"{p}.backend"),
        "fallbackReason": _or_none(_get(o, "fallbackReason", p), f"{p}.fallbackReason", lambda v, q: _str(v, q, _MAX_TEXT)),
        "activeWorkers": _int(_get(o, "activeWorkers", p), f"{p}.activeWorkers"),
        "workerLimit": _int(_get(o, "workerLimit", p), f"{p}.workerLimit"),
    }


def _adapter(value: object, path: str) -> dict[str, str]:
    o = _obj(value, path)
    return {k: _str(_get(o, k, path), f"{path}.{k}") for k in ("vendor", "architecture", "device", "description")}


def _gpu(value: object) -> dict[str, Any]:
    p = "gpu"
    o = _obj(value, p)
    return {
        "webgpu": _enum(_get(o, "webgpu", p), f"{p}.webgpu", ("available", "unavailable")),
        "adapter": _or_unknown(_get(o, "adapter", p), f"{p}.adapter", _adapter),
        "memoryBudgetMiB": _num(_get(o, "memoryBudgetMiB", p), f"{p}.memoryBudgetMiB"),
        # 'unknown' is a string, so _str covers all three cases of the spec's type.
        "initializationError": _or_none(
            _get(o, "initializationError", p), f"{p}.initializationError", lambda v, q: _str(v, q, _MAX_TEXT)
        ),
    }


def _model(value: object, path: str) -> dict[str, Any]:
    o = _obj(value, path)
    wgsl = _obj(_get(o, "wgsl", path), f"{path}.wgsl")
    present = _get(wgsl, "present", f"{path}.wgsl")
    if not isinstance(present, bool):
        raise _bad(f"{path}.wgsl.present", "must be a boolean")
    hashes = _get(wgsl, "sha256", f"{path}.wgsl")
    if not isinstance(hashes, list) or len(hashes) > _MAX_WGSL:
        raise _bad(f"{path}.wgsl.sha256", f"must be a list of at most {_MAX_WGSL} hashes")
    return {
        "id": _str(_get(o, "id", path), f"{path}.id"),
        "version": _str(_get(o, "version", path), f"{path}.version"),
        "wasmSha256": _sha256(_get(o, "wasmSha256", path), f"{path}.wasmSha256"),
        "wgsl": {"present": present, "sha256": [_sha256(h, f"{path}.wgsl.sha256[{i}]") for i, h in enumerate(hashes)]},
    }


def _assignment(value: object, path: str) -> dict[str, Any]:
    o = _obj(value, path)
    return {
        "jobId": _str(_get(o, "jobId", path), f"{path}.jobId"),
        "round": _int(_get(o, "round", path), f"{path}.round"),
        "assignmentId": _str(_get(o, "assignmentId", path), f"{path}.assignmentId"),
        "attemptId": _str(_get(o, "attemptId", path), f"{path}.attemptId"),
        "chunkId": _str(_get(o, "chunkId", path), f"{path}.chunkId"),
        "bytes": _int(_get(o, "bytes", path), f"{path}.bytes"),
        "exampleCount": _int(_get(o, "exampleCount", path), f"{path}.exampleCount"),
        "batchSize": _int(_get(o, "batchSize", path), f"{path}.batchSize", 1),
        "localEpochs": _int(_get(o, "localEpochs", path), f"{path}.localEpochs", 1),
        "learningRate": _or_unknown(_get(o, "learningRate", path), f"{path}.learningRate", _num),
    }


def _timings(value: object) -> dict[str, Any]:
    p = "timings"
    o = _obj(value, p)
    return {k: _or_none(_get(o, k, p), f"{p}.{k}", _num) for k in _TIMED_STAGES.values()}


def _performance(value: object) -> dict[str, Any]:
    p = "performance"
    o = _obj(value, p)
    return {
        "processedExamples": _int(_get(o, "processedExamples", p), f"{p}.processedExamples"),
        "totalExamples": _or_unknown(_get(o, "totalExamples", p), f"{p}.totalExamples", _int),
        "optimizerSteps": _or_unknown(_get(o, "optimizerSteps", p), f"{p}.optimizerSteps", _int),
        "currentExamplesPerSecond": _or_none(_get(o, "currentExamplesPerSecond", p), f"{p}.currentExamplesPerSecond", _num),
        "averageExamplesPerSecond": _or_none(_get(o, "averageExamplesPerSecond", p), f"{p}.averageExamplesPerSecond", _num),
        "lastProgressAt": _or_none(_get(o, "lastProgressAt", p), f"{p}.lastProgressAt", _num),
    }


def parse_diagnostics(value: object) -> dict[str, Any]:
    """Validate a peer's snapshot and return a fresh copy in the spec's shape.

    Takes any value (typically decoded JSON). Unknown fields are dropped, and
    the receiver-side fields (``receivedAt``, ``ageMs``, ``stale``,
    ``connected``) are not read: the result has them set to ``0``, ``0``,
    ``False`` and ``True`` for the caller to fill in. Raises ``WeeiError``
    with reason ``bad-diagnostics``, naming the field, for anything that is
    not a valid ``PeerExecutionDiagnostics``; never any other exception.
    """
    o = _obj(value, "")
    version = _get(o, "schemaVersion", "")
    if type(version) is not int or version != SCHEMA_VERSION:
        raise _bad("schemaVersion", f"must be {SCHEMA_VERSION}, got {str(version)[:20]!r}")
    stage = _enum(_get(o, "stage", ""), "stage", STAGES)
    return {
        "schemaVersion": SCHEMA_VERSION,
        "sequence": _int(_get(o, "sequence", ""), "sequence"),
        "measuredAt": _num(_get(o, "measuredAt", ""), "measuredAt"),
        "receivedAt": 0,
        "ageMs": 0,
        "stale": False,
        "connected": True,
        "environment": _environment(_get(o, "environment", "")),
        "execution": _execution(_get(o, "execution", "")),
        "gpu": _gpu(_get(o, "gpu", "")),
        "model": _or_unknown(_get(o, "model", ""), "model", _model),
        "assignment": _or_none(_get(o, "assignment", ""), "assignment", _assignment),
        "stage": stage,
        "error": _or_none(_get(o, "error", ""), "error", lambda v, q: _str(v, q, _MAX_TEXT)),
        "timings": _timings(_get(o, "timings", "")),
        "performance": _performance(_get(o, "performance", "")),
    }


# --- the participant side ------------------------------------------------------------


def _merge(current: Mapping[str, Any], changes: Mapping[str, Any], section: str) -> dict[str, Any]:
    unknown_keys = [k for k in changes if k not in current]
    if unknown_keys:
        raise UsageError("bad-diagnostics", f"{section} has no field {unknown_keys[0]!r}")
    return {**current, **changes}


def _as_usage(read: Callable[[], Any]) -> Any:
    # The recorder's inputs come from our own adapter: a bad value is our bug, not a peer's.
    try:
        return read()
    except WeeiError as error:
        raise UsageError(error.reason, error.message) from error


class DiagnosticsRecorder:
    """Collects one peer's execution diagnostics and produces its snapshots.

    ``now_mono`` arguments are monotonic milliseconds (``performance.now()``),
    used for durations and for the snapshot period; ``now_wall`` arguments are
    wall-clock milliseconds since the epoch, used only for ``measuredAt`` and
    ``lastProgressAt``.
    """

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
        self._sequence = _as_usage(lambda: _int(sequence_base, "sequence_base"))
        self._model: dict[str, Any] | str = UNKNOWN
        self._job_id: str | None = None
        self._assignment: dict[str, Any] | None = None
        self._stage = "waiting"
        self._stage_since: float = 0.0
        self._error: str | None = None
        self._last_snapshot_at: float | None = None
        self._snapshot_now = False
        self._reset_assignment_figures()

    # -- what the peer is -------------------------------------------------------------

    def update_environment(self, changes: Mapping[str, Any]) -> None:
        """Merge spec-named fields into ``environment``; raises ``UsageError`` if invalid."""
        self._environment = _as_usage(lambda: _environment(_merge(self._environment, changes, "environment")))

    def update_execution(self, changes: Mapping[str, Any]) -> None:
        """Merge spec-named fields (``activeWorkers``, ``actual``, ...) into ``execution``.

        Raises ``UsageError`` if the result is invalid.
        """
        self._execution = _as_usage(lambda: _execution(_merge(self._execution, changes, "execution")))

    def update_gpu(self, changes: Mapping[str, Any]) -> None:
        """Merge spec-named fields into ``gpu``; raises ``UsageError`` if invalid."""
        self._gpu = _as_usage(lambda: _gpu(_merge(self._gpu, changes, "gpu")))

    def set_model(self, model: Mapping[str, Any] | str) -> None:
        """Set the loaded model (``{id, version, wasmSha256, wgsl}``) or ``'unknown'``.

        Raises ``UsageError`` if invalid.
        """
        self._model = _as_usage(lambda: _or_unknown(model, "model", _model))

    # -- job, assignment, stage -------------------------------------------------------

    @property
    def job_id(self) -> str | None:
        """The job this peer takes part in, or None."""
        return self._job_id

    @property
    def stage(self) -> str:
        """The current stage."""
        return self._stage

    def join_job(self, job_id: str, now_mono: float) -> None:
        """Start periodic snapshots for ``job_id``; the first one is due at once."""
        if not isinstance(job_id, str) or not job_id:
            raise UsageError("bad-diagnostics", f"job_id must be a non-empty string, got {job_id!r}")
        self._job_id = job_id
        self._assignment = None
        self._reset_assignment_figures()
        self._stage, self._stage_since, self._error = "waiting", now_mono, None
        self._snapshot_now = True

    def leave_job(self) -> None:
        """Stop snapshots: a peer without a job sends none."""
        self._job_id = None
        self._assignment = None
        self._reset_assignment_figures()
        self._stage, self._error = "waiting", None
        self._snapshot_now = False

    def reconnected(self) -> None:
        """Ask for a complete snapshot at once, as the spec wants after a reconnection."""
        self._snapshot_now = True

    def start_assignment(self, assignment: Mapping[str, Any], now_mono: float) -> None:
        """Begin a new assignment: timings and performance start again from zero.

        ``assignment`` has the spec's fields (``chunkId`` may be ``'unknown'``;
        the coordinator fills it in). The stage is left as it is; its time
        before this call belongs to the previous assignment and is dropped.
        Raises ``UsageError`` without a job, if invalid, or for another job.
        """
        if self._job_id is None:
            raise UsageError("no-job", "start_assignment needs join_job first")
        record = _as_usage(lambda: _assignment(dict(assignment), "assignment"))
        if record["jobId"] != self._job_id:
            raise UsageError("bad-diagnostics", f"assignment of job {record['jobId']!r} while in job {self._job_id!r}")
        self._assignment = record
        self._reset_assignment_figures()
        self._stage_since = now_mono

    def finish_assignment(self) -> None:
        """End the assignment: ``assignment`` becomes null and its figures are dropped."""
        self._assignment = None
        self._reset_assignment_figures()

    def set_stage(self, stage: str, now_mono: float, error: str | None = None) -> None:
        """Enter ``stage`` (``error`` needs a message); a real change makes a snapshot due at once.

        The time spent in the stage being left is added to its total, so a
        stage entered twice is summed. Entering the current stage again
        changes nothing. Raises ``UsageError`` for an unknown stage, or for
        a missing or superfluous ``error``.
        """
        _as_usage(lambda: _enum(stage, "stage", STAGES))
        if (stage == "error") != (error is not None):
            raise UsageError("bad-diagnostics", "an error message goes with stage 'error' and only with it")
        if error is not None:
            error = _as_usage(lambda: _str(error, "error", _MAX_TEXT))
        if stage == self._stage and error == self._error:
            return
        self._close_stage(now_mono)
        self._stage, self._stage_since, self._error = stage, now_mono, error
        self._snapshot_now = True

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
        processed = _as_usage(lambda: _int(processed, "processed"))
        if total is not None:
            self._total = _as_usage(lambda: _int(total, "total"))
        if optimizer_steps is not None:
            self._optimizer_steps = _as_usage(lambda: _int(optimizer_steps, "optimizer_steps"))
        if self._samples and processed < self._samples[-1][1]:
            self._samples.clear()
        self._samples.append((now_mono, processed))
        self._processed = processed
        self._last_progress_at = now_wall

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
        if self._stage == "training":
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
            "gpu": copy.deepcopy(self._gpu),
            "model": copy.deepcopy(self._model),
            "assignment": copy.deepcopy(self._assignment),
            "stage": self._stage,
            "error": self._error,
            # "null until the stage has finished": only closed intervals count here.
            "timings": {name: totals.get(stage) for stage, name in _TIMED_STAGES.items()},
            "performance": {
                "processedExamples": self._processed,
                "totalExamples": self._total if self._total is not None else UNKNOWN,
                "optimizerSteps": self._optimizer_steps if self._optimizer_steps is not None else UNKNOWN,
                "currentExamplesPerSecond": self._current_speed(now_mono),
                "averageExamplesPerSecond": average,
                "lastProgressAt": self._last_progress_at,
            },
        }

    # -- internals --------------------------------------------------------------------

    def _reset_assignment_figures(self) -> None:
        self._finished: dict[str, float] = {}
        self._processed = 0
        self._total: int | None = None
        self._optimizer_steps: int | None = None
        self._samples: deque[tuple[float, int]] = deque(maxlen=_MAX_SPEED_SAMPLES)
        self._last_progress_at: float | None = None

    def _close_stage(self, now_mono: float) -> None:
        if self._stage in _TIMED_STAGES and self._assignment is not None:
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


class AcceptResult(Enum):
    """What ``DiagnosticsBook.accept`` did with a snapshot."""

    ACCEPTED = "accepted"
    """Kept: it is now the peer's entry."""
    OLD_SEQUENCE = "old-sequence"
    """Ignored: its sequence is not above the one held for this peer."""
    OTHER_JOB = "other-job"
    """Ignored: it belongs to another job than the one this book follows."""


class DiagnosticsBook:
    """The latest snapshot of every peer of one job, as this browser received them."""

    def __init__(self, job_id: str | None = None) -> None:
        """Start an empty book following ``job_id`` (None: no job, everything is ignored)."""
        self._job_id = job_id
        self._entries: dict[str, dict[str, Any]] = {}

    @property
    def job_id(self) -> str | None:
        """The job whose diagnostics are kept."""
        return self._job_id

    def set_job(self, job_id: str | None) -> None:
        """Follow another job; entries of the previous job are dropped."""
        if job_id != self._job_id:
            self._entries.clear()
        self._job_id = job_id

    def accept(self, peer_id: str, job_id: object, snapshot: object, now: float, *, chunk_id: str | None = None) -> AcceptResult:
        """Take a snapshot received from ``peer_id`` for ``job_id`` at wall time ``now``.

        ``chunk_id``: the coordinator fills in ``assignment.chunkId`` from its
        own records. Returns whether it was kept or why it was ignored.
        Raises ``WeeiError`` (``bad-diagnostics``) for a malformed snapshot, or
        one whose assignment names another job than the envelope.
        """
        if not isinstance(job_id, str):
            raise _bad("jobId", "must be a string")
        if self._job_id is None or job_id != self._job_id:
            return AcceptResult.OTHER_JOB
        record = parse_diagnostics(snapshot)
        if record["assignment"] is not None and record["assignment"]["jobId"] != job_id:
            raise _bad("assignment.jobId", f"names job {record['assignment']['jobId'][:80]!r}, sent for job {job_id[:80]!r}")
        held = self._entries.get(peer_id)
        if held is not None and record["sequence"] <= held["sequence"]:
            return AcceptResult.OLD_SEQUENCE
        record["receivedAt"] = now
        record["connected"] = True
        if chunk_id is not None and record["assignment"] is not None:
            record["assignment"]["chunkId"] = chunk_id
        self._entries[peer_id] = record
        return AcceptResult.ACCEPTED

    def mark_disconnected(self, peer_id: str) -> None:
        """Keep the peer's last snapshot but show it disconnected (and so stale)."""
        entry = self._entries.get(peer_id)
        if entry is not None:
            entry["connected"] = False

    def forget(self, peer_id: str) -> None:
        """Drop the peer's entry, for example when it leaves the job."""
        self._entries.pop(peer_id, None)

    def view(self, now: float) -> dict[str, dict[str, Any]]:
        """Return ``state.diagnostics`` at wall time ``now``: copies with ``ageMs`` and ``stale``.

        ``ageMs`` is never negative, even if the local clock stepped back.
        """
        result: dict[str, dict[str, Any]] = {}
        for peer_id in sorted(self._entries):
            record = copy.deepcopy(self._entries[peer_id])
            age = max(0, now - record["receivedAt"])
            record["ageMs"] = age
            record["stale"] = age > STALE_AFTER_MS or not record["connected"]
            result[peer_id] = record
        return result


# --- are all participants alike? ----------------------------------------------------

_COMPARED = (
    ("model", "id"),
    ("model", "version"),
    ("model", "wasmSha256"),
    ("assignment", "batchSize"),
    ("assignment", "localEpochs"),
    ("assignment", "learningRate"),
)


@dataclass(frozen=True)
class Difference:
    """One compared field on which peers disagree, with each known value by peer."""

    field: str
    values: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        """Return ``{field, values}``."""
        return {"field": self.field, "values": dict(self.values)}


@dataclass(frozen=True)
class Uniformity:
    """Whether every peer uses the same model and settings.

    ``uniform`` is true when no two known values differ; ``unknown`` lists
    the fields a peer could not report (``peerId -> fields``), which are
    missing data, not a difference.
    """

    uniform: bool
    differences: tuple[Difference, ...] = ()
    unknown: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """Return ``{uniform, differences, unknown}`` as plain data."""
        return {
            "uniform": self.uniform,
            "differences": [d.to_json() for d in self.differences],
            "unknown": {peer: list(fields) for peer, fields in self.unknown.items()},
        }


def uniformity(view: Mapping[str, Mapping[str, Any]]) -> Uniformity:
    """Compare model id, version, wasmSha256 and batchSize, localEpochs, learningRate.

    Takes a ``view()`` (records by peer ID). A model of ``'unknown'``, an
    assignment of null (between assignments) or a learning rate of
    ``'unknown'`` leave that field out for that peer and list it under
    ``unknown``. Returns the ``Uniformity``.
    """
    differences: list[Difference] = []
    unknown: dict[str, list[str]] = {}
    for section, key in _COMPARED:
        name = f"{section}.{key}"
        known: dict[str, Any] = {}
        for peer_id in sorted(view):
            part = view[peer_id].get(section)
            value = part.get(key, UNKNOWN) if isinstance(part, dict) else UNKNOWN
            if value == UNKNOWN:
                unknown.setdefault(peer_id, []).append(name)
            else:
                known[peer_id] = value
        values = list(known.values())
        # Compare by ==, so that 1 and 1.0 (a JSON round trip) are the same value.
        if any(v != values[0] for v in values[1:]):
            differences.append(Difference(name, known))
    return Uniformity(not differences, tuple(differences), {p: tuple(f) for p, f in unknown.items()})
