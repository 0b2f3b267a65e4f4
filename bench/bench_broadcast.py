"""Checkpoint broadcast over WebRTC against a raw aiortc data channel, as ratios measured in one run.

    .venv/bin/python bench/bench_broadcast.py [--mb 16] [--repeat 3] [--peers 1,2,4]

Broadcast: a coordinator ``AgentTransport`` and N participant
``AgentTransport``s meet in one room of the real signaling server
(weei.server.signaling, on a free port of 127.0.0.1). The coordinator sends
one ``Assign`` per participant (one ``Send`` each, exactly as the
controller's commands come out), all naming the same checkpoint of
``--mb`` MB of float32 weights and carrying it as the attachment. Timed from
the first ``send`` until every participant's receiver has the message with
the checkpoint, which the participant's ``FrameReader`` has reassembled and
verified against its SHA-256 (the bytes are compared again after the clock
stops).

Relayed: the same room and a fresh checkpoint, delivered as the product does
it since the relay (``weei.core.links.relay``, docs/peers.md): the coordinator's
host drives a ``Broadcast`` (plans, then the pieces to the first participant
of a chain), each participant's host a ``RelayNode`` (each verified piece
forwarded at once to the next), relayDone reports back. Timed from the
first send until every participant has assembled the checkpoint (compared
with the original bytes afterwards). ``copies`` is the coordinator's own
bytes sent over the checkpoint's size.

``--processes`` puts each participant in a process of its own (it
acknowledges each checkpoint with a ``trainingStarted`` carrying the
SHA-256 of what it holds), as on machines of their own. Four aiortc
participant processes and the coordinator share this machine's cores, so
on 2 cores they are the limit (see the "why P3" line): ``--mb 16 --repeat
1 --peers 1,4`` takes ~80 s.

The P3 line (issue 11): the relayed delivery to 4 over the direct delivery
to 1, best of each, in the same run; ``--no-relay`` gives the line of the
direct send (the code before the relay). Two more P3 lines, labelled
SIMULATED LINKS, give the same plan over links of their own
(``bench/relay_sim.py``: the product's ``Broadcast`` and ``RelayNode``s, in
simulated time): every uplink at the raw aiortc rate of this run (20 ms
latency), then at a fixed 10 MB/s (50 ms). They say what the plan itself
costs, apart from this one process on one core. A "why P3" line after
them says what limits the real one: the CPU the direct send to 1 took (this
process's; with ``--processes`` that of every process of the benchmark,
from /proc), times the 4 copies a delivery to 4 must receive and, relayed,
send again, over the cores the peers can use, against the wall time of
that direct send; and how busy those cores were in the relayed run.

Raw: the same number of bytes between two plain aiortc
``RTCPeerConnection``s (SDP handed over in-process), 64 KiB messages on an
ordered, reliable ``RTCDataChannel`` with the transport's back-pressure
(send while ``bufferedAmount`` < 4 MiB, resume on ``bufferedamountlow`` at
1 MiB); no framing, no hashing. Timed until the receiver has every byte.

Every peer runs in this one process and one event loop (aiortc is pure
Python plus C for crypto; the SCTP stack and the framing share one core), so
the ratio is the cost of framing + hashing + the transport, and the
aggregate for N > 1 is what one Python process can push, not what a network
could carry. For each N, every repetition runs a raw transfer and then the
broadcast back to back (fresh weights each time); the table gives the best
of ``--repeat`` of each and their ratio, the process CPU time over wall time
of that best run, and every run's time (the spread shows a busy machine).
Host candidates are pinned to 127.0.0.1 (aioice otherwise skips loopback and
uses the other interfaces), and every SDP is checked to carry no other
address.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import re
import sys
import time
from collections.abc import Mapping
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import Any

import aioice.ice
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "app" / "py"))

from aiohttp.test_utils import TestServer  # noqa: E402
from machine_cpu import tree_cpu  # noqa: E402  (bench/, this script's folder)
from aiortc import RTCConfiguration, RTCDataChannel, RTCPeerConnection  # noqa: E402

from weei.agent.transport import HIGH_WATER, LOW_WATER, AgentTransport  # noqa: E402
from weei.adapters.link_transport import now_ms  # noqa: E402
from weei.core.wire.commands import Log, Send  # noqa: E402
from weei.core.wire.messages import ArtifactRef, Assign, Message, TrainingStarted, UnitRange  # noqa: E402
from weei.core.links.relay import PIPELINE_PIECES, Broadcast, RelayNode, Relays  # noqa: E402
from weei.core.wire.messages import RelayDone, RelayPiece, RelayPlan  # noqa: E402
from weei.server.signaling import SignalingConfig, create_signaling_app  # noqa: E402
from weei.agent.signaling_client import SignalingClient  # noqa: E402

import relay_sim  # noqa: E402  (bench/relay_sim.py: the same plan over simulated links)

RAW_MESSAGE = 64 * 1024
MB = 1_000_000
TIMEOUT_S = float(os.environ.get("WEEI_BENCH_TIMEOUT", "60"))


def _loopback_only(use_ipv4: bool, use_ipv6: bool) -> list[str]:
    return ["127.0.0.1"] if use_ipv4 else []


aioice.ice.get_host_addresses = _loopback_only  # all ICE traffic on 127.0.0.1

_ADDR = re.compile(r"^(?:a=candidate:\S+ \d+ \S+ \d+ (\S+) |c=IN IP[46] (\S+))", re.M)


def check_loopback(sdp: str) -> None:
    addresses = {a or c for a, c in _ADDR.findall(sdp)} - {"0.0.0.0"}
    if addresses - {"127.0.0.1"}:
        raise AssertionError(f"an SDP names addresses other than 127.0.0.1: {sorted(addresses)}")


# ----------------------------------------------------------------------- raw


class RawPair:
    """Two aiortc peer connections joined by one plain data channel."""

    def __init__(self) -> None:
        config = RTCConfiguration(iceServers=[])
        self.a, self.b = RTCPeerConnection(config), RTCPeerConnection(config)
        self.tx: RTCDataChannel | None = None
        self.rx: RTCDataChannel | None = None
        self.expected = 0
        self.received = 0
        self.done = asyncio.Event()

    async def open(self) -> None:
        self.tx = self.a.createDataChannel("raw", ordered=True)
        self.tx.bufferedAmountLowThreshold = LOW_WATER
        got: asyncio.Future[RTCDataChannel] = asyncio.get_running_loop().create_future()
        opened = asyncio.Event()
        self.tx.on("open", opened.set)
        self.b.on("datachannel", lambda ch: got.done() or got.set_result(ch))
        await self.a.setLocalDescription(await self.a.createOffer())
        check_loopback(self.a.localDescription.sdp)
        await self.b.setRemoteDescription(self.a.localDescription)
        await self.b.setLocalDescription(await self.b.createAnswer())
        check_loopback(self.b.localDescription.sdp)
        await self.a.setRemoteDescription(self.b.localDescription)
        self.rx = await asyncio.wait_for(got, 20)
        await asyncio.wait_for(opened.wait(), 20)
        self.rx.on("message", self._on_message)

    def _on_message(self, data: bytes | str) -> None:
        self.received += len(data)
        if self.received >= self.expected:
            self.done.set()

    async def transfer(self, data: bytes) -> float:
        """Seconds to move ``data`` in 64 KiB messages under the transport's watermarks."""
        tx = self.tx
        assert tx is not None
        self.expected, self.received = len(data), 0
        self.done.clear()
        view = memoryview(data)
        offset = 0

        def pump() -> None:
            nonlocal offset
            buffered = tx.bufferedAmount
            while buffered < HIGH_WATER and offset < len(view):
                piece = bytes(view[offset:offset + RAW_MESSAGE])
                tx.send(piece)
                offset += len(piece)
                buffered += len(piece)

        tx.remove_all_listeners("bufferedamountlow")
        tx.on("bufferedamountlow", pump)
        started = time.perf_counter()
        pump()
        await asyncio.wait_for(self.done.wait(), TIMEOUT_S)
        elapsed = time.perf_counter() - started
        assert self.received == len(data)
        return elapsed

    async def close(self) -> None:
        await asyncio.gather(self.a.close(), self.b.close(), return_exceptions=True)


