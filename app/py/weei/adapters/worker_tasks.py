"""Which Worker tasks wait, run and are cancelled: the bookkeeping both WorkerPools share.

A Worker runs one task at a time (a Web Worker's message loop does; its
model instance is shared by every request), so tasks for one Worker queue
on a lock. :meth:`TaskBook.cancel` marks the matching tasks: one still
waiting leaves the queue at once (its ``run`` raises ``TaskCancelled``),
one running is returned to the pool, which interrupts its Worker (an engine
interrupt in CPython, terminating the Web Worker in a browser) and then
raises ``TaskCancelled`` whatever the Worker's call ended with.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from typing import TypeVar

from ..core.errors import WeeiError
from ..api.ports import TaskCancelled

T = TypeVar("T")

__all__ = ["TaskEntry", "TaskBook"]


@dataclass(eq=False)
class TaskEntry:
    """One task submitted to a Worker."""

    index: int
    tag: str
    running: bool = False
    cancelled: bool = False
    # Done when the task is cancelled: wakes a task still waiting for its Worker.
    signal: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())

    async def outcome(self, call: Awaitable[T]) -> T:
        """Await the Worker's ``call``; once this task is cancelled, raise TaskCancelled whatever it ended with
        (an interrupted or terminated Worker fails its call, a late one may still return)."""
        try:
            result = await call
        except WeeiError:
            if self.cancelled:
                raise TaskCancelled() from None
            raise
        if self.cancelled:
            raise TaskCancelled()
        return result


class TaskBook:
    """Tasks of one pool, by Worker index."""

    def __init__(self) -> None:
        self._entries: set[TaskEntry] = set()
        self._locks: dict[int, asyncio.Lock] = {}
        self.active = 0  # tasks running now (not waiting)

    @contextlib.asynccontextmanager
    async def slot(self, index: int, tag: str) -> AsyncIterator[TaskEntry]:
        """Wait for Worker ``index``, then hold it while the body runs.

        Raises TaskCancelled when the task is cancelled while it waits.
        """
        entry = TaskEntry(index, tag)
        self._entries.add(entry)
        lock = self._locks.setdefault(index, asyncio.Lock())
        acquire = asyncio.ensure_future(lock.acquire())
        try:
            try:
                await asyncio.wait({acquire, entry.signal}, return_when=asyncio.FIRST_COMPLETED)
                if entry.cancelled:
                    raise TaskCancelled()
            except BaseException:
                if not acquire.done():
                    acquire.cancel()  # Lock.acquire gives the lock on to the next waiter
                elif not acquire.cancelled() and acquire.exception() is None:
                    lock.release()
                raise
            entry.running = True
            self.active += 1
            try:
                yield entry
            finally:
                self.active -= 1
                entry.running = False
                lock.release()
        finally:
            self._entries.discard(entry)

    def cancel(self, tag: str | None) -> list[TaskEntry]:
        """Mark the tasks of ``tag`` (all when None) cancelled; return them (the running ones need an interrupt)."""
        hit = [e for e in self._entries if not e.cancelled and (tag is None or e.tag == tag)]
        for entry in hit:
            entry.cancelled = True
            if not entry.signal.done():
                entry.signal.set_result(None)
        return hit
