"""One suite, two link adapters: cases run against the aiortc agent (CPython) and the page (Pyodide).

Each case takes a :class:`Platform` (how to make, join and close one
transport of that adapter) and a fresh room name, pairs two transports
over real WebRTC through the real signaling server, and raises
AssertionError on a difference from docs/peers.md. The same code runs in
tests/unit/test_peerlink_adapters.py (``AgentTransport``) and, inside a
harness page, in tests/browser/test_rtc.py (``BrowserTransport``): nothing
here imports aiortc, js or pytest.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from weei.adapters.link_transport import LinkTransport
from weei.core.wire.commands import Send
from weei.core.wire.framing import data_frame, message_begin_frame
from weei.core.wire.messages import ArtifactRef, Deliver, Message
from weei.core.wire.signaling_session import Signal

__all__ = ["Platform", "CASES"]

BAD_CANDIDATE = {"candidate": "candidate:bad", "sdpMid": "0", "sdpMLineIndex": 0}


class Platform(Protocol):
    async def new(self) -> LinkTransport:
        """A transport connected to signaling (``transport.signaling.peer_id`` known), not in a room yet."""
        ...

    async def join(self, transport: LinkTransport, room: str) -> None: ...

    async def close(self, transport: LinkTransport) -> None: ...


class Recorder:
    """A receiver that records what arrives, in order; ``delay`` makes it slow."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.events: list[tuple[str, str, str | None]] = []  # kind, peer, job

    async def on_peer_message(self, peer: str, message: Message, blobs: Mapping[str, bytes]) -> None:
        await asyncio.sleep(self.delay)
        for sha, data in blobs.items():
            assert hashlib.sha256(data).hexdigest() == sha
        self.events.append(("message", peer, getattr(message, "job_id", None)))

    async def peer_connected(self, peer: str) -> None:
        self.events.append(("connected", peer, None))

    async def peer_disconnected(self, peer: str) -> None:
        self.events.append(("disconnected", peer, None))

    def kinds(self) -> list[str]:
        return [kind for kind, _, _ in self.events]


