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

:meth:`connect` says ``hello`` with the resume token kept in a
:class:`TokenStore`: the page keeps it with its job, in the tab's storage
namespace of ``localStorage`` (``page_main``), so a reload and a closed and
reopened tab keep the peer ID their saved job and its participants know
(issue 24); the default, ``sessionStorage``, keeps it for a reload only. It
returns the welcome; :meth:`join` joins a room and returns its first peer
list. After the socket closes (a server restart, a network hiccup) the client
reconnects by itself after 1, 2, 4 … (at most 30) seconds, with the token,
and joins the same room again; the ``Peers`` of that join tells the
transport who is there now. A ``4001 replaced`` close means another tab
resumed our ID (a duplicated tab copies ``sessionStorage``; two open tabs
never share a storage namespace): the token is dropped and the reconnection
takes a fresh ID rather than fight over it.
A pinger sends the app-level ``ping`` every ``limits.idleTimeout / 3``
seconds (pages cannot send WebSocket pings).

:meth:`signal` is synchronous and best-effort: without an open socket the
signal is dropped (and counted); peer connections recover through the
re-offer of docs/peers.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any, Protocol

import js  # type: ignore[import-not-found]
from pyodide.ffi import create_proxy, to_js  # type: ignore[import-not-found]

from weei.core.errors import WeeiError
from weei.core.wire.signaling_session import (PING, Answer, ClientReason, Closed, Peers, Reason, ServerError, SessionView,
                                          Signal, SignalingEvent, SignalingSession, Unreadable, Welcome, reason_of)

__all__ = [
    "BrowserSignaling",
    "SignalingRefused",
    "TokenStore",
    "SessionStorageTokens",
    "KeyValueTokens",
    "Welcome",
    "Peers",
    "Signal",
    "ServerError",
    "Closed",
    "SignalingEvent",
    "signal_url",
    "detach",
    "TOKEN_KEY",
]

log = logging.getLogger("weei.browser.signaling")

TOKEN_KEY = "weei.signal.token"
_BACKOFF_MAX_S = 30.0


class SignalingRefused(WeeiError):
    """The server refused a request (``reason`` is its reason code), or the socket went away meanwhile."""

    reasons = (Reason, ClientReason)


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


class KeyValueTokens:
    """A :class:`TokenStore` over the controller's KeyValue (``LocalStorageKeyValue`` under the tab's namespace):
    the token outlives the tab, as the job saved beside it in the namespace's IndexedDB does."""

    def __init__(self, kv: Any) -> None:
        self.kv = kv

    def get(self, key: str) -> str | None:
        value = self.kv.get(key)
        return value if isinstance(value, str) and value else None

    def set(self, key: str, value: str | None) -> None:
        if value is None:
            self.kv.remove(key)
        else:
            self.kv.set(key, value)


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
        proxies, self.proxies = self.proxies, []
        detach([(self.ws, ("onopen", "onmessage", "onclose", "onerror"))], proxies)


def detach(targets: list[tuple[Any, tuple[str, ...]]], proxies: list[Any]) -> None:
    """Clear the named handlers of each JS object, then destroy ``proxies`` a tick later: the proxy running
    right now (an onclose) must not be destroyed under itself."""
    for target, names in targets:
        for name in names:
            with contextlib.suppress(Exception):
                setattr(target, name, None)
    asyncio.get_event_loop().call_soon(_destroy_all, proxies)


def _destroy_all(proxies: list[Any]) -> None:
    for proxy in proxies:
        with contextlib.suppress(Exception):
            proxy.destroy()


