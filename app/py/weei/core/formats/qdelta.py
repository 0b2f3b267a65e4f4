"""The compressed update (artifact kind ``qdelta``): one parse/serialize pair.

A participant of a job with ``settings.compression`` sends, instead of its
float32 weights, its delta from the round's checkpoint quantized per block
(docs/wire.md, "Compressed updates"; the arithmetic is
``weei.core.aggregation.compression``). All integers little-endian::

    offset  size        field
    0       4           magic  b"WQD1"
    4       1           bits   8 (int8 codes) or 4 (int4 codes)
    5       1           codec  0: the codes as they are; 1: the codes as one raw deflate stream (RFC 1951)
    6       2           zero
    8       4           block  elements per scale (MIN_BLOCK..MAX_BLOCK)
    12      4           nq     quantized elements (the trainable ones, in weight order)
    16      4           nb     blocks: ceil(nq / block)
    20      4           nraw   float32 values sent as they are (the averageOnly ranges, in order)
    24      4*nb        scales float32, finite and not negative (sign bit clear)
    ..      nq or ceil(nq/2)  codes: int8, or signed nibbles (even element low; an odd tail's high nibble 0);
                        with codec 1 fewer bytes, which inflate to exactly these
    ..      4*nraw      raw    float32 weights

No holes, nothing after ``raw``. The coordinator knows from the settings and
the model what ``bits``, ``block``, ``nq`` and ``nraw`` must be and passes
them in, so a header that disagrees is refused before a byte past it is
read; the size is checked against ``max_bytes('qdelta')`` first.

Codec 1 (``compression.deflate``) is lossless: the codes it inflates to are
the bytes codec 0 would carry, so the dequantized weights are the same bits.
Quantized deltas have low entropy (most codes near 0: about 6 bits a code
for int8, 3 for int4 on digits-mlp), and zlib's run-length strategy takes
the codes to about that. A deflated section must be shorter than the plain codes,
and inflating stops at the size the counts declare, so it can neither be a
decompression bomb nor cost more than reading the codes plain.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from enum import Enum

from ..errors import WeeiError
from ..floats import BytesLike, first_non_finite
from ..limits import max_bytes

__all__ = ["MAGIC", "HEADER_BYTES", "MIN_BLOCK", "MAX_BLOCK", "BITS", "PLAIN", "DEFLATE", "QDeltaReason",
           "QDeltaError", "QDelta", "qdelta_size", "serialize_qdelta", "parse_qdelta"]

MAGIC = b"WQD1"
HEADER_BYTES = 24
#: A scale per 8 elements at the least: then int8 with its scales is 1.5 bytes a weight, never more than float32.
MIN_BLOCK = 8
MAX_BLOCK = 65536
BITS = (8, 4)
#: The codec byte: how the codes travel.
PLAIN = 0
DEFLATE = 1

_HEADER = struct.Struct("<4sBB2sIIII")
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
    """Reserved bytes not zero, bits not 8 or 4, codec not 0 or 1, or a block outside 8..65536."""
    KIND_MISMATCH = "qdelta-kind-mismatch"
    """Codes of another width than the job's ``compression.kind``."""
    BLOCK_MISMATCH = "qdelta-block-mismatch"
    """Another block size than the job's ``compression.block``."""
    CODEC_MISMATCH = "qdelta-codec-mismatch"
    """Deflated codes in a job whose ``compression.deflate`` is off."""
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
    BAD_DEFLATE = "qdelta-bad-deflate"
    """Deflated codes that are not one raw deflate stream ending where the section ends, or not shorter
    than the plain codes."""
    INFLATED_SIZE = "qdelta-inflated-size"
    """Deflated codes that inflate to another size than the codes the header's counts declare."""


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
    codes: BytesLike  # the inflated bytes when the codes came deflated
    raw: memoryview
    deflated: bool


def _code_bytes(bits: int, n_quantized: int) -> int:
    return n_quantized if bits == 8 else (n_quantized + 1) // 2


