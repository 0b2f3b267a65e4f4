"""A process that runs job after job (weei serve, an agent, the demo runner, a tab) keeps nothing of a finished job.

Each test counts the objects that a job used to leave behind, not raw memory, so it does not depend on the
allocator: wasm instances (each with its store and linear memory) and engines.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import io
import json
import time
import weakref
from pathlib import Path

import wasmtime

from weei.demo.run import DemoJob, run_job
from weei.runtime.wasmtime_engine import TICK_S, WasmtimeEngine, WasmtimeInstance

# A module that reports progress once from its one export: the progress import is what wasmtime-py keeps.
_REPORT = '{"processedExamples":1,"totalExamples":2}'
_QUOTED = _REPORT.replace('"', '\\"')
_WAT = f"""(module
  (import "weei" "onProgress" (func $progress (param i32 i32)))
  (memory (export "memory") 1)
  (data (i32.const 64) "{_QUOTED}")
  (func (export "run") (result i32) (call $progress (i32.const 64) (i32.const {len(_REPORT)})) i32.const 7))"""
SETTINGS = {"epochs": 1, "localEpochs": 1, "batchSize": 16, "coordinatorParticipates": True}


def _live(kind: type) -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, kind))


def test_an_instance_with_the_progress_import_is_freed_when_dropped() -> None:
    """wasmtime-py keeps a host function's callback until its store is deleted; a callback that held the
    instance kept the instance, its store and its linear memory for the life of the process."""
    engine = WasmtimeEngine()
    module = engine.compile(wasmtime.wat2wasm(_WAT))
    reports: list[bytes] = []
    refs = []
    for _ in range(5):
        instance = module.instantiate(lambda ptr, size: reports.append(instance.read(ptr, size)))
        assert instance.call("run") == 7  # the progress import still reaches the instance
        refs.append(weakref.ref(instance))
        del instance
    gc.collect()
    assert reports == [_REPORT.encode()] * 5
    assert [r() for r in refs] == [None] * 5


def test_an_engine_in_a_reference_cycle_is_freed() -> None:
    """The deadline ticker kept a list of every registered engine across its sleep, so an engine that only the
    cycle collector could free was taken again at each tick and never freed."""
    holder: list[object] = [WasmtimeEngine()]
    holder.append(holder)  # an owner in a cycle, as a controller and its pool are
    ref = weakref.ref(holder[0])
    del holder
    deadline = time.monotonic() + 20 * TICK_S
    while ref() is not None and time.monotonic() < deadline:
        time.sleep(2 * TICK_S)  # a tick happens while the engine waits for the collector
        gc.collect()
    assert ref() is None


def test_jobs_run_one_after_another_leave_no_instances_or_engines(tmp_path: Path) -> None:
    """The demo runner's jobs (four controllers, their Worker pools and engines each) in one process: the
    live instances and engines after six jobs are those after two (before the fixes, 5 engines and 5
    instances more per job)."""
    job = DemoJob("long-lived", "digits-mlp", {}, peers=4, validation="validation.bin")

    def run(times: int) -> tuple[int, int]:
        for i in range(times):
            run_job(job, tmp_path / str(i), stream=io.StringIO(), settings=SETTINGS, seed=i, flat=True)
        time.sleep(2 * TICK_S)  # past a tick of the deadline ticker
        return _live(WasmtimeInstance), _live(WasmtimeEngine)

    after_two = run(2)
    assert run(4) == after_two


def test_an_agent_keeps_nothing_per_invitation_once_decided(tmp_path: Path) -> None:
    """An agent runs for days and hears invitation after invitation (from anyone in its room): what it kept
    per job ID to decide one (the sender, the job ID being decided) goes once decided, and the decisions it
    keeps to be read are the last ``MAX_DECISIONS_KEPT``."""
    from weei.agent.main import MAX_DECISIONS_KEPT, Agent, AgentOptions
    from weei.demo.network import MemoryNetwork
    from weei.demo.run import _controller, _package_inputs
    from weei.core.wire.messages import Invitation, decode_message

    invitations = MAX_DECISIONS_KEPT + 10

    async def scenario() -> Agent:
        engine = WasmtimeEngine()
        network = MemoryNetwork()
        coordinator = _controller("coordinator", network, engine)
        agent = Agent(AgentOptions(server="ws://127.0.0.1:9/signal", room="room", data_dir=tmp_path),
                      out=io.StringIO())  # no --accept-model: it refuses every invitation
        agent.controller = _controller("agent", network, engine)
        network.workers.pop("agent").cancel()  # the agent, not the network, hands its controller each message
        try:
            await coordinator.init()
            await agent.controller.init()
            job = DemoJob("agent", "digits-mlp", {}, peers=2)
            job_id = await coordinator.create_job(**_package_inputs(job), settings=SETTINGS)
            coordinator.invite("agent")
            inbox = network.inboxes["agent"]
            while True:
                src, text, _ = await inbox.get()
                first = decode_message(json.loads(text))
                if isinstance(first, Invitation):
                    break
            for i in range(invitations):  # one coordinator inviting to job after job
                await agent.on_peer_message(src, dataclasses.replace(first, job_id=f"{job_id}-{i}"), {})
                while agent._tasks:
                    await asyncio.gather(*agent._tasks)
            return agent
        finally:
            await network.close()

    agent = asyncio.run(scenario())
    assert len(agent.decisions) == MAX_DECISIONS_KEPT
    assert not any(d.accepted for d in agent.decisions.values())
    assert (agent._senders, agent._deciding) == ({}, {})
