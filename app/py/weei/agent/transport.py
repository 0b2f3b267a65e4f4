"""The agent's Transport port: aiortc data channels set up through signaling.

Theory of operation
-------------------
The aiortc adapter of docs/peers.md. What to do and when (who offers,
candidates kept until the remote description is set, watchdog, retries,
teardown, framing, in-order delivery per peer, ``transferErrors``) is
decided by :class:`weei.core.links.peerlink.LinkManager`, run on asyncio by
:class:`weei.adapters.link_transport.LinkTransport`; this module only supplies
the aiortc primitives and the agent's signaling client:

* a link is an ``RTCPeerConnection`` with ``RTCConfiguration(iceServers=...)``
  (never None, which would add a public STUN server) and its ``weei`` channel;
* aiortc gathers every candidate before ``setLocalDescription`` returns, so
  its SDP carries them (no trickle out); candidates trickled in are parsed
  with ``candidate_from_sdp``, and one it cannot parse is refused like any
  other (logged, skipped);
* ``pc.close()`` is a coroutine: closers are kept and awaited by
  :meth:`AgentTransport.close`, never cancelled;
* :class:`weei.agent.signaling_client.SignalingClient` does not reconnect by
  itself: after a ``Closed`` this adapter reconnects with the resume token
  (1, 2, 4 … at most 30 s apart) and feeds the new welcome and peer list in.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any, Mapping

from aiortc import RTCConfiguration, RTCDataChannel, RTCIceServer, RTCPeerConnection, RTCSessionDescription
from aiortc.sdp import candidate_from_sdp

from ..adapters.link_transport import LinkTransport, Receiver, now_ms
from ..core.links.peerlink import CHANNEL_LABEL, HIGH_WATER, LOW_WATER
from ..core.links.peerlink_commands import CreateLink, TransferRecord
from ..core.wire.signaling_session import Closed, Welcome
from .signaling_client import SignalingClient

__all__ = ["AgentTransport", "Receiver", "TransferRecord", "CHANNEL_LABEL", "LOW_WATER", "HIGH_WATER"]

_RECONNECT_MAX_S = 30.0


@dataclass
class _Handle:
    """One link's aiortc objects."""

    pc: RTCPeerConnection
    channel: RTCDataChannel | None = None


