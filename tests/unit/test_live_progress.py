"""Live progress of every training peer: the Progress message, its rate limit, the coordinator's bounded
book, recordsPerSecond and estimatedRemainingMs; and what a participant's job view shows."""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from weei.api import TrainingController
from weei.core.observe.live_progress import LIVE_METRICS_KEPT, LiveProgress, estimate_remaining_ms
from weei.core.wire.messages import MessageError, Progress, decode_message, encode_message
from weei.demo.network import MemoryNetwork
from weei.host.memory_storage import MemoryKeyValue, MemoryStorage
from weei.host.worker_pool import ThreadWorkerPool
from weei.kernel.native import NativeKernel
from weei.runtime.wasmtime_engine import WasmtimeEngine

sys.path.insert(0, str(Path(__file__).parent))
from sim import Sim, dataset_spec  # noqa: E402
from test_controller import DIGITS_SETTINGS, digits_validation, on_network, package  # noqa: E402

# ------------------------------------------------------------ core, simulated time


def _training_sim() -> tuple[Sim, LiveProgress, Any]:
    """p1 holds one open attempt and has started training it; the coordinator keeps progress in ``live``."""
    spec, store = dataset_spec(3)
    sim = Sim.start_job(spec, store, ["p1"], start=False)
    sim.auto_train = False
    live = LiveProgress()
    sim.coordinator.progress_sink = lambda peer, m, now: live.report(
        peer, m.processed_examples, m.total_examples, m.metrics, now, attempt_id=m.attempt_id,
        elapsed_ms=m.elapsed_ms)
    sim.coordinator.start(sim.now)
    sim.pump()
    [(peer, assign)] = sim.pending
    assert peer == "p1" and sim.participants["p1"].state == "training"
    return sim, live, assign


def _ignored(sim: Sim) -> list[str]:
    return [log.details["reason"] for who, log in sim.logs
            if who == sim.coordinator.my_peer_id and log.event == "message.ignored" and log.details.get("type") ==
            "progress"]


def test_a_participant_sends_progress_at_most_every_500_ms_and_on_completion() -> None:
    sim, live, assign = _training_sim()
    p1 = sim.participants["p1"]
    total = assign.chunk.example_count
    assert total == 10
    start = sim.now
    for step in range(total + 1):  # a Worker reporting an example every 120 ms
        sim.now = start + 120 * step
        p1.report_progress(step, total, {"loss": 1.0 / (step + 1)}, sim.now)
        sim.pump()
    sent = sim.messages(Progress, src="p1")
    # The first report, the first one 500 ms later (at 600 ms), and the completion (at 1200 ms).
    assert [(m.processed_examples, m.elapsed_ms) for m in sent] == [(0, 0), (5, 600), (10, 1200)]
    p1.report_progress(total, total, {}, sim.now + 5000)  # nothing after the completion
    sim.pump()
    assert len(sim.messages(Progress, src="p1")) == len(sent)
    entry = live.progress_json()["p1"]
    assert entry["processedExamples"] == total and entry["totalExamples"] == total
    assert entry["recordsPerSecond"] == 10 * 1000 / 1200  # the participant's training time, not arrival times
    assert live.live_metrics_json()["p1"][-1]["values"] == sent[-1].metrics


def test_progress_of_a_stale_attempt_or_an_older_report_is_ignored_by_name() -> None:
    sim, live, assign = _training_sim()
    job = sim.coordinator.spec.job_id
    coordinator = sim.coordinator
    coordinator.receive("p1", Progress(job, assign.attempt_id, 5, 10, 100, {}), {}, sim.now)
    coordinator.receive("p1", Progress(job, assign.attempt_id, 3, 10, 120, {}), {}, sim.now)  # older: reordered
    coordinator.receive("p1", Progress(job, "r1-c999-a9", 5, 10, 100, {}), {}, sim.now)  # no such attempt
    coordinator.receive("stranger", Progress(job, assign.attempt_id, 5, 10, 100, {}), {}, sim.now)
    sim.pump()
    assert _ignored(sim) == ["stale-progress", "stale-attempt", "not-a-participant"]
    assert live.progress_json()["p1"]["processedExamples"] == 5
    sim.finish()  # the attempt ends: a late report of it counts for nothing
    coordinator.receive("p1", Progress(job, assign.attempt_id, 10, 10, 200, {}), {}, sim.now)
    sim.pump()
    assert _ignored(sim)[-1] == "stale-attempt"


