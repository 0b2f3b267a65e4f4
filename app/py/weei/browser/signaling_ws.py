"""The signaling client of the page: docs/signaling.md over the browser's ``WebSocket`` (Pyodide only).

Theory of operation
-------------------
:class:`BrowserSignaling` owns one ``js.WebSocket`` at a time and the four
handler proxies it gave it (``onopen``/``onmessage``/``onclose``/
``onerror``); when a socket is gone its handlers are detached and its proxies
destroyed. Server frames become events on an asyncio queue
(:meth:`BrowserSignaling.next_event`), in arrival order:

* :class:`Welcome` after every ``welcome`` (the first one and each one after a
  reconnection: the peer ID may have changed, e.g. after ``4001 replaced``);
* :class:`Peers` for every ``peers`` list, the ``join`` confirmation included;
* :class:`Signal` for relayed offers, answers and candidates;
* :class:`ServerError` for refused frames; :class:`Closed` when a socket closes.

:meth:`connect` says ``hello`` with the resume token kept in
``sessionStorage`` (a reload keeps the peer ID; a new tab gets a new one) and
returns the welcome; :meth:`join` joins a room and returns its first peer
list. After the socket closes (a server restart, a network hiccup) the client
reconnects by itself after 1, 2, 4 … (at most 30) seconds, with the token,
and joins the same room again; the ``Peers`` of that join tells the
transport who is there now. A ``4001 replaced`` close means another tab
resumed our ID (a duplicated tab copies ``sessionStorage``): the token is
dropped and the reconnection takes a fresh ID rather than fight over it.
A pinger sends the app-level ``ping`` every ``limits.idleTimeout / 3``
seconds (pages cannot send WebSocket pings).

:meth:`signal` is synchronous and best-effort: without an open socket the
signal is dropped (and counted); peer connections recover through the
re-offer of docs/peers.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import dataclass, field
from typing import Any, Protocol, Union

import js  # type: ignore[import-not-found]
from pyodide.ffi import create_proxy  # type: ignore[import-not-found]

from weei.core.errors import WeeiError

__all__ = [
    "BrowserSignaling",
    "SignalingRefused",
    "TokenStore",
    "SessionStorageTokens",
    "Welcome",
    "Peers",
    "Signal",
    "ServerError",
    "Closed",
    "SignalingEvent",
    "signal_url",
    "TOKEN_KEY",
]

log = logging.getLogger("weei.browser.signaling")

TOKEN_KEY = "weei.signal.token"
_BACKOFF_MAX_S = 30.0
_DEFAULT_IDLE_TIMEOUT_S = 300.0
_REPLACED = 4001


class SignalingRefused(WeeiError):
    """The server refused a request (``reason`` is its reason code), or the socket went away meanwhile."""


@dataclass(frozen=True)
class Welcome:
    peer_id: str
    token: str
    resumed: bool
    ice_servers: tuple[dict[str, Any], ...]
    limits: dict[str, Any]


@dataclass(frozen=True)
class Peers:
    room: str
    peers: tuple[str, ...]  # join order, self included


@dataclass(frozen=True)
class Signal:
    sender: str
    kind: str  # offer | answer | candidate
    payload: Any  # SDP text, or an RTCIceCandidateInit dict


@dataclass(frozen=True)
class ServerError:
    reason: str
    message: str
    refused: str | None = None


@dataclass(frozen=True)
class Closed:
    code: int
    reason: str
    reconnecting: bool


SignalingEvent = Union[Welcome, Peers, Signal, ServerError, Closed]


class TokenStore(Protocol):
    """Where the resume token lives between page loads."""

    def get(self, key: str) -> str | None: ...

    def set(self, key: str, value: str | None) -> None: ...


class SessionStorageTokens:
    """The page's ``sessionStorage`` (per tab; survives reloads). Silently does nothing where there is none."""

    def get(self, key: str) -> str | None:
        try:
            value = js.sessionStorage.getItem(key)
        except Exception:  # no sessionStorage (a Worker) or storage disabled
            return None
        return value if isinstance(value, str) else None

    def set(self, key: str, value: str | None) -> None:
        with contextlib.suppress(Exception):
            if value is None:
                js.sessionStorage.removeItem(key)
            else:
                js.sessionStorage.setItem(key, value)


def signal_url(base_url: str, path: str = "/signal") -> str:
    """The WebSocket URL of the signaling endpoint on the origin of ``base_url`` (http → ws, https → wss)."""
    url = js.URL.new(path, base_url)
    url.protocol = "wss:" if url.protocol == "https:" else "ws:"
    return str(url.href)


