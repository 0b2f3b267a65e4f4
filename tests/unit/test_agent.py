"""The agent over real WebRTC: aiortc peers on 127.0.0.1, the real signaling server, no mocks.

Every scenario runs under an overall timeout and closes its peer connections
in ``finally`` blocks, so a failure names what did not happen instead of
hanging.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("aiortc")

from aiohttp.test_utils import TestServer  # noqa: E402

from weei.agent.main import Agent, AgentOptions  # noqa: E402
from weei.agent.policy import AcceptancePolicy, CoordinatorTrust, describe_invitation  # noqa: E402
from weei.agent.storage import DiskKeyValue, DiskStorage, StorageError  # noqa: E402
from weei.agent.transport import AgentTransport  # noqa: E402
from weei.api.controller import TrainingController  # noqa: E402
from weei.core.wire.commands import Send  # noqa: E402
from weei.core.wire.messages import ArtifactRef, Deliver, Message  # noqa: E402
from weei.demo.run import DEMO_JOBS, _package_inputs, models_dir  # noqa: E402
from weei.host.memory_storage import MemoryKeyValue, MemoryStorage  # noqa: E402
from weei.host.worker_pool import ThreadWorkerPool  # noqa: E402
from weei.kernel.native import NativeKernel  # noqa: E402
from weei.runtime.wasmtime_engine import WasmtimeEngine  # noqa: E402
from weei.server.signaling import SignalingConfig, create_signaling_app  # noqa: E402
from weei.agent.signaling_client import SignalingClient  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DIGITS = next(job for job in DEMO_JOBS if job.model == "digits-mlp")
SETTINGS = {"epochs": 1, "localEpochs": 1, "batchSize": 16, "coordinatorParticipates": True}


@asynccontextmanager
async def signaling_server() -> AsyncIterator[str]:
    server = TestServer(create_signaling_app(SignalingConfig(secret=b"a" * 32)), host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("/signal"))
    finally:
        await server.close()


def run(coro: Any, timeout: float) -> Any:
    async def bounded() -> Any:
        try:
            return await asyncio.wait_for(coro, timeout)
        except TimeoutError:
            raise AssertionError(f"the scenario did not finish within {timeout:.0f} s") from None
    return asyncio.run(bounded())


async def until(what: str, check: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting until {what}")
        await asyncio.sleep(0.02)


class Inbox:
    """A Receiver that queues what arrives."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[tuple[str, Message | None, dict[str, bytes]]] = asyncio.Queue()
        self.connected: list[str] = []

    async def on_peer_message(self, peer: str, message: Message, blobs: Mapping[str, bytes]) -> None:
        await self.queue.put((peer, message, dict(blobs)))

    async def peer_disconnected(self, peer: str) -> None:
        await self.queue.put((peer, None, {}))

    async def peer_connected(self, peer: str) -> None:
        self.connected.append(peer)

    async def next(self, what: str, timeout: float = 30.0) -> tuple[str, Message | None, dict[str, bytes]]:
        try:
            return await asyncio.wait_for(self.queue.get(), timeout)
        except TimeoutError:
            raise AssertionError(f"nothing arrived within {timeout:.0f} s: expected {what}") from None


def deliver(peer: str, data: bytes, job: str) -> tuple[Send, dict[str, bytes]]:
    sha = hashlib.sha256(data).hexdigest()
    ref = ArtifactRef("module", sha, len(data))
    return Send(peer, Deliver(job, ref, {"id": job}), (ref,)), {sha: data}


# ------------------------------------------------------------------ (a) two peers, 5 MB both ways


