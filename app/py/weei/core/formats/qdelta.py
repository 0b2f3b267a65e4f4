"""The compressed update (artifact kind ``qdelta``): one parse/serialize pair.

A participant of a job with ``settings.compression`` sends, instead of its
float32 weights, its delta from the round's checkpoint quantized per block
(docs/wire.md, "Compressed updates"; the arithmetic is
``weei.core.aggregation.compression``). All integers little-endian::

    offset  size        field
    0       4           magic  b"WQD1"
    4       1           bits   8 (int8 codes) or 4 (int4 codes)
    5       3           zero
    8       4           block  elements per scale (MIN_BLOCK..MAX_BLOCK)
    12      4           nq     quantized elements (the trainable ones, in weight order)
    16      4           nb     blocks: ceil(nq / block)
    20      4           nraw   float32 values sent as they are (the averageOnly ranges, in order)
    24      4*nb        scales float32, finite and not negative (sign bit clear)
    ..      nq or ceil(nq/2)  codes: int8, or signed nibbles (even element low; an odd tail's high nibble 0)
    ..      4*nraw      raw    float32 weights

No holes, nothing after ``raw``. The coordinator knows from the settings and
the model what ``bits``, ``block``, ``nq`` and ``nraw`` must be and passes
them in, so a header that disagrees is refused before a byte past it is
read; the size is checked against ``max_bytes('qdelta')`` first.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import Enum

from ..errors import WeeiError
from ..floats import BytesLike, first_non_finite
from ..limits import max_bytes

__all__ = ["MAGIC", "HEADER_BYTES", "MIN_BLOCK", "MAX_BLOCK", "BITS", "QDeltaReason", "QDeltaError", "QDelta",
           "qdelta_size", "serialize_qdelta", "parse_qdelta"]

MAGIC = b"WQD1"
HEADER_BYTES = 24
#: A scale per 8 elements at the least: then int8 with its scales is 1.5 bytes a weight, never more than float32.
MIN_BLOCK = 8
MAX_BLOCK = 65536
BITS = (8, 4)

_HEADER = struct.Struct("<4sB3sIIII")
_SIGN = bytes(1 if b & 0x80 else 0 for b in range(256))  # a byte's top bit: a float32's sign in its last byte


class QDeltaReason(str, Enum):
    """Why a compressed update was refused (the update's rejection reason, docs/wire.md)."""

    TOO_LARGE = "qdelta-too-large"
    """More bytes than a compressed update may have (``weei.core.limits``)."""
    TRUNCATED = "qdelta-truncated"
    """Fewer bytes than its header (or the header's counts) need."""
    TRAILING_BYTES = "qdelta-trailing-bytes"
    """Bytes after the last raw value."""
    BAD_MAGIC = "qdelta-bad-magic"
    """Not a compressed update (the first four bytes are not ``WQD1``)."""
    BAD_HEADER = "qdelta-bad-header"
    """Reserved bytes not zero, bits not 8 or 4, or a block outside 8..65536."""
    KIND_MISMATCH = "qdelta-kind-mismatch"
    """Codes of another width than the job's ``compression.kind``."""
    BLOCK_MISMATCH = "qdelta-block-mismatch"
    """Another block size than the job's ``compression.block``."""
    WRONG_ELEMENT_COUNT = "qdelta-wrong-element-count"
    """Quantized or raw element counts that are not the model's."""
    WRONG_BLOCK_COUNT = "qdelta-wrong-block-count"
    """A block count that is not ceil(quantized elements / block)."""
    NON_FINITE_SCALE = "qdelta-non-finite-scale"
    """A scale that is NaN or infinite."""
    NEGATIVE_SCALE = "qdelta-negative-scale"
    """A scale with its sign bit set."""
    NONZERO_PADDING = "qdelta-nonzero-padding"
    """The unused high nibble after an odd number of int4 codes is not 0."""


class QDeltaError(WeeiError):
    """A compressed update that does not parse; ``reason`` is a :class:`QDeltaReason`."""

    reasons = (QDeltaReason,)


@dataclass(frozen=True)
class QDelta:
    """A parsed compressed update: views into the bytes it was parsed from."""

    bits: int
    block: int
    n_quantized: int
    scales: memoryview
    codes: memoryview
    raw: memoryview


def _code_bytes(bits: int, n_quantized: int) -> int:
    return n_quantized if bits == 8 else (n_quantized + 1) // 2


def qdelta_size(bits: int, block: int, n_quantized: int, n_raw: int) -> int:
    """The exact byte size of a compressed update of these counts."""
    return HEADER_BYTES + 4 * (-(-n_quantized // block)) + _code_bytes(bits, n_quantized) + 4 * n_raw


def serialize_qdelta(bits: int, block: int, n_quantized: int, scales: BytesLike, codes: BytesLike,
                     raw: BytesLike) -> bytes:
    """The artifact's bytes. Raises ValueError when the parts do not fit the counts (a caller's bug)."""
    n_blocks = -(-n_quantized // block)
    if (bits not in BITS or not MIN_BLOCK <= block <= MAX_BLOCK or len(memoryview(scales).cast("B")) != 4 * n_blocks
            or len(memoryview(codes).cast("B")) != _code_bytes(bits, n_quantized) or len(memoryview(raw).cast("B")) % 4):
        raise ValueError("compressed update parts do not fit their counts")
    n_raw = len(memoryview(raw).cast("B")) // 4
    return b"".join((_HEADER.pack(MAGIC, bits, b"\0\0\0", block, n_quantized, n_blocks, n_raw),
                     bytes(scales), bytes(codes), bytes(raw)))


def parse_qdelta(data: BytesLike, *, bits: int, block: int, n_quantized: int, n_raw: int) -> QDelta:
    """Parse a compressed update that must have these counts (from the job's settings and model).

    Returns: the parts as views of ``data``.
    Raises: QDeltaError with the first reason that applies, checked in the order of the format.
    """
    view = memoryview(data).cast("B")
    size = len(view)
    if size > max_bytes("qdelta"):
        raise QDeltaError(QDeltaReason.TOO_LARGE, f"{size} bytes is over the limit of a compressed update")
    if size < HEADER_BYTES:
        raise QDeltaError(QDeltaReason.TRUNCATED, f"{size} bytes is shorter than the {HEADER_BYTES}-byte header")
    magic, h_bits, zero, h_block, h_nq, h_nb, h_raw = _HEADER.unpack_from(view, 0)
    if magic != MAGIC:
        raise QDeltaError(QDeltaReason.BAD_MAGIC, "not a compressed update (magic is not WQD1)")
    if zero != b"\0\0\0" or h_bits not in BITS or not MIN_BLOCK <= h_block <= MAX_BLOCK:
        raise QDeltaError(QDeltaReason.BAD_HEADER,
                          f"bits {h_bits}, block {h_block}: bits must be 8 or 4, block {MIN_BLOCK}..{MAX_BLOCK}, "
                          "reserved bytes 0")
    if h_bits != bits:
        raise QDeltaError(QDeltaReason.KIND_MISMATCH, f"int{h_bits} codes, the job compresses to int{bits}")
    if h_block != block:
        raise QDeltaError(QDeltaReason.BLOCK_MISMATCH, f"blocks of {h_block}, the job's are {block}")
    if h_nq != n_quantized or h_raw != n_raw:
        raise QDeltaError(QDeltaReason.WRONG_ELEMENT_COUNT,
                          f"{h_nq} quantized and {h_raw} raw values, the model has {n_quantized} and {n_raw}")
    if h_nb != -(-n_quantized // block):
        raise QDeltaError(QDeltaReason.WRONG_BLOCK_COUNT,
                          f"{h_nb} blocks, {n_quantized} values in blocks of {block} are {-(-n_quantized // block)}")
    expected = qdelta_size(bits, block, n_quantized, n_raw)
    if size < expected:
        raise QDeltaError(QDeltaReason.TRUNCATED, f"{size} bytes, the header's counts need {expected}")
    if size > expected:
        raise QDeltaError(QDeltaReason.TRAILING_BYTES, f"{size - expected} bytes after the last value")
    at = HEADER_BYTES
    scales = view[at:at + 4 * h_nb]
    at += 4 * h_nb
    codes = view[at:at + _code_bytes(bits, n_quantized)]
    at += len(codes)
    bad = first_non_finite(scales)
    if bad is not None:
        raise QDeltaError(QDeltaReason.NON_FINITE_SCALE, f"scale {bad} is not a finite number")
    index = bytes(scales[3::4]).translate(_SIGN).find(b"\x01")
    if index >= 0:
        raise QDeltaError(QDeltaReason.NEGATIVE_SCALE, f"scale {index} is negative")
    if bits == 4 and n_quantized % 2 and codes[-1] >> 4:
        raise QDeltaError(QDeltaReason.NONZERO_PADDING, "the padding nibble after the last int4 code is not 0")
    return QDelta(bits, block, n_quantized, scales, codes, view[at:])
