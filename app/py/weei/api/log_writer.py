"""The debug log's copy in the key-value store (localStorage in the browser), written throttled.

``localStorage`` is synchronous: rewriting the whole log (up to 1,000
events) on every drain cost the page time in every round. The copy is
written only when the log changed, at most every ``LOG_WRITE_MS``; a timer
writes what the last change left, and ``write(now=True)`` writes at once
(leave, clear, the page being hidden). What ``getDebugLog()`` returns comes
from the log in memory and does not depend on this copy.
"""

from __future__ import annotations

import asyncio
from typing import Callable

from ..core.observe.debuglog import DebugLog
from .ports import KeyValue

__all__ = ["DebugLogWriter", "DEBUG_LOG_KEY", "LOG_WRITE_MS"]

DEBUG_LOG_KEY = "weei.debugLog"
LOG_WRITE_MS = 2000


class DebugLogWriter:
    def __init__(self, log: DebugLog, kv: KeyValue, monotonic: Callable[[], float]) -> None:
        self.log = log
        self.kv = kv
        self.monotonic = monotonic
        self._revision = log.revision
        self._written_at: float | None = None
        self._pending: asyncio.TimerHandle | None = None

    def write(self, *, now: bool = False) -> None:
        """Copy the log if it changed: at once when ``now`` or LOG_WRITE_MS after the last copy, else later."""
        if self.log.revision == self._revision:
            return
        mono = self.monotonic()
        if now or self._written_at is None or mono - self._written_at >= LOG_WRITE_MS:
            if self._pending is not None:
                self._pending.cancel()
                self._pending = None
            self.kv.set(DEBUG_LOG_KEY, self.log.to_json())
            self._revision = self.log.revision
            self._written_at = mono
        elif self._pending is None:
            delay = (LOG_WRITE_MS - (mono - self._written_at)) / 1000.0

            def fire() -> None:
                self._pending = None
                self.write(now=True)

            self._pending = asyncio.get_event_loop().call_later(max(0.0, delay), fire)
