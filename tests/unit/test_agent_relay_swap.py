"""Issue 20, finding 1, through ``weei agent`` over real WebRTC (aiortc on 127.0.0.1, the real signaling
server): an agent that approved module X (``--accept-model X --trust-room``, the room key proved) is sent a
relay plan for X whose one piece is another module Y, then a Deliver of X without X. It must refuse the
pieces by name, hold nothing under X, and train nothing (test_relay_swap.py has the attack's ``swap``)."""

from __future__ import annotations

import asyncio
import hashlib
import io
from collections.abc import Mapping
from pathlib import Path

import pytest

pytest.importorskip("aiortc")

from test_agent import DIGITS, SETTINGS, coordinator, participant_view, run, signaling_server, until  # noqa: E402
from test_relay_swap import approved_module, swap  # noqa: E402
from weei.agent.main import Agent, AgentOptions  # noqa: E402
from weei.agent.policy import CoordinatorTrust  # noqa: E402
from weei.core.wire.commands import Send  # noqa: E402
from weei.core.wire.messages import Deliver  # noqa: E402
from weei.demo.run import _package_inputs  # noqa: E402


def test_an_agent_refuses_a_module_swapped_in_through_relayed_pieces(tmp_path: Path) -> None:
    x = approved_module()
    x_sha = hashlib.sha256(x).hexdigest()

    async def scenario() -> None:
        out = io.StringIO()
        async with signaling_server() as url, coordinator(url, "swap") as (coord, coord_transport):
            agent = Agent(AgentOptions(server=url, room="swap", data_dir=tmp_path, accept_models=(x_sha,),
                                       trust=CoordinatorTrust(room=True), workers=1), out=out)
            honest = coord_transport.send
            later: list[asyncio.Task[None]] = []

            async def after_relay_done(send: Send, blobs: dict[str, bytes]) -> None:
                # The reader checks what is held when the Deliver arrives: it goes once the agent has
                # answered the relayed pieces (the stored bytes are in place by then).
                await until("the agent answered the relay plan", lambda: any(
                    r.direction == "receive" and r.type == "relayDone" for r in coord_transport.log), 30)
                honest(send, blobs)

            def hostile(send: Send, blobs: Mapping[str, bytes]) -> None:
                for out_send, data in swap(coord_transport.peer_id or "", send, blobs, x):
                    if isinstance(out_send.message, Deliver):
                        later.append(asyncio.ensure_future(after_relay_done(out_send, data)))
                    else:
                        honest(out_send, data)

            coord_transport.send = hostile  # type: ignore[method-assign]
            try:
                await agent.start()
                me = agent.peer_id
                assert me is not None and agent.controller is not None
                await coord_transport.wait_for_peer(me, 20)
                job_id = await coord.create_job(**_package_inputs(DIGITS), settings=SETTINGS)
                coord.invite(me)
                await until("the agent refused the relayed pieces", lambda: any(
                    e["event"] == "relay.failed" for e in agent.controller.get_debug_log()["events"]), 30)
                # It accepted X, and only after the coordinator proved the room key.
                assert agent.decisions[job_id].accepted
                assert f"job {job_id}: coordinator {coord_transport.peer_id} proved the room key" in out.getvalue()
                failed = [e["details"] for e in agent.controller.get_debug_log()["events"]
                          if e["event"] == "relay.failed"]
                assert [d["reason"][:19] for d in failed] == ["assembled-mismatch:"]
                # The Deliver of X without X is refused by the frame reader: nothing is held under X.
                await until("the agent's transport refused the deliver", lambda: any(
                    "neither sent nor held" in str(v) for v in
                    agent.transport.transfers_state()["transferErrors"].values()), 20)  # type: ignore[union-attr]
                assert x_sha not in agent.controller.artifacts
                await coord.start()
                await asyncio.sleep(3.0)  # a digits assignment trains in well under a second
                updates = [r for r in coord_transport.log if r.direction == "receive" and r.type == "update"]
                assert not updates, "the agent trained the swapped module"
                assert participant_view(coord, me).get("state") != "modelLoaded"
            finally:
                for task in later:
                    task.cancel()
                await agent.close()
    run(scenario(), 120)
