"""An in-memory transport between hosts, with the same guarantees as the real one.

Every message is encoded to JSON text and decoded again (so the wire format
is exercised), and every attachment is resolved from the sender's store and
verified by SHA-256 and size into the receiver's, exactly as a WebRTC
transfer would be. Delivery is in order, one message at a time; a message
to a disconnected peer is lost, as on a closed data channel.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from ..core.commands import Send
from ..core.messages import Assign, Deliver, Invitation, JobFinished, UpdateReceipt, decode_message, encode_message
from ..host.coordinator_host import CoordinatorHost
from ..host.participant_host import ParticipantHost

__all__ = ["MemoryNetwork", "Endpoint"]

# Messages a participant machine handles; every other kind goes to a coordinator.
_TO_PARTICIPANT = (Invitation, Deliver, Assign, UpdateReceipt, JobFinished)


@dataclass
class Endpoint:
    """One peer: a coordinator host, a participant host, or both (a participating coordinator)."""

    peer_id: str
    coordinator: CoordinatorHost | None = None
    participant: ParticipantHost | None = None
    connected: bool = True
    on_invitation: Callable[[ParticipantHost, Invitation], None] | None = None
    received_bytes: int = field(default=0)


class MemoryNetwork:
    """Routes ``Send`` commands between endpoints until nothing is left to deliver."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.endpoints: dict[str, Endpoint] = {}
        self.queue: deque[tuple[str, Send]] = deque()
        self.delivered = 0
        self.lost = 0

    def attach(self, endpoint: Endpoint) -> Endpoint:
        self.endpoints[endpoint.peer_id] = endpoint
        return endpoint

    def post(self, src: str, sends: list[Send]) -> None:
        self.queue.extend((src, send) for send in sends)

    def kick(self) -> None:
        """Carry out whatever the coordinators emitted outside message handling (start, invite, ...)."""
        for ep in self.endpoints.values():
            if ep.coordinator is not None:
                self.post(ep.peer_id, ep.coordinator.run(ep.coordinator.coordinator.take_commands()))
            if ep.participant is not None:
                self.post(ep.peer_id, ep.participant.run(ep.participant.participant.take_commands()))
        self.pump()

    def pump(self) -> None:
        while self.queue:
            src, send = self.queue.popleft()
            self._deliver(src, send)

    def _deliver(self, src: str, send: Send) -> None:
        dst = self.endpoints.get(send.peer)
        sender = self.endpoints[src]
        if dst is None or not dst.connected or not sender.connected:
            self.lost += 1
            return
        message = decode_message(json.loads(json.dumps(encode_message(send.message))))
        # Coordinator-bound messages leave a participant's store, and the other way round.
        to_participant = isinstance(message, _TO_PARTICIPANT)
        source = sender.coordinator if to_participant else sender.participant
        if source is None:
            self.lost += 1
            return
        source_store = source.store
        blobs = {ref.sha256: source_store.get(ref.sha256) for ref in send.attachments}
        dst.received_bytes += sum(len(b) for b in blobs.values())
        self.delivered += 1
        now = self.clock()
        if to_participant:
            host = dst.participant
            if host is None:
                self.lost += 1
                return
            for ref in send.attachments:
                host.store.put(blobs[ref.sha256], ref.sha256, ref.bytes)
            host.participant.receive(src, message, now)
            if isinstance(message, Invitation) and dst.on_invitation is not None:
                dst.on_invitation(host, message)
            self.post(dst.peer_id, host.run(host.participant.take_commands()))
        else:
            chost = dst.coordinator
            if chost is None:
                self.lost += 1
                return
            chost.coordinator.receive(src, message, blobs, now)
            self.post(dst.peer_id, chost.run(chost.coordinator.take_commands()))

    def disconnect(self, peer: str) -> None:
        """``peer`` vanishes: every coordinator hears of it, as from a closed channel."""
        self.endpoints[peer].connected = False
        now = self.clock()
        for ep in self.endpoints.values():
            if ep.coordinator is not None and ep.peer_id != peer:
                ep.coordinator.coordinator.peer_disconnected(peer, now)
        self.kick()

