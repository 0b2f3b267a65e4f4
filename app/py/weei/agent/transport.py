"""The agent's Transport port: aiortc data channels set up through signaling.

Theory of operation
-------------------
This is the asyncio adapter of docs/peers.md. One :class:`AgentTransport`
holds the signaling client and one :class:`_Link` per other peer in the
room: an ``RTCPeerConnection``, its ``weei`` data channel and, once the
channel is open, the sans-I/O framing of docs/wire.md for it (a
``FrameWriter`` + ``SendQueue`` out, a ``FrameReader`` in).

* An events task reads signaling: ``peers`` lists make the lower-ID peer
  offer (and tear down links to peers that left); ``offer``/``answer``/
  ``candidate`` signals drive the peer connections. Session setup is
  serialised by one lock, so an answer never races a re-offer.
* ``send`` (the controller's port, synchronous) enqueues on the link's
  writer and pumps frames under the bufferedAmount watermark; the
  channel's ``bufferedamountlow`` event pumps again.
* Received frames go to the reader; complete messages (with verified
  attachments) and disconnections go, in order, through one inbox to a
  delivery task, which awaits ``receiver.receive(peer, message, blobs)`` or
  ``receiver.peer_disconnected(peer)``.
* Transfer progress from writers and readers is kept in ``book``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol

from aiortc import RTCConfiguration, RTCDataChannel, RTCIceServer, RTCPeerConnection, RTCSessionDescription
from aiortc.sdp import candidate_from_sdp

from ..core.commands import Send
from ..core.errors import WeeiError
from ..core.framing import (ChannelBroken, FrameError, FrameReader, FrameWriter, MessageReceived, SendQueue,
                            referenced_artifacts)
from ..core.messages import Message
from ..core.transfers import TransferBook
from ..server.signaling_client import Closed, Peers, ServerError, Signal, SignalingClient, Welcome

__all__ = ["AgentTransport", "Receiver", "TransferRecord", "CHANNEL_LABEL", "LOW_WATER", "HIGH_WATER"]

log = logging.getLogger("weei.agent.transport")

CHANNEL_LABEL = "weei"
LOW_WATER = 1024 * 1024
HIGH_WATER = 4 * 1024 * 1024
_RETRY_MAX_S = 30.0
_STALL_MS = 120_000.0  # a transfer with no frame for this long is dropped ('stalled')


class Receiver(Protocol):
    """Who gets what arrives (a TrainingController, or anything shaped like one)."""

    async def receive(self, peer: str, message: Message, blobs: Mapping[str, bytes]) -> None: ...

    async def peer_disconnected(self, peer: str) -> None: ...

    async def peer_connected(self, peer: str) -> None: ...


@dataclass(frozen=True)
class TransferRecord:
    """One message sent or received: the transfer log the tests (and operators) read."""

    peer: str
    direction: str  # 'send' | 'receive'
    type: str
    attachments: tuple[str, ...]  # SHA-256 of the artifacts that travelled with it
    bytes: int  # attachment bytes
    kinds: tuple[str, ...] = ()  # the artifact kind of each attachment


class _Link:
    """One peer connection and, once its channel is open, the framing state of that channel."""

    def __init__(self, peer: str, pc: RTCPeerConnection, offerer: bool) -> None:
        self.peer = peer
        self.pc = pc
        self.offerer = offerer
        self.channel: RTCDataChannel | None = None
        self.writer: FrameWriter | None = None
        self.queue: SendQueue | None = None
        self.reader: FrameReader | None = None
        self.opened = False
        self.closed = False
        self.remote_set = False
        self.pending_candidates: list[Any] = []
        self.opened_event = asyncio.Event()

    @property
    def is_open(self) -> bool:
        return self.opened and not self.closed and self.channel is not None and self.channel.readyState == "open"


class AgentTransport:
    """The ``Transport`` port over WebRTC (aiortc). ``connect``, ``attach``, ``join``; ``close`` at the end."""

    def __init__(self, signaling: SignalingClient, *, connect_timeout_s: float = 30.0,
                 on_change: Callable[[], None] | None = None) -> None:
        self.signaling = signaling
        self.connect_timeout_s = connect_timeout_s
        self.on_change = on_change
        self.peer_id: str | None = None
        self.book = TransferBook()
        self.log: list[TransferRecord] = []
        self.dropped = 0  # sends to a peer without an open channel
        self.bytes_sent = 0
        self.bytes_received = 0
        self._ice: list[RTCIceServer] = []
        self._receiver: Receiver | None = None
        self._has: Callable[[str], bool] | None = None
        self._links: dict[str, _Link] = {}
        self._room_peers: tuple[str, ...] = ()
        self._attempts: dict[str, int] = {}
        self._setup = asyncio.Lock()
        self._inbox: asyncio.Queue[tuple[str, str, Any]] = asyncio.Queue()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closers: set[asyncio.Task[Any]] = set()  # pc.close() of torn-down links: awaited, never cancelled
        self._closing = False

    # ------------------------------------------------------------------ public

    async def connect(self) -> Welcome:
        """Say hello to the signaling server; returns the welcome (our peer ID)."""
        welcome = await self.signaling.connect()
        self.peer_id = welcome.peer_id
        self._ice = [_ice_server(s) for s in welcome.ice_servers]
        return welcome

    def attach(self, receiver: Receiver, has: Callable[[str], bool] | None = None) -> None:
        """Deliver to ``receiver``; ``has(sha256)`` says which artifacts it already holds (dedupe)."""
        self._receiver = receiver
        self._has = has

    async def join(self, room: str) -> tuple[str, ...]:
        """Join ``room`` and start connecting to its peers; returns the room's peers (self included)."""
        if self.peer_id is None:
            await self.connect()
        peers = await self.signaling.join(room)
        self._spawn(self._events())
        self._spawn(self._deliver())
        self._spawn(self._expire())
        async with self._setup:
            await self._on_peers(peers)
        return peers

    def peers(self) -> list[str]:
        """Peers with an open channel."""
        return sorted(p for p, link in self._links.items() if link.is_open)

    def send(self, send: Send, blobs: Mapping[str, bytes]) -> None:
        """Queue ``send`` for its peer (the controller's port); lost if the peer has no open channel."""
        link = self._links.get(send.peer)
        if link is None or not link.is_open or link.writer is None:
            self.dropped += 1
            log.info("dropped %s to %s: no open channel", send.message.TYPE, send.peer)
            return
        parts = [(ref, blobs[ref.sha256] if ref.sha256 in blobs else send.blobs[ref.sha256])
                 for ref in send.attachments]
        link.writer.enqueue(send.message, parts)
        self.log.append(TransferRecord(send.peer, "send", send.message.TYPE, tuple(r.sha256 for r, _ in parts),
                                       sum(r.bytes for r, _ in parts), tuple(r.kind for r, _ in parts)))
        self._pump(link)

    async def wait_for_peer(self, peer: str, timeout: float) -> None:
        """Wait until ``peer`` has an open channel; raises TimeoutError naming it."""
        deadline = time.monotonic() + timeout
        while peer not in self.peers():
            if time.monotonic() > deadline:
                raise TimeoutError(f"no open data channel to peer {peer} after {timeout:.0f} s "
                                   f"(links: {self.describe()})")
            await asyncio.sleep(0.02)

    async def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every open channel has sent everything queued; False on timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            busy = [link for link in self._links.values() if link.is_open and (
                (link.writer is not None and link.writer.pending) or (link.channel and link.channel.bufferedAmount))]
            if not busy:
                return True
            await asyncio.sleep(0.02)
        return False

    def describe(self) -> dict[str, str]:
        """Each link's state, for messages and logs."""
        return {p: ("open" if link.is_open else f"{link.pc.connectionState}/"
                    f"{link.channel.readyState if link.channel else 'no-channel'}") for p, link in self._links.items()}

    def state(self) -> dict[str, Any]:
        """``{transfers, transferErrors}`` for ``getState()``."""
        return self.book.state()

    async def close(self) -> None:
        """Close every peer connection and the signaling socket; nothing more is delivered."""
        self._closing = True
        current = asyncio.current_task()
        for task in list(self._tasks):
            if task is not current:
                task.cancel()
        for task in list(self._tasks):
            if task is not current:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        links = list(self._links.values())
        self._links.clear()
        for link in links:
            link.closed = True
            if link.reader is not None:
                self.book.apply_all(link.reader.close())
        await asyncio.gather(*(link.pc.close() for link in links), *self._closers, return_exceptions=True)
        await self.signaling.close()

    # --------------------------------------------------------------- signaling

    async def _events(self) -> None:
        while True:
            try:
                event = await self.signaling.next_event(timeout=3600)
            except TimeoutError:
                continue
            try:
                if isinstance(event, Peers):
                    async with self._setup:
                        await self._on_peers(event.peers)
                elif isinstance(event, Signal):
                    async with self._setup:
                        await self._on_signal(event)
                elif isinstance(event, ServerError):
                    log.warning("signaling refused a frame: %s %s", event.reason, event.message)
                elif isinstance(event, Closed):
                    await self._resignal(event)
            except asyncio.CancelledError:
                raise
            except Exception:  # one bad signal must not stop the transport
                log.exception("signaling event %r failed", type(event).__name__)

    async def _resignal(self, event: Closed) -> None:
        """The signaling socket closed: reconnect with the token (open channels keep working)."""
        log.warning("signaling closed (%s %s); reconnecting", event.code, event.reason)
        delay = 1.0
        while not self._closing:
            await asyncio.sleep(delay)
            try:
                await self.signaling.reconnect()
            except Exception as exc:
                log.warning("signaling reconnect failed: %s", exc)
                delay = min(_RETRY_MAX_S, delay * 2)
                continue
            async with self._setup:
                await self._on_peers(self.signaling.peers)
            return

    async def _on_peers(self, peers: tuple[str, ...]) -> None:
        self._room_peers = tuple(peers)
        for peer in [p for p in self._links if p not in peers]:
            self._teardown(self._links[peer], "left the room")
        for peer in peers:
            if peer != self.peer_id and self._offers_to(peer) and peer not in self._links:
                await self._offer(peer)
        self._changed()

    def _offers_to(self, peer: str) -> bool:
        return self.peer_id is not None and self.peer_id < peer

    async def _on_signal(self, signal: Signal) -> None:
        if signal.kind == "offer":
            await self._answer(signal.sender, signal.payload)
            return
        link = self._links.get(signal.sender)
        if link is None:
            log.info("%s from %s, which has no connection: ignored", signal.kind, signal.sender)
            return
        if signal.kind == "answer":
            if not link.offerer or link.remote_set:
                log.info("unexpected answer from %s: ignored", signal.sender)
                return
            await link.pc.setRemoteDescription(RTCSessionDescription(signal.payload, "answer"))
            await self._remote_set(link)
        elif signal.kind == "candidate":
            candidate = _candidate(signal.payload)
            if link.remote_set:
                await link.pc.addIceCandidate(candidate)
            else:
                link.pending_candidates.append(candidate)

    async def _remote_set(self, link: _Link) -> None:
        link.remote_set = True
        pending, link.pending_candidates = link.pending_candidates, []
        for candidate in pending:
            await link.pc.addIceCandidate(candidate)

    # ------------------------------------------------------------ connections

    def _new_link(self, peer: str, offerer: bool) -> _Link:
        pc = RTCPeerConnection(RTCConfiguration(iceServers=list(self._ice)))
        link = _Link(peer, pc, offerer)
        self._links[peer] = link

        @pc.on("connectionstatechange")
        def on_state() -> None:
            if pc.connectionState in ("failed", "closed"):
                self._teardown(link, f"connection {pc.connectionState}")

        self._spawn(self._watchdog(link))
        return link

    async def _offer(self, peer: str) -> None:
        link = self._new_link(peer, offerer=True)
        try:
            self._bind(link, link.pc.createDataChannel(CHANNEL_LABEL, ordered=True))
            await link.pc.setLocalDescription(await link.pc.createOffer())  # returns once ICE gathering is done
            await self.signaling.signal(peer, "offer", link.pc.localDescription.sdp)
        except Exception as exc:
            log.warning("offer to %s failed: %s", peer, exc)
            self._teardown(link, f"offer failed: {exc}")

    async def _answer(self, peer: str, sdp: str) -> None:
        old = self._links.get(peer)
        if old is not None:
            self._teardown(old, "re-negotiation", retry=False)
        link = self._new_link(peer, offerer=False)

        @link.pc.on("datachannel")
        def on_channel(channel: RTCDataChannel) -> None:
            if channel.label != CHANNEL_LABEL or link.channel is not None:
                channel.close()
                return
            self._bind(link, channel)

        try:
            await link.pc.setRemoteDescription(RTCSessionDescription(sdp, "offer"))
            await self._remote_set(link)
            await link.pc.setLocalDescription(await link.pc.createAnswer())
            await self.signaling.signal(peer, "answer", link.pc.localDescription.sdp)
        except Exception as exc:
            log.warning("answer to %s failed: %s", peer, exc)
            self._teardown(link, f"answer failed: {exc}")

    def _bind(self, link: _Link, channel: RTCDataChannel) -> None:
        link.channel = channel
        channel.bufferedAmountLowThreshold = LOW_WATER

        @channel.on("open")
        def on_open() -> None:
            self._opened(link)

        @channel.on("message")
        def on_message(data: bytes | str) -> None:
            self._on_frame(link, data)

        @channel.on("close")
        def on_close() -> None:
            self._teardown(link, "channel closed")

        @channel.on("bufferedamountlow")
        def on_low() -> None:
            self._pump(link)

        if channel.readyState == "open":  # the answerer gets it open already
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
        log.info("data channel to %s open", link.peer)
        self._inbox.put_nowait(("connected", link.peer, None))
        self._changed()

    async def _watchdog(self, link: _Link) -> None:
        with contextlib.suppress(TimeoutError):
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
        if link.reader is not None:
            self.book.apply_all(link.reader.close())
        if link.writer is not None:
            self.book.apply_all(link.writer.take_events())
        self.book.peer_gone(link.peer)
        if not self._closing:
            closer = asyncio.ensure_future(link.pc.close())
            self._closers.add(closer)
            closer.add_done_callback(self._closers.discard)
            if link.opened:
                self._inbox.put_nowait(("disconnected", link.peer, None))
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
        if channel is None or queue is None or link.closed or channel.readyState != "open":
            return
        sent = 0
        for frame in queue.pump(channel.bufferedAmount, _now_ms()):
            channel.send(frame)
            sent += len(frame)
        self.bytes_sent += sent
        assert link.writer is not None
        self.book.apply_all(link.writer.take_events())

    def _on_frame(self, link: _Link, data: bytes | str) -> None:
        reader = link.reader
        if link.closed or reader is None:
            return
        if isinstance(data, str):
            events: list[Any] = [ChannelBroken(link.peer, FrameError("bad-frame", "a text message on the channel"))]
        else:
            self.bytes_received += len(data)
            events = reader.feed(data, _now_ms())
        for event in events:
            if isinstance(event, MessageReceived):
                self._inbox.put_nowait(("message", link.peer, event))
            elif isinstance(event, ChannelBroken):
                log.warning("channel from %s broken: %s", link.peer, event.error)
                self._teardown(link, f"channel broken: {event.error}")
            else:
                self.book.apply(event)

    async def _deliver(self) -> None:
        while True:
            kind, peer, item = await self._inbox.get()
            receiver = self._receiver
            try:
                if kind == "message":
                    message, blobs = item.message, item.blobs
                    refs = {r.sha256: r.kind for r in referenced_artifacts(message) if r.sha256 in blobs}
                    self.log.append(TransferRecord(peer, "receive", message.TYPE, tuple(refs),
                                                   sum(len(blobs[sha]) for sha in refs), tuple(refs.values())))
                    if receiver is not None:
                        await receiver.receive(peer, message, blobs)
                elif kind == "connected" and receiver is not None:
                    await receiver.peer_connected(peer)
                elif receiver is not None:
                    await receiver.peer_disconnected(peer)
            except asyncio.CancelledError:
                raise
            except WeeiError as exc:
                log.warning("delivering %s from %s failed: %s", kind, peer, exc)
            except Exception:
                log.exception("delivering %s from %s failed", kind, peer)
            self._changed()

    async def _expire(self) -> None:
        while True:
            await asyncio.sleep(5.0)
            for link in list(self._links.values()):
                if link.reader is not None and not link.closed:
                    self.book.apply_all(link.reader.expire(_now_ms(), _STALL_MS))

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


def _now_ms() -> float:
    return time.monotonic() * 1000.0


def _ice_server(entry: Mapping[str, Any]) -> RTCIceServer:
    urls = entry.get("urls")
    return RTCIceServer(urls=list(urls) if isinstance(urls, (list, tuple)) else urls,
                        username=entry.get("username"), credential=entry.get("credential"))


def _candidate(payload: Mapping[str, Any]) -> Any:
    """An ``RTCIceCandidateInit`` as an aiortc candidate; None for end-of-candidates (``""``)."""
    text = payload.get("candidate") or ""
    if not text:
        return None
    candidate = candidate_from_sdp(text.split(":", 1)[1] if text.startswith("candidate:") else text)
    candidate.sdpMid = payload.get("sdpMid")
    candidate.sdpMLineIndex = payload.get("sdpMLineIndex")
    return candidate
