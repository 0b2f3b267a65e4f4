"""Shamir's t-of-n secret sharing over the prime field GF(2^521 - 1).

A secret of up to 64 bytes is the constant term of a random polynomial of
degree t - 1; share x is the polynomial at x (x = 1..n). Any t shares give
the secret back by Lagrange interpolation at 0; fewer say nothing about it
(every value of the secret is equally consistent with them). 2^521 - 1 is a
Mersenne prime, so a 32-byte key or seed fits with room to spare.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence

__all__ = ["PRIME", "SHARE_BYTES", "split", "combine"]

PRIME = 2 ** 521 - 1
SHARE_BYTES = 66
MAX_SECRET_BYTES = 64


def split(secret: bytes, threshold: int, count: int,
          randbelow: Callable[[int], int] = secrets.randbelow) -> list[tuple[int, int]]:
    """``count`` shares ``(x, y)`` of ``secret``, x = 1..count, any ``threshold`` of which recover it.

    Raises ValueError when the secret is over 64 bytes or not 1 <= threshold <= count.
    """
    if len(secret) > MAX_SECRET_BYTES:
        raise ValueError("a secret is at most 64 bytes")
    if not 1 <= threshold <= count:
        raise ValueError(f"threshold {threshold} must be from 1 to {count}")
    coefficients = [int.from_bytes(secret, "big")] + [randbelow(PRIME) for _ in range(threshold - 1)]
    shares = []
    for x in range(1, count + 1):
        y = 0
        for c in reversed(coefficients):
            y = (y * x + c) % PRIME
        shares.append((x, y))
    return shares


def combine(shares: Sequence[tuple[int, int]], size: int) -> bytes:
    """The ``size``-byte secret the shares interpolate to at 0 (garbage, not an error, from wrong shares).

    Raises ValueError on no shares, repeated x, or a result over ``size`` bytes.
    """
    xs = [x for x, _ in shares]
    if not shares or len(set(xs)) != len(xs) or any(not 0 < x < PRIME for x in xs):
        raise ValueError("shares need distinct x in the field")
    secret = 0
    for i, (xi, yi) in enumerate(shares):
        num, den = 1, 1
        for j, xj in enumerate(xs):
            if j != i:
                num = num * xj % PRIME
                den = den * (xj - xi) % PRIME
        # The inverse by the extended Euclidean algorithm (pow's -1), a tenth of Fermat's pow(den, p - 2, p)
        # at 521 bits: the same number, and the coordinator inverts t of them per unmasked secret.
        secret = (secret + yi * num * pow(den, -1, PRIME)) % PRIME
    if secret >= 256 ** size:
        raise ValueError("the shares do not interpolate to a secret of that size")
    return secret.to_bytes(size, "big")