@dataclass
class _Socket:
    """One WebSocket and the proxies it holds (destroyed together)."""

    ws: Any
    proxies: list[Any] = field(default_factory=list)
    open: bool = False
    gone: bool = False

    def release(self) -> None:
        for name in ("onopen", "onmessage", "onclose", "onerror"):
            with contextlib.suppress(Exception):
                setattr(self.ws, name, None)
        proxies, self.proxies = self.proxies, []
        # Deferred: the proxy running right now (onclose) must not be destroyed under itself.
        asyncio.get_event_loop().call_soon(_destroy_all, proxies)


def _destroy_all(proxies: list[Any]) -> None:
    for proxy in proxies:
        with contextlib.suppress(Exception):
            proxy.destroy()


class BrowserSignaling:
    """docs/signaling.md from the page; see the module docstring."""

    def __init__(self, url: str, *, tokens: TokenStore | None = None, token_key: str = TOKEN_KEY,
                 backoff_max_s: float = _BACKOFF_MAX_S) -> None:
        self.url = url
        self.tokens: TokenStore = tokens if tokens is not None else SessionStorageTokens()
        self.token_key = token_key
        self.backoff_max_s = backoff_max_s
        self.welcome: Welcome | None = None
        self.room: str | None = None
        self.peers: tuple[str, ...] = ()
        self.dropped_signals = 0
        self.reconnects = 0
        self._sock: _Socket | None = None
        self._events: asyncio.Queue[SignalingEvent] = asyncio.Queue()
        self._welcome_wait: asyncio.Future[Welcome] | None = None
        self._join_wait: asyncio.Future[tuple[str, ...]] | None = None
        self._reconnector: asyncio.Task[None] | None = None
        self._pinger: asyncio.Task[None] | None = None
        self._closing = False

    @property
    def peer_id(self) -> str | None:
        return self.welcome.peer_id if self.welcome is not None else None

    @property
    def connected(self) -> bool:
        return self._sock is not None and self._sock.open and not self._sock.gone

    # ------------------------------------------------------------------ public

    async def connect(self, timeout: float = 15.0) -> Welcome:
        """Open the socket and say hello (with the saved token). Raises SignalingRefused/TimeoutError."""
        self._closing = False
        welcome = await self._dial(timeout)
        if self._pinger is None:
            self._pinger = asyncio.ensure_future(self._ping_loop())
        return welcome

    async def join(self, room: str, timeout: float = 15.0) -> tuple[str, ...]:
        """Join ``room``; returns its peers (self included). Raises SignalingRefused (``room-full``...)."""
        self.room = room
        return await self._join(timeout)

    def signal(self, to: str, kind: str, payload: Any) -> bool:
        """Send a ``signal`` now; False (and counted) when there is no open socket."""
        return self._send({"type": "signal", "to": to, "kind": kind, "payload": payload})

    async def next_event(self, timeout: float | None = None) -> SignalingEvent:
        """The next event (see the module docstring). Raises TimeoutError after ``timeout`` seconds."""
        if timeout is None:
            return await self._events.get()
        return await asyncio.wait_for(self._events.get(), timeout)

    def close(self) -> None:
        """Close the socket for good: no reconnection, tasks stopped, proxies destroyed."""
        self._closing = True
        for task in (self._reconnector, self._pinger):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        self._reconnector = self._pinger = None
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.gone = True
            sock.release()
            with contextlib.suppress(Exception):
                sock.ws.close(1000, "bye")
        self._fail_waiters("closed", "the signaling client was closed")

    # --------------------------------------------------------------- socket

    async def _dial(self, timeout: float) -> Welcome:
        old = self._sock
        if old is not None and not old.gone:
            old.gone = True
            old.release()
            with contextlib.suppress(Exception):
                old.ws.close(1000, "redial")
        loop = asyncio.get_event_loop()
        self._welcome_wait = loop.create_future()
        sock = _Socket(js.WebSocket.new(self.url))
        self._sock = sock

        def guarded(fn: Any) -> Any:
            def handler(event: Any) -> None:
                if sock.gone and fn is not on_close:
                    return
                try:
                    fn(event)
                except Exception:  # a handler must never throw into the page
                    log.exception("signaling handler failed")
            proxy = create_proxy(handler)
            sock.proxies.append(proxy)
            return proxy

        def on_open(_event: Any) -> None:
            sock.open = True
            hello: dict[str, Any] = {"type": "hello", "version": 1}
            token = self.tokens.get(self.token_key)
            if token:
                hello["token"] = token
            self._send(hello)

        def on_message(event: Any) -> None:
            data = event.data
            if isinstance(data, str):
                self._on_frame(data)

        def on_close(event: Any) -> None:
            if sock.gone:
                return
            sock.gone = True
            sock.release()
            if self._sock is sock:
                self._sock = None
            code, reason = int(event.code), str(event.reason)
            if code == _REPLACED:  # another tab resumed our ID: take a fresh one rather than fight
                self.tokens.set(self.token_key, None)
            self._fail_waiters("disconnected", f"signaling socket closed ({code} {reason})")
            reconnecting = not self._closing and self.room is not None
            self._events.put_nowait(Closed(code, reason, reconnecting))
            if reconnecting and self._reconnector is None:
                self._reconnector = asyncio.ensure_future(self._reconnect())

        sock.ws.onopen = guarded(on_open)
        sock.ws.onmessage = guarded(on_message)
        sock.ws.onclose = guarded(on_close)
        sock.ws.onerror = guarded(lambda _e: None)  # a close event always follows
        return await asyncio.wait_for(asyncio.shield(self._welcome_wait), timeout)

    def _send(self, obj: dict[str, Any]) -> bool:
        sock = self._sock
        if sock is None or not sock.open or sock.gone:
            if obj.get("type") == "signal":
                self.dropped_signals += 1
            return False
        try:
            sock.ws.send(json.dumps(obj, separators=(",", ":")))
        except Exception as exc:  # CLOSING/CLOSED between our check and the send
            log.warning("signaling send failed: %s", exc)
            return False
        return True

    def _on_frame(self, text: str) -> None:
        try:
            msg = json.loads(text)
            kind = msg["type"]
        except (ValueError, KeyError, TypeError):
            log.warning("signaling: unreadable frame from the server")
            return
        if kind == "welcome":
            welcome = Welcome(str(msg["peerId"]), str(msg["token"]), bool(msg.get("resumed")),
                              tuple(msg.get("iceServers") or ()), dict(msg.get("limits") or {}))
            self.welcome = welcome
            self.tokens.set(self.token_key, welcome.token)
            _resolve(self._welcome_wait, welcome)
            self._events.put_nowait(welcome)
        elif kind == "peers":
            self.peers = tuple(str(p) for p in msg.get("peers", ()))
            _resolve(self._join_wait, self.peers)
            self._events.put_nowait(Peers(str(msg.get("room", "")), self.peers))
        elif kind == "signal":
            self._events.put_nowait(Signal(str(msg["from"]), str(msg["kind"]), msg.get("payload")))
        elif kind == "error":
            error = ServerError(str(msg.get("reason", "")), str(msg.get("message", "")), msg.get("refused"))
            waiter = self._join_wait if error.refused == "join" else (
                self._welcome_wait if error.refused == "hello" else None)
            if waiter is not None and not waiter.done():
                waiter.set_exception(SignalingRefused(error.reason, error.message))
            else:
                self._events.put_nowait(error)
        # 'pong' needs nothing: the idle timer was reset by our ping.

    def _fail_waiters(self, reason: str, message: str) -> None:
        for waiter in (self._welcome_wait, self._join_wait):
            if waiter is not None and not waiter.done():
                waiter.set_exception(SignalingRefused(reason, message))

    async def _join(self, timeout: float) -> tuple[str, ...]:
        self._join_wait = asyncio.get_event_loop().create_future()
        if not self._send({"type": "join", "room": self.room}):
            raise SignalingRefused("disconnected", "no open signaling socket")
        return await asyncio.wait_for(asyncio.shield(self._join_wait), timeout)

    async def _reconnect(self) -> None:
        delay = 1.0
        try:
            while not self._closing:
                await asyncio.sleep(delay)
                delay = min(self.backoff_max_s, delay * 2)
                try:
                    await self._dial(15.0)
                    if self.room is not None:
                        await self._join(15.0)
                except (SignalingRefused, asyncio.TimeoutError, TimeoutError) as exc:
                    log.warning("signaling reconnect failed: %s", exc)
                    continue
                except Exception as exc:  # js.WebSocket.new refusing the URL, etc.
                    log.warning("signaling reconnect failed: %s", exc)
                    continue
                self.reconnects += 1
                return
        finally:
            if self._reconnector is asyncio.current_task():
                self._reconnector = None

    async def _ping_loop(self) -> None:
        while not self._closing:
            idle = _DEFAULT_IDLE_TIMEOUT_S
            if self.welcome is not None:
                with contextlib.suppress(TypeError, ValueError):
                    idle = float(self.welcome.limits.get("idleTimeout", idle))
            await asyncio.sleep(max(1.0, idle / 3))
            self._send({"type": "ping"})


def _resolve(waiter: asyncio.Future[Any] | None, value: Any) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(value)