# ----------------------------------------------------------------- broadcast


class Participant:
    """A Receiver that notes when the checkpoint of the current round arrived.

    Direct: the checkpoint comes as the attachment of an Assign. Relayed: the
    participant runs ``weei.core.links.relay.RelayNode`` as a host would: plans and
    pieces go to the node, the node's Sends go out on this peer's transport,
    and the checkpoint arrives when the node has assembled it.
    """

    def __init__(self, transport: AgentTransport | None = None) -> None:
        self.transport = transport
        self.node: RelayNode | None = None
        self.coordinator: str | None = None
        self.expect: str | None = None
        self.got: tuple[float, bytes] | None = None
        self.arrived: asyncio.Event = asyncio.Event()
        self.errors: list[str] = []
        self.ack = False  # a --child process: acknowledge every checkpoint to the coordinator

    def reset(self, sha: str) -> None:
        self.expect, self.got = sha, None
        self.arrived.clear()

    async def on_peer_message(self, peer: str, message: Message, blobs: Mapping[str, bytes]) -> None:
        if isinstance(message, (RelayPlan, RelayPiece)) and self.node is not None and self.transport is not None:
            if isinstance(message, RelayPlan):
                self.node.plan(peer, message, job_id="bench-job", coordinator=self.coordinator)
            else:
                self.node.piece(peer, message, blobs)
            for command in self.node.take_commands():
                if isinstance(command, Send):
                    self.transport.send(command, command.blobs)
                elif command.event == "relay.failed":
                    self.errors.append(f"{command.details}")
            for sha, data in self.node.take_assembled().items():
                self._arrive(sha, data)
            return
        if self.ack and isinstance(message, Assign):
            self._arrive(message.checkpoint.sha256, blobs[message.checkpoint.sha256])
            return
        if not isinstance(message, Assign) or message.checkpoint.sha256 != self.expect:
            self.errors.append(f"unexpected {message.TYPE} from {peer}")
            return
        self.got = (time.perf_counter(), blobs[message.checkpoint.sha256])
        self.arrived.set()

    def _arrive(self, sha: str, data: bytes) -> None:
        if self.ack and self.transport is not None and self.coordinator is not None:
            got = hashlib.sha256(data).hexdigest()  # what this process holds, for the parent to compare
            self.transport.send(Send(self.coordinator, TrainingStarted("bench-job", got)), {})
        elif sha == self.expect:
            self.got = (time.perf_counter(), data)
            self.arrived.set()

    async def peer_disconnected(self, peer: str) -> None:
        self.errors.append(f"{peer} disconnected")

    async def peer_connected(self, peer: str) -> None:
        pass


