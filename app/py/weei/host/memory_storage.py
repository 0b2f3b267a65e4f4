"""In-memory Storage and KeyValue ports for CPython hosts and tests.

Values are deep-copied on the way in and out, as IndexedDB's structured
clone does, so a caller can never change what is stored by mutating what
it handed over or got back.
"""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["MemoryStorage", "MemoryKeyValue"]


class MemoryStorage:
    def __init__(self) -> None:
        self._stores: dict[str, dict[str, Any]] = {}
        self.puts = 0

    async def put(self, store: str, key: str, value: Any) -> None:
        self._stores.setdefault(store, {})[key] = copy.deepcopy(value)
        self.puts += 1

    async def get(self, store: str, key: str) -> Any:
        return copy.deepcopy(self._stores.get(store, {}).get(key))

    async def delete(self, store: str, key: str) -> None:
        self._stores.get(store, {}).pop(key, None)

    async def keys(self, store: str) -> list[str]:
        return sorted(self._stores.get(store, {}))


class MemoryKeyValue:
    def __init__(self) -> None:
        self.values: dict[str, str] = {}

    def get(self, key: str) -> str | None:
        return self.values.get(key)

    def set(self, key: str, value: str) -> None:
        self.values[key] = value
