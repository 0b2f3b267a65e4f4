"""A content-addressed artifact store: bytes by SHA-256, verified on the way in."""

from __future__ import annotations

import hashlib

from ..core.errors import WeeiError

__all__ = ["ArtifactStore", "ArtifactError"]


class ArtifactError(WeeiError):
    """An artifact is missing or its bytes do not match its hash or size."""


class ArtifactStore:
    """In-memory artifacts keyed by SHA-256 (lowercase hex)."""

    def __init__(self) -> None:
        self._items: dict[str, bytes] = {}

    def put(self, data: bytes, sha256: str | None = None, size: int | None = None) -> str:
        """Store ``data``; with ``sha256``/``size``, refuse bytes that do not match.

        Returns the SHA-256. Raises ArtifactError ('hash-mismatch', 'wrong-size').
        """
        if size is not None and len(data) != size:
            raise ArtifactError("wrong-size", f"artifact is {len(data)} bytes, {size} were announced")
        digest = hashlib.sha256(data).hexdigest()
        if sha256 is not None and digest != sha256:
            raise ArtifactError("hash-mismatch", f"artifact bytes hash to {digest[:12]}…, not {sha256[:12]}…")
        self._items[digest] = bytes(data)
        return digest

    def get(self, sha256: str) -> bytes:
        """Raises ArtifactError('missing-artifact') when absent."""
        try:
            return self._items[sha256]
        except KeyError:
            raise ArtifactError("missing-artifact", f"artifact {sha256[:12]}… is not here") from None

    def __contains__(self, sha256: object) -> bool:
        return sha256 in self._items

    def hashes(self) -> tuple[str, ...]:
        return tuple(self._items)
