"""The coordinator side: Weei's coordinator in a ``ServerApp``, a Flower grid as its transport.

The coordinator is the ``TrainingController`` the browser runs (its sans-I/O
``Coordinator``, executor, checkpoint writer and timer), so retries,
deadlines, reassignment, robust aggregation and validation are Weei's, not a
second round loop. :class:`GridTransport` is its ``Transport`` port: a
``Send`` to ``node-<id>`` waits in an outbox; :func:`drive` pushes each
node's frames as one Flower message, pulls the replies and hands each frame
to the coordinator as a message from that node. A node that answers with a
Flower error is a closed channel (``peer_disconnected``); one that never
answers is what the coordinator's deadlines are for, and nothing waits for
it past the round deadline.

Attachments a node has acknowledged are not sent to it again (by SHA-256);
a node that lost them asks (``weei.needs``) and gets them.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TextIO

from ..api.controller import TrainingController
from ..core.errors import WeeiError
from ..core.job.coordinator import DEFAULT_ROUND_TIMEOUT_MS
from .errors import FlowerError, FlowerReason
from ..core.verified import VerifiedBlobs
from ..core.wire.commands import Send
from ..core.wire.messages import CheckpointNote, UpdateReceipt
from ..demo.run import DemoJob, models_dir, package_inputs, seeded_bytes
from ..host.memory_storage import MemoryKeyValue, MemoryStorage
from ..host.worker_pool import ThreadWorkerPool
from ..runtime.wasmtime_engine import WasmtimeEngine
from .client import COORDINATOR, REFUSED_KEY, node_peer
from .codec import NEEDS_KEY, decode_frames, encode_frames

__all__ = ["GridTransport", "FlowerRun", "drive", "MESSAGE_TYPE"]

MESSAGE_TYPE = "train"
_UNANSWERED = (UpdateReceipt, CheckpointNote)
# Polling backs off from POLL_S to POLL_MAX_S while nothing arrives: in a deployment each pull is a request
# to the SuperLink, and 200 a second of them took a core from the nodes' training on a small machine; a
# deployed node answers in seconds anyway (its SuperNode polls every 3 s), a simulated one in milliseconds.
POLL_S = 0.005
POLL_MAX_S = 0.2


class GridTransport:
    """The coordinator's ``Transport`` port over a Flower grid."""

    def __init__(self) -> None:
        self.nodes: dict[str, int] = {}
        self.outbox: dict[str, list[tuple[Send, dict[str, bytes]]]] = {}
        self.held: dict[str, set[str]] = {}

    def peers(self) -> list[str]:
        return sorted(self.nodes)

    def send(self, send: Send, blobs: Mapping[str, bytes]) -> None:
        if send.peer in self.nodes:  # to a node that left: lost, as on a closed channel
            self.outbox.setdefault(send.peer, []).append((send, dict(blobs)))

    def transfers_state(self) -> dict[str, Any]:
        return {"transfers": [], "transferErrors": {}}


@dataclass
class FlowerRun:
    """What :func:`drive` did: counts for the report and the benchmark."""

    messages: int = 0
    replies: int = 0
    bytes_sent: int = 0
    bytes_skipped: int = 0
    failed_nodes: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    checkpoints: list[Path] = field(default_factory=list)
    unanswered: list[str] = field(default_factory=list)  # the nodes whose last message got no reply by the end
    contributors: dict[int, list[str]] = field(default_factory=dict)  # round -> the peers whose updates it used


def _controller(transport: GridTransport, engine: WasmtimeEngine, random_bytes: Callable[[int], bytes]
                ) -> TrainingController:
    from ..kernel.native import NativeKernel

    return TrainingController(
        my_peer_id=COORDINATOR, storage=MemoryStorage(), kv=MemoryKeyValue(), pool=ThreadWorkerPool(engine, 1),
        kernel=NativeKernel(), engine=engine, clock=lambda: time.time() * 1000.0,
        monotonic=lambda: time.monotonic() * 1000.0, random_bytes=random_bytes, transport=transport)