def test_two_aiortc_peers_move_5mb_both_ways_through_the_framing() -> None:
    async def scenario() -> None:
        async with signaling_server() as url:
            a, b = AgentTransport(SignalingClient(url)), AgentTransport(SignalingClient(url))
            inbox_a, inbox_b = Inbox(), Inbox()
            try:
                await a.connect()
                await b.connect()
                a.attach(inbox_a)
                b.attach(inbox_b)
                started = time.monotonic()
                await a.join("pair")
                await b.join("pair")
                await a.wait_for_peer(b.peer_id, 20)
                await b.wait_for_peer(a.peer_id, 20)
                connect_s = time.monotonic() - started
                assert a.peers() == [b.peer_id] and b.peers() == [a.peer_id]

                one, two = os.urandom(5_000_000), os.urandom(5_000_001)
                started = time.monotonic()
                a.send(*deliver(b.peer_id, one, "a-to-b"))
                peer, message, blobs = await inbox_b.next("the 5 MB artifact from a")
                a_to_b = time.monotonic() - started
                assert peer == a.peer_id and isinstance(message, Deliver) and message.job_id == "a-to-b"
                assert blobs == {hashlib.sha256(one).hexdigest(): one}

                started = time.monotonic()
                b.send(*deliver(a.peer_id, two, "b-to-a"))
                peer, message, blobs = await inbox_a.next("the 5 MB artifact from b")
                b_to_a = time.monotonic() - started
                assert peer == b.peer_id and isinstance(message, Deliver) and message.job_id == "b-to-a"
                assert blobs == {hashlib.sha256(two).hexdigest(): two}

                for t in (a, b):  # finished transfers leave the book; nothing failed
                    assert t.transfers_state() == {"transfers": [], "transferErrors": {}}
                assert [(r.direction, r.type, r.bytes) for r in a.log] == [("send", "deliver", 5_000_000),
                                                                          ("receive", "deliver", 5_000_001)]
                print(f"\nconnect {connect_s:.2f} s; a->b {5 / a_to_b:.1f} MB/s; b->a {5 / b_to_a:.1f} MB/s")

                # a closed channel is peer_disconnected on the other side, once
                await a.close()
                peer, message, _ = await inbox_b.next("peer_disconnected after a closed")
                assert (peer, message) == (a.peer_id, None)
                await until("b shows no peers", lambda: b.peers() == [], 10)
            finally:
                await a.close()
                await b.close()
    run(scenario(), 60)


# ------------------------------------------------------------ (b) a job with an agent participant


def coordinator_controller(peer_id: str, transport: AgentTransport, engine: WasmtimeEngine,
                           room_key: str | None = None, storage: MemoryStorage | None = None) -> TrainingController:
    """A coordinator's controller as the CLI's host makes one; ``storage``: a given one (a restart's), else fresh."""
    return TrainingController(
        my_peer_id=peer_id, storage=storage if storage is not None else MemoryStorage(), kv=MemoryKeyValue(), pool=ThreadWorkerPool(engine, 1),
        kernel=NativeKernel(), engine=engine, clock=lambda: time.time() * 1000.0,
        monotonic=lambda: time.monotonic() * 1000.0, random_bytes=os.urandom, transport=transport,
        room_key=room_key)


@asynccontextmanager
async def coordinator(url: str, room: str, *, proves: bool = True) -> AsyncIterator[
        tuple[TrainingController, AgentTransport]]:
    """A coordinator in room ``room`` (the key); it proves the key to participants that ask, unless not ``proves``."""
    transport = AgentTransport(SignalingClient(url))
    try:
        welcome = await transport.connect()
        controller = coordinator_controller(welcome.peer_id, transport, WasmtimeEngine(), room if proves else None)
        await controller.init()
        transport.attach(controller, has=controller.holds)
        await transport.join(room)
        yield controller, transport
    finally:
        await transport.close()


def participant_view(controller: TrainingController, peer: str) -> dict[str, Any]:
    return controller.get_state()["job"]["participants"].get(peer, {})


def module_sha() -> str:
    return hashlib.sha256((models_dir() / DIGITS.model / "model.wasm").read_bytes()).hexdigest()


