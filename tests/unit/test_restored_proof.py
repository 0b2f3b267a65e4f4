"""A participation restored after a restart or reload re-proves its coordinator (issue 9, "rooms with keys";
core/job/restored_proof.py).

The gate runs under simulated time beside the challenge it waits for
(``CoordinatorProofs``, ``now`` passed in); then real controllers on the
demo's in-memory network: a participant restarts on its saved storage and
whoever answers under its coordinator's peer ID is the real coordinator
(it continues), one that reopened the same job with another room key or
none (refused by name), or a silent peer (refused as a timeout).
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import pytest

from test_controller import on_network
from test_room_proof import COORD, N1, N2, ROOM, T0, _controller, answer
from weei.api import TrainingController
from weei.core.wire.commands import Send
from weei.core.wire.messages import (ArtifactRef, CheckpointNote, Deliver, JobFinished, Leave, Message, PauseContribution,
                                     RoomProof)
from weei.core.job.restored_proof import MAX_HELD, RESTORED_TRANSITIONS, Hold, RestoredProof, RestoredState
from weei.core.links.room_proof import PROOF_TIMEOUT_MS, CoordinatorProofs, ProofVerdict, RoomProofReason, proof_key
from weei.core.states import IllegalTransition, move
from weei.demo.network import MemoryNetwork
from weei.host.memory_storage import MemoryStorage
from weei.runtime.wasmtime_engine import WasmtimeEngine

JOB, ME = "job-1", "p" * 26
MODULE = b"\0asm module bytes"
MODULE_SHA = hashlib.sha256(MODULE).hexdigest()


def deliver(job: str = JOB) -> tuple[Deliver, dict[str, bytes]]:
    return Deliver(job, ArtifactRef("module", MODULE_SHA, len(MODULE)), {"id": "m"}), {MODULE_SHA: MODULE}


def note(round_: int) -> CheckpointNote:
    return CheckpointNote.of(JOB, {"artifact": {"round": round_, "fileName": f"r{round_}", "sha256": "0" * 64,
                                                "bytes": 1}, "metrics": {}, "createdAt": 0})


def restored() -> tuple[RestoredProof, CoordinatorProofs]:
    return RestoredProof(JOB, COORD), CoordinatorProofs(proof_key(ROOM), ME)


def verdict_of(proofs: CoordinatorProofs, room: str | None, nonce: bytes, now: float) -> ProofVerdict:
    """The participant challenges COORD; a coordinator holding ``room`` (None: no key) answers at ``now``."""
    c = proofs.challenge(JOB, COORD, nonce, T0).message
    reply = answer(room, c, participant=ME) if room is not None else RoomProof(JOB)
    out = proofs.on_proof(COORD, reply, now)
    assert isinstance(out, ProofVerdict)
    return out


# ------------------------------------------------------------------ the gate, simulated time


def test_a_proven_coordinator_s_messages_are_handed_on_in_order_after_the_proof_and_none_before() -> None:
    gate, proofs = restored()
    assert gate.state is RestoredState.WAITING and gate.deciding
    assert gate.connected()  # the channel opened: the caller challenges now
    d, blobs = deliver()
    arrived: list[tuple[Message, Any]] = [(d, blobs), (note(1), {}), (note(2), {})]
    for message, b in arrived:
        assert gate.hold(COORD, message, b) is Hold.HELD
    # Not the gate's: another peer, and the proof itself.
    assert gate.hold("someone-else", note(3), {}) is Hold.PASS
    verdict = verdict_of(proofs, ROOM, N1, T0 + 10)
    assert gate.hold(COORD, answer(ROOM, proofs.challenge(JOB, COORD, N2, T0).message, participant=ME), {}) \
        is Hold.PASS
    assert gate.take_held() is None  # nothing before the verdict
    assert verdict.proven and gate.decide(verdict) and gate.state is RestoredState.PROVEN
    # What arrives while the held messages are handed on waits behind them.
    late = JobFinished(JOB, False)
    assert gate.hold(COORD, late, {}) is Hold.HELD
    out = []
    while (item := gate.take_held()) is not None:
        out.append(item)
    assert out == [*arrived, (late, {})]
    assert out[0][1] is blobs  # the delivery keeps its files
    assert gate.state is RestoredState.RELEASED and gate.closed
    assert gate.hold(COORD, note(4), {}) is Hold.PASS  # from now on, as any participation
    assert not gate.connected()  # a later reconnection asks nothing more


@pytest.mark.parametrize("room,reason", [("another-room-key", RoomProofReason.MISMATCH),
                                         (None, RoomProofReason.MISSING)])
def test_a_wrong_or_missing_proof_drops_everything_held_and_all_that_follows(room: str | None,
                                                                             reason: RoomProofReason) -> None:
    gate, proofs = restored()
    gate.connected()
    assert gate.hold(COORD, *deliver()) is Hold.HELD
    verdict = verdict_of(proofs, room, N1, T0 + 10)
    assert verdict.reason is reason and gate.decide(verdict)
    assert gate.state is RestoredState.REFUSED and gate.closed and gate.held() == 0
    assert gate.take_held() is None
    assert gate.hold(COORD, note(1), {}) is Hold.DROPPED and gate.last_dropped == "refused"


def test_no_proof_in_time_is_a_timeout_refusal() -> None:
    gate, proofs = restored()
    gate.connected()
    c = proofs.challenge(JOB, COORD, N1, T0).message
    assert gate.hold(COORD, *deliver()) is Hold.HELD
    assert proofs.expire(T0 + PROOF_TIMEOUT_MS) == []  # not yet
    [verdict] = proofs.expire(T0 + PROOF_TIMEOUT_MS + 1)
    assert verdict.reason is RoomProofReason.TIMEOUT and gate.decide(verdict)
    assert gate.state is RestoredState.REFUSED and gate.held() == 0
    # the proof that comes too late decides nothing: the challenge is closed
    assert not isinstance(proofs.on_proof(COORD, answer(ROOM, c, participant=ME), T0 + PROOF_TIMEOUT_MS + 2),
                          ProofVerdict)


def test_a_verdict_for_another_job_or_peer_or_before_the_channel_opened_decides_nothing() -> None:
    gate, proofs = restored()
    proven = verdict_of(proofs, ROOM, N1, T0 + 10)
    assert not gate.decide(proven)  # no challenge of this gate is out yet
    gate.connected()
    for other in (ProofVerdict("job-2", COORD, proven.state, None, ""), ProofVerdict(JOB, "x", proven.state, None, "")):
        assert not gate.decide(other)
    assert gate.state is RestoredState.PROVING


def test_a_closed_channel_forgets_what_it_brought_and_the_next_one_is_challenged_afresh() -> None:
    gate, _ = restored()
    assert gate.hold(COORD, note(1), {}) is Hold.DROPPED and gate.last_dropped == "channel-not-open"
    gate.connected()
    assert gate.hold(COORD, *deliver()) is Hold.HELD
    gate.disconnected()
    assert gate.state is RestoredState.WAITING and gate.held() == 0
    assert gate.connected() and gate.state is RestoredState.PROVING
    assert gate.hold(COORD, *deliver()) is Hold.HELD  # the new channel's delivery
    gate.connected()  # opened again without a close seen: what the older one brought goes
    assert gate.held() == 0


def test_what_an_unproven_coordinator_can_make_a_participant_hold_is_bounded() -> None:
    gate = RestoredProof(JOB, COORD, max_held=5)
    gate.connected()
    d, blobs = deliver()
    assert gate.hold(COORD, d, blobs) is Hold.HELD
    # Files come with the delivery only: a second delivery's, or any other message's, are not kept.
    assert gate.hold(COORD, d, blobs) is Hold.DROPPED and gate.last_dropped == "attachments-before-the-proof"
    assert gate.hold(COORD, PauseContribution(JOB, True), {MODULE_SHA: MODULE}) is Hold.DROPPED
    for r in range(4):
        assert gate.hold(COORD, note(r), {}) is Hold.HELD
    assert gate.hold(COORD, note(9), {}) is Hold.DROPPED and gate.last_dropped == "too-many-before-the-proof"
    assert gate.held() == 5 and gate.dropped == {"attachments-before-the-proof": 2, "too-many-before-the-proof": 1}
    assert MAX_HELD > 1000  # a delivery and the 1000 checkpoint notes an honest coordinator sends with it


def test_what_the_participant_says_before_the_proof_waits_for_it_and_goes_out_in_order_after() -> None:
    gate, proofs = restored()
    leave, pause = Send(COORD, Leave(JOB)), Send(COORD, PauseContribution(JOB, True))
    assert gate.hold_outgoing(pause)  # not even connected yet: it waits all the same
    gate.connected()
    challenge = proofs.challenge(JOB, COORD, N1, T0).message
    assert not gate.hold_outgoing(Send(COORD, challenge))  # the challenge itself goes now
    assert not gate.hold_outgoing(Send("someone-else", leave.message))  # not to the gate's coordinator
    assert gate.hold_outgoing(leave)
    assert gate.take_outgoing() == []  # nothing before the verdict
    assert gate.decide(verdict_of(proofs, ROOM, N2, T0 + 10))
    assert gate.take_outgoing() == [pause, leave] and gate.take_outgoing() == []
    assert not gate.hold_outgoing(pause)  # proven: as any participation


def test_what_the_participant_said_before_a_refused_proof_never_goes_out_and_is_bounded() -> None:
    gate, proofs = restored()
    small, small_proofs = RestoredProof(JOB, COORD, max_held=2), CoordinatorProofs(proof_key(ROOM), ME)
    for gate_ in (gate, small):
        gate_.connected()
        for paused in (True, False, True):
            assert gate_.hold_outgoing(Send(COORD, PauseContribution(JOB, paused)))
    assert gate.decide(verdict_of(proofs, "another-room-key", N1, T0 + 10))
    assert gate.take_outgoing() == []
    assert small.dropped == {"outgoing-too-many-before-the-proof": 1}
    assert small.decide(verdict_of(small_proofs, ROOM, N1, T0 + 10))
    assert [s.message for s in small.take_outgoing()] == [PauseContribution(JOB, False), PauseContribution(JOB, True)]


def test_the_gate_moves_by_its_table() -> None:
    assert RESTORED_TRANSITIONS[RestoredState.PROVING]["refused"] is RestoredState.REFUSED
    assert RestoredState.REFUSED not in RESTORED_TRANSITIONS and RestoredState.RELEASED not in RESTORED_TRANSITIONS
    with pytest.raises(IllegalTransition):
        move("restored participation", RESTORED_TRANSITIONS, RestoredState.WAITING, "proven")


# ------------------------------------------------------------------ controllers on the in-memory network


class Sent:
    """What a controller sends, in order (the real transport still carries it)."""

    def __init__(self, controller: TrainingController) -> None:
        self.messages: list[Message] = []
        transport = controller.session.transport
        assert transport is not None
        original = transport.send

        def send(send: Any, blobs: Any) -> None:
            self.messages.append(send.message)
            original(send, blobs)

        transport.send = send  # type: ignore[method-assign]

    def types(self) -> list[str]:
        """The job's messages: a presence card (a peer's name, sent to every peer whose channel opens) is about
        no job and may go before or between them."""
        return [m.TYPE for m in self.messages if m.TYPE != "presence"]


async def accepted(network: MemoryNetwork, engine: WasmtimeEngine, room: str | None) \
        -> tuple[TrainingController, MemoryStorage, TrainingController, MemoryStorage, str]:
    """A coordinator and a participant ("helper") in ``room``, each on its own storage; the helper accepted
    the coordinator's digits job and loaded the module."""
    from test_controller import DIGITS_SETTINGS, package

    coord_storage, helper_storage = MemoryStorage(), MemoryStorage()
    coordinator = _controller(network, engine, COORD, room, storage=coord_storage)
    helper = _controller(network, engine, "helper", room, storage=helper_storage)
    for c in (coordinator, helper):
        await c.init()
    job_id = await coordinator.create_job(**package("digits-mlp"), settings={**DIGITS_SETTINGS, "epochs": 1})
    coordinator.invite("helper")
    await network.settle()
    await helper.decide_invitation(job_id, True)
    await network.settle()
    assert coordinator.get_state()["job"]["participants"]["helper"]["state"] == "modelLoaded"
    return coordinator, coord_storage, helper, helper_storage, job_id


