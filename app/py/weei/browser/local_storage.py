"""The controller's KeyValue port over ``localStorage`` (Pyodide).

In the host worker ``js.localStorage`` is host.js's mirror of the page's weei
keys (a Worker has no Web Storage): reads answer from it at once, and each
write is sent to the page, which writes it to its ``localStorage``.

The controller keeps its debug log here (``weei.debugLog``; a second tab's
under its namespace, ``weei-tab-N:weei.debugLog``), so it survives reloads of
this browser profile. ``localStorage`` is synchronous and small
(about 5 MB per origin): a ``set`` that does not fit (QuotaExceededError)
or a storage the browser disabled must not stop a job, so ``set`` never
raises; the failure is counted in :attr:`LocalStorageKeyValue.failures` and
reported once on the console.
"""

from __future__ import annotations

from typing import Any

import js  # type: ignore[import-not-found]
from pyodide.ffi import JsException  # type: ignore[import-not-found]

from .convert import is_nullish

__all__ = ["LocalStorageKeyValue"]


class LocalStorageKeyValue:
    """:class:`weei.api.ports.KeyValue` over ``window.localStorage``."""

    def __init__(self, storage: Any = None, prefix: str = "") -> None:
        # ``prefix``: this tab's namespace ("weei-tab-N:"; "" for the first tab), so tabs keep apart.
        self._prefix = prefix
        if storage is None:
            try:
                storage = js.localStorage
            except (AttributeError, JsException):  # disabled, or an opaque origin
                storage = None
        self._storage = None if is_nullish(storage) else storage
        self.failures = 0

    def get(self, key: str) -> str | None:
        if self._storage is None:
            return None
        try:
            value = self._storage.getItem(self._prefix + key)
        except JsException:
            return None
        return None if is_nullish(value) else str(value)

    def set(self, key: str, value: str) -> None:
        if self._storage is None:
            return
        try:
            self._storage.setItem(self._prefix + key, value)
        except JsException as exc:
            self.failures += 1
            if self.failures == 1:
                js.console.warn(f"[weei] localStorage refused {key} ({len(value)} characters): {exc}")

    def remove(self, key: str) -> None:
        if self._storage is not None:
            try:
                self._storage.removeItem(self._prefix + key)
            except JsException:
                pass