def test_agent_trains_digits_with_a_coordinator_over_webrtc(tmp_path: Path) -> None:
    async def scenario() -> None:
        out = io.StringIO()
        async with signaling_server() as url, coordinator(url, "digits") as (coord, coord_transport):
            agent = Agent(AgentOptions(server=url, room="digits", data_dir=tmp_path, accept_models=(module_sha(),),
                                       trust=CoordinatorTrust(room=True), workers=1), out=out)
            try:
                await agent.start()
                assert agent.peer_id is not None and agent.controller is not None
                await coord_transport.wait_for_peer(agent.peer_id, 20)
                job_id = await coord.create_job(**_package_inputs(DIGITS), settings=SETTINGS)
                coord.invite(agent.peer_id)
                await until("the agent loaded the module",
                            lambda: participant_view(coord, agent.peer_id).get("state") == "modelLoaded", 20)
                await coord.start()
                await until("the job completed", lambda: coord.get_state()["job"]["status"] in ("completed", "paused"),
                            45)
                state = coord.get_state()
                assert state["job"]["status"] == "completed", state.get("error")
                assert agent.decisions[job_id].accepted
                # --trust-room accepted only once the coordinator proved the room key to the agent itself
                assert f"job {job_id}: coordinator {coord_transport.peer_id} proved the room key" in out.getvalue()
                assert [e["event"] for e in agent.controller.get_debug_log()["events"]
                        if e["event"].startswith("room.proof.")] == ["room.proof.asked", "room.proof.accepted"]

                updates = [r for r in coord_transport.log if r.direction == "receive" and r.type == "update"]
                assert updates and all(r.peer == agent.peer_id for r in updates), "no update came from the agent"
                assert coord.coordinator is not None and not coord.coordinator.rejected

                # The agent's disk holds what it received: the module, every chunk, the newest checkpoint.
                await until("the agent saw the job finish", lambda: agent.controller.participant is not None
                            and agent.controller.participant.state == "stopped", 10)
                sent = [(sha, kind) for r in coord_transport.log if r.direction == "send" and r.peer == agent.peer_id
                        for sha, kind in zip(r.attachments, r.kinds, strict=True)]
                received = {sha for sha, _ in sent}
                checkpoints = [sha for sha, kind in sent if kind == "checkpoint"]
                assert len(checkpoints) >= 2
                on_disk = set(await agent.storage.keys("artifacts"))
                assert on_disk == (received - set(checkpoints)) | {checkpoints[-1]}, "module, chunks, last checkpoint"
                assert module_sha() in on_disk
                assert sorted(p.name for p in (tmp_path / "storage" / "blobs").iterdir()) == sorted(on_disk)
                for sha in on_disk:
                    data = await agent.storage.get("artifacts", sha)
                    assert hashlib.sha256(data).hexdigest() == sha

                env = agent.controller.get_state()["diagnostics"][agent.peer_id]["environment"]
                assert env["browser"] == "agent" and "weei-agent" in env["browserVersion"]
                assert f"accepted job {job_id}" in out.getvalue()
                # One line per assignment it trained, and what it waits for (issue 24, item 16).
                lines = re.findall(rf"job {job_id}: round (\d+) · chunk chunk-\d+ · (\d+) examples · \d+\.\d s · "
                                   r"loss \S+ · update sent; waiting for the round's merge", out.getvalue())
                assert len(lines) == len(updates) and all(int(n) > 0 for _, n in lines), out.getvalue()
                assert "waiting for an invitation" in out.getvalue()
                print(f"\n{len(updates)} updates from the agent, {len(coord.coordinator.checkpoints)} checkpoints, "
                      f"{len(received)} artifacts sent to it")
            finally:
                await agent.close()
    run(scenario(), 90)


# --------------------------------------------------- (c) the policy refuses; nothing is downloaded


