"""The participant side: Weei's participant controller on a SuperNode, inside a ``ClientApp``.

Each SuperNode (a Flower node id) gets one ``TrainingController`` -- the
object the browser and ``weei agent`` run -- with the wasmtime Worker pool,
kept for the life of the ClientApp's process, so its artifacts (module,
compiled module, chunks, checkpoints, by SHA-256) stay and a node is not sent
what it holds. A Flower message delivers the coordinator's frames to it; the
reply carries what it sent back once it is idle again (training done).

A SuperNode runs whatever app it is sent, so Weei's policy applies on top:
an invitation is accepted only when the module's SHA-256 is in the node's
accept-list (node config ``weei-accept``: SHA-256s separated by commas or
spaces, or ``*`` for every module); otherwise it is declined and the reply says ``model-not-accepted``.
A node without ``weei-accept`` uses the app's own list: empty for a deployed
app (it accepts nothing until its operator says so), the package's module
SHA-256 for ``weei flower sim``, whose nodes are all the user's own and have
no node config of their own.

A node trains on its GPU as ``weei agent --backend`` does: node config
``weei-backend`` (``auto``: a hardware GPU only, the default; ``cpu``;
``gpu``: any adapter; ``hybrid``) is the controller's backend preference,
wgpu-py's adapter is the device, and the job's WGSL archive runs only when
its SHA-256 is in the accept-list too (else the job trains on the CPU,
``archive-not-accepted``); the GPU backend's admission gate decides the rest.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Mapping
from typing import Any, Callable

from ..api.controller import TrainingController
from ..core.errors import WeeiError
from ..core.verified import VerifiedBlobs
from ..core.wire.commands import Send
from ..core.wire.messages import DiagnosticsReport
from ..host.memory_storage import MemoryKeyValue, MemoryStorage
from ..host.worker_pool import ThreadWorkerPool
from ..runtime.wasmtime_engine import WasmtimeEngine
from .codec import NEEDS_KEY, Frame, decode_frames, encode_frames

__all__ = ["NodeHost", "NodeHosts", "COORDINATOR", "node_peer", "parse_accept"]

COORDINATOR = "coordinator"
REFUSED_KEY = "weei.refused"


def node_peer(node_id: int) -> str:
    """A SuperNode's peer id in the coordinator's records."""
    return f"node-{node_id}"


def parse_accept(value: object) -> frozenset[str] | None:
    """The accept-list of a node config value; None means every module (``*``)."""
    text = str(value or "").strip().lower()
    if text == "*":
        return None
    return frozenset(t for t in text.replace(",", " ").split() if t)


class _Outbox:
    """The participant's ``Transport`` port: what it sends waits for the reply to the current message."""

    def __init__(self) -> None:
        self.sent: list[tuple[Send, dict[str, bytes]]] = []

    def peers(self) -> list[str]:
        return [COORDINATOR]

    def send(self, send: Send, blobs: Mapping[str, bytes]) -> None:
        self.sent.append((send, dict(blobs)))

    def transfers_state(self) -> dict[str, Any]:
        return {"transfers": [], "transferErrors": {}}


