"""The page's side of an invitation asked again (test_invitation_resend.py): a device that accepted, and whose
acceptance was lost with its channel, takes its coordinator's repeated invitation as the question it is and
answers yes again; it must not decline it as "busy" with the very job it accepted. Real controllers on the
demo's in-memory network (a message to a disconnected peer is lost there, as on a closed channel)."""

from __future__ import annotations

from test_controller import DIGITS_SETTINGS, on_network, package
from test_room_proof import COORD, _controller
from weei.demo.network import MemoryNetwork
from weei.runtime.wasmtime_engine import WasmtimeEngine


def test_an_acceptance_lost_with_the_channel_is_said_again_and_the_module_comes() -> None:
    async def main(network: MemoryNetwork, engine: WasmtimeEngine) -> None:
        coordinator = _controller(network, engine, COORD, None)
        helper = _controller(network, engine, "helper", None)
        for c in (coordinator, helper):
            await c.init()
        job_id = await coordinator.create_job(**package("digits-mlp"), settings={**DIGITS_SETTINGS, "epochs": 1})
        coordinator.invite("helper")
        await network.settle()
        await network.disconnect("helper")
        await helper.decide_invitation(job_id, True)  # lost: the channel is closed
        await network.settle()
        assert coordinator.get_state()["job"]["participants"]["helper"]["state"] == "disconnected"
        network.connected.add("helper")
        await helper.peer_connected(COORD)
        await coordinator.peer_connected("helper")
        await network.settle()
        seen = coordinator.get_state()["job"]["participants"]["helper"]
        assert seen["state"] == "modelLoaded" and seen["approved"], seen
        assert helper.get_state()["job"]["id"] == job_id
        events = [e["event"] for e in helper.get_debug_log()["events"]]
        assert "decision.resent" in events and "invitation.declined" not in events, events

    on_network(main)