def test_policy_refuses_other_module_and_nothing_is_downloaded(tmp_path: Path) -> None:
    other = hashlib.sha256(b"some other model").hexdigest()

    async def scenario() -> None:
        async with signaling_server() as url, coordinator(url, "refuse") as (coord, coord_transport):
            # The real command line, in its own process; it must stop cleanly on SIGTERM.
            env = dict(os.environ, PYTHONPATH=str(ROOT / "app" / "py"))
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "weei.cli", "agent", "--server", url, "--room", "refuse",
                "--ice-host", "127.0.0.1", "--accept-model", other, "--data-dir", str(tmp_path), "--workers", "1",
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
            try:
                await until("the agent process joined the room",
                            lambda: len(coord_transport.signaling.peers) == 2, 30)
                agent_id = next(p for p in coord_transport.signaling.peers if p != coord_transport.peer_id)
                await coord_transport.wait_for_peer(agent_id, 20)
                await coord.create_job(**_package_inputs(DIGITS), settings=SETTINGS)
                coord.invite(agent_id)
                await until("the agent declined", lambda: participant_view(coord, agent_id).get("state") == "declined",
                            20)
                # The coordinator hears which rule refused (its window's events feed says it, issue 24 item 12).
                declined = participant_view(coord, agent_id).get("declined", "")
                assert declined.startswith(f"module sha256 {module_sha()} is not one of --accept-model"), declined
                # Besides the coordinator's card (its name; docs/api.md "Names"), only the invitation went out.
                sent = [(r.type, r.attachments) for r in coord_transport.log
                        if r.direction == "send" and r.peer == agent_id and r.type != "presence"]
                assert sent == [("invitation", ())], sent
                assert not (tmp_path / "storage" / "records" / "artifacts").exists()
                assert not (tmp_path / "storage" / "blobs").exists()
                proc.send_signal(signal.SIGTERM)
                stdout, stderr = await asyncio.wait_for(proc.communicate(), 15)
            except BaseException as exc:
                if proc.returncode is None:
                    proc.kill()
                out, err = await proc.communicate()
                raise AssertionError(f"{exc}\n--- agent stdout:\n{out.decode()}\n--- agent stderr:\n{err.decode()}") \
                    from exc
            text = stdout.decode()
            assert proc.returncode == 0, stderr.decode()
            assert "refused job" in text and "is not one of --accept-model" in text, text
            assert "closed" in text
    run(scenario(), 60)


def test_trust_room_refuses_a_coordinator_that_does_not_prove_the_room_key(tmp_path: Path) -> None:
    """Issue 9: --trust-room trusted whoever the server let into the room. A coordinator in the room that
    cannot prove the key gets a named refusal, in the agent's output and debug log, and no compute."""
    async def scenario() -> None:
        out = io.StringIO()
        async with signaling_server() as url, coordinator(url, "keyed", proves=False) as (coord, coord_transport):
            agent = Agent(AgentOptions(server=url, room="keyed", data_dir=tmp_path, accept_models=(module_sha(),),
                                       trust=CoordinatorTrust(room=True), workers=1), out=out)
            try:
                await agent.start()
                assert agent.peer_id is not None and agent.controller is not None
                await coord_transport.wait_for_peer(agent.peer_id, 20)
                job_id = await coord.create_job(**_package_inputs(DIGITS), settings=SETTINGS)
                coord.invite(agent.peer_id)
                await until("the agent declined",
                            lambda: participant_view(coord, agent.peer_id).get("state") == "declined", 30)
                decision = agent.decisions[job_id]
                assert not decision.accepted and decision.reason.startswith("room-proof-missing:"), decision
                assert participant_view(coord, agent.peer_id).get("declined") not in (None, "declined")
                assert f"refused job {job_id}" in out.getvalue() and "room-proof-missing" in out.getvalue()
                events = agent.controller.get_debug_log()["events"]
                refused = [e for e in events if e["event"] == "room.proof.refused"]
                assert [e["details"]["reason"] for e in refused] == ["room-proof-missing"], events
                assert refused[0]["details"]["coordinator"] == coord_transport.peer_id
                # the coordinator got a challenge and answered it without a proof; nothing else went out
                sent = [(r.type, r.attachments) for r in coord_transport.log
                        if r.direction == "send" and r.peer == agent.peer_id and r.type != "presence"]
                assert sent == [("invitation", ()), ("roomProof", ())], sent
                assert not (tmp_path / "storage" / "blobs").exists()
            finally:
                await agent.close()
    run(scenario(), 90)


