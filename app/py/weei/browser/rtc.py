"""The page's Transport port: WebRTC data channels, from Python through JS interop (Pyodide only).

Theory of operation
-------------------
The browser twin of ``weei.agent.transport`` and docs/peers.md to the
letter. One :class:`BrowserTransport` holds a :class:`BrowserSignaling` and
one :class:`_Link` per other peer in the room: a JS ``RTCPeerConnection``,
its ``weei`` data channel and, once the channel is open, the sans-I/O framing
of docs/wire.md for it (``FrameWriter`` + ``SendQueue`` out, ``FrameReader``
in; a new channel gets new ones).

* One events task reads signaling in order and under a lock: ``peers`` lists
  make the lower-ID peer offer (and tear down links to peers that left);
  ``offer``/``answer``/``candidate`` signals drive the peer connections.
  Trickle ICE both ways: our candidates are signalled once our SDP is out
  (never before it, or the other side would drop them); the other side's are
  kept until its description is set.
* ``send`` (synchronous, the controller's port) enqueues on the link's
  writer and pumps frames while ``bufferedAmount`` is under the 4 MiB mark;
  ``bufferedamountlow`` (threshold 1 MiB) pumps again.
* Received frames go to the reader. ``peer_connected``, complete messages
  (attachments verified) and ``peer_disconnected`` go through a per-peer
  asyncio queue, drained by one task per peer while it has items, so each
  peer's events reach the receiver in arrival order and a slow receiver
  never blocks the JS event handlers.
* Every 5 s the readers expire stalled transfers. Progress and refusals go to
  a ``TransferBook``; :meth:`BrowserTransport.transfers_state` is the
  ``{transfers, transferErrors}`` of ``getState()``.

Ownership (CONVENTIONS 9): every proxy handed to JS (the peer connection's
and the channel's event handlers) belongs to its link; tearing the link down
detaches the handlers, closes the peer connection and destroys the proxies.
:meth:`BrowserTransport.close` tears down every link and the signaling
client. A handler never raises into JS: failures are logged.

Refusals without an artifact to name (a broken channel, a refused message)
are kept in ``transferErrors`` too, under ``"channel:<peerId>"`` and
``"message:<peerId>"``, so the page shows why a peer was cut off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import js  # type: ignore[import-not-found]
from pyodide.ffi import create_proxy  # type: ignore[import-not-found]

from weei.core.commands import Send
from weei.core.framing import (ChannelBroken, FrameError, FrameReader, FrameWriter, MessageReceived, SendQueue,
                               TransferFailed)
from weei.core.messages import Message
from weei.core.transfers import TransferBook

from .convert import from_js_value, is_nullish, to_js_value
from .engine import to_uint8array
from .signaling_ws import BrowserSignaling, Closed, Peers, ServerError, Signal, Welcome

__all__ = ["BrowserTransport", "Receiver", "CHANNEL_LABEL", "LOW_WATER", "HIGH_WATER"]

log = logging.getLogger("weei.browser.rtc")

CHANNEL_LABEL = "weei"
LOW_WATER = 1024 * 1024
HIGH_WATER = 4 * 1024 * 1024
_RETRY_MAX_S = 30.0
_CONNECT_TIMEOUT_S = 30.0
_EXPIRE_EVERY_S = 5.0
_STALL_MS = 120_000.0
_CANDIDATE_FIELDS = ("candidate", "sdpMid", "sdpMLineIndex", "usernameFragment")
_MAX_ERRORS = 256


class Receiver(Protocol):
    """Who gets what arrives: a TrainingController, or anything shaped like one (tests)."""

    async def receive(self, peer: str, message: Message, blobs: Mapping[str, bytes]) -> None: ...

    async def peer_connected(self, peer: str) -> None: ...

    async def peer_disconnected(self, peer: str) -> None: ...


@dataclass
class _Link:
    """One peer connection and, once its channel is open, that channel's framing state and proxies."""

    peer: str
    pc: Any
    offerer: bool
    channel: Any = None
    writer: FrameWriter | None = None
    queue: SendQueue | None = None
    reader: FrameReader | None = None
    opened: bool = False
    closed: bool = False
    remote_set: bool = False
    sdp_sent: bool = False
    remote_candidates: list[dict[str, Any]] = field(default_factory=list)
    local_candidates: list[dict[str, Any]] = field(default_factory=list)
    proxies: list[Any] = field(default_factory=list)
    opened_event: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def is_open(self) -> bool:
        return self.opened and not self.closed and self.channel is not None and self.channel.readyState == "open"

    def release(self) -> None:
        """Detach every handler, close the peer connection, destroy the proxies (deferred a tick)."""
        targets = [(self.pc, ("onicecandidate", "onconnectionstatechange", "ondatachannel"))]
        if self.channel is not None:
            targets.append((self.channel, ("onopen", "onmessage", "onclose", "onerror", "onbufferedamountlow")))
        for target, names in targets:
            for name in names:
                with contextlib.suppress(Exception):
                    setattr(target, name, None)
        with contextlib.suppress(Exception):
            self.pc.close()
        proxies, self.proxies = self.proxies, []
        # The handler running now (onclose...) is among them: destroy after it returned.
        asyncio.get_event_loop().call_soon(_destroy_all, proxies)


