"""The diagnostics record (the spec's ``PeerExecutionDiagnostics``) and its check.

``parse_diagnostics`` turns an untrusted snapshot into a fresh copy in the
spec's shape or raises ``DiagnosticsError`` (``bad-diagnostics``) naming the
field. The section checks take a ``Where``, so the recorder runs the same
checks on its own adapter's values and raises ``UsageError`` instead: there a
bad value is our bug, not a peer's.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any

from ..._check import (SAFE_INTEGER, Fail, Where, as_bool, as_choice, as_int, as_list, as_number, as_object,
                      as_sha256, as_str, nullable)
from ...errors import WeeiError
from .stages import Stage

__all__ = [
    "SCHEMA_VERSION",
    "UNKNOWN",
    "STAGES",
    "TIMED_STAGES",
    "SNAPSHOT_INTERVAL_MS",
    "SPEED_WINDOW_MS",
    "STALE_AFTER_MS",
    "MAX_TEXT",
    "DiagnosticsReason",
    "DiagnosticsError",
    "PEER_INPUT",
    "parse_diagnostics",
    "check_environment",
    "check_execution",
    "check_gpu",
    "check_model",
    "check_assignment",
    "check_stage",
    "check_text",
    "check_count",
]

SCHEMA_VERSION = 1
UNKNOWN = "unknown"
STAGES = tuple(str(stage) for stage in Stage)
SNAPSHOT_INTERVAL_MS = 2_000
SPEED_WINDOW_MS = 5_000
STALE_AFTER_MS = 10_000

#: Stages whose durations the record reports, and the timing field of each.
TIMED_STAGES = {
    "preparing": "preparationMs",
    "compiling": "compilationMs",
    "training": "trainingMs",
    "uploading": "uploadMs",
}
_MAX_NAME = 256  # browser, backend, IDs: short strings
MAX_TEXT = 2_000  # error messages and fallback reasons
_MAX_WGSL = 64
_MAX_NUMBER = 1e300


class DiagnosticsReason(str, Enum):
    """Why diagnostics were refused (the error keeps the string)."""

    BAD_DIAGNOSTICS = "bad-diagnostics"
    """A peer's snapshot is not a valid record, or a field of it is malformed."""


class DiagnosticsError(WeeiError):
    """A peer's diagnostics snapshot is malformed; the message names the field."""

    reasons = (DiagnosticsReason,)


#: Where a peer's snapshot fails: ``diagnostics.<field>: <problem>``.
PEER_INPUT = Where(DiagnosticsError, DiagnosticsReason.BAD_DIAGNOSTICS, "diagnostics")


def check_text(value: Any, fail: Fail, max_chars: int = _MAX_NAME) -> str:
    """A string (empty allowed) of at most ``max_chars``."""
    return as_str(value, fail, nonempty=False, max_chars=max_chars)


def check_count(value: Any, fail: Fail, minimum: int = 0) -> int:
    """A whole number (a whole float is taken as an int) from ``minimum`` to 2**53-1."""
    return as_int(value, fail, minimum, SAFE_INTEGER)


def _amount(value: Any, fail: Fail) -> float | int:
    return as_number(value, fail, 0, _MAX_NUMBER)


def _message(value: Any, fail: Fail) -> str:
    return check_text(value, fail, MAX_TEXT)


def _or_unknown(check: Callable[..., Any]) -> Callable[..., Any]:
    def read(value: Any, fail: Fail, **options: Any) -> Any:
        return UNKNOWN if isinstance(value, str) and value == UNKNOWN else check(value, fail, **options)

    return read


def check_stage(value: Any, fail: Fail) -> str:
    """One of ``STAGES``."""
    return as_choice(value, fail, STAGES)


def check_environment(value: Any, w: Where) -> dict[str, Any]:
    """The ``environment`` section."""
    o = as_object(value, w)
    return {
        "browser": w.read(o, "browser", check_text),
        "browserVersion": w.read(o, "browserVersion", check_text),
        "os": w.read(o, "os", check_text),
        "logicalCores": w.read(o, "logicalCores", _or_unknown(check_count), minimum=1),
    }


def check_execution(value: Any, w: Where) -> dict[str, Any]:
    """The ``execution`` section."""
    o = as_object(value, w)
    return {
        "requested": w.read(o, "requested", as_choice, allowed=("auto", "cpu", "gpu", "hybrid")),
        "actual": w.read(o, "actual", as_choice, allowed=("cpu", "gpu", "hybrid", UNKNOWN)),
        "backend": w.read(o, "backend", check_text),
        "fallbackReason": w.read(o, "fallbackReason", nullable(_message)),
        "activeWorkers": w.read(o, "activeWorkers", check_count),
        "workerLimit": w.read(o, "workerLimit", check_count),
    }


def _adapter(value: Any, w: Where) -> dict[str, str]:
    o = as_object(value, w)
    return {k: w.read(o, k, check_text) for k in ("vendor", "architecture", "device", "description")}