async def _accepted_then_restarted(network: MemoryNetwork, engine: WasmtimeEngine, room: str | None) \
        -> tuple[TrainingController, MemoryStorage, TrainingController, MemoryStorage, str]:
    """``accepted``, then the helper's process dies and a new one starts on the same storage: restored,
    disconnected."""
    coordinator, coord_storage, helper, helper_storage, job_id = await accepted(network, engine, room)
    await network.disconnect("helper")
    helper._clear_job()
    restarted = _controller(network, engine, "helper", room, storage=helper_storage)
    await restarted.init()
    assert restarted.participant is not None and restarted.participant.state == "disconnected"
    return coordinator, coord_storage, restarted, helper_storage, job_id


def _events(c: TrainingController, name: str) -> list[dict[str, Any]]:
    return [e.get("details", {}) for e in c.get_debug_log()["events"] if e["event"] == name]


def test_a_restored_participant_continues_with_a_coordinator_that_proves_the_key_and_not_before() -> None:
    async def main(network: MemoryNetwork, engine: WasmtimeEngine) -> None:
        coordinator, _, restarted, _, job_id = await _accepted_then_restarted(network, engine, ROOM)
        sent = Sent(restarted)
        # Both ends see the channel open: the coordinator delivers at once, the participant challenges.
        await restarted.peer_connected(COORD)
        await coordinator.peer_connected("helper")
        await network.settle()
        assert restarted.participant is not None and restarted.participant.state == "modelLoaded"
        assert coordinator.get_state()["job"]["participants"]["helper"]["state"] == "modelLoaded"
        # The challenge went first; the module status only after the proof was in.
        assert sent.types()[0] == "roomChallenge" and "moduleStatus" in sent.types(), sent.types()
        events = [e["event"] for e in restarted.get_debug_log()["events"]]
        assert events.index("room.proof.accepted") > events.index("room.proof.asked")
        assert [d["coordinator"] for d in _events(restarted, "room.proof.accepted")] == [COORD]
        assert _events(restarted, "participation.restored")[0]["proof"] is True
        assert "error" not in restarted.get_state()

    on_network(main)