def test_a_flood_of_progress_keeps_memory_bounded() -> None:
    sim, live, assign = _training_sim()
    job = sim.coordinator.spec.job_id
    for i in range(5 * LIVE_METRICS_KEPT):  # a hostile peer ignoring the rate limit
        sim.coordinator.receive("p1", Progress(job, assign.attempt_id, min(i, 10), 10, i + 1, {"loss": float(i)}),
                                {}, sim.now + i)
    assert len(live.live_metrics_json()["p1"]) == LIVE_METRICS_KEPT
    assert live.live_metrics_json()["p1"][-1]["values"] == {"loss": float(5 * LIVE_METRICS_KEPT - 1)}
    assert list(live.progress_json()) == ["p1"]


def test_a_malformed_progress_message_is_refused_by_name() -> None:
    good = encode_message(Progress("job-1", "a1", 5, 10, 100, {"loss": 0.5}))
    for change, reason, field in [({"processedExamples": 11}, "bad-field", "processedExamples"),
                                  ({"metrics": {"loss": 1e400}}, "non-finite-metric", "metrics.loss"),
                                  ({"elapsedMs": "soon"}, "bad-field", "elapsedMs"),
                                  ({"totalExamples": 2**60}, "bad-field", "totalExamples")]:
        try:
            decode_message({**json.loads(json.dumps(good)), **change})
        except MessageError as exc:
            assert exc.reason == reason and f"message.{field}" in exc.message, (change, exc)
        else:
            raise AssertionError(f"accepted {change}")


def test_the_estimate_divides_the_work_left_by_the_peers_rates() -> None:
    live = LiveProgress()
    assert estimate_remaining_ms(1000, live, ["a"]) is None  # no rate yet
    live.report("a", 50, 100, {}, 0.0, attempt_id="x", elapsed_ms=1000)  # 50/s, 50 left in flight
    live.report("b", 20, 100, {}, 0.0, attempt_id="y", elapsed_ms=1000)  # 20/s, 80 left in flight
    assert estimate_remaining_ms(570, live, ["a", "b"]) == 1000 * (570 + 50 + 80) // 70
    assert estimate_remaining_ms(570, live, ["a"]) == 1000 * (570 + 50 + 80) // 50  # b paused
    live.retain(["x"])  # y ended: its progress goes, its rate stays for its next assignment
    assert list(live.progress_json()) == ["a"] and live.records_per_second(["a", "b"]) == 70


# ------------------------------------------------------ controllers over the in-memory network


def _make(network: MemoryNetwork, engine: WasmtimeEngine, peer: str) -> TrainingController:
    c = TrainingController(my_peer_id=peer, storage=MemoryStorage(), kv=MemoryKeyValue(),
                           pool=ThreadWorkerPool(engine, 2), kernel=NativeKernel(), engine=engine,
                           clock=lambda: time.time() * 1000, monotonic=lambda: time.monotonic() * 1000,
                           random_bytes=os.urandom, transport=network.transport(peer))
    network.attach(c)
    return c


