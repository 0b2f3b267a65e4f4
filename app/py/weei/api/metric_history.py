"""The metric history a continued job charts before its own checkpoints (issue 24, item 13).

A job continued from a checkpoint starts a new job ID, and its checkpoints
begin at the checkpoint's round: its charts started empty. When the
checkpoint's job is saved on this device, its charted history (the
checkpoints before that round, and the history it had itself continued
from) is copied into the new job's record as ``history``: the charts keep
it after the first job is deleted and after a reload. A checkpoint from
another device brings none (the file carries the weights and that one
round's metrics, docs/checkpoint-format.md).

A point is a checkpoint summary cut down to what a chart plots:
``{"artifact": {"round": R}, "createdAt": ms, "metrics": {"values": {...}},
"validationMetrics": {"values": {...}}}`` (the last three optional), oldest
first, at most :data:`MAX_HISTORY_POINTS` (the newest kept). The record is
read back from storage, so :func:`parse_history` checks every field.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

from ..core._check import Where, as_int, as_list, as_number, as_object, as_str
from ..core.limits import MAX_METRIC_ID_CHARS, MAX_METRICS

__all__ = ["MAX_HISTORY_POINTS", "history_point", "history_before", "parse_history"]

#: Points kept: ten thousand rounds of a chart is more than its width shows.
MAX_HISTORY_POINTS = 10_000

_FIELDS = ("metrics", "validationMetrics")


def _values(summary: Mapping[str, Any], field: str) -> dict[str, float] | None:
    block = summary.get(field)
    values = block.get("values") if isinstance(block, Mapping) else None
    if not isinstance(values, Mapping):
        return None
    out = {k: float(v) for k, v in list(values.items())[:MAX_METRICS]
           if isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
    return out or None


def history_point(summary: Mapping[str, Any]) -> dict[str, Any] | None:
    """A checkpoint summary as a chart point; None when it names no round."""
    artifact = summary.get("artifact")
    round_ = artifact.get("round") if isinstance(artifact, Mapping) else None
    if type(round_) is not int or round_ < 0:
        return None
    point: dict[str, Any] = {"artifact": {"round": round_}}
    created = summary.get("createdAt")
    if isinstance(created, (int, float)) and not isinstance(created, bool):
        point["createdAt"] = created
    for field in _FIELDS:
        values = _values(summary, field)
        if values is not None:
            point[field] = {"values": values}
    return point


def history_before(earlier: Iterable[Mapping[str, Any]], summaries: Iterable[Mapping[str, Any]],
                   round_: int) -> list[dict[str, Any]]:
    """The points before ``round_``: a saved job's own ``earlier`` history, then its checkpoint ``summaries``,
    in round order, one point a round (its last), the newest :data:`MAX_HISTORY_POINTS`."""
    by_round: dict[int, dict[str, Any]] = {}
    for source in (earlier, summaries):
        for summary in source:
            point = history_point(summary)
            if point is not None and point["artifact"]["round"] < round_:
                by_round[point["artifact"]["round"]] = point
    return [by_round[r] for r in sorted(by_round)][-MAX_HISTORY_POINTS:]


def parse_history(value: Any, at: Where) -> list[dict[str, Any]]:
    """A job record's ``history``, checked (raises the ``at`` error naming the field)."""
    points = as_list(value, at, MAX_HISTORY_POINTS)
    for i, raw in enumerate(points):
        where = at.at(i)
        point = as_object(raw, where)
        artifact = as_object(where.get(point, "artifact"), where.at("artifact"))
        where.at("artifact").read(artifact, "round", as_int, minimum=0)
        if "createdAt" in point:
            where.read(point, "createdAt", as_number)
        for field in _FIELDS:
            if field not in point:
                continue
            block = as_object(point[field], where.at(field))
            values = as_object(where.at(field).get(block, "values"), where.at(field).at("values"))
            if len(values) > MAX_METRICS:
                where.at(field).at("values")(f"has {len(values)} metrics, over {MAX_METRICS}")
            for key, number in values.items():
                as_str(key, where.at(field).at("values"), max_chars=MAX_METRIC_ID_CHARS)
                as_number(number, where.at(field).at("values").at(key))
    return points
