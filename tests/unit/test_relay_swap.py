"""Issue 20, finding 1: a coordinator must not make a participant run a module it never approved.

The attack: the participant approved module X. The coordinator sends a relay
plan whose artifact is X but whose one piece is another module Y (the piece
travels under its own hash, so every transport passes it), then a Deliver of
X without X attached. Before the fix the relay node joined the pieces without
hashing the whole, the participant stored Y under X's name, and it trained Y
for every assignment. ``swap`` below turns an honest coordinator's Sends into
that attack; the tests drive it through the relay node alone (sans-I/O) and
through real controllers on the in-memory network.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Mapping
from dataclasses import replace

from weei.api.job_store import JobStore
from weei.core.wire.commands import Log, Send
from weei.core.errors import WeeiError
from weei.core.wire.messages import ArtifactRef, Deliver, Invitation, Message, ModuleStatus, Update
from weei.core.links.relay import RelayNode
from weei.core.wire.messages import Piece, RelayDone, RelayPiece, RelayPlan
from weei.core.verified import VerifiedBlobs
from weei.demo.network import MemoryNetwork
from weei.demo.run import models_dir
from weei.host.memory_storage import MemoryStorage
from weei.runtime.wasmtime_engine import WasmtimeEngine

from test_controller import networked, on_network, package

JOB = "job-1"
C = "coord"
SETTINGS = {"epochs": 1, "localEpochs": 1, "batchSize": 16, "coordinatorParticipates": False}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def approved_module() -> bytes:
    """X: the module the participant approves (not the one the coordinator's job runs)."""
    return (models_dir() / "cartpole-reinforce" / "model.wasm").read_bytes()


def swap(coordinator: str, send: Send, blobs: Mapping[str, bytes],
         approved: bytes) -> list[tuple[Send, dict[str, bytes]]]:
    """What a hostile ``coordinator`` sends instead of ``send``: its invitation names the ``approved`` module
    X; its Deliver of its own module Y becomes a relay plan for X whose one piece is Y, that piece, and a
    Deliver of X with nothing attached. Anything else goes as it is."""
    message, x = send.message, sha(approved)
    if isinstance(message, Invitation):
        claimed = replace(message, module={**message.module, "sha256": x, "bytes": len(approved)})
        return [(replace(send, message=claimed), dict(blobs))]
    if not isinstance(message, Deliver):
        return [(send, dict(blobs))]
    y = message.module.sha256
    module = blobs[y]
    piece = ArtifactRef("checkpoint", y, len(module))
    plan = RelayPlan(message.job_id, 1, x, len(module), coordinator, (), (Piece(y, len(module)),))
    deliver = replace(message, module=ArtifactRef("module", x, len(approved)))
    rest = tuple(a for a in send.attachments if a.sha256 != y)
    return [(Send(send.peer, plan), {}),
            (Send(send.peer, RelayPiece(message.job_id, 1, x, 0, piece), (piece,)), {y: module}),
            (Send(send.peer, deliver, rest), {k: v for k, v in blobs.items() if k != y})]


# ------------------------------------------------------------------------------ the relay node alone


def relay_events(node: RelayNode) -> tuple[list[Log], list[Send]]:
    commands = node.take_commands()
    return [c for c in commands if isinstance(c, Log)], [c for c in commands if isinstance(c, Send)]


def test_pieces_that_join_to_another_artifact_are_refused_by_name_and_not_kept() -> None:
    x, y = approved_module(), (models_dir() / "digits-mlp" / "model.wasm").read_bytes()
    node = RelayNode("p1")
    plan = RelayPlan(JOB, 1, sha(x), len(y), C, (), (Piece(sha(y), len(y)),))
    node.plan(C, plan, job_id=JOB, coordinator=C)
    piece = ArtifactRef("checkpoint", sha(y), len(y))
    # As the frame reader hands it over: the piece itself is what its hash says.
    node.piece(C, RelayPiece(JOB, 1, sha(x), 0, piece), VerifiedBlobs({sha(y): y}))
    assert node.take_assembled() == {} and not node.kept
    logs, sends = relay_events(node)
    assert [log.event for log in logs] == ["relay.failed"]
    assert str(logs[0].details["reason"]).startswith("assembled-mismatch: the pieces join to " + sha(y)[:16])
    (report,) = sends
    assert report.peer == C and isinstance(report.message, RelayDone) and not report.message.ok
    assert report.message.source == C and str(report.message.error).startswith("assembled-mismatch")
    # The coordinator's later pieces for it change nothing.
    node.piece(C, RelayPiece(JOB, 1, sha(x), 0, piece), VerifiedBlobs({sha(y): y}))
    assert node.take_assembled() == {}


def test_pieces_of_an_artifact_no_current_plan_names_are_dropped() -> None:
    data = b"w" * 3000
    pieces = [data[:1000], data[1000:2000], data[2000:]]
    node = RelayNode("p1")
    plan = RelayPlan(JOB, 2, sha(data), len(data), C, (), tuple(Piece(sha(p), len(p)) for p in pieces))
    node.plan(C, plan, job_id=JOB, coordinator=C)
    other = b"v" * 1000
    ref = ArtifactRef("checkpoint", sha(other), len(other))
    node.piece(C, RelayPiece(JOB, 2, sha(other), 0, ref), VerifiedBlobs({sha(other): other}))  # no plan names it
    # An older round's plan for another artifact is not taken either, so its pieces have nothing to join.
    node.plan(C, RelayPlan(JOB, 1, sha(other), len(other), C, (), (Piece(sha(other), len(other)),)),
              job_id=JOB, coordinator=C)
    node.piece(C, RelayPiece(JOB, 1, sha(other), 0, ref), VerifiedBlobs({sha(other): other}))
    logs, sends = relay_events(node)
    assert [(log.event, log.details["reason"]) for log in logs] == [
        ("relay.ignored", "no-plan"), ("relay.ignored", "stale"), ("relay.ignored", "no-plan")]
    assert not sends and node.take_assembled() == {} and list(node.held) == [sha(data)]
    for i, p in enumerate(pieces):  # the plan of the current round still assembles, under its hash
        node.piece(C, RelayPiece(JOB, 2, sha(data), i, ArtifactRef("checkpoint", sha(p), len(p))), {sha(p): p})
    assert node.take_assembled() == {sha(data): data}


# ------------------------------------------------------------------------------------- the job store


def test_the_store_keeps_bytes_only_under_their_own_hash() -> None:
    x, y = approved_module(), b"not the module"
    store = JobStore(MemoryStorage())
    assert store.remember({sha(x): y}) == [sha(x)] and sha(x) not in store.artifacts  # hashed: refused
    assert store.remember({sha(y): y}) == [] and store.artifact(sha(y)) == y


def test_a_tampered_stored_module_is_refused_when_a_saved_job_reopens() -> None:
    async def main(network: MemoryNetwork, engine: WasmtimeEngine) -> None:
        storage = MemoryStorage()
        first = networked(network, engine, C, storage=storage)
        await first.init()
        await first.create_job(**package("digits-mlp"), settings=SETTINGS)
        module = first.coordinator.spec.module.sha256  # type: ignore[union-attr]
        await storage.put("artifacts", module, approved_module())  # someone else wrote the stored copy
        again = networked(network, engine, C, storage=storage)
        await again.init()
        state = again.get_state()
        assert "job" not in state or state["job"].get("id") is None
        assert "could not be reopened" in state["error"] and "does not match its SHA-256" in state["error"]
        assert module not in again.artifacts
        assert [e["details"]["error"] for e in again.get_debug_log()["events"] if e["event"] == "job.reopen-failed"]

    on_network(main)


def test_a_module_whose_bytes_no_longer_match_is_not_loaded() -> None:
    # What the store holds is checked where it is written; a module is hashed once more where it is handed to
    # a backend, so a copy changed after the checks (the write below stands in for any such path) never runs.
    x, y = approved_module(), (models_dir() / "digits-mlp" / "model.wasm").read_bytes()
    store = JobStore(MemoryStorage())
    store.remember(VerifiedBlobs({sha(x): x}))
    assert store.module(sha(x)) == x
    store._held[sha(x)] = y
    try:
        store.module(sha(x))
    except WeeiError as exc:
        assert exc.reason == "hash-mismatch"
    else:
        raise AssertionError("a module that hashes to something else was handed out")


# ------------------------------------------------------------- two controllers, in-memory network


def test_a_coordinator_cannot_swap_the_approved_module_through_relayed_pieces() -> None:
    async def main(network: MemoryNetwork, engine: WasmtimeEngine) -> None:
        x = approved_module()
        seen: list[tuple[str, Message]] = []
        post = network.post

        def hostile(src: str, send: Send, blobs: Mapping[str, bytes]) -> None:
            for out, data in swap(C, send, blobs, x) if src == C else [(send, dict(blobs))]:
                seen.append((src, out.message))
                post(src, out, data)

        network.post = hostile  # type: ignore[method-assign]
        coordinator, participant = networked(network, engine, C), networked(network, engine, "h1")
        for c in (coordinator, participant):
            await c.init()
        job_id = await coordinator.create_job(**package("digits-mlp"), settings=SETTINGS)
        y = coordinator.coordinator.spec.module.sha256  # type: ignore[union-attr]
        coordinator.invite("h1")
        await network.settle()
        assert participant.invitations[job_id]["invitation"]["module"]["sha256"] == sha(x)  # what it approves
        await participant.decide_invitation(job_id, True)
        await network.settle()

        events = participant.get_debug_log()["events"]
        failed = [e["details"] for e in events if e["event"] == "relay.failed"]
        assert [d["reason"][:19] for d in failed] == ["assembled-mismatch:"], events
        assert sha(x) not in participant.artifacts
        statuses = [m for src, m in seen if src == "h1" and isinstance(m, ModuleStatus)]
        missing = f"artifact {sha(x)[:12]}… is not in this browser [missing-artifact]"
        assert [(s.loaded, s.error) for s in statuses] == [(False, missing)]
        assert sha(x) not in statuses[0].held and y not in statuses[0].held

        await coordinator.start()
        deadline = time.monotonic() + 3.0  # a digits assignment trains in well under a second
        while time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert not [m for src, m in seen if src == "h1" and isinstance(m, Update)], "h1 trained the swapped module"
        assert coordinator.coordinator is not None and not coordinator.coordinator.checkpoints[1:]

    on_network(main)