def test_policy_default_refuses_and_interactive_shows_the_invitation() -> None:
    invitation = {"coordinator": "c" * 26, "modelInfo": {"name": "Digits", "id": "digits-mlp", "version": "1.0.0"},
                  "module": {"fileName": "model.wasm", "bytes": 12345, "sha256": "ab" * 32}, "dataBytes": 2_000_000,
                  "settings": {"epochs": 1}}

    async def scenario() -> None:
        sender = "c" * 26
        refused = await AcceptancePolicy().decide("job-1", invitation, sender)
        assert not refused.accepted and "refuses every invitation" in refused.reason
        listed = await AcceptancePolicy(["AB" * 32]).decide("job-1", invitation, sender)
        assert not listed.accepted and "not trusted" in listed.reason  # a module hash alone accepts nothing
        listed = await AcceptancePolicy(["AB" * 32], trust=CoordinatorTrust(room=True)).decide(
            "job-1", invitation, sender)
        assert listed.accepted
        out = io.StringIO()
        prompts: list[str] = []
        asked = AcceptancePolicy(interactive=True, ask=lambda p: prompts.append(p) or "y", out=out)
        assert (await asked.decide("job-1", invitation, sender)).accepted and prompts
        no = AcceptancePolicy(interactive=True, ask=lambda p: "", out=io.StringIO())
        assert not (await no.decide("job-1", invitation, sender)).accepted
        shown = out.getvalue()
        for text in ("Digits", "digits-mlp", "1.0.0", "12.3 kB", "ab" * 32, "2.0 MB", '"epochs": 1', "c" * 26):
            assert text in shown, text
    run(scenario(), 10)
    assert describe_invitation("j", {}).startswith("Invitation to job j")


# ------------------------------------------------------------------------ (d) disk storage


def test_disk_storage_survives_a_restart(tmp_path: Path) -> None:
    blob = os.urandom(300_000)
    sha = hashlib.sha256(blob).hexdigest()

    async def write() -> None:
        storage = DiskStorage(tmp_path)
        await storage.put("artifacts", sha, blob)
        await storage.put("checkpoints", "job-1/00000001", {"summary": {"round": 1, "v": [1.5, None]}, "file": blob})
        await storage.put("jobs", "job-1", {"id": "job-1", "status": "running"})
        await storage.put("jobs", "job-2", {"id": "job-2"})
        await storage.delete("jobs", "job-2")
        kv = DiskKeyValue(tmp_path / "kv.json")
        kv.set("weei.debugLog", "[1,2]")

    async def read() -> None:
        storage = DiskStorage(tmp_path)  # a new process would do exactly this
        assert await storage.keys("jobs") == ["job-1"]
        assert await storage.keys("checkpoints") == ["job-1/00000001"]
        assert await storage.get("jobs", "job-1") == {"id": "job-1", "status": "running"}
        assert await storage.get("artifacts", sha) == blob
        entry = await storage.get("checkpoints", "job-1/00000001")
        assert entry == {"summary": {"round": 1, "v": [1.5, None]}, "file": blob}
        assert await storage.get("jobs", "nope") is None and await storage.keys("nothing") == []
        assert DiskKeyValue(tmp_path / "kv.json").get("weei.debugLog") == "[1,2]"
        # one copy of the bytes, named by content; no temporary files left behind
        assert [p.name for p in (tmp_path / "blobs").iterdir()] == [sha]
        assert not [p for p in tmp_path.rglob(".tmp-*")]
        await storage.delete("artifacts", sha)
        assert await storage.collect_garbage() == 0  # the checkpoint still names the blob
        await storage.delete("checkpoints", "job-1/00000001")
        assert await storage.collect_garbage() == 1
        # a damaged blob is an error, never wrong bytes
        await storage.put("artifacts", sha, blob)
        (tmp_path / "blobs" / sha).write_bytes(bytes([blob[0] ^ 1]) + blob[1:])  # b"x" + ... was no change 1 time in 256
        with pytest.raises(StorageError):
            await storage.get("artifacts", sha)

    asyncio.run(write())
    asyncio.run(read())


