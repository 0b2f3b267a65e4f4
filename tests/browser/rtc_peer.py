"""Test-only: one peer of tests/browser/test_rtc.py, run inside the harness page's Pyodide.

A ``BrowserTransport`` on the page's signaling socket with a receiver that
records what arrives (attachments hashed here, in the receiving page). Every
function the test calls returns JSON text.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
from typing import Any, Mapping

import js  # type: ignore[import-not-found]

from weei.browser.rtc import BrowserTransport
from weei.browser.signaling_ws import BrowserSignaling, signal_url
from weei.core.wire.commands import Send
from weei.core.wire.framing import artifact_begin_frame, data_frame
from weei.core.wire.messages import ArtifactRef, Deliver, Message

logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")


class Recorder:
    """The Receiver: every delivery as a JSON-able record, in order."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    async def on_peer_message(self, peer: str, message: Message, blobs: Mapping[str, bytes]) -> None:
        self.events.append({"kind": "message", "peer": peer, "type": message.TYPE,
                            "job": getattr(message, "job_id", None), "at": js.Date.now(),
                            "blobs": {sha: [len(b), hashlib.sha256(b).hexdigest()] for sha, b in blobs.items()}})

    async def peer_connected(self, peer: str) -> None:
        self.events.append({"kind": "connected", "peer": peer, "at": js.Date.now()})

    async def peer_disconnected(self, peer: str) -> None:
        self.events.append({"kind": "disconnected", "peer": peer, "at": js.Date.now()})


WEEI_URL = ""  # the `weei serve` origin, set by the harness
recorder = Recorder()
transport: BrowserTransport | None = None
_keep: list[bytes] = []


async def start(room: str, url: str | None = None) -> str:
    global transport
    # As page_main does: the room is known before the hello, which may offer the token bound to it.
    transport = BrowserTransport(BrowserSignaling(url or signal_url(WEEI_URL), room=room))
    transport.attach(recorder)
    peer_id = await transport.start(room)
    return json.dumps(peer_id)


def state() -> str:
    assert transport is not None
    return json.dumps({"peerId": transport.peer_id, "peers": transport.peers(), "links": transport.describe(),
                       "events": recorder.events, "dropped": transport.dropped,
                       "signaling": {"connected": transport.signaling.connected,
                                     "reconnects": transport.signaling.reconnects,
                                     "resumed": getattr(transport.signaling.welcome, "resumed", None)},
                       "bytesSent": transport.bytes_sent, "bytesReceived": transport.bytes_received,
                       **transport.transfers_state()})


async def until(what: str, check: Any, timeout: float) -> None:
    loop = asyncio.get_event_loop()
    deadline = loop.time() + timeout
    while not check():
        if loop.time() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting until {what}; state: {state()}")
        await asyncio.sleep(0.05)


async def wait_peer(peer: str, timeout: float = 30.0) -> str:
    assert transport is not None
    await until(f"{peer} has an open channel", lambda: peer in transport.peers(), timeout)
    return state()


async def wait_event(kind: str, peer: str | None = None, job: str | None = None, timeout: float = 60.0,
                     after: int = 0) -> str:
    def find() -> dict[str, Any] | None:
        for event in recorder.events[after:]:
            if event["kind"] == kind and peer in (None, event["peer"]) and job in (None, event.get("job")):
                return event
        return None
    await until(f"a {kind} event (peer {peer}, job {job})", lambda: find() is not None, timeout)
    return json.dumps(find())


def send_blob(to: str, size: int, job: str) -> str:
    """Send a Deliver with ``size`` random bytes attached; returns its SHA-256 and the send time."""
    assert transport is not None
    data = os.urandom(size)
    _keep.append(data)
    sha = hashlib.sha256(data).hexdigest()
    ref = ArtifactRef("module", sha, len(data))
    started = js.Date.now()
    transport.send(Send(to, Deliver(job, ref, {"id": job}), (ref,)), {sha: data})
    return json.dumps({"sha256": sha, "at": started})


def raw_send(to: str, frames: list[Any]) -> str:
    """Hostile: hand frames (bytes, or str for a text message) straight to the data channel."""
    assert transport is not None
    link, _ = transport.links.links()[to]
    channel = transport._handles[link].channel
    for frame in frames:
        if isinstance(frame, str):
            channel.send(frame)
        else:
            array = js.Uint8Array.new(len(frame))
            array.assign(frame)
            channel.send(array)
    return json.dumps(len(frames))


def hostile_frames(to: str, case: str) -> list[Any]:
    """Frames a misbehaving peer might send; the transfer id comes from our own writer, so that the
    reader refuses them for what they are, not for a reused id, and our next honest send still works."""
    assert transport is not None
    writer = transport.links.writer(to)
    assert writer is not None, f"no open channel to {to}"
    tid = writer._new_id()
    if case == "bad-hash":
        content = b"not the announced bytes"
        announced = hashlib.sha256(b"something else").hexdigest()
        return [artifact_begin_frame(tid, "module", announced, len(content)), data_frame(tid, 0, content)]
    if case == "oversized":
        return [data_frame(tid, 0, b"\0" * 200_000)]
    if case == "garbage":
        return [b"\x00garbage that is no frame at all"]
    if case == "text":
        return ["a text message"]
    raise ValueError(case)


class _MemoryTokens:
    """Each transport of the shared cases gets its own peer ID (not the tab's sessionStorage token)."""

    def __init__(self) -> None:
        self.token: str | None = None

    def get(self, key: str) -> str | None:
        return self.token

    def set(self, key: str, value: str | None) -> None:
        self.token = value


class PagePlatform:
    """link_cases.Platform for the page's BrowserTransport (both transports of a case live in this page)."""

    def __init__(self, url: str) -> None:
        self.url = url

    async def new(self) -> BrowserTransport:
        signaling = BrowserSignaling(self.url, tokens=_MemoryTokens())
        await signaling.connect()
        return BrowserTransport(signaling)

    async def join(self, transport: Any, room: str) -> None:
        await transport.start(room)

    async def close(self, transport: Any) -> None:
        transport.close()


async def run_case(name: str, room: str) -> str:
    """Run one case of link_cases.py against BrowserTransport; raises (with its traceback) on a failure."""
    import link_cases

    await asyncio.wait_for(link_cases.CASES[name](PagePlatform(signal_url(WEEI_URL)), room), 60)
    return json.dumps(name)


def close() -> str:
    assert transport is not None
    transport.close()
    return json.dumps(True)
