"""The WGSL archive reaches remote participants, and a saved job keeps it (docs/gpu.md, "Remote participants").

A coordinator's job created with executionFiles announces its archive in
Deliver; a participant that will train on its GPU asks for it and gets it
with its first Assign (through the in-memory network, which checks every
attachment against its SHA-256 and size as the real transport does). A
participant on the CPU never downloads it; a tampered archive is a named
fallback and the job completes on the CPU. On lavapipe through wgpu-py.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from dataclasses import replace
from typing import Any, Mapping

import pytest
import wgpu

from weei.api import TrainingController
from weei.core.wire.commands import Send
from weei.core.wire.messages import Assign, Deliver
from weei.demo.network import MemoryNetwork
from weei.host.memory_storage import MemoryKeyValue, MemoryStorage
from weei.host.worker_pool import ThreadWorkerPool
from weei.kernel.native import NativeKernel
from weei.runtime.wasmtime_engine import WasmtimeEngine

from test_controller import fixed_random, networked, package, run_until_done
from test_gpu_controller import ARCHIVE, ARCHIVE_NAME, SETTINGS
from test_gpu_lavapipe import pytestmark  # noqa: F401  (skipped without a Vulkan adapter)

ARCHIVE_SHA = hashlib.sha256(ARCHIVE).hexdigest()
MODULES = [m["sha256"] for m in json.loads(ARCHIVE)["modules"]]
REMOTE_ONLY = {**SETTINGS, "coordinatorParticipates": False}


class Wire(MemoryNetwork):
    """The in-memory network, counting the WGSL archives it carries; ``tamper`` rewrites messages on the way."""

    def __init__(self, tamper: Any = None) -> None:
        super().__init__()
        self.archives: list[tuple[str, str]] = []  # (to, sha256) of every shader archive sent
        self.tamper = tamper

    def post(self, src: str, send: Send, blobs: Mapping[str, bytes]) -> None:
        if self.tamper is not None:
            send, blobs = self.tamper(send, dict(blobs))
        assign = send.message
        if isinstance(assign, Assign) and assign.shader_archive is not None and assign.shader_archive.sha256 in blobs:
            self.archives.append((send.peer, assign.shader_archive.sha256))
        super().post(src, send, blobs)


def seeded(n: int) -> bytes:
    """Fixed seeds and initial weights (16 bytes: as test_gpu_controller's), fresh job ids and chunk orders
    (the gate is bit-identical on lavapipe whatever the start: test_gpu_lavapipe)."""
    return fixed_random(n) if n == 16 else os.urandom(n)


def make(network: MemoryNetwork, peer: str, storage: MemoryStorage | None = None, **overrides: Any) -> TrainingController:
    return networked(network, WasmtimeEngine(), peer, storage=storage or MemoryStorage(), random_bytes=seeded,
                     environment={"browser": "agent", "os": "Linux"}, gpu=wgpu.gpu, **overrides)


async def remote_job(network: Wire, preference: str, **helper: Any) -> dict[str, Any]:
    """A digits job with the archive, trained by one remote participant with ``preference`` (and ``helper``'s
    controller arguments)."""
    coordinator, helper = make(network, "coord"), make(network, "helper", **helper)
    try:
        for c in (coordinator, helper):
            await c.init()
        await helper.set_backend_preference(preference)
        job_id = await coordinator.create_job(**package("digits-mlp"), execution_files={ARCHIVE_NAME: ARCHIVE},
                                              settings=REMOTE_ONLY)
        coordinator.invite("helper")
        await network.settle()
        await helper.decide_invitation(job_id, True)
        await network.settle()
        await coordinator.start()
        await run_until_done(coordinator, timeout=300)
        await network.settle()
        await asyncio.sleep(0.1)
        state = coordinator.get_state()
        state["helperLog"] = helper.get_debug_log()["events"]
        state["helperHeld"] = ARCHIVE_SHA in helper.artifacts
        state["helperState"] = helper.get_state()
        return state
    finally:
        await network.close()


def events(state: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [e for e in state["helperLog"] if e["event"] == name]


def test_a_remote_participant_fetches_the_archive_once_and_trains_on_the_gpu() -> None:
    network = Wire()
    state = asyncio.run(remote_job(network, "gpu"))
    assert state["job"]["status"] == "completed"
    assert network.archives == [("helper", ARCHIVE_SHA)]  # once per job, to the one that asked
    remote = state["diagnostics"]["helper"]
    assert remote["execution"]["actual"] == "gpu" and remote["execution"]["backend"] == "gpu-webgpu"
    assert remote["execution"]["fallbackReason"] is None
    assert remote["model"]["wgsl"] == {"present": True, "sha256": MODULES}
    assert remote["timings"]["compilationMs"] is not None and remote["timings"]["compilationMs"] >= 0
    assert "llvmpipe" in remote["gpu"]["adapter"]["device"].lower()
    assert len(events(state, "gpu.archive-received")) == 1
    assert len(events(state, "gpu.trained")) == 15  # every assignment of the job on the helper's GPU
    assert state["helperState"]["execution"]["actual"] == "gpu"


def test_a_participant_on_the_cpu_never_downloads_the_archive() -> None:
    network = Wire()
    state = asyncio.run(remote_job(network, "cpu"))
    assert state["job"]["status"] == "completed"
    assert network.archives == [] and not state["helperHeld"]
    remote = state["diagnostics"]["helper"]
    # The package's CPU backend, named from the announcement; nothing to fall back from.
    assert remote["execution"]["actual"] == "cpu" and remote["execution"]["backend"] == "cpu-wasm-simd"
    assert remote["execution"]["fallbackReason"] is None
    assert remote["model"]["wgsl"] == {"present": False, "sha256": []}
    assert not events(state, "gpu.trained") and not events(state, "gpu.archive-received")


def test_an_agent_runs_only_an_archive_its_accept_list_names() -> None:
    """Issue 20 §3: ``--accept-model`` covered the module, not the WGSL archive the job then announced,
    so an accepted module brought any GPU code with it. Now the archive is not even fetched."""
    from test_agent import module_sha
    from weei.agent.policy import AcceptancePolicy

    policy = AcceptancePolicy([module_sha()])  # the module, not the archive
    network = Wire()
    state = asyncio.run(remote_job(network, "gpu", accept_archive=lambda sha: policy.archive_decision(sha).accepted))
    assert state["job"]["status"] == "completed"  # on the CPU: the module was accepted
    assert network.archives == [] and not state["helperHeld"]
    remote = state["diagnostics"]["helper"]
    assert remote["execution"]["actual"] == "cpu"
    assert remote["execution"]["fallbackReason"].startswith("archive-not-accepted:")
    assert [e["details"] for e in events(state, "gpu.archive-refused")] == [
        {"reason": "archive-not-accepted", "sha256": ARCHIVE_SHA}]
    assert not events(state, "gpu.trained")
    assert AcceptancePolicy([module_sha(), ARCHIVE_SHA]).archive_decision(ARCHIVE_SHA.upper()).accepted


def _swap_archive(send: Send, blobs: dict[str, bytes], bad: bytes) -> tuple[Send, dict[str, bytes]]:
    """An Assign whose archive is ``bad`` (its reference re-hashed, so the transport's own check passes)."""
    message = send.message
    if isinstance(message, Assign) and message.shader_archive is not None and message.shader_archive.sha256 in blobs:
        ref = replace(message.shader_archive, sha256=hashlib.sha256(bad).hexdigest(), bytes=len(bad))
        blobs.pop(message.shader_archive.sha256)
        blobs[ref.sha256] = bad
        attachments = tuple(ref if a.kind == "wgsl" else a for a in send.attachments)
        send = replace(send, message=replace(message, shader_archive=ref), attachments=attachments)
    return send, blobs


def _announce(send: Send, bad: bytes) -> Send:
    """A Deliver that announces ``bad`` as the archive (a coordinator that shares a broken one)."""
    message = send.message
    if isinstance(message, Deliver) and message.gpu is not None:
        gpu = {**message.gpu, "shaderArchive": {**message.gpu["shaderArchive"], "bytes": len(bad),
                                                "sha256": hashlib.sha256(bad).hexdigest()}}
        send = replace(send, message=replace(message, gpu=gpu))
    return send


@pytest.mark.parametrize(("name", "bad", "announced", "reason"), [
    ("changed on the wire", ARCHIVE[:-2] + b"  ", False, "archive-hash-mismatch"),
    ("malformed", b"{not json", True, "archive-malformed"),
])
def test_a_bad_archive_on_the_wire_falls_back_by_name_and_the_job_completes(
        name: str, bad: bytes, announced: bool, reason: str) -> None:
    def tamper(send: Send, blobs: dict[str, bytes]) -> tuple[Send, dict[str, bytes]]:
        if announced:
            send = _announce(send, bad)
        return _swap_archive(send, blobs, bad)

    state = asyncio.run(remote_job(Wire(tamper), "gpu"))
    assert state["job"]["status"] == "completed", name
    remote = state["diagnostics"]["helper"]
    assert remote["execution"]["actual"] == "cpu"
    assert remote["execution"]["fallbackReason"].startswith(reason + ":")
    assert remote["gpu"]["initializationError"].startswith(reason + ":")
    assert remote["model"]["wgsl"] == {"present": False, "sha256": []}
    assert [e["details"]["reason"] for e in events(state, "gpu.archive-refused")] == [reason]
    assert {e["details"]["reason"] for e in events(state, "gpu.fallback")} == {reason}
    assert not events(state, "gpu.trained")
    assert state["helperState"]["execution"]["fallback"] == f"cpu: {reason}"


@pytest.mark.parametrize("how", ["createJob", "continueFromCheckpoint"])
def test_a_saved_job_reopened_keeps_its_archive_and_trains_on_the_gpu(how: str) -> None:
    async def main() -> None:
        storage = MemoryStorage()
        network = Wire()
        first = make(network, "me", storage)
        await first.init()
        pkg = {**package("digits-mlp"), "execution_files": {ARCHIVE_NAME: ARCHIVE}, "settings": SETTINGS}
        job_id = await first.create_job(**pkg)
        if how == "continueFromCheckpoint":
            checkpoint = first.export_checkpoint()[1]
            await first.leave()
            job_id = await first.continue_from_checkpoint(checkpoint=checkpoint, dataset_mode="new", **pkg)
        assert await storage.get("artifacts", ARCHIVE_SHA) == ARCHIVE  # stored once, by SHA-256
        await network.close()
        # A page reload: a new controller over the same storage finds the job, and its archive.
        network = Wire()
        again = make(network, "me", storage)
        await again.set_backend_preference("gpu")
        await again.init()
        assert again.get_state()["job"]["id"] == job_id
        assert await storage.get("artifacts", ARCHIVE_SHA) == ARCHIVE  # not collected as unnamed
        await again.start()
        await run_until_done(again, timeout=300)
        state = again.get_state()
        own = state["diagnostics"]["me"]
        assert state["execution"]["actual"] == "gpu" and own["execution"]["backend"] == "gpu-webgpu"
        assert own["model"]["wgsl"] == {"present": True, "sha256": MODULES}
        assert sum(e["event"] == "gpu.trained" for e in again.get_debug_log()["events"]) == 15
        await again.leave()
        saved = set(again.store.saved_jobs)
        assert len(saved) == (2 if how == "continueFromCheckpoint" else 1)
        for other in saved - {job_id}:  # the job it continued names the archive too: it stays for it
            await again.delete_saved_job(other)
            assert await storage.get("artifacts", ARCHIVE_SHA) == ARCHIVE
        await again.delete_saved_job(job_id)
        assert await storage.get("artifacts", ARCHIVE_SHA) is None  # deleted with the last job naming it
        await network.close()

    asyncio.run(main())


def test_weei_agent_with_backend_gpu_trains_on_its_gpu_over_webrtc(tmp_path: Any) -> None:
    """The same over the real transport: aiortc, the framing (the archive as a 'wgsl' artifact,
    then named as held), the signaling server; the agent is ``weei agent --backend gpu``."""
    pytest.importorskip("aiortc")
    import io

    from test_agent import DIGITS, _package_inputs, module_sha, participant_view, run, signaling_server, until
    from weei.agent.main import Agent, AgentOptions
    from weei.agent.policy import CoordinatorTrust
    from weei.agent.transport import AgentTransport
    from weei.agent.signaling_client import SignalingClient

    async def scenario() -> None:
        async with signaling_server() as url:
            coord_transport = AgentTransport(SignalingClient(url))
            agent = Agent(AgentOptions(server=url, room="gpu", data_dir=tmp_path,
                                       accept_models=(module_sha(), ARCHIVE_SHA),
                                       trust=CoordinatorTrust(room=True), workers=1, backend="gpu"),
                          out=io.StringIO())
            try:
                welcome = await coord_transport.connect()
                engine = WasmtimeEngine()
                coord = TrainingController(  # test_agent's coordinator, with fixed seeds
                    my_peer_id=welcome.peer_id, storage=MemoryStorage(), kv=MemoryKeyValue(),
                    pool=ThreadWorkerPool(engine, 1), kernel=NativeKernel(), engine=engine,
                    clock=lambda: time.time() * 1000.0, monotonic=lambda: time.monotonic() * 1000.0,
                    random_bytes=seeded, transport=coord_transport, room_key="gpu")
                await coord.init()
                coord_transport.attach(coord, has=coord.holds)
                await coord_transport.join("gpu")
                await agent.start()
                assert agent.peer_id is not None and agent.controller is not None
                await coord_transport.wait_for_peer(agent.peer_id, 20)
                await coord.create_job(**_package_inputs(DIGITS), execution_files={ARCHIVE_NAME: ARCHIVE},
                                       settings=REMOTE_ONLY)
                coord.invite(agent.peer_id)
                await until("the agent loaded the module",
                            lambda: participant_view(coord, agent.peer_id).get("state") == "modelLoaded", 20)
                await coord.start()
                await until("the job completed", lambda: coord.get_state()["job"]["status"] in ("completed", "paused"),
                            120)
                assert coord.get_state()["job"]["status"] == "completed", coord.get_state().get("error")
                sent = [kind for r in coord_transport.log if r.direction == "send" and r.peer == agent.peer_id
                        for kind in r.kinds]
                assert sent.count("wgsl") == 1  # once, then named as held
                log = agent.controller.get_debug_log()["events"]
                assert sum(e["event"] == "gpu.trained" for e in log) == 15, [e for e in log if e["event"].startswith("gpu.")][:3]
                own = agent.controller.get_state()["diagnostics"][agent.peer_id]
                assert own["execution"]["actual"] == "gpu" and own["model"]["wgsl"]["sha256"] == MODULES
                assert own["timings"]["compilationMs"] is not None
            finally:
                await agent.close()
                await coord_transport.close()
    run(scenario(), 180)