class Coordinator:
    """The coordinator's Receiver in relayed mode: relayDone reports go to the open ``Broadcast``."""

    def __init__(self, transport: AgentTransport) -> None:
        self.transport = transport
        self.cast: Broadcast | None = None
        self.logs: list[Log] = []
        self.acks: dict[str, tuple[float, str]] = {}  # --processes: peer -> (when, the SHA-256 it holds)
        self.expect = 0
        self.all_in = asyncio.Event()

    def run(self) -> None:
        assert self.cast is not None
        for command in self.cast.take_commands():
            if isinstance(command, Send):
                self.transport.send(command, command.blobs)
            else:
                self.logs.append(command)

    async def on_peer_message(self, peer: str, message: Message, blobs: Mapping[str, bytes]) -> None:
        if isinstance(message, TrainingStarted):
            self.acks[peer] = (time.perf_counter(), message.attempt_id)
            if len(self.acks) >= self.expect:
                self.all_in.set()
        elif isinstance(message, RelayDone) and self.cast is not None:
            self.cast.relay_done(peer, message, now_ms())
            self.run()

    async def peer_disconnected(self, peer: str) -> None:
        if self.cast is not None:
            self.cast.peer_left(peer, now_ms())
            self.run()

    async def peer_connected(self, peer: str) -> None:
        pass


def assign_for(peer_index: int, round_: int, ref: ArtifactRef) -> Assign:
    # An experience range, not a chunk: the checkpoint is the one artifact the message names
    # (a chunk ref would have to travel too, or be held by the participant).
    seed = 1234 + peer_index
    return Assign("bench-job", round_, f"a{round_}-{peer_index}", f"t{round_}-{peer_index}", ref,
                  {"epochs": 1, "localEpochs": 1, "batchSize": 16}, seed,
                  experience=UnitRange(100 * peer_index, 100, seed, 1234))