class Notes(logging.Handler):
    """What a transport logged."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


async def until(what: str, check: Callable[[], bool], timeout: float = 30.0) -> None:
    loop = asyncio.get_event_loop()
    deadline = loop.time() + timeout
    while not check():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting until {what}")
        await asyncio.sleep(0.02)


def deliver(peer: str, job: str, size: int) -> tuple[Send, dict[str, bytes]]:
    data = os.urandom(size)
    sha = hashlib.sha256(data).hexdigest()
    ref = ArtifactRef("module", sha, size)
    return Send(peer, Deliver(job, ref, {"id": job}), (ref,)), {sha: data}


class Pair:
    """Two transports in one room: ``lo`` (the offerer, lower ID) and ``hi``, with their receivers."""

    def __init__(self, platform: Platform) -> None:
        self.platform = platform
        self.transports: list[LinkTransport] = []

    async def make(self, room: str, *, lo_delay: float = 0.0,
                   before_join: Callable[[LinkTransport, LinkTransport], None] | None = None) -> None:
        one, two = await self.platform.new(), await self.platform.new()
        self.transports = [one, two]
        self.lo, self.hi = sorted(self.transports, key=lambda t: t.signaling.peer_id)
        self.lo_id, self.hi_id = self.lo.signaling.peer_id, self.hi.signaling.peer_id
        self.rec_lo, self.rec_hi = Recorder(lo_delay), Recorder()
        self.lo.attach(self.rec_lo)
        self.hi.attach(self.rec_hi)
        if before_join is not None:
            before_join(self.lo, self.hi)
        await self.platform.join(self.lo, room)
        await self.platform.join(self.hi, room)
        await until("both ends are open", lambda: self.lo.peers() == [self.hi_id] and self.hi.peers() == [self.lo_id])

    async def close(self) -> None:
        for transport in self.transports:
            await self.platform.close(transport)


async def with_pair(platform: Platform, room: str, body: Callable[[Pair], Awaitable[None]], **options: Any) -> None:
    pair = Pair(platform)
    try:
        await pair.make(room, **options)
        await body(pair)
    finally:
        await pair.close()


# ------------------------------------------------------------------ the cases


async def bad_buffered_candidate_is_logged_and_skipped(platform: Platform, room: str) -> None:
    """A candidate that arrives before the answer, and that the platform refuses, does not cost the link."""
    notes = Notes()
    loggers: list[tuple[logging.Logger, int]] = []

    def inject(lo: LinkTransport, hi: LinkTransport) -> None:
        read, held = lo.signaling.next_event, []

        async def next_event(timeout: float | None = None) -> Any:
            if held:
                return held.pop()
            event = await read(timeout)
            if isinstance(event, Signal) and event.kind == "answer":
                held.append(event)  # the answer comes right after a bad candidate from the same peer
                return Signal(event.sender, "candidate", dict(BAD_CANDIDATE))
            return event
        lo.signaling.next_event = next_event  # type: ignore[method-assign]
        loggers.append((lo.logger, lo.logger.level))
        lo.logger.addHandler(notes)
        lo.logger.setLevel(logging.INFO)

    async def body(pair: Pair) -> None:
        # The refusal is the platform's answer to an async add: the channel may open first.
        await until("the candidate refusal is logged",
                    lambda: any(f"candidate from {pair.hi_id} refused" in line for line in notes.lines), 10.0)
        assert pair.lo.transfers_state() == {"transfers": [], "transferErrors": {}}
        pair.hi.send(*deliver(pair.lo_id, "after-bad-candidate", 50_000))
        await until("the message arrived", lambda: ("message", pair.hi_id, "after-bad-candidate")
                    in pair.rec_lo.events)

    try:
        await with_pair(platform, room, body, before_join=inject)
    finally:
        for logger, level in loggers:
            logger.removeHandler(notes)
            logger.setLevel(level)


async def messages_arrive_in_order_per_peer(platform: Platform, room: str) -> None:
    """A slow receiver gets ``connected`` first, then every message in the order sent."""
    async def body(pair: Pair) -> None:
        jobs = [f"job-{i}" for i in range(8)]
        for i, job in enumerate(jobs):
            pair.hi.send(*deliver(pair.lo_id, job, (7 - i) * 40_000))
        await until("every message arrived", lambda: len(pair.rec_lo.events) == 1 + len(jobs))
        assert pair.rec_lo.events == [("connected", pair.hi_id, None)] + [
            ("message", pair.hi_id, job) for job in jobs]
        sent = [(r.direction, r.type, r.bytes) for r in pair.hi.log]
        assert sent == [("send", "deliver", (7 - i) * 40_000) for i in range(8)]
        assert pair.lo.transfers_state() == pair.hi.transfers_state() == {"transfers": [], "transferErrors": {}}
        assert pair.hi.dropped == 0 and pair.lo.bytes_received >= sum(range(8)) * 40_000
    await with_pair(platform, room, body, lo_delay=0.05)


async def refusals_are_named_then_the_offerer_reconnects(platform: Platform, room: str) -> None:
    """``message:`` and ``channel:`` keys in transferErrors; a broken channel is one disconnected on each side,
    then the offerer offers again and both see connected."""
    async def body(pair: Pair) -> None:
        writer = pair.hi.links.writer(pair.lo_id)
        assert writer is not None
        tid = writer._new_id()
        pair.hi.send_raw(pair.lo_id, [message_begin_frame(tid, 8, []), data_frame(tid, 0, b"not json")])
        await until("the message refusal is named", lambda: f"message:{pair.hi_id}" in
                    pair.lo.transfers_state()["transferErrors"])
        state = pair.lo.transfers_state()
        assert set(state) == {"transfers", "transferErrors"} and isinstance(state["transfers"], list)
        assert state["transferErrors"][f"message:{pair.hi_id}"].startswith("bad-message: ")
        assert pair.lo.peers() == [pair.hi_id], "a refused message does not break the channel"

        pair.hi.send_raw(pair.lo_id, [b"\x00garbage that is no frame at all"])
        await until("both ends saw the channel go", lambda: "disconnected" in pair.rec_lo.kinds()
                    and "disconnected" in pair.rec_hi.kinds())
        errors = pair.lo.transfers_state()["transferErrors"]
        assert errors[f"channel:{pair.hi_id}"].startswith("bad-frame: ") and all(
            isinstance(v, str) for v in errors.values())
        await until("the pair reconnected", lambda: pair.rec_lo.kinds() == ["connected", "disconnected", "connected"]
                    and pair.rec_hi.kinds() == ["connected", "disconnected", "connected"])
        await until("both ends are open again", lambda: pair.lo.peers() == [pair.hi_id]
                    and pair.hi.peers() == [pair.lo_id])
        assert f"channel:{pair.hi_id}" not in pair.lo.transfers_state()["transferErrors"]
        pair.lo.send(*deliver(pair.hi_id, "after-reconnect", 100_000))
        await until("a message on the new channel", lambda: ("message", pair.lo_id, "after-reconnect")
                    in pair.rec_hi.events)
    await with_pair(platform, room, body)


async def a_peer_that_leaves_is_disconnected_once_and_not_retried(platform: Platform, room: str) -> None:
    """Closing one transport: the other hears ``disconnected`` once and keeps no link to it."""
    async def body(pair: Pair) -> None:
        await pair.platform.close(pair.hi)
        pair.transports.remove(pair.hi)
        await until("lo heard the close", lambda: "disconnected" in pair.rec_lo.kinds())
        # The channel's close and signaling's room list travel apart: the close may come first and a retry be
        # offered to a peer signaling still lists (test_peerlink covers that). Once the list drops it, no retry.
        await until("signaling told lo that hi left", lambda: pair.hi_id not in pair.lo.links.members())
        await until("lo dropped the link", lambda: pair.lo.links.links() == {})
        await asyncio.sleep(1.5)  # past the first retry: none, the peer left the room
        assert pair.rec_lo.kinds() == ["connected", "disconnected"] and pair.lo.links.links() == {}
        assert pair.lo.peers() == [] and pair.lo.transfers_state()["transfers"] == []
        pair.lo.send(*deliver(pair.hi_id, "lost", 10))
        assert pair.lo.dropped == 1
    await with_pair(platform, room, body)


CASES: dict[str, Callable[[Platform, str], Awaitable[None]]] = {
    "bad-buffered-candidate": bad_buffered_candidate_is_logged_and_skipped,
    "in-order-delivery": messages_arrive_in_order_per_peer,
    "transfer-errors-and-retry": refusals_are_named_then_the_offerer_reconnects,
    "leave-is-disconnect": a_peer_that_leaves_is_disconnected_once_and_not_retried,
}