class NodeHost:
    """One SuperNode's participant."""

    def __init__(self, node_id: int, accept: frozenset[str] | None, engine: WasmtimeEngine,
                 backend: str = "auto") -> None:
        self.peer_id = node_peer(node_id)
        self.accept = accept
        self.backend = backend
        self.outbox = _Outbox()
        self.refused: list[str] = []
        self.controller = TrainingController(
            my_peer_id=self.peer_id, storage=MemoryStorage(), kv=MemoryKeyValue(), pool=ThreadWorkerPool(engine, 1),
            kernel=_kernel(), engine=engine, clock=lambda: time.time() * 1000.0,
            monotonic=lambda: time.monotonic() * 1000.0, random_bytes=os.urandom, transport=self.outbox,
            gpu=_wgpu() if backend != "cpu" else None, accept_archive=self.accepts)
        self.started = False
        self.timer_paused = False

    def accepts(self, sha256: str) -> bool:
        """Whether this node runs what has ``sha256`` (a module, a WGSL archive): its accept-list."""
        return self.accept is None or sha256.lower() in self.accept

    async def handle(self, frames: list[Frame]) -> list[Frame]:
        """Deliver the coordinator's frames; what this node sent back once idle."""
        if not self.started:
            await self.controller.init()
            await self.controller.set_backend_preference(self.backend)
            self.started = True
        # The participant's diagnostics timer (a snapshot every 2 s, a wake-up every 0.5 s) runs only while a
        # message is being handled: between messages nothing it sends can leave (a reply is the only way out),
        # and at 1,000 idle nodes in one process its wake-ups were a CPU cost growing with the wall time.
        link = self.controller.executor.diagnostics
        if self.timer_paused:
            link.start()
        for src, message, blobs in frames:
            await self.controller.on_peer_message(src, message, VerifiedBlobs(blobs))
            await self._decide()
        while True:
            await self.controller.idle()
            if not self.controller.executor.tasks:
                break
        self.timer_paused = link.task is not None
        link.stop()
        sent, self.outbox.sent = self.outbox.sent, []
        # Only the last diagnostics snapshot goes: over WebRTC each stage change's snapshot leaves at once,
        # here they all leave together in one reply, and the coordinator's book keeps a peer's latest
        # snapshot only (each is whole, with a rising sequence). Parsing the others was most of the
        # coordinator's cost per Flower message (profiled at 100 nodes).
        last = max((i for i, (s, _) in enumerate(sent) if isinstance(s.message, DiagnosticsReport)), default=-1)
        return [(self.peer_id, s.message, b) for i, (s, b) in enumerate(sent)
                if i == last or not isinstance(s.message, DiagnosticsReport)]

    async def _decide(self) -> None:
        for job_id, entry in list(self.controller.invitations.items()):
            sha = str(entry["invitation"]["module"].get("sha256", ""))
            accepted = self.accepts(sha)
            if not accepted:
                self.refused.append(f"model-not-accepted: module {sha} is not in this node's weei-accept list")
            await self.controller.decide_invitation(job_id, accepted)

    def held(self) -> Mapping[str, bytes]:
        return self.controller.artifacts


class NodeHosts:
    """The participants of every SuperNode this process serves, on one background event loop (a ClientApp's
    handler is synchronous and is called again for each message; the controllers' tasks need a loop that
    outlives each call)."""

    def __init__(self, accept: frozenset[str] = frozenset()) -> None:
        self.accept = accept
        self.engine = WasmtimeEngine()
        self.hosts: dict[int, NodeHost] = {}
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="weei-flower-nodes", daemon=True)
        self.thread.start()
        self.lock = threading.Lock()

    def host(self, node_id: int, node_config: Mapping[str, Any]) -> NodeHost:
        with self.lock:
            if node_id not in self.hosts:
                accept = parse_accept(node_config["weei-accept"]) if "weei-accept" in node_config else self.accept
                backend = str(node_config.get("weei-backend", "auto"))
                self.hosts[node_id] = asyncio.run_coroutine_threadsafe(
                    _make(node_id, accept, self.engine, backend), self.loop).result()
            return self.hosts[node_id]

    def handle(self, node_id: int, node_config: Mapping[str, Any], content: Any) -> Any:
        """A Flower message's content for ``node_id`` -> the reply's content (a RecordDict)."""
        from flwr.app import ConfigRecord, RecordDict

        host = self.host(node_id, node_config)
        try:
            frames, missing = decode_frames(content, host.held())
        except WeeiError as exc:
            return RecordDict({REFUSED_KEY: ConfigRecord({"reason": exc.reason, "message": str(exc)})})
        if missing:
            return RecordDict({NEEDS_KEY: ConfigRecord({"sha256": sorted(set(missing))})})
        replies = asyncio.run_coroutine_threadsafe(host.handle(frames), self.loop).result()
        out = encode_frames(replies)
        if host.refused:
            reason, _, message = host.refused.pop().partition(": ")
            out[REFUSED_KEY] = ConfigRecord({"reason": reason, "message": message})
        return out


async def _make(node_id: int, accept: frozenset[str] | None, engine: WasmtimeEngine, backend: str) -> NodeHost:
    return NodeHost(node_id, accept, engine, backend)


def _wgpu() -> Any:
    """wgpu-py's ``gpu`` object, or None where wgpu (or its native library) is missing (as the agent's)."""
    try:
        import wgpu
    except Exception:  # not installed, or no wgpu-native for this platform
        return None
    return wgpu.gpu


def _kernel() -> Any:
    from ..kernel.native import NativeKernel

    return NativeKernel()


def client_handler(hosts: Callable[[], NodeHosts]) -> Callable[[Any, Any], Any]:
    """A ClientApp ``train`` function over ``hosts()`` (created lazily, once per process)."""
    from flwr.app import Message

    def train(message: Any, context: Any) -> Any:
        return Message(hosts().handle(context.node_id, context.node_config, message.content), reply_to=message)

    return train