class _Pump:
    def __init__(self, grid: Any, transport: GridTransport, coordinator: TrainingController, run: FlowerRun) -> None:
        self.grid = grid
        self.transport = transport
        self.coordinator = coordinator
        self.run = run
        self.in_flight: dict[str, tuple[str, frozenset[str]]] = {}  # message id -> (peer, attachments sent)
        self.frames: dict[str, list[Any]] = {}  # message id -> its frames, resent whole when a node lost some
        self.pushed_at: dict[str, float] = {}  # message id -> when it went (the coordinator's clock, ms)
        self.round = 0
        self.idle_s = POLL_S

    async def wait(self) -> None:
        """Nothing arrived: sleep, longer each time in a row."""
        await asyncio.sleep(self.idle_s)
        self.idle_s = min(POLL_MAX_S, self.idle_s * 2)

    def push(self, flush: bool = False) -> None:
        from flwr.app import Message

        # One message in flight per node: a node's frames must arrive in the order the coordinator sent
        # them, and Flower does not order two messages to one node (a simulation may even run them in two
        # processes at once). What waits goes with the next message, after the reply.
        # Frames that ask nothing of a node (an update's receipt, a checkpoint note) wait for the next frame
        # that does (its next assignment), or the end (``flush``): sent alone they cost a deployed node a
        # Flower round trip of seconds each round (its SuperNode polls every 3 s and starts a process per
        # message) for a reply with nothing in it.
        busy = {peer for peer, _ in self.in_flight.values()}
        busy |= {peer for peer, sends in self.transport.outbox.items()
                 if not flush and all(isinstance(s.message, _UNANSWERED) for s, _ in sends)}
        outgoing = {p: v for p, v in self.transport.outbox.items() if p not in busy}
        self.transport.outbox = {p: v for p, v in self.transport.outbox.items() if p in busy}
        messages, meta = [], []
        for peer, sends in sorted(outgoing.items()):
            held = self.transport.held.setdefault(peer, set())
            frames = [(COORDINATOR, s.message, b) for s, b in sends]
            omit = frozenset(sha for _, _, b in frames for sha in b if sha in held)
            content = encode_frames(frames, omit=omit)
            sent = frozenset(sha for _, _, b in frames for sha in b) - omit
            self.run.bytes_sent += sum(len(d) for _, _, b in frames for sha, d in b.items() if sha in sent)
            self.run.bytes_skipped += sum(len(d) for _, _, b in frames for sha, d in b.items() if sha in omit)
            messages.append(Message(content, self.transport.nodes[peer], MESSAGE_TYPE, group_id=str(self.round)))
            meta.append((peer, sent, frames))
        if not messages:
            return
        ids = list(self.grid.push_messages(messages))
        self.run.messages += len(ids)
        now = self.coordinator.clock()
        for mid, (peer, sent, frames) in zip(ids, meta, strict=True):
            self.in_flight[mid] = (peer, sent)
            self.frames[mid] = frames
            self.pushed_at[mid] = now

    def awaited(self) -> list[str]:
        """The messages in flight worth waiting for: those younger than the round deadline. A node silent for
        longer has had its attempt ended by the coordinator's deadline, as over WebRTC; a reply that comes
        later is still taken, but nothing waits for it (a hung ClientApp must not hold the ServerApp)."""
        core = self.coordinator.coordinator
        limit = core.round_timeout_ms if core is not None else DEFAULT_ROUND_TIMEOUT_MS
        now = self.coordinator.clock()
        return [mid for mid in self.in_flight if now - self.pushed_at[mid] < limit]

    async def pull(self) -> int:
        if not self.in_flight:
            return 0
        replies = list(await asyncio.to_thread(self.grid.pull_messages, list(self.in_flight)))
        if replies:
            self.idle_s = POLL_S
        for reply in replies:
            mid = reply.metadata.reply_to_message_id
            if mid not in self.in_flight:
                continue
            peer, sent = self.in_flight.pop(mid)
            frames = self.frames.pop(mid, [])
            self.pushed_at.pop(mid, None)
            self.run.replies += 1
            await self._reply(peer, sent, frames, reply)
        return len(replies)

    async def _reply(self, peer: str, sent: frozenset[str], frames: list[Any], reply: Any) -> None:
        if reply.has_error():
            await self._lose(peer, f"{peer}: flower-error: {reply.error.reason}")
            return
        content = reply.content
        if NEEDS_KEY in content:  # the node lost what we thought it held: send those frames again, whole
            self.transport.held[peer] = set()
            self.transport.outbox.setdefault(peer, [])[:0] = [(Send(peer, m), b) for _, m, b in frames]
            return
        self.transport.held[peer].update(sent)
        if REFUSED_KEY in content:
            self.run.refused.append(f"{peer}: {content[REFUSED_KEY]['reason']}: {content[REFUSED_KEY]['message']}")
        try:
            got, missing = decode_frames(content)
            if missing:
                raise FlowerError(FlowerReason.MISSING_ATTACHMENT, f"{len(missing)} attachments are neither attached nor held")
        except WeeiError as exc:
            await self._lose(peer, f"{peer}: {exc.reason}: {exc}")
            return
        for src, message, blobs in got:
            # A node speaks for itself only: what it says came from `peer`, whatever its frame claims.
            await self.coordinator.on_peer_message(peer, message, VerifiedBlobs(blobs))

    async def _lose(self, peer: str, why: str) -> None:
        """A node that failed at Flower's level is a closed channel: the coordinator reassigns its work."""
        self.run.failed_nodes.append(why)
        self.transport.nodes.pop(peer, None)
        self.transport.outbox.pop(peer, None)
        await self.coordinator.peer_disconnected(peer)


