"""Fixed-point encoding of updates into the ring Z_{2^64}, where masked sums are exact.

A value v becomes round(v * 2^bits) mod 2^64 (two's complement); sums wrap
mod 2^64 and the integer sum is exact as long as its magnitude stays below
2^63. ``frac_bits`` picks the largest scale that keeps a sum of ``count``
values, each at most ``bound`` in magnitude, inside that range; every peer
computes it from the same settings, so the grid is the same everywhere.
Decoding divides one exact integer by a power of two: one correctly
rounded float operation, bit-identical on every platform.
"""

from __future__ import annotations

import math
import sys
from array import array
from collections.abc import Iterable, Sequence

__all__ = ["RING_BITS", "MODULUS", "frac_bits", "encode", "encode_bytes", "encode_into", "decode", "to_bytes", "from_bytes", "RingSum"]

RING_BITS = 64
MODULUS = 1 << RING_BITS
_MASK = MODULUS - 1
_HALF = 1 << (RING_BITS - 1)
MAX_FRAC_BITS = 40


def frac_bits(bound: float, count: int) -> int:
    """The scale 2^bits for ``count`` values of magnitude <= ``bound``: their sum stays under 2^62 on the grid.

    Raises ValueError when even 2^0 would overflow (bound * count too large) or inputs are not positive.
    """
    if not (math.isfinite(bound) and bound > 0) or count < 1:
        raise ValueError("bound must be finite and positive, count at least 1")
    room = 62 - math.ceil(math.log2(bound * count + 1))
    if room < 0:
        raise ValueError(f"a sum of {count} values of magnitude {bound:g} does not fit the ring")
    return min(room, MAX_FRAC_BITS)


def encode(values: Iterable[float], bits: int, bound: float) -> list[int]:
    """Each value clamped to [-bound, bound] (a NaN becomes 0), scaled by 2^bits, rounded, mod 2^64."""
    return from_bytes(encode_bytes(values, bits, bound))


#: 1.5 * 2^52: for |y| < 2^51, the float sum y + _SHIFT is C's round-to-nearest-even of y (as ``round``) plus
#: _SHIFT, and its IEEE bits are _SHIFT's plus that integer: the rounding is done by one float addition.
_SHIFT = 1.5 * 2.0 ** 52
_SHIFT_WORD = (0x4338000000000000).to_bytes(8, "little")


def encode_bytes(values: Iterable[float], bits: int, bound: float) -> bytes:
    """``encode`` as little-endian u64 bytes, the form a vector is masked in."""
    items = values if isinstance(values, list) else list(values)
    acc = RingSum(len(items))
    encode_into(acc, items, bits, bound)
    return acc.value()


def encode_into(acc: RingSum, values: Iterable[float], bits: int, bound: float) -> None:
    """Add ``encode(values, bits, bound)`` to the ring sum ``acc`` (of as many elements)."""
    scale, low = float(1 << bits), -bound
    items = values if isinstance(values, list) else list(values)
    total = sum(items) if items else math.nan  # a NaN (or +inf and -inf) makes the sum NaN
    least, most = (min(items), max(items)) if total == total else (math.nan, math.nan)
    # A clipped update is finite and within the bound: no clamp per value.
    if low <= least and most <= bound and max(-least, most) * scale < 2.0 ** 50:
        # Well inside the grid (the common case): rounded by one float addition each, and _SHIFT's bits taken
        # from every word by one ring subtraction.
        shifted = array("d", [v * scale + _SHIFT for v in items])
        if sys.byteorder != "little":
            shifted.byteswap()
        acc.add(shifted.tobytes())
        acc.sub(_SHIFT_WORD * len(items))
    elif low <= least and most <= bound and bound * scale < 2.0 ** 63:
        # Straight into signed 64-bit words: two's complement is the ring's form.
        signed = array("q", [round(v * scale) for v in items])
        if sys.byteorder != "little":
            signed.byteswap()
        acc.add(signed.tobytes())
    else:
        acc.add(to_bytes([round((low if v < low else bound if v > bound else v) * scale) & _MASK if v == v else 0
                          for v in items]))


def decode(words: Sequence[int], bits: int) -> list[float]:
    """Ring elements back to floats: two's complement, then divided by 2^bits."""
    scale = float(1 << bits)
    return [((w - MODULUS) if w >= _HALF else w) / scale for w in words]


def to_bytes(words: Sequence[int]) -> bytes:
    """Ring elements as little-endian u64, the form masks and masked vectors travel in."""
    out = array("Q", words)
    if sys.byteorder != "little":
        out.byteswap()
    return out.tobytes()


def from_bytes(data: bytes) -> list[int]:
    """Little-endian u64 back to ring elements (the length is the caller's to check: a multiple of 8)."""
    out = array("Q")
    out.frombytes(data)
    if sys.byteorder != "little":
        out.byteswap()
    return out.tolist()


class RingSum:
    """A running sum of vectors in Z_{2^64}, each given as little-endian u64 bytes.

    A vector becomes two Python integers, its elements' low and high 32-bit
    halves each in a 64-bit lane, so a whole vector adds in one big-integer
    addition (in C, in CPython and Pyodide alike) instead of a loop per
    element. A lane's upper 32 bits catch the carries: 2^32 additions
    before they could reach the next lane, far beyond any round.
    Subtraction adds the complements of the halves, which never borrow.
    """

    def __init__(self, length: int) -> None:
        self.length = length
        # Built from bytes, in linear time (a division of a number of 64 * length bits costs far more per vector).
        self._halves = int.from_bytes(b"\xff\xff\xff\xff\0\0\0\0" * length, "little")  # 0xFFFFFFFF in every lane
        self._two32 = int.from_bytes(b"\0\0\0\0\1\0\0\0" * length, "little")  # 2^32 in every lane
        self._lo = self._hi = 0
        self._adds = 0

    def _split(self, data: bytes) -> tuple[int, int]:
        if len(data) != 8 * self.length:
            raise ValueError(f"a vector of {self.length} ring elements is {8 * self.length} bytes, not {len(data)}")
        whole = int.from_bytes(data, "little")
        return whole & self._halves, (whole >> 32) & self._halves

    def add(self, data: bytes) -> None:
        """Add a vector. Raises ValueError on the wrong length."""
        lo, hi = self._split(data)
        self._lo += lo
        self._hi += hi
        self._count()

    def sub(self, data: bytes) -> None:
        """Subtract a vector. Raises ValueError on the wrong length."""
        lo, hi = self._split(data)
        # -v = (2^32 - lo) + 2^32 * (2^32 - 1 - hi) - 2^64: both terms in 0..2^32, so nothing borrows.
        self._lo += self._two32 - lo
        self._hi += self._halves - hi
        self._count()

    def _count(self) -> None:
        self._adds += 1
        if self._adds >= 1 << 31:
            raise OverflowError("a ring sum of 2^31 vectors could carry across lanes")

    def value(self) -> bytes:
        """The sum mod 2^64, as little-endian u64 bytes."""
        lo = self._lo & self._halves
        hi = (self._hi + ((self._lo >> 32) & self._halves)) & self._halves
        return (lo | (hi << 32)).to_bytes(8 * self.length, "little")