def _destroy_all(proxies: list[Any]) -> None:
    for proxy in proxies:
        with contextlib.suppress(Exception):
            proxy.destroy()


def _now_ms() -> float:
    return time.monotonic() * 1000.0


class BrowserTransport:
    """The ``Transport`` port over the page's WebRTC. ``attach``, ``start(room)``; ``close`` at the end."""

    def __init__(self, signaling: BrowserSignaling, *, connect_timeout_s: float = _CONNECT_TIMEOUT_S,
                 on_change: Callable[[], None] | None = None) -> None:
        self.signaling = signaling
        self.connect_timeout_s = connect_timeout_s
        self.on_change = on_change
        self.peer_id: str | None = None
        self.book = TransferBook()
        self.errors: OrderedDict[str, str] = OrderedDict()  # refusals with no artifact to name
        self.dropped = 0  # sends to a peer without an open channel
        self.bytes_sent = 0
        self.bytes_received = 0
        self._ice: list[dict[str, Any]] = []
        self._receiver: Receiver | None = None
        self._has: Callable[[str], bool] | None = None
        self._links: dict[str, _Link] = {}
        self._room_peers: tuple[str, ...] = ()
        self._attempts: dict[str, int] = {}
        self._setup = asyncio.Lock()
        self._inboxes: dict[str, deque[tuple[str, Any]]] = {}
        self._drainers: dict[str, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closing = False

    # ------------------------------------------------------------------ public

    def attach(self, receiver: Receiver, has: Callable[[str], bool] | None = None) -> None:
        """Deliver to ``receiver``; ``has(sha256)`` says which artifacts it already holds (dedupe)."""
        self._receiver = receiver
        self._has = has

    async def start(self, room: str) -> str:
        """Connect to signaling (if not yet), join ``room`` and start connecting to its peers; returns our peer ID.

        Raises ``SignalingRefused`` (``room-full``, ``bad-room``...) or ``TimeoutError``.
        """
        if self.signaling.welcome is None:
            await self.signaling.connect()
        self._welcomed(self.signaling.welcome)
        await self.signaling.join(room)  # its peer list also arrives as an event
        self._spawn(self._events())
        self._spawn(self._expire())
        assert self.peer_id is not None
        return self.peer_id

    def peers(self) -> list[str]:
        """Peers with an open channel."""
        return sorted(p for p, link in self._links.items() if link.is_open)

    def send(self, send: Send, blobs: Mapping[str, bytes]) -> None:
        """Queue ``send`` for its peer; lost (and counted in ``dropped``) without an open channel."""
        link = self._links.get(send.peer)
        if link is None or not link.is_open or link.writer is None:
            self.dropped += 1
            log.info("dropped %s to %s: no open channel", send.message.TYPE, send.peer)
            return
        parts = [(ref, blobs[ref.sha256] if ref.sha256 in blobs else send.blobs[ref.sha256])
                 for ref in send.attachments]
        link.writer.enqueue(send.message, parts)
        self._pump(link)

    def transfers_state(self) -> dict[str, Any]:
        """``{"transfers": [...], "transferErrors": {id: "reason: message"}}`` for ``getState()``."""
        state = self.book.state()
        state["transferErrors"].update(self.errors)
        return state

    def describe(self) -> dict[str, str]:
        """Each link's state, for logs and test failures."""
        out = {}
        for peer, link in self._links.items():
            channel = str(link.channel.readyState) if link.channel is not None else "no-channel"
            out[peer] = "open" if link.is_open else f"{link.pc.connectionState}/{channel}"
        return out

    def close(self) -> None:
        """Close every peer connection and the signaling socket; nothing more is delivered."""
        self._closing = True
        for task in [*self._tasks, *self._drainers.values()]:
            if task is not asyncio.current_task():
                task.cancel()
        self._drainers.clear()
        self._inboxes.clear()
        for link in list(self._links.values()):
            self._teardown(link, "transport closed", retry=False)
        self.signaling.close()

    # --------------------------------------------------------------- signaling

    def _welcomed(self, welcome: Welcome | None) -> None:
        if welcome is None:
            return
        if self.peer_id is not None and welcome.peer_id != self.peer_id:
            # A fresh ID (our token was replaced): every pairing was made under the old one.
            for link in list(self._links.values()):
                self._teardown(link, "our peer ID changed", retry=False)
        self.peer_id = welcome.peer_id
        self._ice = [dict(server) for server in welcome.ice_servers]

    async def _events(self) -> None:
        while not self._closing:
            event = await self.signaling.next_event()
            try:
                async with self._setup:
                    if isinstance(event, Peers):
                        await self._on_peers(event.peers)
                    elif isinstance(event, Signal):
                        await self._on_signal(event)
                    elif isinstance(event, Welcome):
                        self._welcomed(event)
                    elif isinstance(event, ServerError):
                        log.warning("signaling refused a frame: %s %s", event.reason, event.message)
                    elif isinstance(event, Closed):
                        # Open channels keep working; the client rejoins and a new Peers list follows.
                        log.warning("signaling closed (%s %s)", event.code, event.reason)
            except asyncio.CancelledError:
                raise
            except Exception:  # one bad signal must not stop the transport
                log.exception("signaling event %s failed", type(event).__name__)

    async def _on_peers(self, peers: tuple[str, ...]) -> None:
        self._room_peers = tuple(peers)
        for peer in [p for p in self._links if p not in peers]:
            self._teardown(self._links[peer], "left the room", retry=False)
        for peer in peers:
            if peer != self.peer_id and self._offers_to(peer) and peer not in self._links:
                await self._offer(peer)
        self._changed()

    def _offers_to(self, peer: str) -> bool:
        return self.peer_id is not None and self.peer_id < peer

    async def _on_signal(self, signal: Signal) -> None:
        if signal.kind == "offer":
            if isinstance(signal.payload, str):
                await self._answer(signal.sender, signal.payload)
            return
        link = self._links.get(signal.sender)
        if link is None or link.closed:
            log.info("%s from %s, which has no connection: ignored", signal.kind, signal.sender)
            return
        if signal.kind == "answer":
            if not link.offerer or link.remote_set or not isinstance(signal.payload, str):
                log.info("unexpected answer from %s: ignored", signal.sender)
                return
            await link.pc.setRemoteDescription(to_js_value({"type": "answer", "sdp": signal.payload}))
            await self._remote_set(link)
        elif signal.kind == "candidate" and isinstance(signal.payload, dict):
            init = {k: signal.payload[k] for k in _CANDIDATE_FIELDS if k in signal.payload}
            if link.remote_set:
                await self._add_candidate(link, init)
            else:
                link.remote_candidates.append(init)

    async def _remote_set(self, link: _Link) -> None:
        link.remote_set = True
        pending, link.remote_candidates = link.remote_candidates, []
        for init in pending:
            await self._add_candidate(link, init)

    @staticmethod
    async def _add_candidate(link: _Link, init: dict[str, Any]) -> None:
        try:
            await link.pc.addIceCandidate(to_js_value(init))
        except Exception as exc:  # a candidate we cannot use is not fatal: others may work
            log.info("candidate from %s refused: %s", link.peer, exc)

    def _sdp_sent(self, link: _Link) -> None:
        link.sdp_sent = True
        pending, link.local_candidates = link.local_candidates, []
        for init in pending:
            self.signaling.signal(link.peer, "candidate", init)

    # ------------------------------------------------------------ connections

    def _handler(self, link: _Link, fn: Callable[[Any], None]) -> Any:
        """A proxy owned by ``link`` that never raises into JS and is inert once the link is closed."""
        def handler(event: Any) -> None:
            if link.closed:
                return
            try:
                fn(event)
            except Exception:
                log.exception("handler for %s failed", link.peer)
        proxy = create_proxy(handler)
        link.proxies.append(proxy)
        return proxy

    def _new_link(self, peer: str, offerer: bool) -> _Link:
        pc = js.RTCPeerConnection.new(to_js_value({"iceServers": self._ice}))
        link = _Link(peer, pc, offerer)
        self._links[peer] = link

        def on_candidate(event: Any) -> None:
            candidate = event.candidate
            if is_nullish(candidate):
                init: dict[str, Any] = {"candidate": ""}  # end of gathering
            else:
                raw = from_js_value(candidate.toJSON())
                init = {k: raw[k] for k in _CANDIDATE_FIELDS if k in raw}
            if link.sdp_sent:
                self.signaling.signal(peer, "candidate", init)
            else:
                link.local_candidates.append(init)

        def on_state(_event: Any) -> None:
            state = str(pc.connectionState)
            if state in ("failed", "closed"):
                self._teardown(link, f"connection {state}")

        pc.onicecandidate = self._handler(link, on_candidate)
        pc.onconnectionstatechange = self._handler(link, on_state)
        self._spawn(self._watchdog(link))
        return link

    async def _offer(self, peer: str) -> None:
        link = self._new_link(peer, offerer=True)
        try:
            self._bind(link, link.pc.createDataChannel(CHANNEL_LABEL, to_js_value({"ordered": True})))
            offer = await link.pc.createOffer()
            await link.pc.setLocalDescription(offer)
            if link.closed:
                return
            self.signaling.signal(peer, "offer", str(link.pc.localDescription.sdp))
            self._sdp_sent(link)
        except Exception as exc:
            log.warning("offer to %s failed: %s", peer, exc)
            self._teardown(link, f"offer failed: {exc}")

    async def _answer(self, peer: str, sdp: str) -> None:
        old = self._links.get(peer)
        if old is not None:  # a restarted peer starts afresh
            self._teardown(old, "re-negotiation", retry=False)
        link = self._new_link(peer, offerer=False)

        def on_channel(event: Any) -> None:
            channel = event.channel
            if str(channel.label) != CHANNEL_LABEL or link.channel is not None:
                channel.close()
                return
            self._bind(link, channel)

        link.pc.ondatachannel = self._handler(link, on_channel)
        try:
            await link.pc.setRemoteDescription(to_js_value({"type": "offer", "sdp": sdp}))
            await self._remote_set(link)
            answer = await link.pc.createAnswer()
            await link.pc.setLocalDescription(answer)
            if link.closed:
                return
            self.signaling.signal(peer, "answer", str(link.pc.localDescription.sdp))
            self._sdp_sent(link)
        except Exception as exc:
            log.warning("answer to %s failed: %s", peer, exc)
            self._teardown(link, f"answer failed: {exc}")

    def _bind(self, link: _Link, channel: Any) -> None:
        link.channel = channel
        channel.binaryType = "arraybuffer"
        channel.bufferedAmountLowThreshold = LOW_WATER
        channel.onopen = self._handler(link, lambda _e: self._opened(link))
        channel.onmessage = self._handler(link, lambda e: self._on_frame(link, e.data))
        channel.onclose = self._handler(link, lambda _e: self._teardown(link, "channel closed"))
        channel.onerror = self._handler(link, lambda e: log.info("channel to %s: error %s", link.peer,
                                                                 getattr(e, "error", "")))
        channel.onbufferedamountlow = self._handler(link, lambda _e: self._pump(link))
        if str(channel.readyState) == "open":
            self._opened(link)

    def _opened(self, link: _Link) -> None:
        if link.opened or link.closed:
            return
        link.writer = FrameWriter(link.peer)
        link.queue = SendQueue(link.writer, high_water=HIGH_WATER, low_water=LOW_WATER)
        link.reader = FrameReader(link.peer, has=self._has)
        link.opened = True
        link.opened_event.set()
        self._attempts.pop(link.peer, None)
        self.errors.pop(f"channel:{link.peer}", None)
        log.info("data channel to %s open", link.peer)
        self._deliver(link.peer, "connected", None)
        self._changed()

    async def _watchdog(self, link: _Link) -> None:
        with contextlib.suppress(asyncio.TimeoutError, TimeoutError):
            await asyncio.wait_for(link.opened_event.wait(), self.connect_timeout_s)
            return
        if not link.opened and not link.closed:
            self._teardown(link, f"not open after {self.connect_timeout_s:.0f} s")

    def _teardown(self, link: _Link, why: str, *, retry: bool = True) -> None:
        """docs/peers.md 'Disconnection': close, fail open transfers, tell the receiver once."""
        if link.closed:
            return
        link.closed = True
        link.opened_event.set()  # ends the watchdog
        if self._links.get(link.peer) is link:
            del self._links[link.peer]
        log.info("connection to %s closed: %s", link.peer, why)
        link.release()
        if link.reader is not None:
            self._record(link.reader.close())
        if link.writer is not None:
            self._record(link.writer.take_events())
        self.book.peer_gone(link.peer)
        if not self._closing:
            if link.opened:
                self._deliver(link.peer, "disconnected", None)
            if retry and self._offers_to(link.peer) and link.peer in self._room_peers:
                self._spawn(self._retry(link.peer))
        self._changed()

    async def _retry(self, peer: str) -> None:
        attempt = self._attempts.get(peer, 0)
        self._attempts[peer] = attempt + 1
        await asyncio.sleep(min(_RETRY_MAX_S, 2.0 ** attempt))
        async with self._setup:
            if not self._closing and peer in self._room_peers and peer not in self._links:
                await self._offer(peer)

    # ------------------------------------------------------------------ frames

    def _pump(self, link: _Link) -> None:
        channel, queue = link.channel, link.queue
        if channel is None or queue is None or link.closed or str(channel.readyState) != "open":
            return
        send = channel.send
        try:
            for frame in queue.pump(int(channel.bufferedAmount), _now_ms()):
                send(to_uint8array(frame))
                self.bytes_sent += len(frame)
        except Exception as exc:  # the channel closed under us; its close event follows
            log.warning("send to %s failed: %s", link.peer, exc)
            self._teardown(link, f"send failed: {exc}")
            return
        assert link.writer is not None
        self._record(link.writer.take_events())

    def _on_frame(self, link: _Link, data: Any) -> None:
        reader = link.reader
        if link.closed or reader is None:
            return
        if isinstance(data, str):
            events: list[Any] = [ChannelBroken(link.peer, FrameError("bad-frame", "a text message on the channel"))]
        else:
            frame = data.to_bytes()
            self.bytes_received += len(frame)
            events = reader.feed(frame, _now_ms())
        for event in events:
            if isinstance(event, MessageReceived):
                self._deliver(link.peer, "message", event)
            elif isinstance(event, ChannelBroken):
                log.warning("channel from %s broken: %s", link.peer, event.error)
                self._error(f"channel:{link.peer}", event.error)
                self._teardown(link, f"channel broken: {event.error}")
            else:
                self._record([event])

    def _record(self, events: list[Any]) -> None:
        for event in events:
            if isinstance(event, TransferFailed) and event.artifact_id is None:
                self._error(f"message:{event.peer_id}", event.error)
            else:
                self.book.apply(event)

    def _error(self, key: str, error: Any) -> None:
        self.errors[key] = f"{error.reason}: {error.message}"
        self.errors.move_to_end(key)
        while len(self.errors) > _MAX_ERRORS:
            self.errors.popitem(last=False)

    # --------------------------------------------------------------- delivery

    def _deliver(self, peer: str, kind: str, item: Any) -> None:
        self._inboxes.setdefault(peer, deque()).append((kind, item))
        if peer not in self._drainers:
            self._drainers[peer] = asyncio.ensure_future(self._drain(peer))

    async def _drain(self, peer: str) -> None:
        inbox = self._inboxes[peer]
        try:
            while inbox:
                kind, item = inbox.popleft()
                receiver = self._receiver
                if receiver is None:
                    continue
                try:
                    if kind == "message":
                        await receiver.receive(peer, item.message, item.blobs)
                    elif kind == "connected":
                        hook = getattr(receiver, "peer_connected", None)
                        if hook is not None:
                            await hook(peer)
                    else:
                        await receiver.peer_disconnected(peer)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("delivering %s from %s failed", kind, peer)
                self._changed()
        finally:
            # Nothing awaited between the empty check and here: a new item starts a new drainer.
            if self._drainers.get(peer) is asyncio.current_task():
                del self._drainers[peer]
                if not inbox:
                    self._inboxes.pop(peer, None)

    async def _expire(self) -> None:
        while not self._closing:
            await asyncio.sleep(_EXPIRE_EVERY_S)
            for link in list(self._links.values()):
                if link.reader is not None and not link.closed:
                    self._record(link.reader.expire(_now_ms(), _STALL_MS))

    # ----------------------------------------------------------------- helpers

    def _changed(self) -> None:
        if self.on_change is not None:
            try:
                self.on_change()
            except Exception:
                log.exception("on_change failed")

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
