"""Frozen results of ABI-1 operations and the checks that build them.

Everything a module returns is untrusted: it is parsed here, at the
boundary, into frozen objects, and anything malformed becomes a
:class:`~weei.core.errors.ModelError` naming the operation and the field.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

from weei.core._check import parse_json
from weei.core.errors import ModelError, ModelReason

__all__ = [
    "TrainProgress",
    "TrainResult",
    "EvalResult",
    "parse_result_json",
    "field_count",
    "field_metrics",
]


def _own_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    # A private plain dict (not a MappingProxy): callers serialise metrics
    # with json.dumps, which refuses proxies. Treat it as read-only.
    return dict(metrics)


@dataclass(frozen=True)
class TrainProgress:
    """One ``weei.onProgress`` report.

    For experience models ``processed_examples`` counts completed units and
    ``total_examples`` the assignment's units.
    """

    processed_examples: int
    total_examples: int
    metrics: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "metrics", _own_metrics(self.metrics))


@dataclass(frozen=True)
class TrainResult:
    """The result of ``train``.

    ``weights`` has the model's weight size. Dataset models report
    ``unique_examples`` (``completed_units`` is ``None``); experience models
    report ``completed_units`` (``unique_examples`` is ``None``).
    ``optimizer_steps`` is ``None`` when the model does not count them.
    """

    weights: bytes = field(repr=False)  # often megabytes
    metrics: dict[str, float]
    unique_examples: int | None
    completed_units: int | None
    optimizer_steps: int | None

    def __post_init__(self) -> None:
        object.__setattr__(self, "metrics", _own_metrics(self.metrics))

    @property
    def examples(self) -> int:
        """The aggregation weight: unique examples, or completed units."""
        if self.unique_examples is not None:
            return self.unique_examples
        return self.completed_units or 0


@dataclass(frozen=True)
class EvalResult:
    """The result of ``evaluate``: finite metrics over ``examples`` examples (or units)."""

    metrics: dict[str, float]
    examples: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "metrics", _own_metrics(self.metrics))


def parse_result_json(op: str, raw: bytes) -> dict[str, Any]:
    """Parse a result (or progress payload) as a UTF-8 JSON object.

    Raises ``ModelError`` ('malformed-result') for anything else, and
    ('operation-failed') for an ``{"error": ...}`` result.
    """

    def malformed(message: str) -> NoReturn:
        # Not UTF-8, not JSON (NaN and Infinity are not: a model that prints
        # them produced a non-finite number), or nested past MAX_JSON_DEPTH.
        snippet = raw[:80].decode("utf-8", "replace")
        raise ModelError(ModelReason.MALFORMED_RESULT, f"{op}: result {message}: {snippet!r}")

    value = parse_json(raw, malformed)
    if not isinstance(value, dict):
        raise ModelError(
            ModelReason.MALFORMED_RESULT, f"{op}: result is a JSON {type(value).__name__}, not an object"
        )
    if "error" in value:
        reason = value["error"]
        text = reason if isinstance(reason, str) else json.dumps(reason)[:200]
        raise ModelError(ModelReason.OPERATION_FAILED, f"{op}: the model reported an error: {text}")
    return value


def _number(value: Any) -> float | None:
    # bool is an int subclass; true/false are not numbers in a result.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:  # an integer literal beyond float range
        return math.inf if value > 0 else -math.inf


def field_count(op: str, result: Mapping[str, Any], key: str, *, required: bool = True) -> int | None:
    """A non-negative integer field (``128`` or ``128.0``: JSON has one number type).

    Raises ``ModelError`` ('invalid-result') when missing (and required), not a
    whole number, or negative.
    """
    if key not in result:
        if required:
            raise ModelError(ModelReason.INVALID_RESULT, f"{op}: result lacks {key!r}")
        return None
    value = result[key]
    count: int | None = None
    if isinstance(value, bool):
        count = None
    elif isinstance(value, int):
        count = value
    elif isinstance(value, float) and value.is_integer():
        count = int(value)
    if count is None:
        raise ModelError(ModelReason.INVALID_RESULT, f"{op}: {key!r} is not an integer: {value!r}")
    if count < 0:
        raise ModelError(ModelReason.INVALID_RESULT, f"{op}: {key!r} is negative: {value!r}")
    return count


def field_metrics(op: str, result: Mapping[str, Any], key: str = "metrics") -> dict[str, float]:
    """A ``{name: finite number}`` object.

    Raises ``ModelError``: 'invalid-result' when missing or mistyped,
    'non-finite-metric' for NaN or infinity (for example a ``1e999`` literal).
    """
    if key not in result:
        raise ModelError(ModelReason.INVALID_RESULT, f"{op}: result lacks {key!r}")
    metrics = result[key]
    if not isinstance(metrics, dict):
        raise ModelError(ModelReason.INVALID_RESULT, f"{op}: {key!r} is not an object")
    out: dict[str, float] = {}
    for name, value in metrics.items():
        number = _number(value)
        if number is None:
            raise ModelError(ModelReason.INVALID_RESULT, f"{op}: metric {name!r} is not a number: {value!r}")
        if not math.isfinite(number):
            raise ModelError(ModelReason.NON_FINITE_METRIC, f"{op}: metric {name!r} is {number}")
        out[name] = number
    return out
