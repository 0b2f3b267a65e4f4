"""What the agent writes to its disk (issue 20, findings 4 and 8).

Any peer in the agent's room could send it files and have them written before any check, and they stayed
after garbage collection; a symlinked ``storage/blobs`` made garbage collection delete the files of its
target. Now only the coordinator of the job the agent accepted gets files written, only those the job asks
for, within a budget per peer (``agent/keep.py``), and the storage keeps to its own directories.

The rules are tested sans-I/O on ``DiskClaims`` with a real ``Participant``; the agent over real WebRTC
(aiortc on 127.0.0.1) and the real signaling server, as in test_agent.py.
"""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path
from typing import Any

import pytest

from weei.agent.keep import DiskClaims, KeepReason
from weei.agent.storage import DiskStorage, StorageError
from weei.core.wire.messages import ArtifactRef, Assign, ChunkRef, Deliver, Invitation, Message, Update
from weei.core.job.participant import Participant

COORD, OTHER = "c" * 26, "d" * 26
MODULE = b"\0asm the module"
AUX = b"auxiliary weights"
MODEL_INFO = {"id": "m", "auxiliaryWeights": [{"id": "emb"}]}


def ref(kind: str, data: bytes) -> ArtifactRef:
    return ArtifactRef(kind, hashlib.sha256(data).hexdigest(), len(data))


def blobs(*datas: bytes) -> dict[str, bytes]:
    return {hashlib.sha256(d).hexdigest(): d for d in datas}


def accepted(job_id: str = "job-1", coordinator: str = COORD) -> Participant:
    """A participant that accepted ``job_id`` from ``coordinator`` (approved: the module comes next)."""
    p = Participant("me")
    p.on_message(coordinator, Invitation(job_id, coordinator, MODEL_INFO, {"fileName": "model.wasm",
              "bytes": len(MODULE), "sha256": ref("module", MODULE).sha256}, 1000, {}), 0.0)
    p.decide(True, 0.0)
    return p


def assign(job_id: str, checkpoint: bytes, chunk: bytes | None = None, round_: int = 1) -> Message:
    data = ChunkRef("c1", "npz", 10, ref("chunk", chunk)) if chunk is not None else None
    return Assign(job_id, round_, f"a{round_}", f"t{round_}", ref("checkpoint", checkpoint), {}, 7, data)


def shas(refs: Any) -> set[str]:
    return {r.sha256 for r in refs}


# ------------------------------------------------------------------------ the rules, sans-I/O


def test_only_the_accepted_coordinator_gets_files_kept_and_only_those_its_job_asks_for() -> None:
    claims = DiskClaims(budget_bytes=1 << 20)
    junk = os.urandom(1000)
    deliver = Deliver("job-1", ref("module", junk), MODEL_INFO)

    # Nobody accepted yet, or the sender is another room peer: nothing is kept, said once per peer and reason.
    v1 = claims.judge(None, OTHER, deliver, blobs(junk))
    v2 = claims.judge(accepted(), OTHER, deliver, blobs(junk))
    assert not v1.keep and not v2.keep and not v1.stale
    assert [(r.reason, r.first) for r in v1.refused + v2.refused] == [
        (KeepReason.NOT_OUR_COORDINATOR, True), (KeepReason.NOT_OUR_COORDINATOR, False)]
    assert claims.refusals == {(OTHER, KeepReason.NOT_OUR_COORDINATOR): 2}

    # The coordinator of an invitation not (yet) accepted: nothing either.
    invited = Participant("me")
    invited.on_message(COORD, Invitation("job-1", COORD, MODEL_INFO, {"sha256": ref("module", MODULE).sha256}, 0, {}),
                    0.0)
    assert claims.judge(invited, COORD, Deliver("job-1", ref("module", MODULE), MODEL_INFO),
                        blobs(MODULE)).refused[0].reason is KeepReason.NOT_OUR_COORDINATOR

    p = accepted()
    # The accepted coordinator: its module and a declared auxiliary file are kept...
    good = Deliver("job-1", ref("module", MODULE), MODEL_INFO, {"emb": ref("auxiliary", AUX)})
    verdict = claims.judge(p, COORD, good, blobs(MODULE, AUX))
    assert shas(verdict.keep) == {ref("module", MODULE).sha256, ref("auxiliary", AUX).sha256}
    assert not verdict.refused
    assert claims.used(COORD) == len(MODULE) + len(AUX) and claims.used(OTHER) == 0
    assert claims.judge(p, COORD, good, blobs(MODULE, AUX)).keep == ()  # once

    # ...but not another module, an undeclared slot, another job's files, or what no job file is.
    cases: list[tuple[Message, dict[str, bytes]]] = [
        (Deliver("job-1", ref("module", junk), MODEL_INFO), blobs(junk)),
        (Deliver("job-1", ref("module", MODULE), MODEL_INFO, {"other": ref("auxiliary", junk)}), blobs(junk)),
        (assign("job-2", junk), blobs(junk)),
        (Update("job-1", 1, "a", "t", "0" * 64, ref("update", junk), {}, 1), blobs(junk)),
    ]
    for message, attached in cases:
        verdict = claims.judge(p, COORD, message, attached)
        assert not verdict.keep and [r.reason for r in verdict.refused] == [KeepReason.UNCLAIMED], message
    assert claims.refusals[(COORD, KeepReason.UNCLAIMED)] == 4


