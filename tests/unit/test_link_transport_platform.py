"""LinkTransport against a platform that keeps the W3C rule the browser keeps: an operation still queued on a
``RTCPeerConnection`` when it closes never settles. One such promise must not stall the transport."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from weei.adapters.link_transport import LinkTransport
from weei.core.links.peerlink_commands import CreateLink
from weei.core.wire.signaling_session import Peers, Signal, Welcome

ME, OTHER = "b-peer", "a-peer"  # OTHER sorts lower: it offers, we answer


class Signaling:
    def __init__(self) -> None:
        self.events: asyncio.Queue[Any] = asyncio.Queue()
        self.sent: list[tuple[str, str]] = []

    async def next_event(self, timeout: float | None = None) -> Any:
        return await asyncio.wait_for(self.events.get(), timeout)


class Handle:
    def __init__(self) -> None:
        self.closed = False
        self.never: list[asyncio.Future[None]] = []


class QueuedOpsNeverSettle(LinkTransport):
    """Descriptions resolve at once; a candidate is queued until the connection closes, and then forgotten."""

    def _create(self, command: CreateLink) -> Handle:
        return Handle()

    @staticmethod
    async def _local_description(handle: Any, kind: str) -> str:
        return f"sdp-{kind}"

    async def _set_remote(self, handle: Any, kind: str, sdp: str) -> None:
        return None

    async def _add_candidate(self, handle: Any, init: dict[str, Any]) -> None:
        pending: asyncio.Future[None] = asyncio.get_event_loop().create_future()
        handle.never.append(pending)
        await pending

    async def _signal(self, peer: str, kind: str, payload: Any) -> None:
        self.signaling.sent.append((peer, kind))

    def _buffered(self, handle: Any) -> int | None:
        return None

    def _send_frame(self, handle: Any, frame: bytes) -> None:
        raise AssertionError("no channel in this test")

    def _close(self, handle: Any) -> None:
        handle.closed = True

    def _state(self, handle: Any) -> str:
        return "closed" if handle.closed else "new"


class _Notes(logging.Handler):
    def __init__(self, lines: list[str]) -> None:
        super().__init__(logging.INFO)
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


async def _until(check: Any, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.005)


def test_a_candidate_queued_on_a_closing_connection_does_not_stall_signaling() -> None:
    async def scenario() -> None:
        signaling = Signaling()
        transport = QueuedOpsNeverSettle(signaling, connect_timeout_s=3600.0)
        transport._welcomed(Welcome(ME, "token", False, (), {}))
        transport._listen()
        signaling.events.put_nowait(Peers("room", (OTHER, ME)))
        signaling.events.put_nowait(Signal(OTHER, "offer", "sdp-offer"))
        await _until(lambda: (OTHER, "answer") in signaling.sent)
        signaling.events.put_nowait(Signal(OTHER, "candidate", {"candidate": "candidate:1", "sdpMid": "0"}))
        await _until(lambda: any(h.never for h in transport._handles.values()))
        (link,) = transport._handles
        transport._platform(link, "closed", "connection closed")  # the peer went away mid-operation
        signaling.events.put_nowait(Peers("room", (ME,)))
        await _until(lambda: transport.links.members() == (ME,))
        assert transport.links.links() == {} and not transport._setup.locked()
        transport._shutdown()
    asyncio.run(asyncio.wait_for(scenario(), 10))


def test_the_connect_watchdog_frees_a_setup_the_platform_never_finishes() -> None:
    async def scenario() -> None:
        signaling = Signaling()
        transport = QueuedOpsNeverSettle(signaling, connect_timeout_s=0.2)
        notes: list[str] = []
        transport.logger = logging.getLogger("test.link_transport_platform")
        transport.logger.setLevel(logging.INFO)
        transport.logger.addHandler(_Notes(notes))
        transport._welcomed(Welcome(ME, "token", False, (), {}))
        transport._listen()
        signaling.events.put_nowait(Peers("room", (OTHER, ME)))
        signaling.events.put_nowait(Signal(OTHER, "offer", "sdp-offer"))
        await _until(lambda: (OTHER, "answer") in signaling.sent)
        signaling.events.put_nowait(Signal(OTHER, "candidate", {"candidate": "candidate:1", "sdpMid": "0"}))
        signaling.events.put_nowait(Peers("room", (OTHER, ME, "c-peer")))
        await _until(lambda: transport.links.members() == (OTHER, ME, "c-peer"))
        await _until(lambda: transport.links.links() == {})
        assert any(f"connection to {OTHER} closed: not open after" in line for line in notes)
        assert not transport._setup.locked()
        transport._shutdown()
    asyncio.run(asyncio.wait_for(scenario(), 10))