class BrowserSignaling(SessionView):
    """docs/signaling.md from the page (frames and their meaning: ``SignalingSession``); see the module docstring."""

    def __init__(self, url: str, *, tokens: TokenStore | None = None, token_key: str = TOKEN_KEY,
                 backoff_max_s: float = _BACKOFF_MAX_S, room: str | None = None) -> None:
        self.url = url
        self.tokens: TokenStore = tokens if tokens is not None else SessionStorageTokens()
        self.token_key = token_key
        self.backoff_max_s = backoff_max_s
        # ``room``: the room key the page will join, so the first hello may offer the token bound to it.
        self.protocol = SignalingSession(self.tokens.get(token_key), answers_are_events=True, room=room)
        self._saved_token = self.protocol.token
        self.dropped_signals = 0
        self.reconnects = 0
        self._sock: _Socket | None = None
        self._events: asyncio.Queue[SignalingEvent] = asyncio.Queue()
        self._waiters: dict[str, asyncio.Future[Any]] = {}
        self._reconnector: asyncio.Task[None] | None = None
        self._pinger: asyncio.Task[None] | None = None
        self._closing = False

    @property
    def connected(self) -> bool:
        return self._sock is not None and self._sock.open and not self._sock.gone

    # ------------------------------------------------------------------ public

    async def connect(self, timeout: float = 15.0) -> Welcome:
        """Open the socket and say hello (with the saved token). Raises SignalingRefused/TimeoutError."""
        self._closing = False
        try:
            welcome: Welcome = await self._dial(timeout)
        except SignalingRefused as exc:
            # A socket refused before its upgrade closes with no reason a page can read (1006, ""): ask why.
            if exc.reason == ClientReason.CLOSED and await self._origin_refused():
                page = str(js.location.origin)
                server = str(js.URL.new(self.url).host)
                raise SignalingRefused(ClientReason.ORIGIN_NOT_ALLOWED, (
                    f"the Weei server {server} does not let pages of {page} use its signaling (origin-not-allowed); "
                    f"its operator allows them with: weei serve --allow-origin {page}")) from None
            raise
        if self._pinger is None:
            self._pinger = asyncio.ensure_future(self._ping_loop())
        return welcome

    async def join(self, room: str, timeout: float = 15.0) -> tuple[str, ...]:
        """Join ``room``; returns its peers (self included). Raises SignalingRefused (``room-full``...)."""
        return await self._request("join", self.protocol.join(room), timeout)

    def signal(self, to: str, kind: str, payload: Any) -> bool:
        """Send a ``signal`` now; False (and counted) when there is no open socket."""
        if self._send(self.protocol.signal(to, kind, payload)):
            return True
        self.dropped_signals += 1
        return False

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
        self._dispatch(self.protocol.closed(None, "the signaling client was closed"), queue=False)

    # --------------------------------------------------------------- socket

    async def _dial(self, timeout: float) -> Any:
        old = self._sock
        if old is not None and not old.gone:
            old.gone = True
            old.release()
            with contextlib.suppress(Exception):
                old.ws.close(1000, "redial")
        waiter = self._waiter("hello")
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
            self.protocol.token = self._saved_token = self.tokens.get(self.token_key)
            self._send(self.protocol.hello())

        def on_message(event: Any) -> None:
            data = event.data
            if isinstance(data, str):
                self._dispatch(self.protocol.on_server_message(data))

        def on_close(event: Any) -> None:
            if sock.gone:
                return
            sock.gone = True
            sock.release()
            if self._sock is sock:
                self._sock = None
            reconnecting = not self._closing and self.room is not None
            self._dispatch(self.protocol.closed(int(event.code), str(event.reason), reconnecting=reconnecting))
            if reconnecting and self._reconnector is None:
                self._reconnector = asyncio.ensure_future(self._reconnect())

        sock.ws.onopen = guarded(on_open)
        sock.ws.onmessage = guarded(on_message)
        sock.ws.onclose = guarded(on_close)
        sock.ws.onerror = guarded(lambda _e: None)  # a close event always follows
        return await asyncio.wait_for(asyncio.shield(waiter), timeout)

    async def _origin_refused(self, timeout: float = 5.0) -> bool:
        """Whether the signaling URL, asked over HTTP, answers ``403 origin-not-allowed`` to this page (the
        server's error responses carry ``Access-Control-Allow-Origin: *``, so the page may read them)."""
        url = js.URL.new(self.url)
        url.protocol = "https:" if url.protocol == "wss:" else "http:"
        try:
            response = await asyncio.wait_for(js.fetch(str(url.href), to_js({"cache": "no-store"})), timeout)
            if int(response.status) != 403:
                return False
            body = await asyncio.wait_for(response.text(), timeout)
        except Exception:  # unreachable, or not our server: the socket's own error stands
            return False
        return str(body)[:100].strip() == "origin-not-allowed"

    def _send(self, text: str) -> bool:
        sock = self._sock
        if sock is None or not sock.open or sock.gone:
            return False
        try:
            sock.ws.send(text)
        except Exception as exc:  # CLOSING/CLOSED between our check and the send
            log.warning("signaling send failed: %s", exc)
            return False
        return True

    def _dispatch(self, items: list[Any], *, queue: bool = True) -> None:
        if self.protocol.token != self._saved_token:  # a welcome set it, or 4001 replaced dropped it
            self._saved_token = self.protocol.token
            self.tokens.set(self.token_key, self._saved_token)
        for item in items:
            if isinstance(item, Answer):
                waiter = self._waiters.pop(item.request, None)
                if waiter is None or waiter.done():
                    continue
                if item.error is not None:
                    waiter.set_exception(SignalingRefused(reason_of(item.error.reason), item.error.message))
                else:
                    waiter.set_result(item.value)
            elif isinstance(item, Unreadable):
                log.warning("signaling: unreadable frame from the server: %s", item.detail)
            elif queue:
                self._events.put_nowait(item)
            if isinstance(item, Closed):  # a request not yet sent (the socket never opened) fails too
                for waiter in self._waiters.values():
                    if not waiter.done():
                        waiter.set_exception(SignalingRefused(ClientReason.CLOSED, f"signaling socket closed ({item.reason})"))
                self._waiters.clear()

    def _waiter(self, request: str) -> asyncio.Future[Any]:
        waiter: asyncio.Future[Any] = asyncio.get_event_loop().create_future()
        self._waiters[request] = waiter
        return waiter

    async def _request(self, request: str, text: str, timeout: float) -> Any:
        waiter = self._waiter(request)
        if not self._send(text):
            self._waiters.pop(request, None)
            self.protocol.pending.discard(request)
            raise SignalingRefused(ClientReason.DISCONNECTED, "no open signaling socket")
        return await asyncio.wait_for(asyncio.shield(waiter), timeout)

    async def _reconnect(self) -> None:
        delay = 1.0
        try:
            while not self._closing:
                await asyncio.sleep(delay)
                delay = min(self.backoff_max_s, delay * 2)
                try:
                    await self._dial(15.0)
                    if self.room is not None:
                        await self.join(self.room)
                except Exception as exc:  # refused, timed out, js.WebSocket.new refusing the URL...
                    log.warning("signaling reconnect failed: %s", exc)
                    continue
                self.reconnects += 1
                return
        finally:
            if self._reconnector is asyncio.current_task():
                self._reconnector = None

    async def _ping_loop(self) -> None:
        while not self._closing:
            await asyncio.sleep(self.protocol.ping_interval_s())
            self._send(PING)