def test_the_budget_per_peer_and_the_newest_weights_only() -> None:
    one, two, three = os.urandom(400), os.urandom(400), os.urandom(400)
    chunk = os.urandom(300)
    claims = DiskClaims(budget_bytes=1000)
    p = accepted()

    assert shas(claims.judge(p, COORD, assign("job-1", one, chunk), blobs(one, chunk)).keep) == shas(
        [ref("checkpoint", one), ref("chunk", chunk)])
    # A newer checkpoint replaces the older one on disk: it fits in the budget the older one frees.
    verdict = claims.judge(p, COORD, assign("job-1", two, round_=2), blobs(two))
    assert shas(verdict.keep) == {ref("checkpoint", two).sha256}
    assert verdict.stale == (ref("checkpoint", one).sha256,)
    assert claims.used(COORD) == 700
    # A chunk past the budget is refused by name; nothing is written for it.
    big = os.urandom(301)
    verdict = claims.judge(p, COORD, assign("job-1", two, big, round_=3), blobs(big))
    assert not verdict.keep and [r.reason for r in verdict.refused] == [KeepReason.BUDGET_EXCEEDED]
    assert "past the budget of 1000 bytes (700 used)" in verdict.refused[0].detail
    assert claims.used(COORD) == 700

    # Another job (here: from another coordinator) makes the first one's files stale at once.
    q = accepted("job-2", OTHER)
    verdict = claims.judge(q, OTHER, assign("job-2", three), blobs(three))
    assert shas(verdict.keep) == {ref("checkpoint", three).sha256}
    assert set(verdict.stale) == shas([ref("checkpoint", two), ref("chunk", chunk)])
    assert claims.used(COORD) == 0 and claims.used(OTHER) == 400
    assert claims.claimed(q) == {ref("checkpoint", three).sha256}
    assert claims.claimed(p) == frozenset()  # not the participation whose files are on disk
    q.leave(1.0)
    assert claims.claimed(q) == frozenset()  # a job left claims nothing


# ------------------------------------------------------------------------ the storage keeps to its directories


