"""The distributed-training API over real ports in CPython (memory storage, wasmtime Workers)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any, Awaitable, Callable

import pytest

from weei.api import TrainingController
from weei.core.formats.checkpoint import read_checkpoint
from weei.core.errors import CheckpointError, ManifestError, UsageError
from weei.demo.network import MemoryNetwork
from weei.demo.run import models_dir
from weei.host.memory_storage import MemoryKeyValue, MemoryStorage
from weei.host.worker_pool import ThreadWorkerPool
from weei.kernel.native import NativeKernel
from weei.runtime.wasmtime_engine import WasmtimeEngine

DIGITS_SETTINGS = {"epochs": 2, "localEpochs": 1, "batchSize": 16, "coordinatorParticipates": True,
                   "validationSchedule": {"enabled": True, "unit": "epoch", "every": 1}}


def controller(storage: MemoryStorage | None = None, kv: MemoryKeyValue | None = None,
               random_bytes: Any = os.urandom) -> TrainingController:
    engine = WasmtimeEngine()
    return TrainingController(my_peer_id="me", storage=storage or MemoryStorage(), kv=kv or MemoryKeyValue(),
                              pool=ThreadWorkerPool(engine, device_limit=2), kernel=NativeKernel(), engine=engine,
                              clock=lambda: time.time() * 1000, monotonic=lambda: time.monotonic() * 1000,
                              random_bytes=random_bytes)


def networked(network: MemoryNetwork, engine: WasmtimeEngine, peer: str, **overrides: Any) -> TrainingController:
    """A real controller (wasmtime, the native kernel, one Worker thread) on the in-memory ``network`` as
    ``peer``; ``overrides`` replace its arguments (storage, random_bytes, room_key, environment, gpu...)."""
    args: dict[str, Any] = {
        "my_peer_id": peer, "storage": MemoryStorage(), "kv": MemoryKeyValue(), "pool": ThreadWorkerPool(engine, 1),
        "kernel": NativeKernel(), "engine": engine, "clock": lambda: time.time() * 1000,
        "monotonic": lambda: time.monotonic() * 1000, "random_bytes": os.urandom, "transport": network.transport(peer),
    }
    c = TrainingController(**(args | overrides))
    network.attach(c)
    return c


def on_network(test: Callable[[MemoryNetwork, WasmtimeEngine], Awaitable[None]]) -> None:
    """Run ``test`` on a fresh in-memory network and wasmtime engine; the network is closed however it ends."""
    async def main() -> None:
        network, engine = MemoryNetwork(), WasmtimeEngine()
        try:
            await test(network, engine)
        finally:
            await network.close()

    asyncio.run(main())


def fixed_random(n: int) -> bytes:
    """A fixed random source: the same job seed and initial weights every run."""
    return bytes((7 * i + 3) % 256 for i in range(n))


def package(model: str) -> dict[str, Any]:
    root = models_dir() / model
    manifest = (root / "manifest.json").read_bytes()
    entries = json.loads(manifest)["inlineJson"]["dataset-manifest.json"]
    files = {e["fileName"]: (root / "data" / e["fileName"]).read_bytes() for e in entries}
    return {"wasm_name": "model.wasm", "wasm": (root / "model.wasm").read_bytes(), "manifest": manifest,
            "files": files}


def digits_validation() -> tuple[str, bytes]:
    return ("validation.bin", (models_dir() / "digits-mlp" / "data" / "validation.bin").read_bytes())


async def run_until_done(c: TrainingController, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while c.get_state()["job"]["status"] != "completed":
        assert time.monotonic() < deadline, c.get_state()["job"]
        await asyncio.sleep(0.01)
    await c.idle()


def test_run_a_job_from_your_own_interface_completes_with_improving_metrics() -> None:
    async def main() -> None:
        c = controller()
        await c.init()
        states: list[dict[str, Any]] = []
        stop = c.subscribe(states.append)
        assert states and states[0]["ready"] is True and "job" not in states[0]
        await c.create_job(**package("digits-mlp"), settings=DIGITS_SETTINGS, validation=digits_validation())
        await c.start()
        await run_until_done(c)
        stop()
        job = c.get_state()["job"]
        assert job["role"] == "coordinator" and job["progress"]["datasetEpoch"] == 2
        # 15 chunks, one training peer: 15 rounds per epoch.
        assert len(job["checkpoints"]) == 31
        validated = [cp for cp in job["checkpoints"] if "validationMetrics" in cp]
        # 30 rounds at most: past SHORT_JOB_ROUNDS, so every 15th; round 0 at Start.
        assert [cp["artifact"]["round"] for cp in validated] == [0, 15, 30]
        assert validated[-1]["validationMetrics"]["values"]["accuracy"] > 0.85
        name, data = c.export_checkpoint()
        assert name.endswith(".weei-checkpoint") and read_checkpoint(data).metadata.round == 30
        assert len(states) > 10
        log = c.get_debug_log()
        assert log["schemaVersion"] == 2 and any(e["event"] == "checkpoint.saved" for e in log["events"])
        assert "indexeddb.checkpoint-save" in log["baseline"]["phases"]
        # 30 rounds: each its training, its aggregation (after aggregation.started) and its save.
        phases = log["baseline"]["phases"]
        assert phases["fedavg"]["count"] == 30 and phases["round.training"]["count"] == 30
        assert sum(e["event"] == "aggregation.started" for e in log["events"]) == 30
        idle = log["baseline"]["idle"]
        assert idle["samples"] == 60 and idle["totalMs"] >= 0 and idle["avgMs"] == idle["totalMs"] / 60

    asyncio.run(main())


def test_state_is_a_copy_without_weights() -> None:
    async def main() -> None:
        c = controller()
        await c.init()
        await c.create_job(**package("digits-mlp"), settings=DIGITS_SETTINGS)
        state = c.get_state()
        state["job"]["checkpoints"].clear()
        assert len(c.get_state()["job"]["checkpoints"]) == 1
        text = json.dumps(c.get_state())  # plain JSON: no bytes anywhere
        assert "weights" not in text

    asyncio.run(main())


def test_a_reloaded_page_continues_the_job_from_its_last_checkpoint() -> None:
    async def main() -> None:
        storage, kv = MemoryStorage(), MemoryKeyValue()
        first = controller(storage, kv)
        await first.init()
        await first.create_job(**package("digits-mlp"), settings=DIGITS_SETTINGS)
        await first.start()
        while len(first.get_state()["job"]["checkpoints"]) < 5:
            await asyncio.sleep(0.005)
        saved_rounds = len(first.get_state()["job"]["checkpoints"])
        # The page goes away mid-job: nothing more is carried out.
        first._clear_job()
        await first.idle()

        second = controller(storage, kv)
        await second.init()
        state = second.get_state()
        assert [j["status"] for j in state["savedJobs"]] == ["running"]
        assert len(state["job"]["checkpoints"]) >= saved_rounds
        await run_until_done(second)
        job = second.get_state()["job"]
        assert len(job["checkpoints"]) == 31  # nothing lost, nothing trained twice into a checkpoint
        assert [cp["artifact"]["round"] for cp in job["checkpoints"]] == list(range(31))

    asyncio.run(main())


def test_continue_from_an_exported_checkpoint_in_both_modes() -> None:
    async def main() -> None:
        c = controller()
        await c.init()
        await c.create_job(**package("digits-mlp"), settings={**DIGITS_SETTINGS, "epochs": 1})
        await c.start()
        await run_until_done(c)
        _, checkpoint = c.export_checkpoint()
        _, module = c.export_module()
        await c.leave()
        assert c.get_state()["savedJobs"][0]["active"] is False
        for mode in ("new", "resume"):
            pkg = package("digits-mlp")
            pkg["wasm"] = module
            # 'new' plans one fresh pass; 'resume' restores one finished pass of the two planned.
            epochs = 1 if mode == "new" else 2
            await c.continue_from_checkpoint(checkpoint=checkpoint, **pkg, settings={**DIGITS_SETTINGS, "epochs": epochs},
                                             dataset_mode=mode)
            job = c.get_state()["job"]
            assert job["checkpoints"][0]["artifact"]["round"] == 15
            await c.start()
            await run_until_done(c)
            rounds = [cp["artifact"]["round"] for cp in c.get_state()["job"]["checkpoints"]]
            assert rounds[-1] == 30, (mode, rounds)
            await c.leave()

    asyncio.run(main())


def test_a_continued_job_charts_the_rounds_before_its_checkpoint() -> None:
    """Issue 24, item 13: continuing from a checkpoint of a job saved here keeps the charts' history, in the
    new job's record (after the first job is deleted, after a reload); round 0 and every round of a short job
    are validated."""
    async def main() -> None:
        storage, kv = MemoryStorage(), MemoryKeyValue()
        c = controller(storage, kv)
        await c.init()
        first = await c.create_job(**package("digits-mlp"), settings={
            **DIGITS_SETTINGS, "epochs": 1, "validationSchedule": {"enabled": True, "unit": "round", "every": 5}},
            validation=digits_validation())
        await c.start()
        await run_until_done(c)
        validated = [cp["artifact"]["round"] for cp in c.get_state()["job"]["checkpoints"] if "validationMetrics" in cp]
        assert validated == list(range(16))  # 15 rounds at most: every one, and round 0 before them
        _, checkpoint = c.export_checkpoint()
        await c.leave()
        second = await c.continue_from_checkpoint(checkpoint=checkpoint, **package("digits-mlp"),
                                                  settings={**DIGITS_SETTINGS, "epochs": 1}, dataset_mode="new")
        job = c.get_state()["job"]
        assert [p["artifact"]["round"] for p in job["history"]] == list(range(15))
        assert all(0 <= p["validationMetrics"]["values"]["accuracy"] <= 1 for p in job["history"])
        assert job["checkpoints"][0]["artifact"]["round"] == 15
        await c.delete_saved_job(first)
        again = controller(storage, kv)
        await again.init()
        job = again.get_state()["job"]
        assert job["id"] == second and [p["artifact"]["round"] for p in job["history"]] == list(range(15))
        # A checkpoint of a job this device never saw brings no history (the file has one round's metrics).
        await again.leave()
        await again.delete_saved_job(second)
        await again.continue_from_checkpoint(checkpoint=checkpoint, **package("digits-mlp"),
                                             settings={**DIGITS_SETTINGS, "epochs": 1}, dataset_mode="new")
        assert "history" not in again.get_state()["job"]

    asyncio.run(main())


def test_bad_inputs_are_refused_by_name_and_nothing_saved_is_lost() -> None:
    async def main() -> None:
        storage = MemoryStorage()
        c = controller(storage)
        await c.init()
        await c.create_job(**package("digits-mlp"), settings={**DIGITS_SETTINGS, "epochs": 1})
        await c.start()
        await run_until_done(c)
        _, checkpoint = c.export_checkpoint()
        await c.leave()
        before = await storage.keys("checkpoints")

        bad = package("digits-mlp")
        bad["files"]["training-003.bin"] = bad["files"]["training-003.bin"][::-1]
        with pytest.raises(ManifestError) as err:
            await c.create_job(**bad, settings=DIGITS_SETTINGS)
        assert err.value.reason == "file-sha256-mismatch"

        missing = package("digits-mlp")
        del missing["files"]["training-007.bin"]
        with pytest.raises(ManifestError) as err:
            await c.create_job(**missing, settings=DIGITS_SETTINGS)
        assert err.value.reason == "missing-file"

        broken = package("digits-mlp")
        broken["manifest"] = b"{not json"
        with pytest.raises(ManifestError) as err:
            await c.create_job(**broken, settings=DIGITS_SETTINGS)
        assert err.value.reason == "invalid-json"

        corrupt = bytearray(checkpoint)
        corrupt[-1] ^= 0xFF
        with pytest.raises(CheckpointError) as cerr:
            await c.continue_from_checkpoint(checkpoint=bytes(corrupt), **package("digits-mlp"),
                                             settings=DIGITS_SETTINGS, dataset_mode="new")
        assert cerr.value.reason == "weights-sha256-mismatch" or "sha256" in cerr.value.reason

        with pytest.raises(CheckpointError) as cerr:
            await c.continue_from_checkpoint(checkpoint=bytes(256 * 1000 * 1000 + 1), **package("digits-mlp"),
                                             settings=DIGITS_SETTINGS, dataset_mode="new")
        assert cerr.value.reason == "file-too-large"

        assert await storage.keys("checkpoints") == before
        assert "job" not in c.get_state()
        assert [j["status"] for j in c.get_state()["savedJobs"]] == ["completed"]

    asyncio.run(main())


def test_commands_check_the_role_and_say_why() -> None:
    async def main() -> None:
        c = controller()
        await c.init()
        with pytest.raises(UsageError) as err:
            await c.start()
        assert err.value.reason == "no-job"
        with pytest.raises(UsageError):
            c.export_checkpoint()
        await c.create_job(**package("digits-mlp"), settings=DIGITS_SETTINGS)
        with pytest.raises(UsageError) as err:
            c.invite("someone")
        assert err.value.reason == "peer-not-connected"
        with pytest.raises(UsageError) as err:
            await c.create_job(**package("digits-mlp"), settings=DIGITS_SETTINGS)
        assert err.value.reason == "job-active"

    asyncio.run(main())


def test_cartpole_splits_assignments_across_local_workers() -> None:
    async def main() -> None:
        c = controller(random_bytes=fixed_random)
        await c.init()
        await c.set_max_local_workers(2)
        await c.create_job(**package("cartpole-reinforce"),
                           settings={"epochs": 12, "localEpochs": 1, "batchSize": 16, "coordinatorParticipates": True,
                                     "experience": {"unitsPerAssignment": 32},
                                     "validationSchedule": {"enabled": True, "unit": "round", "every": 4}})
        assert c.get_state()["job"]["localWorkers"] == {"requested": 2, "capacity": 2, "effective": 2, "active": 0}
        await c.start()
        await run_until_done(c)
        job = c.get_state()["job"]
        assert len(job["checkpoints"]) == 13
        evals = [cp["validationMetrics"]["values"]["episodeReturn"] for cp in job["checkpoints"]
                 if "validationMetrics" in cp]
        assert len(evals) == 13 and evals[-1] > evals[0]  # a 12-round job: round 0 and every round
        assert all(cp["metrics"]["examplesProcessed"] == 32 for cp in job["checkpoints"][1:])

    asyncio.run(main())


def test_participants_report_diagnostics_and_a_declined_invitation_reaches_the_coordinator() -> None:
    async def main(network: MemoryNetwork, engine: WasmtimeEngine) -> None:
        def make(peer: str) -> TrainingController:
            return networked(network, engine, peer, environment={"browser": "agent", "os": "Linux"})

        coordinator, helper, refuser = make("coord"), make("helper"), make("refuser")
        for c in (coordinator, helper, refuser):
            await c.init()
        job_id = await coordinator.create_job(**package("digits-mlp"), settings={**DIGITS_SETTINGS, "epochs": 1})
        coordinator.invite("helper")
        coordinator.invite("refuser")
        await network.settle()
        invitation = dict(refuser.get_state()["invitations"])[job_id]["invitation"]
        assert invitation["module"]["sha256"] == coordinator.get_state()["job"]["module"]["sha256"]
        await refuser.decide_invitation(job_id, False)
        await helper.decide_invitation(job_id, True)
        await network.settle()
        assert coordinator.get_state()["job"]["participants"]["refuser"]["state"] == "declined"
        # Every stage the helper enters, in order (the recorder's own method, observed).
        recorder, stages = helper.session.recorder, []
        enter = recorder.on

        def observe(event: str, *a: Any, **k: Any) -> bool:
            changed = enter(event, *a, **k)
            if changed:
                stages.append(str(recorder.stage))
            return changed
        recorder.on = observe  # type: ignore[method-assign]
        await coordinator.start()
        await run_until_done(coordinator)
        await network.settle()
        await asyncio.sleep(0.1)
        # Each assignment: prepared (module and weights into the Worker), trained, sent, and
        # awaited until the next one or the job's end, after which the helper waits with none.
        seen = [st for st in stages if st != "receiving"]
        one = ["preparing", "training", "uploading", "awaitingAggregation"]
        rounds = (len(seen) - 1) // len(one)
        assert rounds >= 1 and seen == one * rounds + ["waiting"], stages
        diagnostics = coordinator.get_state()["diagnostics"]
        assert set(diagnostics) == {"coord", "helper"}
        remote = diagnostics["helper"]
        assert remote["environment"]["browser"] == "agent" and remote["connected"] is True
        assert remote["model"]["id"] == "digits-mlp" and remote["sequence"] >= 2
        # The package's CPU backend (Deliver's cpuBackend), not the host's 'cpu-wasm'.
        assert remote["execution"]["actual"] == "cpu" and remote["execution"]["backend"] == "cpu-wasm-simd"
        assert remote["stage"] == "waiting" and remote["assignment"] is None
        assert remote["timings"]["trainingMs"] > 0 and remote["timings"]["preparationMs"] > 0
        # digits-mlp counts its steps: one per batch of the last chunk the helper trained.
        steps = remote["performance"]["optimizerSteps"]
        assert isinstance(steps, int) and steps >= 1
        assert "weights" not in json.dumps(remote)

    on_network(main)


class SlowStorage(MemoryStorage):
    """Puts that yield to the event loop, as IndexedDB's do: commands interleave.

    ``probe()``, if set, runs while a put is pending: what a page that polls
    getState() during the controller's storage awaits would see.
    """

    def __init__(self) -> None:
        super().__init__()
        self.written: set[tuple[str, str]] = set()
        self.probe: Callable[[], None] | None = None

    async def put(self, store: str, key: str, value: Any) -> None:
        if self.probe is not None:
            self.probe()
        await asyncio.sleep(0.002)
        if self.probe is not None:
            self.probe()
        await super().put(store, key, value)
        self.written.add((store, key))


@pytest.mark.parametrize("validated", [True, False])
def test_a_finished_job_looks_idle_only_once_its_last_checkpoint_and_validation_are_in(validated: bool) -> None:
    async def main() -> None:
        storage = SlowStorage()
        c = controller(storage)
        await c.init()
        job_id = await c.create_job(**package("digits-mlp"), settings={**DIGITS_SETTINGS, "epochs": 1},
                                    validation=digits_validation() if validated else None)
        idle_but_unfinished: list[Any] = []
        finished: list[bool] = []

        def probe() -> None:
            state = c.get_state()
            job = state.get("job")
            if job is None or job["status"] != "completed":
                return
            if not (state["busy"] or state["transitioning"] or state["evaluating"]):
                last = job["checkpoints"][-1]
                key = ("checkpoints", f"{job_id}/{last['artifact']['round']:08d}")
                if ("validationMetrics" not in last and validated) or key not in storage.written:
                    idle_but_unfinished.append(last)
            finished.append(True)

        storage.probe = probe
        await c.start()
        await run_until_done(c)
        probe()
        assert len(finished) > 2 and not idle_but_unfinished, idle_but_unfinished

    asyncio.run(main())


def test_leave_right_after_the_end_keeps_the_job_inactive_in_saved_jobs() -> None:
    async def main() -> None:
        storage = SlowStorage()
        c = controller(storage)
        await c.init()
        job_id = await c.create_job(**package("digits-mlp"), settings={**DIGITS_SETTINGS, "epochs": 1},
                                    validation=digits_validation())
        await c.start()
        while c.get_state()["job"]["status"] != "completed":
            await asyncio.sleep(0.001)
        await c.leave()  # while the last validation and its record save are still on their way
        await c.idle()
        assert c.get_state()["savedJobs"][0]["active"] is False
        assert (await storage.get("jobs", job_id))["active"] is False

    asyncio.run(main())


def test_a_completed_experience_job_can_be_reopened_from_saved_jobs() -> None:
    async def main() -> None:
        storage, kv = MemoryStorage(), MemoryKeyValue()
        c = controller(storage, kv)
        await c.init()
        job_id = await c.create_job(**package("cartpole-reinforce"),
                                    settings={"epochs": 2, "localEpochs": 1, "batchSize": 16,
                                              "coordinatorParticipates": True, "experience": {"unitsPerAssignment": 4}})
        await c.start()
        await run_until_done(c)
        await c.leave()
        await c.open_saved_job(job_id)
        job = c.get_state()["job"]
        assert job["status"] == "completed" and len(job["checkpoints"]) == 3

    asyncio.run(main())


def test_a_participant_that_restarts_takes_part_again_when_its_coordinator_is_back() -> None:
    async def main(network: MemoryNetwork, engine: WasmtimeEngine) -> None:
        helper_storage = MemoryStorage()

        def make(peer: str, storage: MemoryStorage) -> TrainingController:
            return networked(network, engine, peer, storage=storage)

        coordinator, helper = make("coord", MemoryStorage()), make("helper", helper_storage)
        for c in (coordinator, helper):
            await c.init()
        job_id = await coordinator.create_job(**package("digits-mlp"), settings={**DIGITS_SETTINGS, "epochs": 3})
        coordinator.invite("helper")
        await network.settle()
        await helper.decide_invitation(job_id, True)
        await network.settle()
        await coordinator.start()
        while len(coordinator.get_state()["job"]["checkpoints"]) < 4:
            await asyncio.sleep(0.005)
        # The helper's process dies; a new one starts on the same storage with the same peer id.
        await network.disconnect("helper")
        helper._clear_job()
        restarted = make("helper", helper_storage)
        await restarted.init()
        assert restarted.participant is not None and restarted.participant.state == "disconnected"
        await restarted.peer_connected("coord")
        await coordinator.peer_connected("helper")
        await run_until_done(coordinator)
        await network.settle()
        rounds_after = [cp for cp in coordinator.get_state()["job"]["checkpoints"][5:]]
        # After the restart the helper trained again: rounds with two contributions.
        assert any(cp["metrics"]["examplesProcessed"] == 200 for cp in rounds_after)
        assert await helper_storage.get("settings", "participation") is None  # the job finished

    on_network(main)


def test_progress_reports_reach_subscribers_at_most_every_100_ms() -> None:
    async def main() -> None:
        c = controller()
        await c.init()
        seen: list[dict[str, Any]] = []
        c.subscribe(seen.append)
        before = len(seen)
        for done in range(1, 51):  # a burst of Worker progress reports
            c._on_local_progress({"processedExamples": done, "totalExamples": 50, "metrics": {"loss": 1.0 / done}})
        assert len(seen) == before  # nothing yet: coalesced
        await asyncio.sleep(0.15)
        assert len(seen) == before + 1
        assert seen[-1]["progress"]["me"]["processedExamples"] == 50  # the latest figures
        assert len(seen[-1]["liveMetrics"]["me"]) == 50  # no sample is lost, only notifications

    asyncio.run(main())


def test_the_job_record_is_written_only_when_it_changes() -> None:
    async def main() -> None:
        storage = MemoryStorage()
        c = controller(storage)
        await c.init()
        await c.create_job(**package("digits-mlp"), settings=DIGITS_SETTINGS)
        writes = storage.puts
        for _ in range(5):
            await c._drain()  # nothing happened: nothing to persist
        assert storage.puts == writes
        await c.start()  # the status changed: one more record
        assert storage.puts > writes

    asyncio.run(main())


def test_training_and_validation_run_on_the_backend_the_controller_is_given() -> None:
    from weei.api import CpuWorkerBackend

    class SecondBackend(CpuWorkerBackend):
        """Another backend behind the ComputeBackend seam: the CPU pool under another id, counting its work."""

        id = "second-backend"

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.calls: list[str] = []

        async def train(self, assign: Any, **kwargs: Any) -> Any:
            self.calls.append("train")
            return await super().train(assign, **kwargs)

        async def evaluate(self, **kwargs: Any) -> Any:
            self.calls.append("evaluate")
            return await super().evaluate(**kwargs)

    async def main() -> None:
        engine = WasmtimeEngine()
        pool = ThreadWorkerPool(engine, device_limit=2)
        backend = SecondBackend(pool, NativeKernel())
        c = TrainingController(my_peer_id="me", storage=MemoryStorage(), kv=MemoryKeyValue(), pool=pool,
                               kernel=NativeKernel(), engine=engine, clock=lambda: time.time() * 1000,
                               monotonic=lambda: time.monotonic() * 1000, random_bytes=os.urandom, backend=backend)
        await c.init()
        await c.create_job(**package("cartpole-reinforce"),
                           settings={"epochs": 2, "localEpochs": 1, "batchSize": 16, "coordinatorParticipates": True,
                                     "experience": {"unitsPerAssignment": 2},
                                     "validationSchedule": {"enabled": True, "unit": "round", "every": 1}})
        await c.start()
        await run_until_done(c)
        assert backend.calls.count("train") == 2 and backend.calls.count("evaluate") == 3  # rounds 0, 1, 2
        assert c.get_state()["diagnostics"]["me"]["execution"]["backend"] == "second-backend"

    asyncio.run(main())


def test_the_coordinators_timer_is_armed_again_only_when_its_deadline_or_the_clock_moves() -> None:
    """A drain asks for the next deadline every time (12 drains a client message at 1,000 Flower nodes): the
    same deadline keeps the waiting timer; a clock that jumps against the loop's gets a new one."""
    async def main(network: MemoryNetwork, engine: WasmtimeEngine) -> None:
        skew = [0.0]
        coordinator = networked(network, engine, "coord", clock=lambda: time.time() * 1000 + skew[0])
        helper = networked(network, engine, "helper")
        for c in (coordinator, helper):
            await c.init()
        await coordinator.create_job(**package("digits-mlp"), settings={**DIGITS_SETTINGS, "epochs": 1})
        coordinator.invite("helper")  # left unanswered: its expiry is the coordinator's next deadline
        await network.settle()
        executor = coordinator.executor
        timer = executor.timer
        assert timer is not None
        for _ in range(3):
            await executor.drain()
        assert executor.timer is timer and not timer.done()
        skew[0] += 60_000.0  # the clock steps a minute ahead of the loop: the sleep is worked out again
        await executor.drain()
        await asyncio.sleep(0)
        assert executor.timer is not timer and timer.cancelled()

    on_network(main)
