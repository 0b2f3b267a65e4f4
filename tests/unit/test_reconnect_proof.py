"""A coordinator whose channel drops during a session proves the room key again when it is back (issue 9,
"rooms with keys"; core/job/restored_proof.py, docs/agent.md).

No restart here: a participant that accepted keeps running while its
coordinator's channel closes. Whoever then answers under the coordinator's
peer ID (someone holding its resume token) must prove the key, exactly as
after a restart; until it does, nothing the participant says goes to it,
not even a pause or a leave. Real controllers on the demo's in-memory network.
"""

from __future__ import annotations

from test_controller import on_network
from test_restored_proof import Sent, _events, accepted
from test_room_proof import COORD, ROOM, _controller
from weei.api import TrainingController
from weei.demo.network import MemoryNetwork
from weei.host.memory_storage import MemoryStorage
from weei.runtime.wasmtime_engine import WasmtimeEngine


async def _dropped(network: MemoryNetwork, engine: WasmtimeEngine) \
        -> tuple[TrainingController, MemoryStorage, TrainingController, str]:
    """``accepted`` in ROOM; then the channel between them closes (both see it) and the coordinator's peer ID
    is free to come back."""
    coordinator, coord_storage, helper, _, job_id = await accepted(network, engine, ROOM)
    await network.disconnect(COORD)
    await coordinator.peer_disconnected("helper")
    assert helper.participant is not None and helper.participant.state == "disconnected"
    return coordinator, coord_storage, helper, job_id


def test_the_coordinator_back_on_a_new_channel_proves_the_key_before_the_participant_acts() -> None:
    async def main(network: MemoryNetwork, engine: WasmtimeEngine) -> None:
        coordinator, _, helper, _ = await _dropped(network, engine)
        network.connected.add(COORD)
        sent = Sent(helper)
        await helper.peer_connected(COORD)
        helper.pause_contribution(True)  # said before the proof: it waits for it
        await coordinator.peer_connected("helper")  # it delivers the module again at once
        await network.settle()
        assert helper.participant is not None and helper.participant.state == "modelLoaded"
        assert sent.types()[:2] == ["roomChallenge", "pauseContribution"], sent.types()
        assert "moduleStatus" in sent.types()
        assert len(_events(helper, "room.proof.accepted")) == 2  # at the acceptance, and now again
        assert coordinator.get_state()["job"]["participants"]["helper"].get("paused") is True
        assert "error" not in helper.get_state()

    on_network(main)


def test_someone_else_back_under_the_coordinator_s_peer_id_is_refused_and_told_nothing() -> None:
    async def main(network: MemoryNetwork, engine: WasmtimeEngine) -> None:
        _, coord_storage, helper, job_id = await _dropped(network, engine)
        impostor = _controller(network, engine, COORD, "another-room-key", storage=coord_storage)
        await impostor.init()
        assert impostor.get_state()["job"]["id"] == job_id  # the very job, without the key
        sent = Sent(helper)
        await helper.peer_connected(COORD)
        helper.pause_contribution(True)
        await impostor.peer_connected("helper")
        await network.settle()
        assert helper.participant is None
        assert sent.types() == ["roomChallenge"]  # not the pause, not a module status
        refused = _events(helper, "participation.refused")
        assert [(d["jobId"], d["reason"]) for d in refused] == [(job_id, "room-proof-mismatch")]
        assert "ask them for a fresh invite link" in helper.get_state()["error"].lower()

    on_network(main)


def test_leaving_while_the_proof_is_out_tells_the_unproven_peer_nothing() -> None:
    async def main(network: MemoryNetwork, engine: WasmtimeEngine) -> None:
        _, coord_storage, helper, _ = await _dropped(network, engine)
        impostor = _controller(network, engine, COORD, None, storage=coord_storage)
        await impostor.init()
        sent = Sent(helper)
        await helper.peer_connected(COORD)
        await helper.leave()
        await impostor.peer_connected("helper")
        await network.settle()
        assert helper.participant is None and sent.types() == ["roomChallenge"]
        assert [e["type"] for e in _events(helper, "send.held")] == ["leave"]

    on_network(main)