class Room:
    """A coordinator and N participants, every channel open (the participants' to each other too)."""

    def __init__(self, url: str, n: int) -> None:
        self.url, self.n = url, n
        self.coordinator = AgentTransport(SignalingClient(url))
        self.transports = [AgentTransport(SignalingClient(url)) for _ in range(n)]
        self.receivers = [Participant(t) for t in self.transports]
        self.host = Coordinator(self.coordinator)
        self.relays: Relays | None = None
        self.copies = 0.0  # checkpoint copies the coordinator sent in the last run (its bytes_sent / size)

    async def open(self, room: str) -> None:
        await self.coordinator.connect()
        self.coordinator.attach(self.host)
        for transport, receiver in zip(self.transports, self.receivers):
            await transport.connect()
            transport.attach(receiver)
        await self.coordinator.join(room)
        for transport in self.transports:
            await transport.join(room)
        everyone = [self.coordinator, *self.transports]
        for a in everyone:
            for b in everyone:
                if a is not b:
                    assert b.peer_id is not None
                    await a.wait_for_peer(b.peer_id, 30)
        assert self.coordinator.peer_id is not None
        self.relays = Relays(self.coordinator.peer_id, "bench-job")
        for transport, receiver in zip(self.transports, self.receivers):
            assert transport.peer_id is not None
            receiver.node, receiver.coordinator = RelayNode(transport.peer_id), self.coordinator.peer_id
        for handle in [*self.coordinator._handles.values(),
                       *(handle for t in self.transports for handle in t._handles.values())]:
            for description in (handle.pc.localDescription, handle.pc.remoteDescription):
                if description is not None:
                    check_loopback(description.sdp)

    async def relayed(self, weights: bytes, round_: int) -> float:
        """Seconds from the coordinator's first Send until every participant assembled the checkpoint
        relayed down a chain of participants (``weei.core.links.relay``)."""
        assert self.relays is not None
        sha = hashlib.sha256(weights).hexdigest()
        self._reset(sha)
        sent = self.coordinator.bytes_sent
        started = time.perf_counter()
        self.host.cast = self.relays.broadcast(round_, sha, weights, self.targets(), now_ms())
        self.host.run()
        await self._wait(sha)
        finished = self._check(weights)
        assert not self.host.cast.errors, self.host.cast.errors
        self.copies = (self.coordinator.bytes_sent - sent) / len(weights)
        return finished - started

    def targets(self) -> list[str]:
        return [t.peer_id for t in self.transports]  # type: ignore[misc]

    def _reset(self, sha: str) -> None:
        for receiver in self.receivers:
            receiver.reset(sha)

    def _arrived(self) -> Any:
        return asyncio.gather(*(r.arrived.wait() for r in self.receivers))

    def _check(self, weights: bytes) -> float:
        """When the last participant had the checkpoint; each one's bytes are the original's."""
        for receiver in self.receivers:
            assert receiver.got is not None and not receiver.errors, receiver.errors
            assert receiver.got[1] == weights, "the checkpoint arrived with other bytes"
        return max(r.got[0] for r in self.receivers if r.got is not None)

    async def _wait(self, sha: str) -> None:
        deadline = time.monotonic() + TIMEOUT_S
        waiting = self._arrived()
        while not waiting.done():
            if time.monotonic() > deadline:
                waiting.cancel()
                raise AssertionError(
                    f"the checkpoint did not reach every participant within {TIMEOUT_S:.0f} s: sent "
                    f"{self.coordinator.bytes_sent} B; received {[t.bytes_received for t in self.transports]} B; "
                    f"errors {[t.transfers_state()['transferErrors'] for t in self.transports]} "
                    f"{[r.errors for r in self.receivers]} acks {sorted(self.host.acks)}")
            await asyncio.wait([waiting], timeout=0.5)
            if self.host.cast is not None:  # the relay's deadlines, on this clock
                self.host.cast.handle_timer(now_ms())
                self.host.run()

    async def broadcast(self, weights: bytes, round_: int) -> float:
        """Seconds from the first Send until every participant holds the verified checkpoint."""
        sha = hashlib.sha256(weights).hexdigest()
        ref = ArtifactRef("checkpoint", sha, len(weights))
        blobs = {sha: weights}
        sends = [Send(peer, assign_for(i, round_, ref), (ref,)) for i, peer in enumerate(self.targets())]
        self._reset(sha)
        self.host.cast = None
        sent = self.coordinator.bytes_sent
        started = time.perf_counter()
        for send in sends:
            self.coordinator.send(send, blobs)
        await self._wait(sha)
        finished = self._check(weights)
        assert self.coordinator.dropped == 0
        self.copies = (self.coordinator.bytes_sent - sent) / len(weights)
        return finished - started

    async def close(self) -> None:
        await asyncio.gather(self.coordinator.close(), *(t.close() for t in self.transports),
                             return_exceptions=True)


