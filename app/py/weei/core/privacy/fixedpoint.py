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
from collections.abc import Iterable, Sequence

__all__ = ["RING_BITS", "MODULUS", "frac_bits", "encode", "decode", "add_into", "sub_into"]

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
    scale = float(1 << bits)
    out = []
    for v in values:
        if v != v:
            v = 0.0
        v = -bound if v < -bound else bound if v > bound else v
        out.append(round(v * scale) & _MASK)
    return out


def decode(words: Sequence[int], bits: int) -> list[float]:
    """Ring elements back to floats: two's complement, then divided by 2^bits."""
    scale = float(1 << bits)
    return [((w - MODULUS) if w >= _HALF else w) / scale for w in words]


def add_into(acc: list[int], words: Sequence[int]) -> None:
    """``acc += words`` mod 2^64, element-wise (the lengths are the caller's to check)."""
    for i, w in enumerate(words):
        acc[i] = (acc[i] + w) & _MASK


def sub_into(acc: list[int], words: Sequence[int]) -> None:
    """``acc -= words`` mod 2^64, element-wise."""
    for i, w in enumerate(words):
        acc[i] = (acc[i] - w) & _MASK
