"""The page's Transport port: WebRTC data channels, from Python through JS interop (Pyodide only).

Theory of operation
-------------------
The browser adapter of docs/peers.md, the twin of ``weei.agent.transport``:
both are a :class:`weei.adapters.link_transport.LinkTransport`, which runs the
sans-I/O :class:`weei.core.links.peerlink.LinkManager` (it decides every step of a
link, its timing, teardown, framing, delivery and errors). Here are only the
page's primitives and its signaling client (:class:`BrowserSignaling`,
which reconnects and rejoins by itself and reports each new welcome and peer
list as an event):

* a link is a JS ``RTCPeerConnection`` and its ``weei`` data channel
  (``binaryType = "arraybuffer"``);
* Chromium trickles: each ``icecandidate`` goes to the link manager, which
  signals it once our SDP is out (never before it, or the other side would
  drop it); the other side's candidates it keeps until its description is set.

Ownership (CONVENTIONS 9): every proxy handed to JS (the peer connection's
and the channel's event handlers) belongs to its link's :class:`_Handle`;
closing the link detaches the handlers, closes the peer connection and
destroys the proxies. A handler never raises into JS: failures are logged.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import js  # type: ignore[import-not-found]
from pyodide.ffi import create_proxy  # type: ignore[import-not-found]

from weei.adapters.link_transport import LinkTransport, Receiver
from weei.core.links.peerlink import CHANNEL_LABEL, HIGH_WATER, LOW_WATER
from weei.core.links.peerlink_commands import CreateLink

from .convert import from_js_value, is_nullish, to_js_value
from .engine import to_uint8array
from .signaling_ws import BrowserSignaling, detach

__all__ = ["BrowserTransport", "Receiver", "CHANNEL_LABEL", "LOW_WATER", "HIGH_WATER"]

_CHANNEL_EVENTS = ("onopen", "onmessage", "onclose", "onerror", "onbufferedamountlow")


@dataclass
class _Handle:
    """One link's JS objects and the proxies they hold."""

    pc: Any
    channel: Any = None
    proxies: list[Any] = field(default_factory=list)

    def release(self) -> None:
        """Detach every handler, close the peer connection, destroy the proxies (deferred a tick)."""
        targets = [(self.pc, ("onicecandidate", "onconnectionstatechange", "ondatachannel"))]
        if self.channel is not None:
            targets.append((self.channel, _CHANNEL_EVENTS))
        proxies, self.proxies = self.proxies, []
        detach(targets, proxies)
        with contextlib.suppress(Exception):
            self.pc.close()


class BrowserTransport(LinkTransport):
    """The ``Transport`` port over the page's WebRTC. ``attach``, ``start(room)``; ``close`` at the end."""

    logger = logging.getLogger("weei.browser.rtc")

    def __init__(self, signaling: BrowserSignaling, *, connect_timeout_s: float = 30.0,
                 on_change: Callable[[], None] | None = None) -> None:
        super().__init__(signaling, connect_timeout_s=connect_timeout_s, on_change=on_change)

    async def start(self, room: str) -> str:
        """Connect to signaling (if not yet), join ``room`` and start connecting to its peers; returns our peer ID.

        Raises ``SignalingRefused`` (``room-full``, ``bad-room``...) or ``TimeoutError``.
        """
        if self.signaling.welcome is None:
            await self.signaling.connect()
        self._welcomed(self.signaling.welcome)
        await self.signaling.join(room)  # its peer list also arrives as an event
        self._listen()
        assert self.peer_id is not None
        return self.peer_id

    def close(self) -> None:
        """Close every peer connection and the signaling socket; nothing more is delivered."""
        self._shutdown()
        self.signaling.close()

    # ------------------------------------------------------------ primitives

    def _handler(self, handle: _Handle, fn: Callable[[Any], None]) -> Any:
        """A proxy owned by ``handle`` that never raises into JS."""
        def handler(event: Any) -> None:
            try:
                fn(event)
            except Exception:
                self.logger.exception("link handler failed")
        proxy = create_proxy(handler)
        handle.proxies.append(proxy)
        return proxy

    def _create(self, command: CreateLink) -> _Handle:
        pc = js.RTCPeerConnection.new(to_js_value({"iceServers": list(command.ice_servers)}))
        handle, link = _Handle(pc), command.link

        def on_candidate(event: Any) -> None:
            candidate = event.candidate
            init = None if is_nullish(candidate) else from_js_value(candidate.toJSON())
            self._platform(link, "candidate", init)

        def on_state(_event: Any) -> None:
            state = str(pc.connectionState)
            if state in ("failed", "closed"):
                self._platform(link, "closed", f"connection {state}")

        def on_channel(event: Any) -> None:
            channel = event.channel
            if not self.links.accepts_channel(link, str(channel.label)):
                channel.close()
                return
            self._bind(link, handle, channel)

        pc.onicecandidate = self._handler(handle, on_candidate)
        pc.onconnectionstatechange = self._handler(handle, on_state)
        pc.ondatachannel = self._handler(handle, on_channel)
        if command.offerer:
            self._bind(link, handle, pc.createDataChannel(CHANNEL_LABEL, to_js_value({"ordered": True})))
        return handle

    def _bind(self, link: int, handle: _Handle, channel: Any) -> None:
        handle.channel = channel
        channel.binaryType = "arraybuffer"
        channel.bufferedAmountLowThreshold = LOW_WATER
        on = self._platform
        channel.onopen = self._handler(handle, lambda _e: on(link, "open"))
        channel.onmessage = self._handler(handle, lambda e: on(link, "frame", _frame_data(e.data)))
        channel.onclose = self._handler(handle, lambda _e: on(link, "closed", "channel closed"))
        channel.onerror = self._handler(handle, lambda e: self.logger.info("channel error: %s",
                                                                           getattr(e, "error", "")))
        channel.onbufferedamountlow = self._handler(handle, lambda _e: on(link, "low"))
        if str(channel.readyState) == "open":
            on(link, "open")

    async def _set_remote(self, handle: _Handle, kind: str, sdp: str) -> None:
        await handle.pc.setRemoteDescription(to_js_value({"type": kind, "sdp": sdp}))

    async def _add_candidate(self, handle: _Handle, init: dict[str, Any]) -> None:
        await handle.pc.addIceCandidate(to_js_value(init))

    async def _signal(self, peer: str, kind: str, payload: Any) -> None:
        self.signaling.signal(peer, kind, payload)  # best-effort: dropped (and counted) without a socket

    def _buffered(self, handle: _Handle | None) -> int | None:
        channel = handle.channel if handle is not None else None
        return int(channel.bufferedAmount) if channel is not None and str(channel.readyState) == "open" else None

    def _send_frame(self, handle: _Handle, frame: bytes) -> None:
        handle.channel.send(to_uint8array(frame))

    def _close(self, handle: _Handle) -> None:
        handle.release()

    def _state(self, handle: _Handle | None) -> str:
        if handle is None:
            return "no-connection"
        channel = str(handle.channel.readyState) if handle.channel is not None else "no-channel"
        return f"{handle.pc.connectionState}/{channel}"


def _frame_data(data: Any) -> bytes | str:
    """A channel message: bytes from its ArrayBuffer, or the text of a text message (which breaks the channel)."""
    return data if isinstance(data, str) else bytes(data.to_bytes())