class ProcessRoom(Room):
    """``--processes``: each participant is a process of its own (``--child``), as on its own machine.

    A participant acknowledges a checkpoint with a ``trainingStarted`` whose
    attempt id is the SHA-256 it computed over the bytes it holds; the time
    is the coordinator's when the last acknowledgement arrives.
    """

    def __init__(self, url: str, n: int) -> None:
        super().__init__(url, 0)
        self.n = n
        self.children: list[asyncio.subprocess.Process] = []
        self.ids: list[str] = []

    async def open(self, room: str) -> None:
        await self.coordinator.connect()
        self.coordinator.attach(self.host)
        await self.coordinator.join(room)
        assert self.coordinator.peer_id is not None
        for _ in range(self.n):
            self.children.append(await asyncio.create_subprocess_exec(
                sys.executable, __file__, "--child", self.url, room, self.coordinator.peer_id, str(self.n),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE))
        for child in self.children:
            assert child.stdout is not None
            self.ids.append((await asyncio.wait_for(child.stdout.readline(), 120)).decode().strip())
        for peer in self.ids:
            await self.coordinator.wait_for_peer(peer, 60)
        self.relays = Relays(self.coordinator.peer_id, "bench-job")

    def targets(self) -> list[str]:
        return list(self.ids)

    def _reset(self, sha: str) -> None:
        self.host.acks.clear()
        self.host.all_in.clear()
        self.host.expect = self.n

    def _arrived(self) -> Any:
        return asyncio.ensure_future(self.host.all_in.wait())

    def _check(self, weights: bytes) -> float:
        sha = hashlib.sha256(weights).hexdigest()
        assert sorted(self.host.acks) == sorted(self.ids), self.host.acks
        assert all(got == sha for _, got in self.host.acks.values()), "a checkpoint arrived with other bytes"
        return max(t for t, _ in self.host.acks.values())

    async def close(self) -> None:
        for child in self.children:
            if child.stdin is not None:
                child.stdin.close()
        await asyncio.gather(*(asyncio.wait_for(c.wait(), 30) for c in self.children), return_exceptions=True)
        await self.coordinator.close()