def test_the_coordinator_sees_a_remote_participants_progress_and_estimates_the_time_left() -> None:
    async def main(network: MemoryNetwork, engine: WasmtimeEngine) -> None:
        coordinator, helper = _make(network, engine, "coord"), _make(network, engine, "helper")
        for c in (coordinator, helper):
            await c.init()
        settings = {**DIGITS_SETTINGS, "epochs": 2, "coordinatorParticipates": False, "workers": 1}
        job_id = await coordinator.create_job(**package("digits-mlp"), settings=settings,
                                              validation=digits_validation())
        coordinator.invite("helper")
        await network.settle()
        await helper.decide_invitation(job_id, True)
        await network.settle()

        # The participant's job view: the job's settings and module, the module file, its capacity.
        mine = helper.get_state()["job"]
        theirs = coordinator.get_state()["job"]
        assert mine["role"] == "participant" and mine["status"] == "running"
        assert mine["settings"] == theirs["settings"] and mine["settings"]["workers"] == 1
        assert mine["module"] == theirs["module"] and mine["hasModuleFile"] is True
        assert mine["localWorkers"] == {"requested": 1, "capacity": 1, "effective": 1, "active": 0}
        name, data = helper.export_module()
        assert (name, len(data)) == (theirs["module"]["fileName"], theirs["module"]["bytes"])
        assert coordinator.export_module() == (name, data)
        helper.pause_contribution(True)
        await network.settle()
        assert helper.get_state()["job"]["status"] == "paused"
        assert helper.get_state()["job"]["participants"]["helper"]["paused"] is True
        helper.pause_contribution(False)
        await network.settle()

        told: list[dict[str, Any]] = []
        coordinator.subscribe(told.append)
        await coordinator.start()
        assert any(s["busy"] for s in told) and not coordinator.get_state()["busy"]
        seen: list[dict[str, Any]] = []  # polled: subscribers hear of progress at most every 100 ms
        while (state := coordinator.get_state())["job"]["status"] != "completed":
            seen.append(state)
            await asyncio.sleep(0.001)
        await network.settle()

        remote = [s["progress"]["helper"] for s in seen if "helper" in s["progress"]]
        assert remote, "the coordinator never saw the helper's progress"
        assert all(0 <= p["processedExamples"] <= p["totalExamples"] == 100 for p in remote)
        assert any(p.get("recordsPerSecond", 0) > 0 for p in remote)
        assert any(s["liveMetrics"].get("helper") and set(s["liveMetrics"]["helper"][-1]["values"]) ==
                   {"loss", "accuracy"} for s in seen)
        estimates = [s["estimatedRemainingMs"] for s in seen if "estimatedRemainingMs" in s]
        assert len(estimates) > 8
        quarter = len(estimates) // 4  # the rate of a tiny chunk is noisy: compare medians
        assert statistics.median(estimates[-quarter:]) < statistics.median(estimates[:quarter])
        assert all(s["job"]["progress"]["estimatedRemainingMs"] == s["estimatedRemainingMs"]
                   for s in seen if "estimatedRemainingMs" in s)
        final = coordinator.get_state()
        assert final["progress"] == {} and "estimatedRemainingMs" not in final  # nobody trains now
        validated = [cp["validationMetrics"] for cp in final["job"]["checkpoints"] if "validationMetrics" in cp]
        assert validated and all(v["examplesProcessed"] > 0 for v in validated)
        assert network.refused == []

    on_network(main)


def test_a_malformed_progress_on_the_wire_is_refused_and_changes_nothing() -> None:
    async def main(network: MemoryNetwork, engine: WasmtimeEngine) -> None:
        coordinator = _make(network, engine, "coord")
        _make(network, engine, "helper")
        await coordinator.init()
        await coordinator.create_job(**package("digits-mlp"), settings=DIGITS_SETTINGS)
        bad = {"type": "progress", "jobId": coordinator.get_state()["job"]["id"], "attemptId": "a",
               "processedExamples": 1, "totalExamples": 2, "elapsedMs": 1, "metrics": {"loss": "NaN"}}
        network.inboxes["coord"].put_nowait(("helper", json.dumps(bad), {}))
        await network.settle()
        assert len(network.refused) == 1 and "non-finite-metric" in network.refused[0]
        assert coordinator.get_state()["progress"] == {}

    on_network(main)


def test_settings_workers_sets_the_worker_split() -> None:
    async def main(network: MemoryNetwork, engine: WasmtimeEngine) -> None:
        c = _make(network, engine, "me")
        await c.init()
        await c.set_max_local_workers(2)
        await c.create_job(**package("cartpole-reinforce"),
                           settings={"epochs": 2, "localEpochs": 1, "batchSize": 16,
                                     "coordinatorParticipates": True, "workers": 1,
                                     "experience": {"unitsPerAssignment": 32}})
        assert c.get_state()["job"]["localWorkers"] == {"requested": 1, "capacity": 2, "effective": 1,
                                                        "active": 0}
        seen: list[dict[str, Any]] = []
        c.subscribe(seen.append)
        await c.start()
        while c.get_state()["job"]["status"] != "completed":
            await asyncio.sleep(0.005)
        await c.idle()
        used = {s["diagnostics"]["me"]["execution"].get("activeWorkers") for s in seen
                if "me" in s["diagnostics"]}
        assert max(u for u in used if u is not None) == 1  # the device allows 2, the job asks for 1

    on_network(main)
