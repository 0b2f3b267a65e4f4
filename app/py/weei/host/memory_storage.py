"""In-memory Storage and KeyValue ports for CPython hosts and tests.

Values are deep-copied on the way in and out, as IndexedDB's structured
clone does, so a caller can never change what is stored by mutating what
it handed over or got back. An optional quota makes ``put`` refuse, as a
full IndexedDB does (QuotaExceededError), once the stored bytes would pass it.
"""

from __future__ import annotations

import json
from typing import Any

from ..api.ports import STORAGE_QUOTA_EXCEEDED, StorageError
from ..core.jsonclone import clone_json

__all__ = ["MemoryStorage", "MemoryKeyValue", "stored_size"]


def stored_size(value: Any) -> int:
    """About how many bytes ``value`` takes in storage: its bytes in full, everything else as JSON text."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return len(value)
    if isinstance(value, dict):
        return sum(len(str(k)) + stored_size(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return sum(stored_size(v) for v in value)
    return len(json.dumps(value))


class MemoryStorage:
    def __init__(self, quota_bytes: int | None = None) -> None:
        self._stores: dict[str, dict[str, Any]] = {}
        self.quota_bytes = quota_bytes
        self.puts = 0

    async def put(self, store: str, key: str, value: Any) -> None:
        if self.quota_bytes is not None:
            old = self._stores.get(store, {}).get(key)
            after = self.size() - (stored_size(old) if old is not None else 0) + stored_size(value)
            if after > self.quota_bytes:
                raise StorageError(STORAGE_QUOTA_EXCEEDED, f"QuotaExceededError: {store}/{key} does not fit "
                                   f"({after} of {self.quota_bytes} bytes)")
        self._stores.setdefault(store, {})[key] = clone_json(value)
        self.puts += 1

    async def get(self, store: str, key: str) -> Any:
        return clone_json(self._stores.get(store, {}).get(key))

    async def delete(self, store: str, key: str) -> None:
        self._stores.get(store, {}).pop(key, None)

    async def keys(self, store: str) -> list[str]:
        return sorted(self._stores.get(store, {}))

    def size(self, store: str | None = None) -> int:
        """Bytes held (by :func:`stored_size`), in one store or in all."""
        stores = [self._stores.get(store, {})] if store is not None else list(self._stores.values())
        return sum(stored_size(v) for s in stores for v in s.values())


class MemoryKeyValue:
    def __init__(self) -> None:
        self.values: dict[str, str] = {}
        self.sets = 0

    def get(self, key: str) -> str | None:
        return self.values.get(key)

    def set(self, key: str, value: str) -> None:
        self.values[key] = value
        self.sets += 1