async def drive(grid: Any, job: DemoJob, *, settings: dict[str, Any] | None = None, seed: int | None = None,
                out: Path | None = None, stream: TextIO | None = None, timeout_s: float = 3600.0,
                min_nodes: int = 1, nodes_wait_s: float = 120.0, resume: bytes | None = None,
                execution_files: Mapping[str, bytes] | None = None) -> FlowerRun:
    """Run ``job`` to completion with Weei's coordinator, the grid's nodes as its participants.

    With ``seed`` the job id and initial weights are those of ``weei demo``'s run with that seed
    (:func:`weei.demo.run.seeded_bytes`). With ``resume`` (a ``.weei-checkpoint`` file's bytes, from this
    or any other Weei run of the package) the job continues from it as the widget's
    ``continueFromCheckpoint`` with ``datasetMode: 'resume'`` does: its weights, aggregation state, dataset
    queue and seed. ``execution_files`` are ``createJob``'s (the WGSL archive a node with ``weei-backend``
    trains on its GPU with). Each ``.weei-checkpoint`` goes into ``out``. Raises
    RuntimeError when the job pauses or the deadline passes, or when fewer than ``min_nodes`` nodes have
    connected within ``nodes_wait_s`` (SuperNodes, simulated ones too, connect after the ServerApp starts:
    the nodes present at the start are the job's participants)."""
    from ..demo.run import JobReport, _Table

    engine = WasmtimeEngine()
    transport = GridTransport()
    node_ids = list(grid.get_node_ids())
    wait_until = time.monotonic() + nodes_wait_s
    while len(node_ids) < min_nodes:
        if time.monotonic() > wait_until:
            raise RuntimeError(f"{job.name}: {len(node_ids)} of {min_nodes} nodes connected in {nodes_wait_s} s")
        await asyncio.sleep(0.1)
        node_ids = list(grid.get_node_ids())
    for node_id in sorted(node_ids):
        transport.nodes[node_peer(node_id)] = node_id
    coordinator = _controller(transport, engine, os.urandom if seed is None else seeded_bytes(seed))
    run = FlowerRun()
    pump = _Pump(grid, transport, coordinator, run)
    await coordinator.init()
    package_dir = job.package or models_dir() / job.model
    inputs = {**package_inputs(package_dir, job.data or package_dir / "data", job.validation),
              "execution_files": execution_files}
    if resume is None:
        job_id = await coordinator.create_job(**inputs, settings=settings or job.settings)
    else:
        job_id = await coordinator.continue_from_checkpoint(checkpoint=resume, **inputs,
                                                            settings=settings or job.settings, dataset_mode="resume")
    state = coordinator.get_state()["job"]
    info = state["info"]
    table = None
    if stream is not None:
        metric = info["metrics"][0]
        print(f"\n== {job.name} on Flower: {info['name']} — {len(transport.nodes)} nodes, {job_id}", file=stream)
        table = _Table(stream, info, "workSource" in info, JobReport(job.name, metric["id"], metric["direction"]))
    contributors: dict[int, int] = {}

    def on_state() -> None:
        core = coordinator.coordinator
        if core is not None and core.checkpoint_round not in contributors:
            contributors[core.checkpoint_round] = len(core.last_contributors)
            run.contributors[core.checkpoint_round] = list(core.last_contributors)
        if table is not None:
            # The checkpoints' summaries are what the table reads; a state snapshot (get_state) copies every
            # peer's diagnostics and live metrics too: at 1,000 nodes ~0.2 s a snapshot, 0.5 ms a message.
            table.update({"job": {"checkpoints": core.checkpoints}} if core is not None else coordinator.get_state(),
                         contributors)

    # Not coordinator.subscribe(...): a subscriber gets a full state snapshot at every change, i.e. per
    # message, and a snapshot copies every peer's diagnostics, so at N nodes a round cost O(N^2) copying
    # (half of an in-process run's time at 10 peers, profiled). A look when the checkpoint round moves is
    # enough for the table and the contributors.
    seen = {"round": -1}

    def progress() -> None:
        core = coordinator.coordinator
        if core is not None and core.checkpoint_round != seen["round"]:
            seen["round"] = core.checkpoint_round
            on_state()

    for peer in transport.peers():
        coordinator.invite(peer)

    async def settle(flush: bool = False) -> None:
        while True:
            await coordinator.idle()
            pump.push(flush)
            if not pump.awaited():
                return
            if not await pump.pull():
                await pump.wait()
            progress()

    await settle()
    await coordinator.run_validation()
    await settle()
    await coordinator.start()
    deadline = time.monotonic() + timeout_s
    # The core's status, not get_state(): a full state snapshot (diagnostics copied whole) each turn of this
    # loop was most of the ServerApp's time per message at 100 nodes and more.
    while (status := str(coordinator.coordinator.status if coordinator.coordinator is not None
                         else coordinator.get_state()["job"]["status"])) != "completed":
        if status == "paused" or time.monotonic() > deadline:
            raise RuntimeError(f"{job.name}: the job is {status}: {coordinator.get_state().get('error')}")
        await coordinator.idle()
        pump.round = coordinator.coordinator.checkpoint_round if coordinator.coordinator else 0
        pump.push()
        if not await pump.pull():
            await pump.wait()
        progress()
    await settle(flush=True)
    on_state()
    run.unanswered = sorted(peer for peer, _ in pump.in_flight.values())
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        for key in await coordinator.storage.keys("checkpoints"):
            entry = await coordinator.storage.get("checkpoints", key)
            path = out / entry["summary"]["artifact"]["fileName"]
            path.write_bytes(entry["file"])
            run.checkpoints.append(path)
    if stream is not None:
        print(f"-- {job.name}: {len(run.checkpoints)} checkpoints in {out}; {run.messages} Flower messages, "
              f"{run.bytes_sent / 1e6:.1f} MB sent, {run.bytes_skipped / 1e6:.1f} MB not re-sent (held); "
              f"failed nodes: {len(run.failed_nodes)}; refused: {len(run.refused)}; "
              f"unanswered: {len(run.unanswered)}", file=stream)
        for line in run.failed_nodes + run.refused:
            print(f"-- {line}", file=stream)
    return run
