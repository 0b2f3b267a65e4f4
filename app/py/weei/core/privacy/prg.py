"""The pseudorandom expansions of secure aggregation, all from SHAKE-256 (FIPS 202).

SHAKE-256 is an extendable-output function: one call turns a 32-byte seed
into as many bytes as a mask needs, in C in both CPython and Pyodide
(``hashlib``), so a mask of a million weights costs one call, and the same
seed gives the same bytes everywhere. Every use is domain-separated by a
label, so a pairwise key never doubles as a mask seed.

``seal``/``open_sealed`` carry a Shamir share to one peer through the
coordinator: a SHAKE-256 keystream, then HMAC-SHA-256 over the ciphertext
(encrypt-then-MAC), under keys derived from the pair's X25519 secret.
Each key encrypts exactly one message (it is derived per round, sender and
receiver), so the keystream needs no nonce.
"""

from __future__ import annotations

import hashlib
import hmac

__all__ = ["SEED_BYTES", "TAG_BYTES", "derive", "expand", "mask_bytes", "seal", "open_sealed"]

SEED_BYTES = 32
TAG_BYTES = 32


def derive(label: str, *parts: bytes, size: int = SEED_BYTES) -> bytes:
    """``size`` bytes of SHAKE-256 over the label and the parts, each length-prefixed (no two inputs collide)."""
    h = hashlib.shake_256()
    for piece in (label.encode(), *parts):
        h.update(len(piece).to_bytes(4, "big"))
        h.update(piece)
    return h.digest(size)


def expand(seed: bytes, size: int) -> bytes:
    """``size`` pseudorandom bytes from a 32-byte seed."""
    return hashlib.shake_256(b"weei-secagg-mask\x00" + seed).digest(size)


def mask_bytes(seed: bytes, length: int) -> bytes:
    """A mask of ``length`` uniform elements of Z_{2^64} from a seed, as little-endian u64 bytes."""
    return expand(seed, 8 * length)


def seal(key: bytes, plaintext: bytes) -> bytes:
    """Ciphertext then a 32-byte tag, under a one-use 32-byte key."""
    stream = derive("seal-stream", key, size=len(plaintext))
    body = bytes(a ^ b for a, b in zip(plaintext, stream, strict=True))
    return body + hmac.new(derive("seal-mac", key), body, "sha256").digest()


def open_sealed(key: bytes, sealed: bytes) -> bytes | None:
    """The plaintext of ``seal(key, ...)``, or None when the tag does not match (tampered, or another key)."""
    if len(sealed) < TAG_BYTES:
        return None
    body, tag = sealed[:-TAG_BYTES], sealed[-TAG_BYTES:]
    if not hmac.compare_digest(tag, hmac.new(derive("seal-mac", key), body, "sha256").digest()):
        return None
    stream = derive("seal-stream", key, size=len(body))
    return bytes(a ^ b for a, b in zip(body, stream, strict=True))
