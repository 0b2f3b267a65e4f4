"""This device's side of compressed updates: quantize a trained result and keep its error.

The arithmetic and the rule for when a kept error is used are
``weei.core.aggregation.compression``; here is where the error lives. It is
saved with the participation, in the settings store (``settings/errorFeedback``:
the agent's disk store, the browser's IndexedDB), before the update leaves,
so a device that restarts between two rounds of the same job still sends
what the last round could not. One record per device: a participant takes
part in one job at a time, and another job's record is never used.
"""

from __future__ import annotations

import math
from typing import Any

from ..core._check import Where, as_choice, as_int, as_object, as_str
from ..core.aggregation.compression import ErrorFeedback, compress_update, layout, usable_feedback
from ..core.aggregation.methods import AggregationKernel
from ..core.floats import first_non_finite
from ..core.formats.modelinfo import ModelAggregation
from ..core.formats.settings import COMPRESSION_KINDS, CompressionSettings
from ..core.job.participant import TrainOutcome
from ..core.wire.messages import Assign
from .job_store import JobStore
from .ports import StorageError, StorageReason

__all__ = ["FEEDBACK_KEY", "UpdateCompressor", "parse_feedback"]

FEEDBACK_KEY = "errorFeedback"


def parse_feedback(value: Any) -> ErrorFeedback:
    """``settings/errorFeedback`` as stored. Raises StorageError ``corrupt`` naming the field."""
    at = Where(StorageError, StorageReason.CORRUPT, "settings/errorFeedback")
    record = as_object(value, at)
    residual = record.get("residual")
    if not isinstance(residual, (bytes, bytearray, memoryview)) or len(residual) % 4:
        at.at("residual")("must be float32 bytes")
    return ErrorFeedback(at.read(record, "jobId", as_str, max_chars=200), at.read(record, "round", as_int, minimum=0),
                         at.read(record, "kind", as_choice, allowed=tuple(COMPRESSION_KINDS)),
                         at.read(record, "block", as_int, minimum=1), bytes(residual))


class UpdateCompressor:
    """Compresses this participant's results; keeps the error feedback in memory and in the store."""

    def __init__(self, store: JobStore, kernel: AggregationKernel) -> None:
        self.store = store
        self.kernel = kernel
        self._feedback: ErrorFeedback | None = None
        self._loaded = False
        #: The last result's (float32 bytes, bytes sent): what the diagnostics show.
        self.last_sizes: tuple[int, int] | None = None

    async def compress(self, assign: Assign, settings: CompressionSettings, aggregation: ModelAggregation,
                       start: bytes, outcome: TrainOutcome) -> TrainOutcome:
        """``outcome`` with its compressed form; unchanged (and no error kept) when it is not a result the
        participant sends: weights of another size than ``start``'s, or a value or metric not finite (the
        participant then reports the result's fault as it would uncompressed)."""
        if len(outcome.weights) != len(start) or first_non_finite(outcome.weights) is not None \
                or not all(math.isfinite(v) for v in outcome.metrics.values()):
            return outcome
        if not self._loaded:
            self._feedback = await self.store.read_setting(FEEDBACK_KEY, parse_feedback)
            self._loaded = True
        shape = layout(len(start), [(r.offset, r.bytes) for r in aggregation.average_only])
        residual = usable_feedback(self._feedback, job_id=assign.job_id, round_=assign.round, settings=settings,
                                   n_quantized=shape.n_quantized)
        artifact, new_residual = compress_update(self.kernel, start, outcome.weights, settings, shape, residual)
        self._feedback = ErrorFeedback(assign.job_id, assign.round, settings.kind, settings.block, new_residual)
        await self.store.put_setting(FEEDBACK_KEY, self._feedback.to_json())
        self.last_sizes = (len(outcome.weights), len(artifact))
        return TrainOutcome(outcome.weights, outcome.metrics, outcome.count, outcome.optimizer_steps, artifact)