@pytest.mark.parametrize("impostor_key,reason", [("another-room-key", "room-proof-mismatch"),
                                                 (None, "room-proof-missing")])
def test_a_restored_participant_refuses_whoever_answers_without_the_key(impostor_key: str | None,
                                                                        reason: str) -> None:
    """Someone else answers under the coordinator's peer ID: the same job, reopened from the coordinator's
    own storage, but with another room key (or none). Nothing goes to it but the challenge."""
    async def main(network: MemoryNetwork, engine: WasmtimeEngine) -> None:
        _, coord_storage, restarted, helper_storage, job_id = await _accepted_then_restarted(network, engine, ROOM)
        await network.disconnect(COORD)
        impostor = _controller(network, engine, COORD, impostor_key, storage=coord_storage)
        await impostor.init()
        assert impostor.get_state()["job"]["id"] == job_id  # it runs the very job
        saved = {store: await helper_storage.keys(store) for store in ("artifacts", "jobs", "checkpoints")}
        sent = Sent(restarted)
        await restarted.peer_connected(COORD)
        await impostor.peer_connected("helper")  # it delivers the module at once
        await network.settle()
        assert restarted.participant is None
        assert sent.types() == ["roomChallenge"]  # no module status, no update: nothing but the challenge
        refused = _events(restarted, "participation.refused")
        assert [(d["jobId"], d["coordinator"], d["reason"]) for d in refused] == [(job_id, COORD, reason)]
        error = restarted.get_state()["error"]
        assert reason in error and "ask them for a fresh invite link" in error.lower(), error
        # The participation is over; nothing else this device saved is gone.
        assert await helper_storage.get("settings", "participation") is None
        assert {store: await helper_storage.keys(store) for store in saved} == saved
        # The module that came before the proof was not taken: neither kept nor loaded.
        assert impostor.session.coordinator is not None
        assert impostor.session.coordinator.spec.module.sha256 not in restarted.artifacts

    on_network(main)