class AgentTransport(LinkTransport):
    """The ``Transport`` port over WebRTC (aiortc). ``connect``, ``attach``, ``join``; ``close`` at the end."""

    logger = logging.getLogger("weei.agent.transport")

    def __init__(self, signaling: SignalingClient, *, connect_timeout_s: float = 30.0,
                 on_change: Any = None) -> None:
        super().__init__(signaling, connect_timeout_s=connect_timeout_s, on_change=on_change)
        self._closers: set[asyncio.Future[Any]] = set()  # pc.close() of torn-down links: awaited, never cancelled

    async def connect(self) -> Welcome:
        """Say hello to the signaling server; returns the welcome (our peer ID)."""
        welcome = await self.signaling.connect()
        self._welcomed(welcome)
        return welcome

    async def join(self, room: str) -> tuple[str, ...]:
        """Join ``room`` and start connecting to its peers; returns the room's peers (self included)."""
        if self.peer_id is None:
            await self.connect()
        peers: tuple[str, ...] = await self.signaling.join(room)
        self._listen()
        async with self._setup:
            await self._run(self.links.room(peers, now_ms()))
        return peers

    async def close(self) -> None:
        """Close every peer connection and the signaling socket; nothing more is delivered."""
        tasks = [task for task in self._tasks if task is not asyncio.current_task()]
        self._shutdown()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await asyncio.gather(*self._closers, return_exceptions=True)
        await self.signaling.close()

    def _signaling_closed(self, event: Closed) -> None:
        super()._signaling_closed(event)
        self._spawn(self._resignal())

    async def _resignal(self) -> None:
        """Reconnect with the token (open channels keep working meanwhile), then take the room as it is now."""
        delay = 1.0
        while not self.links.closing:
            await asyncio.sleep(delay)
            try:
                welcome = await self.signaling.reconnect()
            except Exception as exc:
                self.logger.warning("signaling reconnect failed: %s", exc)
                delay = min(_RECONNECT_MAX_S, delay * 2)
                continue
            async with self._setup:
                self._welcomed(welcome)
                await self._run(self.links.room(self.signaling.peers, now_ms()))
            return

    # ------------------------------------------------------------ primitives

    def _create(self, command: CreateLink) -> _Handle:
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[_ice_server(s) for s in command.ice_servers]))
        handle, link = _Handle(pc), command.link

        @pc.on("connectionstatechange")
        def on_state() -> None:
            if pc.connectionState in ("failed", "closed"):
                self._platform(link, "closed", f"connection {pc.connectionState}")

        @pc.on("datachannel")
        def on_channel(channel: RTCDataChannel) -> None:
            if not self.links.accepts_channel(link, channel.label):
                channel.close()
                return
            self._bind(link, handle, channel)

        if command.offerer:
            self._bind(link, handle, pc.createDataChannel(CHANNEL_LABEL, ordered=True))
        return handle

    def _bind(self, link: int, handle: _Handle, channel: RTCDataChannel) -> None:
        handle.channel = channel
        channel.bufferedAmountLowThreshold = LOW_WATER
        channel.on("open", lambda: self._platform(link, "open"))
        channel.on("message", lambda data: self._platform(link, "frame", data))
        channel.on("close", lambda: self._platform(link, "closed", "channel closed"))
        channel.on("bufferedamountlow", lambda: self._platform(link, "low"))
        if channel.readyState == "open":  # the answerer gets it open already
            self._platform(link, "open")

    async def _set_remote(self, handle: _Handle, kind: str, sdp: str) -> None:
        await handle.pc.setRemoteDescription(RTCSessionDescription(sdp, kind))

    async def _add_candidate(self, handle: _Handle, init: dict[str, Any]) -> None:
        await handle.pc.addIceCandidate(_candidate(init))

    async def _signal(self, peer: str, kind: str, payload: Any) -> None:
        await self.signaling.signal(peer, kind, payload)

    def _buffered(self, handle: _Handle | None) -> int | None:
        channel = handle.channel if handle is not None else None
        return int(channel.bufferedAmount) if channel is not None and channel.readyState == "open" else None

    def _send_frame(self, handle: _Handle, frame: bytes) -> None:
        assert handle.channel is not None
        handle.channel.send(frame)

    def _close(self, handle: _Handle) -> None:
        # Its handlers may still fire (the channel's close): the link manager ignores a link it closed.
        closer = asyncio.ensure_future(handle.pc.close())
        self._closers.add(closer)
        closer.add_done_callback(self._closers.discard)

    def _state(self, handle: _Handle | None) -> str:
        if handle is None:
            return "no-connection"
        return f"{handle.pc.connectionState}/{handle.channel.readyState if handle.channel else 'no-channel'}"


def _ice_server(entry: Mapping[str, Any]) -> RTCIceServer:
    urls = entry.get("urls")
    return RTCIceServer(urls=list(urls) if isinstance(urls, (list, tuple)) else urls,
                        username=entry.get("username"), credential=entry.get("credential"))


def _candidate(payload: Mapping[str, Any]) -> Any:
    """An ``RTCIceCandidateInit`` as an aiortc candidate; None for end-of-candidates (``""``).

    Raises ValueError (or what ``candidate_from_sdp`` raises) for text that is no candidate.
    """
    text = payload.get("candidate") or ""
    if not isinstance(text, str):
        raise ValueError("candidate is not a string")
    if not text:
        return None
    candidate = candidate_from_sdp(text.split(":", 1)[1] if text.startswith("candidate:") else text)
    candidate.sdpMid = payload.get("sdpMid")
    candidate.sdpMLineIndex = payload.get("sdpMLineIndex")
    return candidate
