"""A job's peers keep finding each other (issue 24, item 2): the signaling secret survives a server restart,
a participant says since when its coordinator is offline, nobody is shown 'finished' who never heard the
end, and a tab whose peer ID changed shows the new one."""

from __future__ import annotations

import argparse
import asyncio
import os
import stat
from pathlib import Path

import pytest
from sim import Sim, dataset_spec
from test_controller import DIGITS_SETTINGS, networked, on_network, package

from weei.core.states import JobStatus
from weei.core.wire.messages import JobFinished
from weei.demo.network import MemoryNetwork
from weei.runtime.wasmtime_engine import WasmtimeEngine
from weei.server.rooms import make_token, verify_token
from weei.server.signaling import read_secret


PEER = "a" * 26  # a signaling peer ID: 26 base32 characters


def no_secret_options() -> argparse.Namespace:
    return argparse.Namespace(secret_file=None)


def test_a_server_without_a_secret_file_keeps_one_so_a_restart_keeps_every_peer_id(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    monkeypatch.delenv("WEEI_SIGNAL_SECRET", raising=False)
    first = read_secret(no_secret_options())
    assert first is not None and len(first) >= 32
    kept = tmp_path / "weei" / "signal-secret"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    # The next start reads the same secret: a token of the first start resumes the same ID.
    again = read_secret(no_secret_options())
    token = make_token(first, PEER, "room-1", 2_000_000_000)
    assert again == first and verify_token(again, token, 1_900_000_000) == (PEER, "room-1")
    # An explicit secret still wins.
    monkeypatch.setenv("WEEI_SIGNAL_SECRET", "s" * 40)
    assert read_secret(no_secret_options()) == b"s" * 40


def test_an_unwritable_state_directory_falls_back_to_a_secret_per_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    monkeypatch.setenv("XDG_STATE_HOME", str(blocked))
    monkeypatch.delenv("WEEI_SIGNAL_SECRET", raising=False)
    assert read_secret(no_secret_options()) is None


def test_a_participant_offline_at_the_end_is_not_finished_until_it_hears_so() -> None:
    spec, store = dataset_spec(2)
    sim = Sim.start_job(spec, store, ["p1", "p2"], start=False)
    sim.auto_train = False
    sim.coordinator.start(sim.now)
    sim.pump()
    sim.disconnect("p2")  # its work goes to p1
    while sim.pending:
        sim.finish()
    assert sim.coordinator.status is JobStatus.COMPLETED
    p2 = sim.coordinator.view(sim.now)["participants"]["p2"]
    # Before: 'stopped' like p1, which the window showed as 'finished'.
    assert p2["missedEnd"] is True and "missedEnd" not in sim.coordinator.view(sim.now)["participants"]["p1"]
    assert sim.participants["p2"].offline_since == sim.now
    sim.reconnect("p2")
    assert sim.messages(JobFinished, dst="p2")
    assert "missedEnd" not in sim.coordinator.view(sim.now)["participants"]["p2"]
    assert str(sim.participants["p2"].state) == "stopped" and sim.participants["p2"].offline_since is None


def test_a_participant_says_since_when_its_coordinator_is_offline() -> None:
    async def main(network: MemoryNetwork, engine: WasmtimeEngine) -> None:
        coordinator, helper = networked(network, engine, "coord"), networked(network, engine, "helper")
        for c in (coordinator, helper):
            await c.init()
        job_id = await coordinator.create_job(**package("digits-mlp"), settings={**DIGITS_SETTINGS, "epochs": 3})
        coordinator.invite("helper")
        await network.settle()
        await helper.decide_invitation(job_id, True)
        await network.settle()
        assert "coordinatorOffline" not in helper.get_state()["job"]
        before = helper.clock()
        await network.disconnect("coord")
        job = helper.get_state()["job"]
        # Before: "running" for ever, with nothing to say the coordinator was gone.
        assert job["coordinatorOffline"]["since"] >= before
        await helper.peer_connected("coord")
        assert "coordinatorOffline" not in helper.get_state()["job"]

    on_network(main)


def test_a_tab_given_a_new_peer_id_shows_it_and_takes_it_on_once_its_job_is_left() -> None:
    async def main(network: MemoryNetwork, engine: WasmtimeEngine) -> None:
        alone = networked(network, engine, "old-a")
        await alone.init()
        alone.peer_id_changed("new-a")  # no job: taken on at once
        assert alone.get_state()["myPeerId"] == "new-a" == alone.my_peer_id
        assert "peerIdChanged" not in alone.get_state()
        busy = networked(network, engine, "old-b")
        await busy.init()
        await busy.create_job(**package("digits-mlp"), settings={**DIGITS_SETTINGS, "epochs": 1})
        busy.peer_id_changed("new-b")
        state = busy.get_state()
        # Before: the tab kept showing the ID nobody could reach it under any more.
        assert state["myPeerId"] == "new-b" and state["peerIdChanged"] == {"from": "old-b", "to": "new-b"}
        assert "old-b" in state["error"] and "new-b" in state["error"]
        assert busy.coordinator is not None and busy.coordinator.my_peer_id == "old-b"  # the job's own identity
        await busy.leave()
        assert busy.my_peer_id == "new-b" and "peerIdChanged" not in busy.get_state()

    on_network(main)


def test_a_transport_told_another_id_after_a_server_restart_reports_it() -> None:
    """The server restarts with another secret: the transport reconnects, signaling names a new peer ID, and the
    receiver hears it (``on_peer_id``), so the window does not go on showing the old one."""
    pytest.importorskip("aiortc")
    from aiohttp.test_utils import TestServer, unused_port

    from weei.agent.signaling_client import SignalingClient
    from weei.agent.transport import AgentTransport
    from weei.server.signaling import SignalingConfig, create_signaling_app

    async def scenario() -> None:
        port = unused_port()
        server = TestServer(create_signaling_app(SignalingConfig(secret=b"a" * 32)), host="127.0.0.1", port=port)
        await server.start_server()
        told: list[str] = []
        transport = AgentTransport(SignalingClient(str(server.make_url("/signal"))))
        transport.on_peer_id = told.append
        try:
            first = (await transport.connect()).peer_id
            await transport.join("room-" + os.urandom(4).hex())
            await server.close()
            server = TestServer(create_signaling_app(SignalingConfig(secret=b"b" * 32)), host="127.0.0.1",
                                port=port)
            await server.start_server()
            for _ in range(200):
                if told:
                    break
                await asyncio.sleep(0.05)
            assert len(told) == 1 and told[0] != first and transport.peer_id == told[0]
        finally:
            await transport.close()
            await server.close()

    asyncio.run(scenario())
