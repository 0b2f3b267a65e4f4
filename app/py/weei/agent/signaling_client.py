"""A small asyncio client of the signaling server, for the agent and the tests.

Usage::

    async with SignalingClient("ws://host:8080/signal") as client:
        welcome = await client.connect()          # peer ID, token, ICE servers
        peers = await client.join("my-room")      # everyone in the room, self included
        await client.signal(peers[0], "offer", sdp)
        event = await client.next_event()         # Peers, Signal, ServerError or Closed

A reader task turns frames into events on a queue; :meth:`connect` and
:meth:`join` wait for their answer (or the error that refuses them), which
then does not appear as an event: events are the peer lists that follow
other peers' joins and leaves, signals, errors about our signals, and the
close. A
pinger keeps the connection inside the server's idle timeout.
:meth:`reconnect` opens a new socket with the resume token, so the peer keeps
its ID, and joins the same room again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Union

import aiohttp

from ..core.errors import UsageError, UsageReason
from ..core.wire.signaling_session import (PING, Answer, ClientReason, Closed, Peers, ServerError, SessionView, Signal,
                                       SignalingSession, Unreadable, Welcome, reason_of)
from ..server.rooms import SignalingError

__all__ = [
    "SignalingClient",
    "Welcome",
    "Peers",
    "Signal",
    "ServerError",
    "Closed",
    "Event",
]

log = logging.getLogger("weei.agent.signaling_client")

Event = Union[Peers, Signal, ServerError, Closed]


class SignalingClient(SessionView):
    """One peer's connection to the signaling server (the frames and their meaning: ``SignalingSession``)."""

    def __init__(self, url: str, *, token: str | None = None, room: str | None = None,
                 session: aiohttp.ClientSession | None = None,
                 ping_interval_s: float | None = None, timeout_s: float = 10.0) -> None:
        self.url = url
        # ``room``: the room key about to be joined, so the first hello may offer a token bound to it.
        self.protocol = SignalingSession(token, room=room)
        self._session = session
        self._own_session = session is None
        self._ping_interval = ping_interval_s
        self._timeout = timeout_s
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._events: asyncio.Queue[Event] = asyncio.Queue()
        self._pending: dict[str, asyncio.Future[Any]] = {}
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> SignalingClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def connected(self) -> bool:
        return self._ws is not None and not self._ws.closed

    async def connect(self) -> Welcome:
        """Open the socket and say hello (with the resume token, if any).

        Raises :class:`SignalingError` if the server refuses or closes.
        """
        if self.connected:
            raise UsageError(UsageReason.ALREADY_CONNECTED, "SignalingClient.connect: already connected")
        if self._session is None:
            self._session = aiohttp.ClientSession()
        self._ws = await self._session.ws_connect(self.url, autoping=True)
        self._tasks = [asyncio.create_task(self._read(self._ws))]
        welcome: Welcome = await self._request("hello", self.protocol.hello())
        interval = self._ping_interval if self._ping_interval is not None else self.protocol.ping_interval_s()
        self._tasks.append(asyncio.create_task(self._ping(self._ws, interval)))
        return welcome

    async def join(self, room: str) -> tuple[str, ...]:
        """Join the room of key ``room``; returns its peers (self included). Raises SignalingError if refused
        (``room-refused`` for a wrong key). Afterwards :attr:`token` is bound to this room."""
        if self.welcome is None or not self.connected:
            raise UsageError(UsageReason.NOT_CONNECTED, "SignalingClient.join: connect first")
        peers: tuple[str, ...] = await self._request("join", self.protocol.join(room))
        return peers

    async def signal(self, to: str, kind: str, payload: Any) -> None:
        """Send an offer/answer (SDP string) or a candidate (RTCIceCandidateInit dict) to ``to``."""
        await self._send(self.protocol.signal(to, kind, payload))

    async def send_raw(self, text: str) -> None:
        """Send a frame as it is (tests use it to misbehave)."""
        if self._ws is None:
            raise UsageError(UsageReason.NOT_CONNECTED, "SignalingClient.send_raw: connect first")
        await self._ws.send_str(text)

    async def next_event(self, timeout: float | None = None) -> Event:
        """The next event; raises TimeoutError after ``timeout`` seconds."""
        return await asyncio.wait_for(self._events.get(), timeout if timeout is not None else self._timeout)

    async def next_signal(self, timeout: float | None = None) -> Signal:
        """The next Signal, skipping peer lists; raises SignalingError on an error or close."""
        while True:
            event = await self.next_event(timeout)
            if isinstance(event, Signal):
                return event
            if isinstance(event, ServerError):
                raise SignalingError(reason_of(event.reason), event.message, event.refused)
            if isinstance(event, Closed):
                raise SignalingError(ClientReason.CLOSED, f"the socket closed ({event.code} {event.reason})")

    async def reconnect(self) -> Welcome:
        """Drop the socket, connect again with the token and rejoin the room."""
        await self._disconnect()
        welcome = await self.connect()
        if self.room is not None:
            await self.join(self.room)
        return welcome

    async def close(self) -> None:
        """Close the socket (and the session this client made)."""
        await self._disconnect()
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None

    # -- internals ---------------------------------------------------------

    async def _send(self, text: str) -> None:
        if self._ws is None or self._ws.closed:
            raise UsageError(UsageReason.NOT_CONNECTED, "SignalingClient: not connected")
        await self._ws.send_str(text)

    async def _request(self, kind: str, text: str) -> Any:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[kind] = future
        try:
            await self._send(text)
            return await asyncio.wait_for(future, self._timeout)
        finally:
            self._pending.pop(kind, None)
            self.protocol.pending.discard(kind)

    async def _disconnect(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if self._ws is not None:
            await self._ws.close()
            self._ws = None
        self.protocol.welcome = None

    async def _ping(self, ws: aiohttp.ClientWebSocketResponse, interval: float) -> None:
        while not ws.closed:
            await asyncio.sleep(interval)
            with contextlib.suppress(ConnectionError, RuntimeError):
                await ws.send_str(PING)

    async def _read(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        reason = ""
        while True:
            msg = await ws.receive()
            if msg.type is aiohttp.WSMsgType.TEXT:
                self._dispatch(self.protocol.on_server_message(msg.data))
            elif msg.type is aiohttp.WSMsgType.CLOSE:
                reason = str(msg.extra or "")
                break
            elif msg.type in (aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.ERROR):
                break
        self._dispatch(self.protocol.closed(ws.close_code, reason))

    def _dispatch(self, items: list[Any]) -> None:
        # An Answer goes to its request only; everything else becomes an event.
        for item in items:
            if isinstance(item, Answer):
                future = self._pending.get(item.request)
                if future is None or future.done():
                    continue
                if item.error is not None:
                    future.set_exception(SignalingError(reason_of(item.error.reason), item.error.message, item.request))
                else:
                    future.set_result(item.value)
            elif isinstance(item, Unreadable):
                log.warning("signaling: unreadable frame from the server: %s", item.detail)
            else:
                self._events.put_nowait(item)