def test_a_restored_participant_refuses_a_coordinator_that_never_answers() -> None:
    async def main(network: MemoryNetwork, engine: WasmtimeEngine) -> None:
        _, _, restarted, helper_storage, job_id = await _accepted_then_restarted(network, engine, ROOM)
        await network.disconnect(COORD)
        network.workers.pop(COORD).cancel()
        network.transport(COORD)  # a silent peer under the coordinator's ID: nobody reads its inbox
        assert restarted.peer_events.room_check is not None
        restarted.peer_events.room_check.proofs.timeout_ms = 300.0
        await restarted.peer_connected(COORD)
        await asyncio.wait_for(restarted.idle(), 60)
        assert restarted.participant is None
        assert [d["reason"] for d in _events(restarted, "participation.refused")] == ["room-proof-timeout"]
        assert await helper_storage.get("settings", "participation") is None

    on_network(main)


def test_a_restored_participation_in_a_keyless_room_asks_nothing_as_at_its_first_acceptance() -> None:
    async def main(network: MemoryNetwork, engine: WasmtimeEngine) -> None:
        coordinator, _, restarted, _, _ = await _accepted_then_restarted(network, engine, None)
        await restarted.peer_connected(COORD)
        assert restarted.participant is not None and restarted.participant.state == "approved"
        await coordinator.peer_connected("helper")
        await network.settle()
        assert restarted.participant.state == "modelLoaded"
        assert _events(restarted, "room.proof.asked") == []
        assert _events(restarted, "participation.restored")[0]["proof"] is False

    on_network(main)
