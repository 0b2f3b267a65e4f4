"""``weei agent`` restarted with its saved participation re-proves its coordinator (issue 9, "rooms with keys";
docs/agent.md "A restored participation proves its coordinator again"), over real WebRTC (aiortc on
127.0.0.1) and the real signaling server.

The agent "crashes" (its connections close, nothing is left politely) and starts again on the same data
directory, so it keeps its peer ID and its saved participation. First the coordinator is still there and
proves the key again: the agent takes part again. Then the coordinator is gone and someone holding the
coordinator's resume token (so its peer ID) and its saved job, but no room key, answers: the agent sends it
the challenge and nothing else, and the participation ends by name.
"""

from __future__ import annotations

import io
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

pytest.importorskip("aiortc")

from test_agent import DIGITS, SETTINGS, coordinator_controller, module_sha, participant_view, run, signaling_server, until  # noqa: E402
from weei.agent.main import Agent, AgentOptions  # noqa: E402
from weei.agent.policy import CoordinatorTrust  # noqa: E402
from weei.agent.transport import AgentTransport  # noqa: E402
from weei.api.controller import TrainingController  # noqa: E402
from weei.demo.run import _package_inputs  # noqa: E402
from weei.host.memory_storage import MemoryStorage  # noqa: E402
from weei.runtime.wasmtime_engine import WasmtimeEngine  # noqa: E402
from weei.agent.signaling_client import SignalingClient  # noqa: E402

ROOM = "restored-room"


@asynccontextmanager
async def coordinator(url: str, storage: MemoryStorage, room_key: str | None, token: str | None = None) \
        -> AsyncIterator[tuple[TrainingController, AgentTransport]]:
    """A coordinator in ROOM (it joins with the key) on ``storage``, proving ``room_key`` (None: none);
    ``token``: a resume token, to come back under a peer ID given before."""
    transport = AgentTransport(SignalingClient(url, token=token, room=ROOM if token else None))
    try:
        welcome = await transport.connect()
        controller = coordinator_controller(welcome.peer_id, transport, WasmtimeEngine(), room_key, storage)
        await controller.init()
        transport.attach(controller, has=controller.holds)
        await transport.join(ROOM)
        yield controller, transport
    finally:
        await transport.close()


def agent(url: str, data_dir: Path, out: io.StringIO) -> Agent:
    return Agent(AgentOptions(server=url, room=ROOM, data_dir=data_dir, accept_models=(module_sha(),),
                              trust=CoordinatorTrust(room=True), workers=1), out=out)


async def crash(a: Agent) -> None:
    """The process dies: its connections close, it leaves no job and says nothing."""
    assert a.transport is not None and a.controller is not None
    await a.transport.close()
    a.controller._clear_job()


def sent_by(transport: AgentTransport, peer: str, after: int = 0) -> list[str]:
    """The types of the job's messages ``transport`` received from ``peer`` (from record number ``after`` on): not
    the card (name, activity) every peer sends (docs/api.md "Names")."""
    return [r.type for r in list(transport.log)[after:]
            if r.direction == "receive" and r.peer == peer and r.type != "presence"]


def test_a_restarted_agent_re_proves_its_coordinator_and_refuses_one_without_the_key(tmp_path: Path) -> None:
    async def scenario() -> None:
        coord_storage = MemoryStorage()
        async with signaling_server() as url:
            out1, out2, out3 = io.StringIO(), io.StringIO(), io.StringIO()
            async with coordinator(url, coord_storage, ROOM) as (coord, coord_transport):
                first = agent(url, tmp_path, out1)
                await first.start()
                me = first.peer_id
                assert me is not None
                await coord_transport.wait_for_peer(me, 20)
                job_id = await coord.create_job(**_package_inputs(DIGITS), settings=SETTINGS)
                coord.invite(me)
                await until("the agent loaded the module",
                            lambda: participant_view(coord, me).get("state") == "modelLoaded", 30)
                await crash(first)
                await until("the coordinator saw the agent go",
                            lambda: participant_view(coord, me).get("state") == "disconnected", 30)

                # 1. Restarted: the same peer ID, the saved participation, the coordinator proves the key again.
                mark = len(coord_transport.log)
                second = agent(url, tmp_path, out2)
                try:
                    await second.start()
                    assert second.peer_id == me and second.controller is not None
                    await until("the restarted agent loaded the module again",
                                lambda: participant_view(coord, me).get("state") == "modelLoaded", 60)
                    types = sent_by(coord_transport, me, mark)
                    assert types[0] == "roomChallenge" and "moduleStatus" in types, types
                    assert f"job {job_id}: coordinator {coord_transport.peer_id} proved the room key" in out2.getvalue()
                    # what it held until then reached its disk once released: the module
                    assert module_sha() in await second.storage.keys("artifacts")
                finally:
                    await crash(second)
                coord_token = coord_transport.signaling.token
                assert coord_token is not None
                coord_id = coord_transport.peer_id
                blobs = sorted(p.name for p in (tmp_path / "storage" / "blobs").iterdir())

            # 2. The coordinator is gone; its peer ID and its saved job come back without the room key.
            async with coordinator(url, coord_storage, None, token=coord_token) as (impostor, impostor_transport):
                assert impostor_transport.peer_id == coord_id
                assert impostor.get_state()["job"]["id"] == job_id
                third = agent(url, tmp_path, out3)
                try:
                    await third.start()
                    assert third.peer_id == me and third.controller is not None
                    await until("the restarted agent refused the coordinator",
                                lambda: third.controller is not None and third.controller.participant is None, 60)
                    text = out3.getvalue()
                    assert f"job {job_id}: room-proof-missing: coordinator {coord_id} holds no room key" in text, text
                    refused = [e["details"] for e in third.controller.get_debug_log()["events"]
                               if e["event"] == "participation.refused"]
                    assert [(d["jobId"], d["reason"]) for d in refused] == [(job_id, "room-proof-missing")]
                    assert "fresh invite link" in third.controller.get_state()["error"]
                    # It got the challenge, nothing else; the agent's disk lost nothing but the participation.
                    await until("the impostor saw the challenge",
                                lambda: "roomChallenge" in sent_by(impostor_transport, me), 10)
                    assert sent_by(impostor_transport, me) == ["roomChallenge"], sent_by(impostor_transport, me)
                    assert sorted(p.name for p in (tmp_path / "storage" / "blobs").iterdir()) == blobs
                    assert await third.storage.get("settings", "participation") is None
                finally:
                    await third.close()
    run(scenario(), 240)