def test_garbage_collection_never_deletes_through_a_symlinked_blobs_folder(tmp_path: Path) -> None:
    import asyncio

    async def scenario() -> None:
        storage = DiskStorage(tmp_path / "storage")
        await storage.put("artifacts", "a" * 64, b"kept")
        precious = tmp_path / "elsewhere"
        precious.mkdir()
        # Named as a blob would be, and not: neither may go.
        (precious / ("f" * 64)).write_bytes(b"a private key")
        (precious / "id_ed25519").write_bytes(b"another")
        real_blobs = tmp_path / "storage" / "blobs"
        for path in real_blobs.iterdir():
            path.unlink()
        real_blobs.rmdir()
        real_blobs.symlink_to(precious, target_is_directory=True)

        with pytest.raises(StorageError) as caught:
            await storage.collect_garbage()
        assert caught.value.reason == "storage-symlink"
        for call in (storage.put("artifacts", "b" * 64, b"x"), storage.get("artifacts", "a" * 64),
                     storage.keys("jobs")):
            with pytest.raises(StorageError) as caught:
                await call
            assert caught.value.reason == "storage-symlink"
        assert sorted(p.name for p in precious.iterdir()) == sorted(["f" * 64, "id_ed25519"])

        # A symlinked store folder is refused the same way; a link inside blobs/ is never followed.
        real_blobs.unlink()
        real_blobs.mkdir()
        (real_blobs / ("e" * 64)).symlink_to(precious / "id_ed25519")
        records = tmp_path / "storage" / "records"
        (records / "jobs").symlink_to(precious, target_is_directory=True)
        with pytest.raises(StorageError) as caught:
            await storage.keys("jobs")
        assert caught.value.reason == "storage-symlink"
        (records / "jobs").unlink()
        await storage.collect_garbage()
        assert (precious / "id_ed25519").read_bytes() == b"another"

    asyncio.run(scenario())


# ------------------------------------------------------------------------ the agent, over real WebRTC


def disk_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def test_a_room_peer_that_was_not_invited_cannot_fill_the_agents_disk(tmp_path: Path) -> None:
    """128 MB from a room peer nobody invited: nothing is written, the refusal is named once; the accepted
    coordinator's files still are; collect_garbage removes what no participation claims."""
    pytest.importorskip("aiortc")
    from test_agent import (DIGITS, SETTINGS, coordinator, deliver, module_sha, participant_view, run,
                            signaling_server, until)
    from weei.agent.main import Agent, AgentOptions
    from weei.agent.policy import CoordinatorTrust
    from weei.agent.transport import AgentTransport
    from weei.demo.run import _package_inputs
    from weei.agent.signaling_client import SignalingClient

    async def scenario() -> None:
        out = io.StringIO()
        async with signaling_server() as url, coordinator(url, "disk") as (coord, coord_transport):
            agent = Agent(AgentOptions(server=url, room="disk", data_dir=tmp_path, accept_models=(module_sha(),),
                                       trust=CoordinatorTrust(room=True), workers=1), out=out)
            attacker = AgentTransport(SignalingClient(url))
            try:
                await agent.start()
                assert agent.peer_id is not None and agent.controller is not None
                await attacker.connect()
                await attacker.join("disk")
                await attacker.wait_for_peer(agent.peer_id, 20)
                storage = tmp_path / "storage"
                before = disk_bytes(storage)

                # Over the data channel, as any room peer can: a module "delivered" for a job nobody offered.
                attacker.send(*deliver(agent.peer_id, os.urandom(3_000_000), "not-a-job"))
                await until("the agent refused the attacker's files", lambda: "disk-not-our-coordinator" in
                            out.getvalue(), 30)
                # Then 125 MB more, handed to the agent as its transport hands every checked message on.
                for i in range(5):
                    send, attached = deliver(agent.peer_id, os.urandom(25_000_000), f"junk-{i}")
                    await agent.on_peer_message(attacker.peer_id or "", send.message, attached)
                assert disk_bytes(storage) == before
                assert not (storage / "blobs").exists()
                text = out.getvalue()
                assert text.count(f"not storing files from peer {attacker.peer_id}: disk-not-our-coordinator") == 1
                refused = [e["details"] for e in agent.controller.get_debug_log()["events"]
                           if e["event"] == "disk.refused"]
                assert [(d["from"], d["reason"]) for d in refused] == [(attacker.peer_id, "disk-not-our-coordinator")]
                assert agent.disk.refusals[(attacker.peer_id, "disk-not-our-coordinator")] == 6

                # The accepted coordinator's files flow; the attacker's, sent for that very job, still do not.
                await coord_transport.wait_for_peer(agent.peer_id, 20)
                job_id = await coord.create_job(**_package_inputs(DIGITS), settings=SETTINGS)
                coord.invite(agent.peer_id)
                await until("the agent loaded the module",
                            lambda: participant_view(coord, agent.peer_id).get("state") == "modelLoaded", 20)
                send, attached = deliver(agent.peer_id, os.urandom(2_000_000), job_id)
                await agent.on_peer_message(attacker.peer_id or "", send.message, attached)
                await coord.start()
                await until("the job completed", lambda: coord.get_state()["job"]["status"] in ("completed", "paused"),
                            45)
                assert coord.get_state()["job"]["status"] == "completed"
                await until("the agent saw the job finish", lambda: agent.controller is not None and
                            agent.controller.participant is not None and
                            agent.controller.participant.state == "stopped", 10)
                sent = [(sha, kind) for r in coord_transport.log if r.direction == "send" and r.peer == agent.peer_id
                        for sha, kind in zip(r.attachments, r.kinds, strict=True)]
                checkpoints = [sha for sha, kind in sent if kind == "checkpoint"]
                on_disk = set(await agent.storage.keys("artifacts"))
                assert on_disk == ({sha for sha, _ in sent} - set(checkpoints)) | {checkpoints[-1]}
                assert sorted(p.name for p in (storage / "blobs").iterdir()) == sorted(on_disk)
                assert agent.disk.used(coord_transport.peer_id or "") == disk_bytes(storage / "blobs")

                # Leftovers: the finished job's files and what an older version wrote go with collect_garbage.
                await agent.storage.put("artifacts", hashlib.sha256(b"old").hexdigest(), b"old")
                (storage / "blobs" / ("0" * 64)).write_bytes(b"stray")
                removed = await agent.collect_garbage()
                assert removed == 2 * len(on_disk) + 3
                assert await agent.storage.keys("artifacts") == [] and list((storage / "blobs").iterdir()) == []
            finally:
                await attacker.close()
                await agent.close()
    run(scenario(), 120)


