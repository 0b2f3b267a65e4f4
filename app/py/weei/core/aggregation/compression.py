"""Compressed updates: the participant quantizes its delta, the coordinator dequantizes it.

Theory of operation (docs/methods.md, "Compressed updates"). With
``settings.compression`` a participant sends, instead of its trained float32
weights ``x``, the artifact of ``weei.core.formats.qdelta``: over the
trainable weights (everything outside the model's ``averageOnly`` ranges,
gathered in weight order) the delta from the round's checkpoint ``s`` plus the
error it kept from its previous update, ``t = (x - s) + e``, quantized per
block (``AggregationKernel.quantize``); the ``averageOnly`` values go as they
are (they are averaged, never stepped, and are often counts or statistics
that do not quantize well). The new error ``e' = t - scale*code`` stays on
the participant (error feedback: what one round could not send is sent
later instead of lost; Seide et al. 2014, Karimireddy et al. 2019).

The coordinator rebuilds ``s + scale*code`` with one rounding to float32
(``AggregationKernel.dequantize``; bit-identical on every kernel) and the raw
ranges, then checks and averages the result exactly as an uncompressed
update. Checkpoints stay exact float32: the quantization error only ever
lives in what a participant sends.

The error kept is good for the next assignment of the same job only when
the participant missed no round (:func:`usable_feedback`): a residual is the
part of a delta taken from one checkpoint that was not yet sent, and after a
missed round the model has moved on without this participant, so adding it
would push a stale direction; it is dropped, never guessed at.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..floats import BytesLike, first_non_finite
from ..formats.qdelta import parse_qdelta, serialize_qdelta
from ..formats.settings import CompressionSettings
from .aggregate import Segment, trainable_segments
from .methods import AggregationKernel

__all__ = ["Layout", "ErrorFeedback", "layout", "compress_update", "decompress_update", "usable_feedback"]


@dataclass(frozen=True)
class Layout:
    """Which elements are quantized (``segments``, in order) and which travel raw (``raw``)."""

    n_elems: int
    segments: tuple[Segment, ...]
    raw: tuple[Segment, ...]

    @property
    def n_quantized(self) -> int:
        return sum(hi - lo for lo, hi in self.segments)

    @property
    def n_raw(self) -> int:
        return self.n_elems - self.n_quantized


def layout(weight_bytes: int, average_only: Sequence[tuple[int, int]]) -> Layout:
    """The layout of weights of ``weight_bytes`` with the model's ``averageOnly`` ``(offset, bytes)`` ranges.

    Raises ManifestError (``trainable_segments``) for a range past the weights.
    """
    n = weight_bytes // 4
    segments = trainable_segments(n, sorted(average_only))
    raw: list[Segment] = []
    at = 0
    for lo, hi in segments:
        if lo > at:
            raw.append((at, lo))
        at = hi
    if at < n:
        raw.append((at, n))
    return Layout(n, tuple(segments), tuple(raw))


def _gather(data: BytesLike, ranges: Sequence[Segment]) -> BytesLike:
    view = memoryview(data).cast("B")
    if len(ranges) == 1 and ranges[0] == (0, len(view) // 4):
        return view  # the usual case, a model without averageOnly ranges: no copy
    return b"".join(view[4 * lo:4 * hi] for lo, hi in ranges)


@dataclass(frozen=True)
class ErrorFeedback:
    """What a participant keeps between its updates of one job: the quantization error of the update it
    sent for ``round``, float32-le over the quantized elements, and the settings it was made under."""

    job_id: str
    round: int
    kind: str
    block: int
    residual: bytes

    def to_json(self) -> dict[str, Any]:
        """The stored form (the residual as bytes; the stores keep bytes inside records)."""
        return {"jobId": self.job_id, "round": self.round, "kind": self.kind, "block": self.block,
                "residual": self.residual}


def usable_feedback(feedback: ErrorFeedback | None, *, job_id: str, round_: int, settings: CompressionSettings,
                    n_quantized: int) -> bytes | None:
    """The residual an assignment of ``round_`` adds to its delta, or None (start from zero).

    Usable when it is this job's, made under the same kind and block, of the
    right size, finite, and made for this round or the one before: a
    participant that missed a round drops it (see the module docstring).
    """
    if feedback is None or feedback.job_id != job_id or feedback.kind != settings.kind \
            or feedback.block != settings.block or len(feedback.residual) != 4 * n_quantized:
        return None
    if not round_ - 1 <= feedback.round <= round_:
        return None
    if first_non_finite(feedback.residual) is not None:
        return None
    return feedback.residual


def compress_update(kernel: AggregationKernel, start: BytesLike, trained: BytesLike, settings: CompressionSettings,
                    shape: Layout, residual: bytes | None) -> tuple[bytes, bytes]:
    """The participant's side: returns ``(qdelta artifact bytes, new residual)``.

    ``start`` is the round's checkpoint, ``trained`` the finite weights trained
    from it (same size), ``residual`` what :func:`usable_feedback` gave (None: zeros).
    """
    s_q, x_q = _gather(start, shape.segments), _gather(trained, shape.segments)
    e = residual if residual is not None else bytes(4 * shape.n_quantized)
    scales, codes, new_residual = kernel.quantize(s_q, x_q, e, settings.block, settings.bits)
    artifact = serialize_qdelta(settings.bits, settings.block, shape.n_quantized, scales, codes,
                                _gather(trained, shape.raw), deflate=settings.deflate)
    return artifact, new_residual


def decompress_update(kernel: AggregationKernel, start: BytesLike, data: BytesLike, settings: CompressionSettings,
                      shape: Layout) -> BytesLike:
    """The coordinator's side: the float32 weights a compressed update stands for.

    Raises QDeltaError naming what is wrong with ``data``; the result is not
    yet checked for finite values (the caller checks it as any update).
    """
    q = parse_qdelta(data, bits=settings.bits, block=settings.block, n_quantized=shape.n_quantized,
                     n_raw=shape.n_raw, deflate=settings.deflate)
    dequantized = kernel.dequantize(_gather(start, shape.segments), q.scales, q.codes, settings.block, settings.bits)
    if not shape.raw:
        return dequantized
    quantized = memoryview(dequantized)
    pieces: list[BytesLike] = []
    qi = ri = 0
    q_at = r_at = 0
    # Segments and raw ranges tile the weights; walk both in weight order.
    while qi < len(shape.segments) or ri < len(shape.raw):
        if ri == len(shape.raw) or (qi < len(shape.segments) and shape.segments[qi][0] < shape.raw[ri][0]):
            lo, hi = shape.segments[qi]
            pieces.append(quantized[4 * q_at:4 * (q_at + hi - lo)])
            q_at, qi = q_at + hi - lo, qi + 1
        else:
            lo, hi = shape.raw[ri]
            pieces.append(q.raw[4 * r_at:4 * (r_at + hi - lo)])
            r_at, ri = r_at + hi - lo, ri + 1
    return b"".join(pieces)
