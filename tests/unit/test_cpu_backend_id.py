"""A remote participant on the CPU names the package's CPU backend (``cpu-wasm-simd``), not the host's
(``cpu-wasm``), for a job without a WGSL archive too: Deliver carries ``cpuBackend`` and a saved job keeps it.
No GPU here (``gpu=None``): the controllers talk over the in-memory network.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from weei.api import TrainingController
from weei.api.records import spec_from_record, spec_to_record
from weei.core.wire.messages import ArtifactRef, Deliver, MessageError, decode_message
from weei.demo.network import MemoryNetwork
from weei.runtime.wasmtime_engine import WasmtimeEngine

from test_controller import fixed_random, networked, package, run_until_done

SETTINGS = {"epochs": 1, "localEpochs": 1, "batchSize": 32, "coordinatorParticipates": False}


def make(network: MemoryNetwork, peer: str) -> TrainingController:
    return networked(network, WasmtimeEngine(), peer, random_bytes=fixed_random,
                     environment={"browser": "agent", "os": "Linux"})


async def remote_cpu_job() -> tuple[dict[str, Any], Any]:
    network = MemoryNetwork()
    coordinator, helper = make(network, "coord"), make(network, "helper")
    try:
        for c in (coordinator, helper):
            await c.init()
        job_id = await coordinator.create_job(**package("digits-mlp"), settings=SETTINGS)
        coordinator.invite("helper")
        await network.settle()
        await helper.decide_invitation(job_id, True)
        await network.settle()
        await coordinator.start()
        await run_until_done(coordinator, timeout=300)
        await network.settle()
        await asyncio.sleep(0.1)
        return coordinator.get_state(), coordinator.session.coordinator.spec
    finally:
        await network.close()


def test_a_remote_cpu_participant_names_the_packages_cpu_backend() -> None:
    state, spec = asyncio.run(remote_cpu_job())
    assert state["job"]["status"] == "completed"
    remote = state["diagnostics"]["helper"]
    assert remote["execution"]["actual"] == "cpu" and remote["execution"]["backend"] == "cpu-wasm-simd"
    # The saved job keeps it, so a reopened job delivers it again.
    assert spec.cpu_backend == "cpu-wasm-simd"
    record = spec_to_record(spec, job_seed=None, validation_sha256=None)
    assert record["cpuBackend"] == "cpu-wasm-simd"
    assert spec_from_record(record)[0].cpu_backend == "cpu-wasm-simd"


def test_deliver_carries_the_cpu_backend_checked_at_the_boundary() -> None:
    ref = ArtifactRef("module", "a" * 64, 10)
    message = Deliver("job-1", ref, {"name": "m"}, {}, None, cpu_backend="cpu-wasm-simd").to_json()
    assert message["cpuBackend"] == "cpu-wasm-simd"
    assert decode_message(message).cpu_backend == "cpu-wasm-simd"
    assert "cpuBackend" not in Deliver("job-1", ref, {"name": "m"}).to_json()
    for bad in (7, "x" * 65):
        with pytest.raises(MessageError):
            decode_message({**message, "cpuBackend": bad})