def test_a_coordinator_past_the_budget_is_refused_by_name_and_the_job_goes_on(tmp_path: Path) -> None:
    pytest.importorskip("aiortc")
    from test_agent import DIGITS, SETTINGS, coordinator, module_sha, participant_view, run, signaling_server, until
    from weei.agent.main import Agent, AgentOptions
    from weei.agent.policy import CoordinatorTrust
    from weei.demo.run import _package_inputs

    async def scenario() -> None:
        out = io.StringIO()
        async with signaling_server() as url, coordinator(url, "budget") as (coord, coord_transport):
            agent = Agent(AgentOptions(server=url, room="budget", data_dir=tmp_path, accept_models=(module_sha(),),
                                       trust=CoordinatorTrust(room=True), workers=1, disk_budget_mib=0), out=out)
            try:
                await agent.start()
                assert agent.peer_id is not None
                await coord_transport.wait_for_peer(agent.peer_id, 20)
                await coord.create_job(**_package_inputs(DIGITS), settings=SETTINGS)
                coord.invite(agent.peer_id)
                await until("the agent loaded the module",
                            lambda: participant_view(coord, agent.peer_id).get("state") == "modelLoaded", 20)
                await coord.start()
                await until("the job completed", lambda: coord.get_state()["job"]["status"] in ("completed", "paused"),
                            45)
                assert coord.get_state()["job"]["status"] == "completed"
                assert coord.coordinator is not None and not coord.coordinator.rejected
                assert f"not storing files from peer {coord_transport.peer_id}: disk-budget-exceeded" in out.getvalue()
                assert not (tmp_path / "storage" / "blobs").exists()
            finally:
                await agent.close()
    run(scenario(), 90)


def test_the_disk_budget_flag_is_checked(capsys: Any) -> None:
    import argparse

    from weei.agent.main import add_arguments, run_cli

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args(["--room", "r"]).disk_budget_mib == 4096
    args = parser.parse_args(["--server", "ws://127.0.0.1:9/signal", "--room", "r", "--disk-budget-mib", "-1"])
    assert run_cli(args) == 2 and "--disk-budget-mib must be 0 to 2**30" in capsys.readouterr().err
