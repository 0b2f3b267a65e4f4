"""Artifact bytes whose SHA-256 was computed once, when they arrived.

Theory of operation
-------------------
Artifacts are named by the SHA-256 of their bytes, and a receiver checks
that name once. The framing reader hashes each artifact as its fragments
arrive (``core/wire/framing/reader.py``), so by the time the message that names
it is complete, the check is done; the coordinator's own participant hashes
the weights it trained when it names them. :class:`VerifiedBlobs` carries
that fact along with the bytes, so the coordinator does not hash a 64 MB
update a second time in the round's critical path (issue 11, P4). A plain
mapping (a test, a host that checks nothing) is still hashed once, by
:func:`sha256_hex`, the one seam through which the core hashes an arriving
artifact.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping

from .errors import UsageError, UsageReason

__all__ = ["VerifiedBlobs", "sha256_hex", "is_verified"]


def sha256_hex(data: bytes | bytearray | memoryview) -> str:
    """The SHA-256 of an arriving artifact, as lowercase hex."""
    return hashlib.sha256(data).hexdigest()


class VerifiedBlobs(Mapping[str, bytes]):
    """Artifact bytes by SHA-256, every key the hash of its bytes, computed when they arrived.

    Build it only where that hash was computed: ``VerifiedBlobs(blobs)``
    states that the caller hashed every entry itself (as the framing reader
    does while receiving); :meth:`check` hashes them now.
    """

    __slots__ = ("_blobs",)

    def __init__(self, blobs: Mapping[str, bytes] | None = None) -> None:
        self._blobs: dict[str, bytes] = dict(blobs or {})

    @classmethod
    def check(cls, blobs: Mapping[str, bytes]) -> VerifiedBlobs:
        """Hash every entry once. Raises UsageError (hash-mismatch) when one does not match its key."""
        for sha, data in blobs.items():
            if sha256_hex(data) != sha:
                raise UsageError(UsageReason.HASH_MISMATCH, f"artifact {sha[:16]}... does not match its SHA-256")
        return cls(blobs)

    def __getitem__(self, sha: str) -> bytes:
        return self._blobs[sha]

    def __iter__(self) -> Iterator[str]:
        return iter(self._blobs)

    def __len__(self) -> int:
        return len(self._blobs)

    def __repr__(self) -> str:
        return f"VerifiedBlobs({sorted(self._blobs)!r})"


def is_verified(blobs: Mapping[str, bytes]) -> bool:
    """Whether every key of ``blobs`` is already known to be the SHA-256 of its bytes."""
    return isinstance(blobs, VerifiedBlobs)