def test_controller_state_survives_on_disk_storage(tmp_path: Path) -> None:
    """The coordinator's own records through DiskStorage: a new controller finds the saved job."""
    engine = WasmtimeEngine()

    def controller() -> TrainingController:
        return TrainingController(
            my_peer_id="me", storage=DiskStorage(tmp_path / "s"), kv=DiskKeyValue(tmp_path / "kv.json"),
            pool=ThreadWorkerPool(engine, 1), kernel=NativeKernel(), engine=engine,
            clock=lambda: time.time() * 1000.0, monotonic=lambda: time.monotonic() * 1000.0,
            random_bytes=os.urandom)

    async def scenario() -> None:
        first = controller()
        await first.init()
        job_id = await first.create_job(**_package_inputs(DIGITS), settings=SETTINGS)
        second = controller()
        await second.init()
        assert second.get_state()["job"]["id"] == job_id
        assert second.get_state()["job"]["hasModuleFile"]
    asyncio.run(scenario())


# -------------------------------------------------- trickled candidates (what Chromium does)


class TricklingSignaling(SignalingClient):
    """Sends SDP without candidates, then each candidate and the end as `candidate` signals, as Chromium does."""

    trickled = 0

    async def signal(self, to: str, kind: str, payload: Any) -> None:
        if kind not in ("offer", "answer"):
            return await super().signal(to, kind, payload)
        lines = payload.split("\r\n")
        candidates = [line[2:] for line in lines if line.startswith("a=candidate:")]
        assert candidates, "aiortc gathered no candidate"
        bare = "\r\n".join(line for line in lines if not line.startswith(("a=candidate:", "a=end-of-candidates")))
        await super().signal(to, kind, bare)
        for candidate in candidates:
            await super().signal(to, "candidate", {"candidate": candidate, "sdpMid": "0", "sdpMLineIndex": 0})
            self.trickled += 1
        await super().signal(to, "candidate", {"candidate": "", "sdpMid": "0", "sdpMLineIndex": 0})


def test_peers_connect_with_trickled_candidates_only() -> None:
    async def scenario() -> None:
        async with signaling_server() as url:
            sig_a, sig_b = TricklingSignaling(url), TricklingSignaling(url)
            a, b = AgentTransport(sig_a), AgentTransport(sig_b)
            inbox = Inbox()
            try:
                await a.connect()
                await b.connect()
                b.attach(inbox)
                await a.join("trickle")
                await b.join("trickle")
                await a.wait_for_peer(b.peer_id, 20)
                assert sig_a.trickled and sig_b.trickled
                data = os.urandom(200_000)
                a.send(*deliver(b.peer_id, data, "trickled"))
                _, message, blobs = await inbox.next("a message over the trickled connection")
                assert isinstance(message, Deliver) and list(blobs.values()) == [data]
            finally:
                await a.close()
                await b.close()
    run(scenario(), 40)


def test_a_peer_that_comes_back_with_its_id_is_renegotiated() -> None:
    async def scenario() -> None:
        async with signaling_server() as url:
            a, b = AgentTransport(SignalingClient(url)), AgentTransport(SignalingClient(url))
            inbox = Inbox()
            b2: AgentTransport | None = None
            try:
                await a.connect()
                a.attach(inbox)
                await a.join("again")
                await b.connect()
                await b.join("again")
                await a.wait_for_peer(b.peer_id, 20)
                token, b_id = b.signaling.token, b.peer_id
                await b.close()
                peer, message, _ = await inbox.next("peer_disconnected for b")
                assert (peer, message) == (b_id, None)
                # a restart that keeps the peer ID (the token is bound to the room it joins again)
                b2 = AgentTransport(SignalingClient(url, token=token, room="again"))
                assert (await b2.connect()).peer_id == b_id
                await b2.join("again")
                await a.wait_for_peer(b_id, 20)
                await b2.wait_for_peer(a.peer_id, 20)
                data = os.urandom(100_000)
                b2.send(*deliver(a.peer_id, data, "again"))
                peer, message, blobs = await inbox.next("a message over the new connection")
                assert peer == b_id and list(blobs.values()) == [data]
            finally:
                await a.close()
                await b.close()
                if b2 is not None:
                    await b2.close()
    run(scenario(), 40)