def qdelta_size(bits: int, block: int, n_quantized: int, n_raw: int) -> int:
    """The exact byte size of a compressed update of these counts with plain codes (the most one may have)."""
    return HEADER_BYTES + 4 * (-(-n_quantized // block)) + _code_bytes(bits, n_quantized) + 4 * n_raw


def _deflate(codes: BytesLike) -> bytes:
    # Z_RLE: runs of one code (zeros, mostly) and a Huffman code over the rest. On digits-mlp's codes it was
    # smaller than the default strategy at level 9 and 4 to 10 times faster to make (docs/methods.md).
    packer = zlib.compressobj(9, zlib.DEFLATED, -15, 9, zlib.Z_RLE)
    return packer.compress(codes) + packer.flush()


def serialize_qdelta(bits: int, block: int, n_quantized: int, scales: BytesLike, codes: BytesLike,
                     raw: BytesLike, *, deflate: bool = False) -> bytes:
    """The artifact's bytes; with ``deflate`` the codes are deflated when that makes them smaller.

    Raises ValueError when the parts do not fit the counts (a caller's bug).
    """
    n_blocks = -(-n_quantized // block)
    if (bits not in BITS or not MIN_BLOCK <= block <= MAX_BLOCK or len(memoryview(scales).cast("B")) != 4 * n_blocks
            or len(memoryview(codes).cast("B")) != _code_bytes(bits, n_quantized) or len(memoryview(raw).cast("B")) % 4):
        raise ValueError("compressed update parts do not fit their counts")
    n_raw = len(memoryview(raw).cast("B")) // 4
    codec, section = PLAIN, bytes(codes)
    if deflate:
        packed = _deflate(codes)
        if len(packed) < len(section):
            codec, section = DEFLATE, packed
    return b"".join((_HEADER.pack(MAGIC, bits, codec, b"\0\0", block, n_quantized, n_blocks, n_raw),
                     bytes(scales), section, bytes(raw)))


def _inflate(section: memoryview, expected: int) -> bytes:
    """The codes a deflated section stands for, never more than ``expected`` bytes of them."""
    inflater = zlib.decompressobj(-15)
    try:
        codes = inflater.decompress(section, expected)
        if not inflater.eof:
            # Output stopped at ``expected``: the stream must end here without another byte of output.
            if inflater.decompress(inflater.unconsumed_tail, 1):
                raise QDeltaError(QDeltaReason.INFLATED_SIZE, f"the deflated codes inflate to more than {expected} bytes")
    except zlib.error as exc:
        raise QDeltaError(QDeltaReason.BAD_DEFLATE, f"the deflated codes do not inflate ({exc})") from None
    if not inflater.eof:
        raise QDeltaError(QDeltaReason.BAD_DEFLATE, "the deflate stream of the codes does not end")
    if inflater.unused_data:
        raise QDeltaError(QDeltaReason.BAD_DEFLATE, f"{len(inflater.unused_data)} bytes after the codes' deflate stream")
    if len(codes) != expected:
        raise QDeltaError(QDeltaReason.INFLATED_SIZE, f"the deflated codes inflate to {len(codes)} bytes, not {expected}")
    return codes


def parse_qdelta(data: BytesLike, *, bits: int, block: int, n_quantized: int, n_raw: int,
                 deflate: bool = False) -> QDelta:
    """Parse a compressed update that must have these counts (from the job's settings and model);
    deflated codes are accepted only with ``deflate`` (the job's ``compression.deflate``).

    Returns: the parts as views of ``data`` (the codes inflated when they came deflated).
    Raises: QDeltaError with the first reason that applies, checked in the order of the format.
    """
    view = memoryview(data).cast("B")
    size = len(view)
    if size > max_bytes("qdelta"):
        raise QDeltaError(QDeltaReason.TOO_LARGE, f"{size} bytes is over the limit of a compressed update")
    if size < HEADER_BYTES:
        raise QDeltaError(QDeltaReason.TRUNCATED, f"{size} bytes is shorter than the {HEADER_BYTES}-byte header")
    magic, h_bits, codec, zero, h_block, h_nq, h_nb, h_raw = _HEADER.unpack_from(view, 0)
    if magic != MAGIC:
        raise QDeltaError(QDeltaReason.BAD_MAGIC, "not a compressed update (magic is not WQD1)")
    if zero != b"\0\0" or h_bits not in BITS or codec not in (PLAIN, DEFLATE) or not MIN_BLOCK <= h_block <= MAX_BLOCK:
        raise QDeltaError(QDeltaReason.BAD_HEADER,
                          f"bits {h_bits}, codec {codec}, block {h_block}: bits must be 8 or 4, codec 0 or 1, "
                          f"block {MIN_BLOCK}..{MAX_BLOCK}, reserved bytes 0")
    if h_bits != bits:
        raise QDeltaError(QDeltaReason.KIND_MISMATCH, f"int{h_bits} codes, the job compresses to int{bits}")
    if h_block != block:
        raise QDeltaError(QDeltaReason.BLOCK_MISMATCH, f"blocks of {h_block}, the job's are {block}")
    if codec == DEFLATE and not deflate:
        raise QDeltaError(QDeltaReason.CODEC_MISMATCH, "deflated codes, the job's compression does not deflate")
    if h_nq != n_quantized or h_raw != n_raw:
        raise QDeltaError(QDeltaReason.WRONG_ELEMENT_COUNT,
                          f"{h_nq} quantized and {h_raw} raw values, the model has {n_quantized} and {n_raw}")
    if h_nb != -(-n_quantized // block):
        raise QDeltaError(QDeltaReason.WRONG_BLOCK_COUNT,
                          f"{h_nb} blocks, {n_quantized} values in blocks of {block} are {-(-n_quantized // block)}")
    code_bytes = _code_bytes(bits, n_quantized)
    expected = qdelta_size(bits, block, n_quantized, n_raw)
    if codec == PLAIN:
        if size < expected:
            raise QDeltaError(QDeltaReason.TRUNCATED, f"{size} bytes, the header's counts need {expected}")
        if size > expected:
            raise QDeltaError(QDeltaReason.TRAILING_BYTES, f"{size - expected} bytes after the last value")
    else:
        fixed = expected - code_bytes
        if size <= fixed:
            raise QDeltaError(QDeltaReason.TRUNCATED, f"{size} bytes, the header's counts need {fixed} and the codes")
        if size - fixed >= code_bytes:
            raise QDeltaError(QDeltaReason.BAD_DEFLATE,
                              f"{size - fixed} bytes of deflated codes, not fewer than the {code_bytes} plain ones")
    at = HEADER_BYTES
    scales = view[at:at + 4 * h_nb]
    at += 4 * h_nb
    section = view[at:size - 4 * n_raw]
    at = size - 4 * n_raw
    bad = first_non_finite(scales)
    if bad is not None:
        raise QDeltaError(QDeltaReason.NON_FINITE_SCALE, f"scale {bad} is not a finite number")
    index = bytes(scales[3::4]).translate(_SIGN).find(b"\x01")
    if index >= 0:
        raise QDeltaError(QDeltaReason.NEGATIVE_SCALE, f"scale {index} is negative")
    codes: BytesLike = section if codec == PLAIN else _inflate(section, code_bytes)
    if bits == 4 and n_quantized % 2 and codes[-1] >> 4:
        raise QDeltaError(QDeltaReason.NONZERO_PADDING, "the padding nibble after the last int4 code is not 0")
    return QDelta(bits, block, n_quantized, scales, codes, view[at:], codec == DEFLATE)
