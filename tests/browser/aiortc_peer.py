"""A peer of the browser tests that speaks Weei's protocol from this process, over real WebRTC (aiortc).

It joins a room of the test's ``weei serve`` through the signaling server,
on an asyncio loop in a thread of its own (Playwright's sync API holds the
test's thread). Subclasses are the ``AgentTransport`` receiver: they answer
``peer_connected``, ``peer_disconnected`` and ``on_peer_message`` with whatever the
test needs a peer to do (lie, refuse, prove nothing).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

__all__ = ["ThreadedPeer"]


class ThreadedPeer:
    """Connects and joins ``room`` at once; ``joined`` is set when it is in (or ``error`` says why not)."""

    def __init__(self, server: str, room: str) -> None:
        self.server, self.room = server, room
        self.peer_id: str | None = None
        self.error: BaseException | None = None
        self.joined = threading.Event()
        self.loop = asyncio.new_event_loop()
        self.transport: Any = None
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop)

    def has(self, sha256: str, size: int) -> bool:
        """Whether this peer holds an artifact (the transport asks before it fetches one)."""
        return False

    def failed(self, exc: BaseException) -> None:
        """Joining failed (``error`` is set, ``joined`` is about to be)."""

    async def _start(self) -> None:
        from weei.agent.transport import AgentTransport
        from weei.agent.signaling_client import SignalingClient

        try:
            self.transport = AgentTransport(SignalingClient(self.server))
            self.peer_id = (await self.transport.connect()).peer_id
            self.transport.attach(self, has=self.has)
            await self.transport.join(self.room)
        except BaseException as exc:
            self.error = exc
            self.failed(exc)
        self.joined.set()

    async def peer_disconnected(self, peer: str) -> None:
        pass

    def close(self) -> None:
        async def stop() -> None:
            if self.transport is not None:
                await self.transport.close()
        try:
            asyncio.run_coroutine_threadsafe(stop(), self.loop).result(15)
        except Exception:  # the transport is already gone
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