async def child(url: str, room: str, coordinator: str, n: int) -> None:
    """One participant of ``ProcessRoom``: relays what it is told to, acknowledges each checkpoint."""
    transport = AgentTransport(SignalingClient(url))
    receiver = Participant(transport)
    receiver.coordinator, receiver.ack = coordinator, True
    await transport.connect()
    transport.attach(receiver)
    await transport.join(room)
    assert transport.peer_id is not None
    receiver.node = RelayNode(transport.peer_id)
    deadline = time.monotonic() + 120
    while len(transport.peers()) < n and time.monotonic() < deadline:  # the coordinator and the n-1 others
        await asyncio.sleep(0.1)
    print(transport.peer_id, flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the parent closes stdin
    await transport.close()


# ---------------------------------------------------------------------- main


@dataclass(frozen=True, order=True)
class Run:
    """One timed transfer: wall seconds (runs order by it), this process's CPU seconds meanwhile, and those
    of this process and every process it started (the participants with --processes; None without /proc)."""

    seconds: float
    cpu: float
    tree_cpu: float | None


async def timed(transfer: Any) -> Run:
    """The transfer's reported wall seconds, with the CPU this process and its process tree spent meanwhile."""
    cpu, tree = time.process_time(), tree_cpu()
    seconds = await transfer
    after = tree_cpu()
    return Run(seconds, time.process_time() - cpu, None if tree is None or after is None else after - tree)


def spread(runs: list[Run]) -> str:
    return " ".join(f"{r.seconds:.2f}" for r in runs)


def checkpoint(nbytes: int, seed: int) -> bytes:
    return np.random.default_rng(seed).standard_normal(nbytes // 4, dtype=np.float32).tobytes()


async def measure(mb: float, repeat: int, counts: list[int], relay: bool, processes: bool,
                  whole_mib: bool = False) -> tuple[list[tuple[str, ...]], dict[tuple[str, int], Run]]:
    nbytes = int(mb * MB) // 4 * 4
    server = TestServer(create_signaling_app(SignalingConfig(secret=b"b" * 32)), host="127.0.0.1")
    await server.start_server()
    url = str(server.make_url("/signal"))
    raw = RawPair()
    rooms: dict[int, Room] = {}
    # Per N, each repetition is a (raw, broadcast) pair run back to back.
    raw_runs: dict[int, list[Run]] = {n: [] for n in counts}
    cast_runs: dict[int, list[Run]] = {n: [] for n in counts}
    relay_runs: dict[int, list[Run]] = {n: [] for n in counts}
    mib_runs: dict[int, list[Run]] = {n: [] for n in counts}  # --whole-mib: the plan before
    copies: dict[tuple[str, int], float] = {}
    try:
        await raw.open()
        for n in counts:
            rooms[n] = ProcessRoom(url, n) if processes else Room(url, n)
            await rooms[n].open(f"broadcast-{n}")
        await raw.transfer(checkpoint(nbytes, 99))  # warm-up: SCTP congestion window, allocators
        for n in counts:
            await rooms[n].broadcast(checkpoint(nbytes, 98), 1)
            if relay:
                await rooms[n].relayed(checkpoint(nbytes, 97), 1)
        for rep in range(repeat):  # fresh weights every time
            for n in counts:
                raw_runs[n].append(await timed(raw.transfer(checkpoint(nbytes, 10 * rep + n))))
                cast_runs[n].append(await timed(rooms[n].broadcast(checkpoint(nbytes, 1000 + 10 * rep + n), rep + 2)))
                copies["direct", n] = rooms[n].copies
                if relay:
                    relay_runs[n].append(await timed(rooms[n].relayed(checkpoint(nbytes, 2000 + 10 * rep + n), rep + 2)))
                    copies["relay", n] = rooms[n].copies
                if relay and whole_mib:
                    policy = rooms[n].relays
                    assert policy is not None
                    policy.pipeline_pieces = 1  # pieces of 1 MiB, as before bench/relay_sim.py's measurement
                    mib_runs[n].append(await timed(rooms[n].relayed(checkpoint(nbytes, 3000 + 10 * rep + n),
                                                                    rep + 2)))
                    policy.pipeline_pieces = PIPELINE_PIECES
    finally:
        await asyncio.gather(raw.close(), *(room.close() for room in rooms.values()), return_exceptions=True)
        await server.close()

    rows = []
    for n in counts:
        raw_s, raw_cpu, _ = astuple(min(raw_runs[n]))
        raw_rate = nbytes / MB / raw_s
        rows.append((f"raw aiortc 1->1 (paired with N={n})", f"{raw_s:.3f}", f"{raw_rate:.1f}", f"{raw_rate:.1f}",
                     "1.00x", "-", f"{100 * raw_cpu / raw_s:.0f}%", "1", spread(raw_runs[n])))
        for name, runs in (("broadcast", cast_runs), ("relayed", relay_runs), ("relayed 1 MiB pieces", mib_runs)):
            if not runs[n]:
                continue
            best, cpu, _ = astuple(min(runs[n]))
            per = nbytes / MB / best
            rows.append((f"{name} 1->{n}", f"{best:.3f}", f"{per:.1f}", f"{per * n:.1f}",
                         f"{per * n / raw_rate:.2f}x", f"{per / raw_rate:.2f}x", f"{100 * cpu / best:.0f}%",
                         f"{copies['direct' if name == 'broadcast' else 'relay', n]:.2f}", spread(runs[n])))
    best = {("direct", n): min(cast_runs[n]) for n in counts}
    best.update({("raw", n): min(raw_runs[n]) for n in counts})
    best.update({("relay", n): min(relay_runs[n]) for n in counts if relay_runs[n]})
    return rows, best


def p3_line(mb: float, best: dict[tuple[str, int], Run], mode: str) -> str:
    """The issue-11 goal: delivering to 4 takes at most 1.5 x delivering to 1 (the direct send), same run."""
    if ("direct", 1) not in best or (mode, 4) not in best:
        return "P3 broadcast: needs --peers with 1 and 4 not met"
    how = "relayed down a chain of participants" if mode == "relay" else "the coordinator sends every copy"
    to_4, to_1 = best[mode, 4].seconds, best["direct", 1].seconds
    ratio = to_4 / to_1
    verdict = "MET" if ratio <= 1.5 else "not met"
    return (f"P3 broadcast {mb:g} MB checkpoint to 4 participants ({how}): {to_4:.2f} s = {ratio:.2f} x "
            f"to 1 ({to_1:.2f} s) (goal <= 1.5 x) {verdict}")


def cpu_bound_line(best: dict[tuple[str, int], Run], processes: bool) -> str | None:
    """Why P3 is not met here: the CPU the direct send to 1 took, times the 4 copies a delivery to 4 must
    receive (and, relayed, send), over the cores the peers can use, is already the wall time that run took.
    One process: its own CPU on its one event loop. A process each: that of all the benchmark's processes."""
    if ("direct", 1) not in best or ("relay", 4) not in best:
        return None
    one, four = best["direct", 1], best["relay", 4]
    if processes:
        if one.tree_cpu is None or four.tree_cpu is None:
            return None
        cores, cpu_1, cpu_4, what = os.cpu_count() or 1, one.tree_cpu, four.tree_cpu, "its processes'"
    else:
        cores, cpu_1, cpu_4, what = 1, one.cpu, four.cpu, "this process's"
    floor = 4 * cpu_1 / cores
    return (f"why P3: the direct send to 1 took {cpu_1:.2f} s of {what} CPU in {one.seconds:.2f} s; 4 participants "
            f"receive 4 x the bytes (and relays send them again), so on {cores} core{'s' * (cores > 1)} delivering to "
            f"4 takes at least {floor:.2f} s = {floor / one.seconds:.2f} x to 1 (goal 1.5 x); the relayed delivery "
            f"to 4 used {cpu_4:.2f} s of CPU, {100 * cpu_4 / (cores * four.seconds):.0f}% of {cores} "
            f"core{'s' * (cores > 1)} for its {four.seconds:.2f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=16.0, help="checkpoint size in MB (default 16)")
    parser.add_argument("--repeat", type=int, default=3, help="best of this many (default 3)")
    parser.add_argument("--peers", default="1,2,4", help="participant counts (default 1,2,4)")
    parser.add_argument("--no-relay", action="store_true", help="only the direct broadcast (as before the relay)")
    parser.add_argument("--whole-mib", action="store_true",
                        help="also relay in pieces of 1 MiB (the plan before relay_sim.py), side by side")
    parser.add_argument("--processes", action="store_true",
                        help="each participant in a process of its own (default: every peer in this one)")
    parser.add_argument("--child", nargs=4, metavar=("URL", "ROOM", "COORDINATOR", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        asyncio.run(child(*args.child[:3], int(args.child[3])))
        return 0
    counts = [int(x) for x in args.peers.split(",")]
    started = time.monotonic()
    rows, best = asyncio.run(measure(args.mb, args.repeat, counts, not args.no_relay, args.processes,
                                     args.whole_mib))
    header = ("transfer", "best s", "MB/s each", "MB/s total", "total/raw", "each/raw", "CPU", "copies",
              "all runs s")
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    where = "a process per participant" if args.processes else "one process"
    print(f"checkpoint broadcast, {args.mb:g} MB float32, best of {args.repeat}, {where}, "
          f"{os.cpu_count()} CPUs, 127.0.0.1, load average {os.getloadavg()[0]:.1f}")
    for row in (header, *rows):
        print("  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths))))
    print("total/raw: aggregate broadcast rate over the raw rate measured just before it; CPU: this process's CPU "
          "time over wall time of that run (100% = one core; " + (
              "the coordinator only)" if args.processes else "every peer shares one event loop)"))
    print(f"(whole run {time.monotonic() - started:.0f} s)")
    print("copies: checkpoint copies the coordinator itself sent (its bytes over the checkpoint's size)")
    nbytes = int(args.mb * MB) // 4 * 4
    raw_rate = nbytes / min(best["raw", n].seconds for n in counts)
    data = checkpoint(nbytes, 3)
    print(relay_sim.ratio_line(data, relay_sim.Links(raw_rate, 0.020),
                               f"every uplink at this run's raw aiortc rate, {raw_rate / MB:.1f} MB/s, 20 ms latency"))
    print(relay_sim.ratio_line(data, relay_sim.Links(10 * MB, 0.050), "every uplink 10 MB/s, 50 ms latency"))
    if args.no_relay:
        print(p3_line(args.mb, best, "direct"))
    else:
        print("reference, " + p3_line(args.mb, best, "direct").removeprefix("P3 ").rsplit(" (goal", 1)[0])
        print(p3_line(args.mb, best, "relay"))
        why = cpu_bound_line(best, args.processes)
        if why is not None:
            print(why)
    return 0


if __name__ == "__main__":
    sys.exit(main())
