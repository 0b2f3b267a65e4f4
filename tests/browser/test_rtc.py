"""BrowserTransport over real WebRTC between separate Chromium processes, through `weei serve`'s /signal.

Each peer is a harness page (rtc_harness.html + rtc_peer.py, served by a
small test server on another origin) that loads Pyodide and weei-py.zip
from `weei serve`, signals through its /signal and runs
``weei.browser.rtc.BrowserTransport``.
Peer A lives in the session's Chromium, peer B in a second Chromium process
launched here, so the data channel crosses processes as between real users.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from link_cases import CASES
from site_helpers import CHROMIUM, CHROMIUM_ARGS, ROOT, TIMEOUT_MS, Server, serve_harness, start_server, stop_server

MB = 1_000_000


@pytest.fixture(scope="module")
def harness_origin() -> Iterator[str]:
    """A second origin serving the harness files."""
    httpd, origin = serve_harness()
    yield origin
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def weei_server(site: Path, harness_origin: str) -> Iterator[Server]:
    """`weei serve` whose /signal admits the harness's origin (a WebSocket from
    another origin is refused unless the operator names it: --allow-origin)."""
    server = start_server(site, "--allow-origin", harness_origin)
    yield server
    assert stop_server(server) == 0, "weei serve did not shut down cleanly:\n" + "".join(server.lines)


@pytest.fixture(scope="module")
def harness(weei_server: Server, harness_origin: str) -> str:
    """The harness URL, on the second origin.

    The page loads Pyodide and weei-py.zip from `weei serve`, which allows other origins.
    """
    weei = weei_server.url.rstrip("/") + "/"
    return f"{harness_origin}/rtc_harness.html?weei={quote(weei, safe='')}"


@pytest.fixture
def browser1(browser: Any) -> Iterator[Any]:
    """A fresh Chromium process for one peer of one test (not the session's, which earlier
    tests have loaded with pages: each peer here runs Pyodide and WebRTC)."""
    own = browser.browser_type.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
    yield own
    own.close()


@pytest.fixture
def browser2(browser: Any) -> Iterator[Any]:
    """A second fresh Chromium process: the other peer."""
    other = browser.browser_type.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
    yield other
    other.close()


class Peer:
    """One harness page; ``py(code)`` runs Python there and returns its JSON result decoded."""

    def __init__(self, browser: Any, harness_url: str) -> None:
        self.context = browser.new_context()
        self.page = self.context.new_page()
        self.page.set_default_timeout(TIMEOUT_MS)
        self.errors: list[str] = []
        self.console: list[str] = []
        self.page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))
        self.page.on("console", lambda m: self.console.append(f"{m.type}: {m.text}"))
        self.page.goto(harness_url)
        self.page.evaluate("() => window.harness")
        self.id = ""
        self.room = ""

    def reload(self) -> None:
        self.page.reload()
        self.page.evaluate("() => window.harness")

    def py(self, code: str) -> Any:
        try:
            return json.loads(self.page.evaluate("(code) => window.py(code)", code))
        except Exception as exc:
            raise AssertionError(f"{exc}\n--- console:\n" + "\n".join(self.console[-40:])) from None

    def start(self, room: str, url: str | None = None) -> str:
        self.room = room
        self.id = self.py(f"await rtc_peer.start({room!r}, {url!r})")
        return self.id

    def state(self) -> dict[str, Any]:
        return self.py("rtc_peer.state()")

    def close(self) -> None:
        self.context.close()


def new_room() -> str:
    return "rtc-" + uuid.uuid4().hex[:12]


def connect(a: Peer, b: Peer, url: str | None = None) -> float:
    room = new_room()
    started = time.monotonic()
    a.start(room, url)
    b.start(room, url)
    a.py(f"await rtc_peer.wait_peer({b.id!r}, 30)")
    b.py(f"await rtc_peer.wait_peer({a.id!r}, 30)")
    return time.monotonic() - started


def transfer(src: Peer, dst: Peer, size: int, job: str) -> float:
    """Send ``size`` random bytes src → dst; check the hash in dst; returns MB/s (send call to delivery)."""
    sent = src.py(f"rtc_peer.send_blob({dst.id!r}, {size}, {job!r})")
    got = dst.py(f"await rtc_peer.wait_event('message', {src.id!r}, {job!r}, 120)")
    assert got["type"] == "deliver" and got["job"] == job
    assert got["blobs"] == {sent["sha256"]: [size, sent["sha256"]]}, got
    seconds = max(1e-3, (got["at"] - sent["at"]) / 1000)
    return size / MB / seconds


# ------------------------------------------------------------------ (a) + (b)


def test_two_browser_processes_move_5mb_both_ways_then_see_the_close(harness: str, browser1: Any,
                                                                     browser2: Any) -> None:
    a, b = Peer(browser1, harness), Peer(browser2, harness)
    try:
        connect_s = connect(a, b)
        ab = transfer(a, b, 5 * MB, "a-to-b")
        ba = transfer(b, a, 5 * MB, "b-to-a")
        print(f"\nconnect {connect_s:.2f} s; 5 MB A->B {ab:.1f} MB/s; B->A {ba:.1f} MB/s")
        for peer, other in ((a, b), (b, a)):
            state = peer.state()
            assert state["peers"] == [other.id]
            assert state["transfers"] == [] and state["transferErrors"] == {}, state
            assert [e["kind"] for e in state["events"]][:1] == ["connected"]
            assert state["dropped"] == 0

        # (b) B's page goes away: A hears peer_disconnected within a few seconds.
        closed = time.monotonic()
        b.close()
        a.py(f"await rtc_peer.wait_event('disconnected', {b.id!r}, timeout=10)")
        seen_s = time.monotonic() - closed
        print(f"peer_disconnected {seen_s:.2f} s after B's page closed")
        assert seen_s < 10
        state = a.state()
        assert state["peers"] == [] and [e["kind"] for e in state["events"]].count("disconnected") == 1
        assert not a.errors and not b.errors, a.errors + b.errors
    finally:
        a.close()
        b.close()


# ------------------------------------------------------------------ the shared link-adapter suite


@pytest.fixture(scope="module")
def case_page(harness: str, browser: Any) -> Iterator[Peer]:
    """One harness page in its own Chromium process; each case runs its two transports in it."""
    own = browser.browser_type.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
    page = Peer(own, harness)
    yield page
    page.close()
    own.close()


@pytest.mark.parametrize("case", sorted(CASES))
def test_browser_transport_passes_the_shared_link_cases(case_page: Peer, case: str) -> None:
    """tests/browser/link_cases.py, the suite tests/unit/test_peerlink_adapters.py runs against aiortc."""
    assert case_page.py(f"await rtc_peer.run_case({case!r}, {new_room()!r})") == case
    assert not case_page.errors, case_page.errors


# ------------------------------------------------------------------ (c)


def test_hostile_frames_are_refused_with_named_reasons(harness: str, browser1: Any, browser2: Any) -> None:
    a, h = Peer(browser1, harness), Peer(browser2, harness)
    try:
        connect(a, h)
        # A frame with a bad hash: that transfer is dropped, the channel goes on.
        bad = hashlib.sha256(b"something else").hexdigest()
        h.py(f"rtc_peer.raw_send({a.id!r}, rtc_peer.hostile_frames({a.id!r}, 'bad-hash'))")
        transfer(h, a, 100_000, "still-fine")
        state = a.state()
        assert state["transferErrors"][bad].startswith("hash-mismatch: "), state
        assert state["peers"] == [h.id]

        # Framing corruption breaks the channel; the pair reconnects and says why.
        for case, reason in (("oversized", "oversized-frame"), ("garbage", "bad-frame"), ("text", "bad-frame")):
            before = len(a.state()["events"])
            h.py(f"rtc_peer.raw_send({a.id!r}, rtc_peer.hostile_frames({a.id!r}, {case!r}))")
            a.py(f"await rtc_peer.wait_event('disconnected', {h.id!r}, timeout=15, after={before})")
            state = a.state()
            assert state["transferErrors"][f"channel:{h.id}"].startswith(reason + ": "), (case, state)
            a.py(f"await rtc_peer.wait_event('connected', {h.id!r}, timeout=30, after={before})")
            h.py(f"await rtc_peer.wait_peer({a.id!r}, 30)")

        # A's page survived all of it: messages flow both ways on the new channel.
        transfer(h, a, 200_000, "after-h")
        transfer(a, h, 200_000, "after-a")
        assert not a.errors, a.errors
    finally:
        a.close()
        h.close()


# ------------------------------------------------------------------ signaling restart, page reload


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_signaling(port: int, origin: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "WEEI_SIGNAL_SECRET": "restart-test-secret-0123456789"}
    proc = subprocess.Popen([sys.executable, "-m", "weei.server.signaling", "--port", str(port),
                             "--allow-origin", origin], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc
        assert proc.poll() is None and time.monotonic() < deadline, "the signaling server did not start"
        time.sleep(0.05)


def _until(what: str, check: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s waiting until {what}"
        time.sleep(0.1)


def test_signaling_restart_and_page_reload_keep_peer_ids(harness: str, harness_origin: str,
                                                          browser1: Any, browser2: Any) -> None:
    port = _free_port()
    url = f"ws://127.0.0.1:{port}/signal"
    server = _start_signaling(port, harness_origin)
    a, b = Peer(browser1, harness), Peer(browser2, harness)
    try:
        connect(a, b, url)
        first_a, first_b = a.id, b.id

        # The server goes away: open channels keep working without it.
        server.send_signal(signal.SIGTERM)
        assert server.wait(15) == 0
        _until("both pages saw the signaling socket close",
               lambda: not a.state()["signaling"]["connected"] and not b.state()["signaling"]["connected"], 10)
        transfer(a, b, 100_000, "while-server-down")

        # It comes back (same secret): both reconnect by themselves and keep their IDs.
        server = _start_signaling(port, harness_origin)
        _until("both pages reconnected", lambda: all(
            s["signaling"]["connected"] and s["signaling"]["reconnects"] >= 1 and s["signaling"]["resumed"]
            for s in (a.state(), b.state())), 40)
        assert (a.state()["peerId"], b.state()["peerId"]) == (first_a, first_b)
        # The first to rejoin saw a room without the other and, as docs/peers.md says, dropped
        # that link: the pair re-negotiates once both are back.
        a.py(f"await rtc_peer.wait_peer({first_b!r}, 30)")
        b.py(f"await rtc_peer.wait_peer({first_a!r}, 30)")
        transfer(b, a, 100_000, "after-restart")

        # B reloads: same tab, same sessionStorage token, same peer ID; A reconnects to it.
        before = len(a.state()["events"])
        b.reload()
        assert b.start(a.room, url) == first_b
        a.py(f"await rtc_peer.wait_event('disconnected', {first_b!r}, timeout=15, after={before})")
        a.py(f"await rtc_peer.wait_event('connected', {first_b!r}, timeout=30, after={before})")
        b.py(f"await rtc_peer.wait_peer({first_a!r}, 30)")
        assert b.state()["signaling"]["resumed"] is True
        transfer(b, a, 100_000, "after-reload")
        transfer(a, b, 100_000, "after-reload-back")
        assert not a.errors and not b.errors, a.errors + b.errors
    finally:
        a.close()
        b.close()
        server.send_signal(signal.SIGTERM)
        server.wait(15)


# ------------------------------------------------------------------ (d)


class _AgentInbox:
    def __init__(self) -> None:
        self.items: list[tuple[str, Any, dict[str, bytes]]] = []

    async def on_peer_message(self, peer: str, message: Any, blobs: Mapping[str, bytes]) -> None:
        self.items.append((peer, message, dict(blobs)))

    async def peer_disconnected(self, peer: str) -> None:
        self.items.append((peer, None, {}))


def test_browser_and_aiortc_agent_exchange_messages(weei_server: Any, harness: str, browser1: Any) -> None:
    pytest.importorskip("aiortc")
    from weei.agent.transport import AgentTransport
    from weei.core.wire.commands import Send
    from weei.core.wire.messages import ArtifactRef, Deliver
    from weei.agent.signaling_client import SignalingClient

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def run(coro: Any, timeout: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)

    ws_url = weei_server.url.replace("http://", "ws://").rstrip("/") + "/signal"
    page = Peer(browser1, harness)
    inbox = _AgentInbox()
    agent: Any = None
    try:
        room = new_room()

        async def make() -> Any:
            transport = AgentTransport(SignalingClient(ws_url))
            await transport.connect()
            transport.attach(inbox)
            await transport.join(room)
            return transport

        agent = run(make())
        page.start(room)
        run(agent.wait_for_peer(page.id, 30))
        page.py(f"await rtc_peer.wait_peer({agent.peer_id!r}, 30)")

        # agent -> browser
        data = os.urandom(2 * MB)
        sha = hashlib.sha256(data).hexdigest()
        ref = ArtifactRef("module", sha, len(data))
        started = time.time() * 1000
        loop.call_soon_threadsafe(agent.send, Send(page.id, Deliver("from-agent", ref, {"id": "x"}), (ref,)),
                                  {sha: data})
        got = page.py(f"await rtc_peer.wait_event('message', {agent.peer_id!r}, 'from-agent', 60)")
        assert got["blobs"] == {sha: [len(data), sha]}
        agent_to_page = len(data) / MB / max(1e-3, (got["at"] - started) / 1000)

        # browser -> agent
        sent = page.py(f"rtc_peer.send_blob({agent.peer_id!r}, {2 * MB}, 'from-page')")
        deadline = time.monotonic() + 60
        while not any(m is not None and m.job_id == "from-page" for _, m, _ in list(inbox.items)):
            assert time.monotonic() < deadline, f"nothing from the page; agent links {agent.describe()}"
            time.sleep(0.05)
        peer, message, blobs = next(i for i in inbox.items if i[1] is not None and i[1].job_id == "from-page")
        page_to_agent = 2 * MB / MB / max(1e-3, time.time() - sent["at"] / 1000)
        assert peer == page.id and isinstance(message, Deliver)
        assert {k: hashlib.sha256(v).hexdigest() for k, v in blobs.items()} == {sent["sha256"]: sent["sha256"]}
        print(f"\naiortc->browser {agent_to_page:.1f} MB/s; browser->aiortc {page_to_agent:.1f} MB/s (2 MB)")
        assert page.state()["transferErrors"] == {}
        assert not page.errors, page.errors
    finally:
        if agent is not None:
            run(agent.close(), 30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        page.close()
