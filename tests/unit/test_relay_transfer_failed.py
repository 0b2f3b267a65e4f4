"""A relay that forwards a piece whose bytes do not match its hash, over real links: the controllers talk
through ``LinkTransport`` and ``LinkManager`` (frame writer and reader; the platform below only carries
frames between them in memory, in order). The reader refuses the piece (``hash-mismatch``); the node
below the relay reports it at once, and the coordinator sends that node the checkpoint itself, long before
the relay's deadline (``relay_timeout_ms``: 30 s at least) would have.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any, Mapping

from weei.adapters.link_transport import LinkTransport
from weei.api import TrainingController
from weei.core.links.peerlink_commands import CreateLink
from weei.core.links.relay import relay_timeout_ms
from weei.core.wire.commands import Send
from weei.core.wire.messages import RelayPiece, RelayPlan
from weei.core.wire.signaling_session import Peers, Signal, Welcome
from weei.host.memory_storage import MemoryKeyValue, MemoryStorage
from weei.host.worker_pool import ThreadWorkerPool
from weei.kernel.native import NativeKernel
from weei.runtime.wasmtime_engine import WasmtimeEngine

from test_controller import package, run_until_done

SETTINGS = {"epochs": 1, "localEpochs": 1, "batchSize": 16, "coordinatorParticipates": False}
COORD, RELAY, BELOW = "c" * 26, "r" * 26, "s" * 26  # the chain: COORD -> RELAY -> BELOW


class Signaling:
    def __init__(self) -> None:
        self.events: asyncio.Queue[Any] = asyncio.Queue()

    async def next_event(self, timeout: float | None = None) -> Any:
        return await asyncio.wait_for(self.events.get(), timeout)


class Handle:
    def __init__(self, link: int, peer: str) -> None:
        self.link, self.peer, self.open, self.closed = link, peer, False, False


class Wired(LinkTransport):
    """The WebRTC primitives in memory: a channel opens once the offerer applied the answer; frames go to the
    other end's open link in order (one event-loop callback each)."""

    def __init__(self, wire: dict[str, Wired], me: str) -> None:
        super().__init__(Signaling())
        self.wire, self.me = wire, me
        wire[me] = self

    def start(self, room: tuple[str, ...]) -> None:
        self._welcomed(Welcome(self.me, "token", False, (), {}))
        self._listen()
        self.signaling.events.put_nowait(Peers("room", room))

    def _other(self, handle: Handle) -> tuple[Wired, Handle] | None:
        other = self.wire[handle.peer]
        ends = [h for h in other._handles.values() if h.peer == self.me and not h.closed]
        return (other, ends[-1]) if ends else None

    def _create(self, command: CreateLink) -> Handle:
        return Handle(command.link, command.peer)

    @staticmethod
    async def _local_description(handle: Any, kind: str) -> str:
        return f"sdp-{kind}"

    async def _set_remote(self, handle: Handle, kind: str, sdp: str) -> None:
        other = self._other(handle)
        if kind == "answer" and other is not None:
            loop = asyncio.get_event_loop()
            for transport, end in ((self, handle), other):
                end.open = True
                loop.call_soon(transport._platform, end.link, "open")

    async def _add_candidate(self, handle: Any, init: dict[str, Any]) -> None:
        return None

    async def _signal(self, peer: str, kind: str, payload: Any) -> None:
        self.wire[peer].signaling.events.put_nowait(Signal(self.me, kind, payload))

    def _buffered(self, handle: Handle | None) -> int | None:
        return 0 if handle is not None and handle.open and not handle.closed else None

    def _send_frame(self, handle: Handle, frame: bytes) -> None:
        other = self._other(handle)
        if other is not None:
            asyncio.get_event_loop().call_soon(other[0]._platform, other[1].link, "frame", bytes(frame))

    def _close(self, handle: Handle) -> None:
        handle.closed = True
        other = self._other(handle)
        if other is not None:
            asyncio.get_event_loop().call_soon(other[0]._platform, other[1].link, "closed", "channel closed")

    def _state(self, handle: Any) -> str:
        return "closed" if handle is None or handle.closed else "new"


