"""X25519 key agreement (RFC 7748, section 5), in pure Python integers.

The Montgomery ladder of the RFC, with its conditional swaps written as
arithmetic. Python integers are not constant-time; a participant's key lives
for one round and the timing an observer could gather is the data channel's,
so the exposure is one round's mask, never a model update in the clear.

This ladder is the reference: a host hands the protocol a faster function of
the same type (``X25519``; the C kernel's, ``weei.kernel``, natively and as
WebAssembly, tested against this one for the same bytes), and it stays the
fallback where no kernel is given.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["BASE_POINT", "KEY_BYTES", "X25519", "check_sizes", "x25519", "public_key"]

P = 2 ** 255 - 19
A24 = 121665
KEY_BYTES = 32
BASE_POINT = (9).to_bytes(32, "little")

#: An implementation of the X25519 function: (32-byte scalar, 32-byte u-coordinate) -> 32 bytes.
X25519 = Callable[[bytes, bytes], bytes]


def _decode_scalar(k: bytes) -> int:
    b = bytearray(k)
    b[0] &= 248
    b[31] &= 127
    b[31] |= 64
    return int.from_bytes(b, "little")


def _decode_u(u: bytes) -> int:
    b = bytearray(u)
    b[31] &= 127  # RFC 7748: the top bit of a u-coordinate is ignored
    return int.from_bytes(b, "little") % P


def check_sizes(k: bytes, u: bytes) -> None:
    """Raises ValueError when the scalar or the u-coordinate is not 32 bytes (every ``X25519`` checks this)."""
    if len(k) != KEY_BYTES or len(u) != KEY_BYTES:
        raise ValueError("X25519 takes a 32-byte scalar and a 32-byte u-coordinate")


def x25519(k: bytes, u: bytes) -> bytes:
    """The X25519 function: scalar ``k`` (32 bytes) times the point ``u`` (32 bytes); 32 bytes out.

    Raises ValueError when either input is not 32 bytes.
    """
    check_sizes(k, u)
    scalar = _decode_scalar(k)
    x1 = _decode_u(u)
    x2, z2, x3, z3 = 1, 0, x1, 1
    swap = 0
    for t in range(254, -1, -1):
        bit = (scalar >> t) & 1
        swap ^= bit
        if swap:
            x2, x3, z2, z3 = x3, x2, z3, z2
        swap = bit
        a = (x2 + z2) % P
        aa = a * a % P
        b = (x2 - z2) % P
        bb = b * b % P
        e = (aa - bb) % P
        c = (x3 + z3) % P
        d = (x3 - z3) % P
        da = d * a % P
        cb = c * b % P
        x3 = (da + cb) ** 2 % P
        z3 = x1 * (da - cb) ** 2 % P
        x2 = aa * bb % P
        z2 = e * (aa + A24 * e) % P
    if swap:
        x2, z2 = x3, z3
    return (x2 * pow(z2, P - 2, P) % P).to_bytes(32, "little")


def public_key(secret: bytes, x25519: X25519 = x25519) -> bytes:
    """The public key of a 32-byte secret key: ``x25519(secret, 9)`` (``x25519``: this module's by default)."""
    return x25519(secret, BASE_POINT)
