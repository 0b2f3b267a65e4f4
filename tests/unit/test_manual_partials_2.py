"""Where the manual was met only in part (issue 21, section 6, the later items): one test per item,
each failing on the code before its fix."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from sim import Sim, experience_spec
from test_controller import DIGITS_SETTINGS, controller, fixed_random, networked, on_network, package, run_until_done
from weei.api import TrainingController
from weei.demo.network import MemoryNetwork
from weei.host.memory_storage import MemoryKeyValue, MemoryStorage
from weei.host.worker_pool import ThreadWorkerPool
from weei.kernel.native import NativeKernel
from weei.runtime.wasmtime_engine import WasmtimeEngine
from weei.core.errors import CheckpointError
from weei.core.formats.checkpoint import read_checkpoint, write_checkpoint
from weei.core.formats.seeds import assignment_seed
from weei.core.wire.messages import Assign, DiagnosticsReport

JOB_SEED = 12345678901234567890
CARTPOLE = "cartpole-reinforce"
CARTPOLE_SETTINGS = {"epochs": 3, "localEpochs": 1, "batchSize": 16, "coordinatorParticipates": True,
                     "experience": {"unitsPerAssignment": 24}}
EXPERIENCE = {"epochs": 3, "localEpochs": 1, "batchSize": 4, "coordinatorParticipates": False,
              "experience": {"unitsPerAssignment": 8}}


# ------------------------------------------- unit ranges waiting for a retry survive a resume


def _round_one_with_a_failed_range() -> tuple[Any, dict[str, bytes], Sim, Assign]:
    """Round 1 of an experience job on p1 and p2, where p2's range fails with nobody idle to take it:
    it waits for a retry when the round closes."""
    spec, store = experience_spec(settings=EXPERIENCE)
    sim = Sim.create(spec, store, job_seed=JOB_SEED)
    sim.auto_train = False
    for peer in ("p1", "p2"):
        sim.join(peer)
    sim.coordinator.start(sim.now)
    sim.pump()
    failed = dict(sim.pending)["p2"]
    sim.behaviour["p2"] = lambda a, s, d: "environment crashed"
    sim.finish()
    assert sim.rounds == [0, 1]
    return spec, store, sim, failed


def test_a_checkpoint_records_the_ranges_waiting_for_a_retry_and_a_resume_plays_them_first() -> None:
    spec, store, sim, failed = _round_one_with_a_failed_range()
    checkpoint = sim.checkpoint(1)
    start = failed.experience.unit_start
    assert checkpoint.metadata.experience == {"jobSeed": str(JOB_SEED), "nextUnit": 16,
                                              "retry": [{"unitStart": start, "unitCount": 8}]}

    resumed = Sim.resume(spec, store, checkpoint, mode="resume", peers=("p1",), start=False)
    resumed.auto_train = False
    resumed.coordinator.start(resumed.now)
    resumed.pump()
    [(_, first)] = resumed.pending
    # The range the failure left is played before any new unit, with the seed it had.
    assert first.round == 2 and first.experience.unit_start == start and first.experience.unit_count == 8
    assert first.seed == failed.seed == assignment_seed(JOB_SEED, start)
    resumed.finish()
    [(_, second)] = resumed.pending
    assert second.experience.unit_start == 16  # then the units after the checkpoint's nextUnit
    resumed.finish()
    assert resumed.checkpoint(3).metadata.experience == {"jobSeed": str(JOB_SEED), "nextUnit": 24}


def test_a_checkpoint_without_retries_is_written_as_before() -> None:
    spec, store = experience_spec(settings=EXPERIENCE)
    sim = Sim.start_job(spec, store, ["p1", "p2"], job_seed=JOB_SEED)
    assert [sim.checkpoint(r).metadata.experience for r in (0, 3)] == [
        {"jobSeed": str(JOB_SEED), "nextUnit": 0}, {"jobSeed": str(JOB_SEED), "nextUnit": 48}]


@pytest.mark.parametrize("retry", [
    [{"unitStart": 16, "unitCount": 8}],  # not handed out yet: at or above nextUnit
    [{"unitStart": 0, "unitCount": 0}],
    [{"unitStart": -1, "unitCount": 2}],
    [{"unitStart": 0, "unitCount": 8}, {"unitStart": 4, "unitCount": 8}],  # overlapping
    [{"unitStart": 0, "unitCount": True}],
    [{"unitStart": 0, "unitCount": 8, "seed": "1"}],
    {"unitStart": 0, "unitCount": 8},
    [[0, 8]],
    [{"unitStart": 0, "unitCount": 1}] * 5000,
])
def test_a_malformed_retry_list_is_refused_with_the_checkpoint(retry: Any) -> None:
    _, _, sim, _ = _round_one_with_a_failed_range()
    good = sim.checkpoint(1)
    metadata = good.metadata.to_json()
    metadata["experience"] = {**metadata["experience"], "retry": retry}
    with pytest.raises(CheckpointError) as info:
        read_checkpoint(write_checkpoint(metadata, good.weights))
    assert info.value.reason == "invalid-metadata"


# --------------------------------------------- 'gpu' requested, no WGSL archive: a named reason


def _trained(preference: str, settings: dict[str, Any]) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        c = controller()
        await c.init()
        await c.set_backend_preference(preference)
        await c.create_job(**package(CARTPOLE), settings=settings)
        await c.start()
        await run_until_done(c)
        return c.get_state()

    return asyncio.run(main())


@pytest.mark.parametrize("preference", ["gpu", "hybrid"])
def test_gpu_requested_for_a_job_without_an_archive_names_why_it_trains_on_the_cpu(preference: str) -> None:
    state = _trained(preference, {**CARTPOLE_SETTINGS, "epochs": 1})
    own = state["diagnostics"]["me"]["execution"]
    assert own["requested"] == preference and own["actual"] == "cpu"
    assert own["fallbackReason"].startswith("no-gpu-archive: ")
    assert state["execution"]["fallback"] == "cpu: no-gpu-archive"


def test_auto_without_an_archive_is_no_fallback() -> None:
    state = _trained("auto", {**CARTPOLE_SETTINGS, "epochs": 1})
    assert state["diagnostics"]["me"]["execution"]["fallbackReason"] is None
    assert state["execution"]["fallback"] == "none"


# ------------------- diagnostics: the non-training coordinator's own entry; stage changes sent at once


def _collapsed(stages: list[str]) -> list[str]:
    return [s for i, s in enumerate(stages) if i == 0 or stages[i - 1] != s]


def test_a_coordinator_that_does_not_train_has_its_own_entry_and_sees_every_stage_at_once() -> None:
    async def main(network: MemoryNetwork, engine: WasmtimeEngine) -> None:
        coordinator = networked(network, engine, "coord", environment={"browser": "agent", "os": "Linux"})
        helper = networked(network, engine, "helper", environment={"browser": "agent", "os": "Linux"})
        for c in (coordinator, helper):
            await c.init()
        job_id = await coordinator.create_job(**package("digits-mlp"), settings={
            **DIGITS_SETTINGS, "epochs": 1, "coordinatorParticipates": False, "validationSchedule": {"enabled": False, "unit": "epoch", "every": 1}})
        # The manual: "every peer has its own entry". It coordinates, trains nothing.
        own = coordinator.get_state()["diagnostics"]["coord"]
        assert own["stage"] == "waiting" and own["assignment"] is None and own["connected"] is True
        assert own["environment"]["browser"] == "agent" and own["model"]["id"] == "digits-mlp"
        assert own["model"]["wasmSha256"] == coordinator.get_state()["job"]["module"]["sha256"]
        assert own["execution"]["requested"] == "auto" and own["execution"]["actual"] == "unknown"
        assert own["execution"]["activeWorkers"] == 0

        coordinator.invite("helper")
        await network.settle()
        await helper.decide_invitation(job_id, True)
        await network.settle()
        # What the helper's snapshots say as they leave it; every stage it enters; and for each
        # awaitingAggregation, what its last snapshot said right when it entered it.
        transport, sent = helper.session.transport, []
        send = transport.send
        transport.send = lambda command, blobs: (
            sent.append(command.message.snapshot["stage"]) if isinstance(command.message, DiagnosticsReport) else None,
            send(command, blobs))[1]
        recorder, entered, told = helper.session.recorder, [], []

        def on(event: str, *args: Any, **kwargs: Any) -> bool:
            changed = move(event, *args, **kwargs)
            if changed:
                entered.append(recorder.stage.value)
                if recorder.stage.value == "awaitingAggregation":
                    told.append(sent[-1])
            return changed

        move, recorder.on = recorder.on, on
        book, received = coordinator.session.book, []
        take = book.accept
        book.accept = lambda peer, job, snapshot, *a, **k: (
            received.append(snapshot["stage"]) if peer == "helper" else None, take(peer, job, snapshot, *a, **k))[1]
        await coordinator.start()
        await run_until_done(coordinator)
        await network.settle()
        # Each stage change leaves when it happens, not at the next 0.5 s poll: awaitingAggregation
        # too, though the next assignment follows within milliseconds (no one else trains).
        rounds = coordinator.get_state()["job"]["checkpoints"][-1]["artifact"]["round"]
        assert rounds == 15 and told == ["awaitingAggregation"] * rounds
        assert received.count("awaitingAggregation") == rounds
        assert _collapsed(received)[-len(_collapsed(entered)):] == _collapsed(entered)
        own = coordinator.get_state()["diagnostics"]["coord"]
        assert own["stage"] == "waiting" and own["assignment"] is None

    on_network(main)


# ------------------------------- an experience assignment: the same bits on 1, 2 or 3 Workers


def test_an_assignment_gives_the_same_bits_whatever_the_worker_count() -> None:
    async def run(workers: int) -> tuple[int, bytes]:
        engine = WasmtimeEngine()
        c = TrainingController(my_peer_id="me", storage=MemoryStorage(), kv=MemoryKeyValue(),
                               pool=ThreadWorkerPool(engine, device_limit=3), kernel=NativeKernel(), engine=engine,
                               clock=lambda: time.time() * 1000, monotonic=lambda: time.monotonic() * 1000,
                               random_bytes=fixed_random)  # the same job seed and initial weights each time
        await c.init()
        await c.set_max_local_workers(workers)
        await c.create_job(**package(CARTPOLE), settings=CARTPOLE_SETTINGS)
        await c.start()
        await run_until_done(c)
        effective = c.get_state()["job"]["localWorkers"]["effective"]
        return effective, read_checkpoint(c.export_checkpoint()[1]).weights

    results = [asyncio.run(run(n)) for n in (1, 2, 3)]
    assert [effective for effective, _ in results] == [1, 2, 3]
    # cartpole-reinforce declares maxWorkers 4: every device plays the same 4 ranges of 6 episodes,
    # each with its own seed, and averages them in range order, however many Workers play them.
    assert results[0][1] == results[1][1] == results[2][1]