def corrupting(transport: Wired, sent: list[float]) -> None:
    """``transport`` sends every relayed piece with its first byte flipped, under the piece's own hash."""
    send = transport.send

    def bad(message: Send, blobs: Mapping[str, bytes]) -> None:
        if isinstance(message.message, RelayPiece):
            sha = message.message.data.sha256
            data = bytearray(blobs.get(sha, message.blobs.get(sha, b"")))
            data[0] ^= 0xFF
            sent.append(time.monotonic())
            message = Send(message.peer, message.message, message.attachments, {sha: bytes(data)})
            blobs = {k: v for k, v in blobs.items() if k != sha}
        send(message, blobs)

    transport.send = bad  # type: ignore[method-assign]


def test_a_relay_that_sends_a_bad_piece_hands_its_child_to_a_direct_send_at_once() -> None:
    async def main() -> None:
        engine, wire = WasmtimeEngine(), {}
        plans: list[RelayPlan] = []
        corrupted: list[float] = []

        def make(peer: str) -> TrainingController:
            transport = Wired(wire, peer)
            c = TrainingController(my_peer_id=peer, storage=MemoryStorage(), kv=MemoryKeyValue(),
                                   pool=ThreadWorkerPool(engine, 1), kernel=NativeKernel(), engine=engine,
                                   clock=lambda: time.time() * 1000, monotonic=lambda: time.monotonic() * 1000,
                                   random_bytes=os.urandom, transport=transport)
            transport.attach(c, has=c.holds, job_of=c.job_with)
            return c

        coordinator, relay, below = (make(p) for p in (COORD, RELAY, BELOW))
        corrupting(wire[RELAY], corrupted)
        send = wire[COORD].send
        wire[COORD].send = lambda m, b: (plans.append(m.message) if isinstance(m.message, RelayPlan) else None,  # type: ignore[method-assign]
                                         send(m, b))[-1]
        try:
            for c in (coordinator, relay, below):
                await c.init()
            for peer in wire:
                wire[peer].start(tuple(wire))
            for peer in wire:
                for other in wire:
                    if other != peer:
                        await wire[peer].wait_for_peer(other, 10)
            job_id = await coordinator.create_job(**package("digits-mlp"), settings=SETTINGS)
            machine = coordinator.coordinator
            assert machine is not None
            machine.relays.min_relay_bytes, machine.relays.piece_bytes = 1, 4096
            for peer in (RELAY, BELOW):
                coordinator.invite(peer)
            for helper in (relay, below):
                async with asyncio.timeout(10):
                    while job_id not in helper.invitations:
                        await asyncio.sleep(0.01)
                await helper.decide_invitation(job_id, True)
            async with asyncio.timeout(10):
                while set(machine.peers) != {RELAY, BELOW} or not all(
                        machine.peers[p].state.value == "modelLoaded" for p in (RELAY, BELOW)):
                    await asyncio.sleep(0.01)
            await coordinator.start()
            async with asyncio.timeout(10):
                while not corrupted:
                    await asyncio.sleep(0.005)
            first = next(p for p in plans if p.source == RELAY)  # BELOW's plan, its relay RELAY
            deadline_s = relay_timeout_ms(first.bytes) / 1000
            async with asyncio.timeout(deadline_s):
                while first.artifact not in below.store.artifacts:
                    await asyncio.sleep(0.005)
            took = time.monotonic() - corrupted[0]
            assert took < deadline_s / 10, (took, deadline_s)
            failed = [e for e in coordinator.get_debug_log()["events"] if e["event"] == "relay.failed"]
            assert failed and failed[0]["details"]["peer"] == RELAY and "hash-mismatch" in failed[0]["details"]["error"]
            # The relay is blamed for good: later rounds go straight to both, and the job completes.
            await run_until_done(coordinator, timeout=120)
            assert machine.relays.blamed.keys() == {RELAY}
        finally:
            for transport in wire.values():
                transport._shutdown()

    asyncio.run(main())
