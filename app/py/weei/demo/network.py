"""An in-memory transport between controllers, with the guarantees of the real one.

Every message is encoded to JSON text and decoded again (so the wire format
is exercised), and every attachment is checked against its announced
SHA-256 and size before delivery, exactly as a WebRTC transfer is. Delivery
is in order per receiving peer; a message to a disconnected peer is lost,
as on a closed data channel.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from typing import Any, Mapping

from ..api.controller import TrainingController
from ..core.wire.commands import Send
from ..core.wire.framing import referenced_artifacts
from ..core.errors import WeeiError, WeeiReason
from ..core.wire.framing.frames import framed_bytes
from ..core.wire.messages import decode_message, encode_message
from ..core.verified import VerifiedBlobs

__all__ = ["MemoryNetwork", "MemoryTransport"]


class MemoryTransport:
    """One controller's view of the network (the ``Transport`` port)."""

    def __init__(self, network: MemoryNetwork, peer_id: str) -> None:
        self.network = network
        self.peer_id = peer_id

    def peers(self) -> list[str]:
        return sorted(p for p in self.network.connected if p != self.peer_id)

    def send(self, send: Send, blobs: Mapping[str, bytes]) -> None:
        self.network.post(self.peer_id, send, blobs)

    def transfers_state(self) -> dict[str, Any]:
        """Messages move whole in memory: never a transfer in flight, never a refused one."""
        return {"transfers": [], "transferErrors": {}}


class MemoryNetwork:
    """Controllers by peer id, each with an inbox drained in order."""

    def __init__(self) -> None:
        self.controllers: dict[str, TrainingController] = {}
        self.connected: set[str] = set()
        self.inboxes: dict[str, asyncio.Queue[tuple[str, str, dict[str, bytes]]]] = {}
        self.workers: dict[str, asyncio.Task[None]] = {}
        self.bytes_moved = 0
        #: Bytes moved (the frames of the message and its attachments, as on a data channel) and messages, by
        #: message type ("update", "assign", ...).
        self.bytes_by_type: dict[str, int] = {}
        self.count_by_type: dict[str, int] = {}
        #: The same by (sender, receiver, message type): [bytes, messages]; shows who carries a protocol's traffic.
        self.routes: dict[tuple[str, str, str], list[int]] = {}
        self.lost = 0
        self.refused: list[str] = []

    def transport(self, peer_id: str) -> MemoryTransport:
        self.inboxes[peer_id] = asyncio.Queue()
        self.connected.add(peer_id)
        return MemoryTransport(self, peer_id)

    def attach(self, controller: TrainingController) -> None:
        old = self.workers.get(controller.my_peer_id)
        if old is not None:  # the peer restarted: its new controller takes over
            old.cancel()
        self.controllers[controller.my_peer_id] = controller
        self.workers[controller.my_peer_id] = asyncio.ensure_future(self._drain(controller.my_peer_id))

    def post(self, src: str, send: Send, blobs: Mapping[str, bytes]) -> None:
        if src not in self.connected or send.peer not in self.connected:
            self.lost += 1
            return
        # As the frame writer encodes it, and counted as the frames that would carry it and its attachments.
        text = json.dumps(encode_message(send.message), separators=(",", ":"), ensure_ascii=False)
        kinds = {ref.sha256: ref.kind for ref in referenced_artifacts(send.message)}
        size = framed_bytes(len(text.encode()), [(kinds.get(sha, ""), len(b)) for sha, b in blobs.items()])
        self.bytes_moved += size
        kind = send.message.TYPE
        self.bytes_by_type[kind] = self.bytes_by_type.get(kind, 0) + size
        self.count_by_type[kind] = self.count_by_type.get(kind, 0) + 1
        route = self.routes.setdefault((src, send.peer, kind), [0, 0])
        route[0] += size
        route[1] += 1
        self.inboxes[send.peer].put_nowait((src, text, dict(blobs)))

    async def _drain(self, peer: str) -> None:
        inbox = self.inboxes[peer]
        while True:
            src, text, blobs = await inbox.get()
            try:
                if peer in self.connected:
                    await self._deliver(peer, src, text, blobs)
            finally:
                inbox.task_done()

    async def _deliver(self, peer: str, src: str, text: str, blobs: dict[str, bytes]) -> None:
        try:
            message = decode_message(json.loads(text))
            refs = {ref.sha256: ref for ref in referenced_artifacts(message)}
            for sha, data in blobs.items():
                if hashlib.sha256(data).hexdigest() != sha or (sha in refs and refs[sha].bytes != len(data)):
                    raise WeeiError(WeeiReason.HASH_MISMATCH, f"an attachment from {src} does not match its hash or size")
        except WeeiError as exc:
            self.refused.append(f"{src}->{peer}: {exc}")
            return
        # Checked above, once, as the framing reader checks on arrival: the coordinator does not hash them again.
        await self.controllers[peer].on_peer_message(src, message, VerifiedBlobs(blobs))

    async def settle(self) -> None:
        """Wait until every inbox is empty and every controller is idle."""
        while True:
            # A peer with a transport but no controller (a test's hand-driven sender) reads nothing: what others
            # send it (a presence card to every connected peer) waits in its inbox for ever, as unread as on a
            # real channel nobody drains, and is not waited for.
            inboxes = [q for peer, q in self.inboxes.items() if peer in self.workers]
            await asyncio.gather(*(q.join() for q in inboxes))
            await asyncio.gather(*(c.idle() for c in self.controllers.values()))
            if all(q.empty() for q in inboxes) and not any(c.executor.tasks for c in self.controllers.values()):
                return

    async def disconnect(self, peer: str) -> None:
        """``peer`` vanishes: every other controller hears of it, as from a closed channel."""
        self.connected.discard(peer)
        for other, controller in self.controllers.items():
            if other != peer:
                await controller.peer_disconnected(peer)

    async def close(self) -> None:
        for task in self.workers.values():
            task.cancel()
        await asyncio.gather(*self.workers.values(), return_exceptions=True)