def check_gpu(value: Any, w: Where) -> dict[str, Any]:
    """The ``gpu`` section."""
    o = as_object(value, w)
    return {
        "webgpu": w.read(o, "webgpu", as_choice, allowed=("available", "unavailable")),
        "adapter": w.read(o, "adapter", _or_unknown(_adapter)),
        "memoryBudgetMiB": w.read(o, "memoryBudgetMiB", _amount),
        # 'unknown' is a string, so a text check covers all three cases of the spec's type.
        "initializationError": w.read(o, "initializationError", nullable(_message)),
    }


def check_model(value: Any, w: Where) -> dict[str, Any]:
    """The ``model`` section (not ``'unknown'``)."""
    o = as_object(value, w)
    wgsl_at = w.at("wgsl")
    wgsl = as_object(w.get(o, "wgsl"), wgsl_at)
    hashes_at = wgsl_at.at("sha256")
    hashes = as_list(wgsl_at.get(wgsl, "sha256"), hashes_at, _MAX_WGSL)
    return {
        "id": w.read(o, "id", check_text),
        "version": w.read(o, "version", check_text),
        "wasmSha256": w.read(o, "wasmSha256", as_sha256),
        "wgsl": {
            "present": wgsl_at.read(wgsl, "present", as_bool),
            "sha256": [as_sha256(h, hashes_at.at(i)) for i, h in enumerate(hashes)],
        },
    }


def check_assignment(value: Any, w: Where) -> dict[str, Any]:
    """The ``assignment`` section (not null)."""
    o = as_object(value, w)
    return {
        "jobId": w.read(o, "jobId", check_text),
        "round": w.read(o, "round", check_count),
        "assignmentId": w.read(o, "assignmentId", check_text),
        "attemptId": w.read(o, "attemptId", check_text),
        "chunkId": w.read(o, "chunkId", check_text),
        "bytes": w.read(o, "bytes", check_count),
        "exampleCount": w.read(o, "exampleCount", check_count),
        "batchSize": w.read(o, "batchSize", check_count, minimum=1),
        "localEpochs": w.read(o, "localEpochs", check_count, minimum=1),
        "learningRate": w.read(o, "learningRate", _or_unknown(_amount)),
    }


def _timings(value: Any, w: Where) -> dict[str, Any]:
    o = as_object(value, w)
    return {k: w.read(o, k, nullable(_amount)) for k in TIMED_STAGES.values()}


def _performance(value: Any, w: Where) -> dict[str, Any]:
    o = as_object(value, w)
    return {
        "processedExamples": w.read(o, "processedExamples", check_count),
        "totalExamples": w.read(o, "totalExamples", _or_unknown(check_count)),
        "optimizerSteps": w.read(o, "optimizerSteps", _or_unknown(check_count)),
        "currentExamplesPerSecond": w.read(o, "currentExamplesPerSecond", nullable(_amount)),
        "averageExamplesPerSecond": w.read(o, "averageExamplesPerSecond", nullable(_amount)),
        "lastProgressAt": w.read(o, "lastProgressAt", nullable(_amount)),
        # Additive (issue 25): the update's bytes as sent; a peer of an older version leaves it out.
        "uploadBytes": nullable(check_count)(o.get("uploadBytes"), w.at("uploadBytes")),
    }


def parse_diagnostics(value: object) -> dict[str, Any]:
    """Validate a peer's snapshot and return a fresh copy in the spec's shape.

    Takes any value (typically decoded JSON). Unknown fields are dropped, and
    the receiver-side fields (``receivedAt``, ``ageMs``, ``stale``,
    ``connected``) are not read: the result has them set to ``0``, ``0``,
    ``False`` and ``True`` for the caller to fill in. Raises
    ``DiagnosticsError`` (a ``WeeiError``) with reason ``bad-diagnostics``,
    naming the field, for anything that is not a valid
    ``PeerExecutionDiagnostics``; never any other exception.
    """
    w = PEER_INPUT
    o = as_object(value, w)
    version = w.get(o, "schemaVersion")
    if type(version) is not int or version != SCHEMA_VERSION:
        w.at("schemaVersion")(f"must be {SCHEMA_VERSION}, not {str(version)[:20]!r}")
    return {
        "schemaVersion": SCHEMA_VERSION,
        "sequence": w.read(o, "sequence", check_count),
        "measuredAt": w.read(o, "measuredAt", _amount),
        "receivedAt": 0,
        "ageMs": 0,
        "stale": False,
        "connected": True,
        "environment": w.read(o, "environment", check_environment),
        "execution": w.read(o, "execution", check_execution),
        "gpu": w.read(o, "gpu", check_gpu),
        "model": w.read(o, "model", _or_unknown(check_model)),
        "assignment": w.read(o, "assignment", nullable(check_assignment)),
        "stage": w.read(o, "stage", check_stage),
        "error": w.read(o, "error", nullable(_message)),
        "timings": w.read(o, "timings", _timings),
        "performance": w.read(o, "performance", _performance),
    }
