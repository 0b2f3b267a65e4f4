"""The ``checkpoint`` message (coordinator -> participant): a checkpoint's summary, never its weights.

The coordinator sends one to every approved, connected participant when it
saves a checkpoint and again when that checkpoint's validation finishes, so a
participant's window lists the job's checkpoints and charts their metrics as
the coordinator's does (docs/wire.md, "Checkpoint notes"). Parsed as strictly
as every message: counts are integers, metrics finite (at most 64), texts
bounded; the participant keeps at most ``participant.CHECKPOINTS_KEPT``.
It is registered in :mod:`weei.core.wire.messages` (``decode_message``); import it from there
(this module needs that one loaded first).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from .._check import as_number
from .messages import _AT, MAX_TEXT, Direction, _int, _Message, _metrics, _sha, _str

__all__ = ["CheckpointNote"]


@dataclass(frozen=True)
class CheckpointNote(_Message):
    """A checkpoint the coordinator saved (or its validation result), so a participant's window
    lists the job's checkpoints and charts its metrics: the summary, never the weights."""

    TYPE: ClassVar[str] = "checkpoint"
    DIRECTION: ClassVar[Direction] = Direction.TO_PARTICIPANT
    job_id: str
    round: int
    sha256: str
    bytes: int
    file_name: str
    examples_processed: int
    metrics: dict[str, float]
    created_at: float  # on the coordinator's clock (ms since the epoch)
    validation_metrics: dict[str, float] | None = None
    validation_examples: int | None = None
    validation_error: str | None = None

    @classmethod
    def _parse(cls, obj: dict[str, Any]) -> CheckpointNote:
        created = as_number(obj.get("createdAt"), _AT.at("createdAt"), 0)
        validation = _metrics(obj, "validationMetrics") if obj.get("validationMetrics") is not None else None
        return cls(_str(obj, "jobId"), _int(obj, "round"), _sha(obj, "sha256"), _int(obj, "bytes"),
                   _str(obj, "fileName"), _int(obj, "examplesProcessed"), _metrics(obj, "metrics"), float(created),
                   validation, _int(obj, "validationExamples", optional=True),
                   _str(obj, "validationError", optional=True, limit=MAX_TEXT))

    @classmethod
    def of(cls, job_id: str, summary: Mapping[str, Any]) -> CheckpointNote:
        """The note of a coordinator's CheckpointSummary."""
        artifact, metrics = summary["artifact"], summary["metrics"]
        validation = summary.get("validationMetrics")
        return cls(job_id, artifact["round"], artifact["sha256"], artifact["bytes"], artifact["fileName"],
                   metrics.get("examplesProcessed", 0), dict(metrics.get("values", {})), summary["createdAt"],
                   dict(validation["values"]) if validation else None,
                   validation["examplesProcessed"] if validation else None, summary.get("validationError"))

    def summary(self) -> dict[str, Any]:
        """The CheckpointSummary a participant's job view lists (docs/api.md)."""
        out: dict[str, Any] = {
            "artifact": {"round": self.round, "sha256": self.sha256, "bytes": self.bytes, "fileName": self.file_name},
            "metrics": {"values": dict(self.metrics), "examplesProcessed": self.examples_processed},
            "createdAt": self.created_at,
        }
        if self.validation_metrics is not None:
            out["validationMetrics"] = {"values": dict(self.validation_metrics),
                                        "examplesProcessed": self.validation_examples or 0}
        if self.validation_error is not None:
            out["validationError"] = self.validation_error
        return out
