"""The coordinator state machine with participants in memory, under simulated time."""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from sim import (
    COORD, HANG, JOB_ID, Sim, dataset_spec, experience_info, experience_spec, floats, nan_at,
    replace_weights, rewrite_update, sha, to_floats,
)

from weei.core.job.coordinator import JOIN_GRACE_MS, MAX_EMPTY_ROUNDS, Coordinator
from weei.core.wire.commands import RunValidation
from weei.kernel.numpy_kernel import NumpyKernel
from weei.core.errors import SettingsError, UsageError
from weei.core.wire.messages import (
    Assign, Deliver, Invitation, JobFinished, Update, UpdateReceipt,
)
from weei.core.job.participant import TrainOutcome
from weei.core.job.schedule import MAX_ATTEMPTS
from weei.core.formats.seeds import assignment_seed, evaluation_seed
from weei.core.formats.settings import TrainingSettings

JOB_SEED = 12345678901234567890


def settings(**kw: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"epochs": 1, "localEpochs": 1, "batchSize": 4, "coordinatorParticipates": False}
    out.update(kw)
    return out


def fedavg_reference(contributions: list[tuple[int, bytes]]) -> bytes:
    """An independent FedAvg: a float64 weighted mean rounded once to float32 (compared within rounding)."""
    total = sum(c for c, _ in contributions)
    acc = sum(c * to_floats(w).astype(np.float64) for c, w in contributions)
    return (acc / total).astype("<f4").tobytes()


def assigns(sim: Sim, *, round_: int | None = None, peer: str | None = None) -> list[Assign]:
    return [m for m in sim.messages(Assign, dst=peer) if round_ is None or m.round == round_]


def receipts(sim: Sim, peer: str, *, accepted: bool | None = None) -> list[UpdateReceipt]:
    return [m for m in sim.messages(UpdateReceipt, dst=peer) if accepted is None or m.accepted is accepted]


# --------------------------------------------------------- a whole job


def test_spec_example_40_chunks_4_participants_3_epochs() -> None:
    spec, store = dataset_spec(40, settings=settings(epochs=3))
    peers = ["p1", "p2", "p3", "p4"]
    sim = Sim.start_job(spec, store, peers)
    c = sim.coordinator

    assert c.status == "completed" and not c.incomplete
    assert sim.rounds == list(range(31))  # checkpoint 0 and 30 more
    for peer in peers:
        assert sim.messages(JobFinished, dst=peer) == [JobFinished(JOB_ID, False)]
    order = [ch.id for ch in spec.chunks]
    examples = {ch.id: ch.example_count for ch in spec.chunks}
    for r in range(1, 31):
        round_assigns = assigns(sim, round_=r)
        # every active participant gets exactly one chunk per round, never two
        assert sorted(a.attempt_id.split("-a")[0] for a in round_assigns) == sorted(a.assignment_id for a in round_assigns)
        assert sorted(d.dst for d in sim.delivered(Assign) if d.message.round == r) == peers
        assert len({a.chunk.id for a in round_assigns}) == 4
    for peer in peers:
        per_round = [a.round for a in assigns(sim, peer=peer)]
        assert per_round == list(range(1, 31))
    attempt_ids = [a.attempt_id for a in assigns(sim)]
    assert len(set(attempt_ids)) == len(attempt_ids) == 120

    for r in range(31):
        ck = sim.checkpoint(r)
        meta = ck.metadata.to_json()
        summary = c.checkpoints[r]
        assert meta["round"] == r == summary["artifact"]["round"]
        assert sha(ck.weights) == summary["artifact"]["sha256"] == meta["checkpoint"]["sha256"]
        assert summary["artifact"]["fileName"] == meta["checkpoint"]["fileName"] == f"synthetic-round-{r:04d}.weei-checkpoint"
        epoch, into = divmod(r, 10)
        if r == 30:
            assert meta["datasetEpoch"] == 3 and meta["remainingChunkIds"] == [] and meta["trainedChunkIds"] == order
            assert summary["datasetProgress"] == 3.0
        else:
            assert meta["datasetEpoch"] == epoch == summary["datasetEpoch"]
            assert meta["trainedChunkIds"] == order[: 4 * into]
            assert meta["remainingChunkIds"] == order[4 * into:] == summary["remaining"]
            assert summary["datasetProgress"] == pytest.approx(epoch + into / 10)
        assert meta["incomplete"] is False
        if r:
            trained = [a.chunk.id for a in assigns(sim, round_=r)]
            assert meta["metrics"]["examplesProcessed"] == sum(examples[i] for i in trained)
            assert set(meta["metrics"]["values"]) == {"loss"}
        else:
            assert meta["metrics"] == {"values": {}, "examplesProcessed": 0}
    view = c.view(sim.now)
    assert view["status"] == "completed" and view["progress"]["datasetEpoch"] == 3
    assert all(p["state"] == "stopped" for p in view["participants"].values())


def test_checkpoint_is_the_weighted_average_of_the_round() -> None:
    spec, store = dataset_spec(4, settings=settings())
    sim = Sim.start_job(spec, store, ["p1", "p2"])
    start = sim.checkpoint(0).weights
    updates = [(u, sim.stores[u_peer][u.weights.sha256]) for u_peer in ("p1", "p2")
               for u in sim.messages(Update, src=u_peer) if u.round == 1]
    expected = fedavg_reference([(u.count, w) for u, w in updates])
    got = sim.checkpoint(1).weights
    assert np.allclose(to_floats(got), to_floats(expected), rtol=0, atol=1e-7)
    assert got != start
    # checkpoint 2 trains from checkpoint 1: the Assign names it
    assert {a.checkpoint.sha256 for a in assigns(sim, round_=2)} == {sha(got)}


def test_assignment_ids_seeds_and_attachments() -> None:
    spec, store = dataset_spec(4, settings=settings())
    sim = Sim.start_job(spec, store, ["p1", "p2"])
    got = {(d.dst, d.message.attempt_id): d for d in sim.delivered(Assign)}
    r1 = got[("p1", "r1-c000-a1")]
    assert r1.message.assignment_id == "r1-c000" and r1.message.chunk.id == "c000"
    assert got[("p2", "r1-c001-a2")].message.chunk.id == "c001"
    assert got[("p1", "r2-c002-a3")].message.checkpoint.sha256 == sim.coordinator.checkpoints[1]["artifact"]["sha256"]
    # the checkpoint travels once per version, the chunk every time, the module never with an Assign
    kinds = [a.kind for a in r1.attachments]
    assert sorted(kinds) == ["checkpoint", "chunk"]
    seed = int.from_bytes(hashlib.sha256(f"{JOB_ID}/r1-c000".encode()).digest()[:8], "little")
    assert r1.message.seed == seed
    assert r1.message.settings == {"localEpochs": 1, "batchSize": 4}


# ------------------------------------------------------------- failures


def test_disconnect_mid_round_hands_the_chunk_to_an_idle_participant() -> None:
    spec, store = dataset_spec(5, settings=settings())
    sim = Sim.start_job(spec, store, ["p1", "p2", "p3"], start=False)
    sim.auto_train = False
    sim.coordinator.start(sim.now)
    sim.pump()
    sim.finish()  # round 1: c000..c002
    assert sim.rounds == [0, 1]
    round2 = {peer: a for peer, a in sim.pending}
    assert sorted(round2) == ["p1", "p2"]  # two chunks left for three participants: p3 is idle
    sim.pending = [(p, a) for p, a in sim.pending if p != "p1"]
    sim.disconnect("p1")
    moved = assigns(sim, round_=2, peer="p3")
    assert len(moved) == 1
    assert moved[0].assignment_id == round2["p1"].assignment_id and moved[0].attempt_id != round2["p1"].attempt_id
    assert sim.coordinator.view(sim.now)["participants"]["p1"]["state"] == "disconnected"
    sim.finish()
    assert sim.rounds == [0, 1, 2]
    meta = sim.checkpoint(2).metadata.to_json()
    assert meta["datasetEpoch"] == 1 and meta["trainedChunkIds"] == [f"c{i:03d}" for i in range(5)]
    assert sim.coordinator.status == "completed" and not sim.coordinator.incomplete


def test_disconnect_without_idle_participant_puts_the_chunk_first_in_the_queue() -> None:
    spec, store = dataset_spec(6, settings=settings())
    sim = Sim.start_job(spec, store, ["p1", "p2", "p3"], start=False)
    sim.auto_train = False
    sim.coordinator.start(sim.now)
    sim.pump()
    lost = dict(sim.pending)["p2"]
    sim.pending = [(p, a) for p, a in sim.pending if p != "p2"]
    sim.disconnect("p2")
    assert sim.coordinator.view(sim.now)["queue"][0] == lost.chunk.id
    sim.finish()
    assert sim.rounds == [0, 1]  # the round still closed, on two updates
    assert sim.checkpoint(1).metadata.to_json()["remainingChunkIds"] == ["c001", "c003", "c004", "c005"]
    first = sorted(assigns(sim, round_=2), key=lambda a: a.attempt_id)[0]
    assert first.chunk.id == lost.chunk.id


def test_late_update_is_rejected_and_not_averaged() -> None:
    spec, store = dataset_spec(4, settings=settings())
    sim = Sim.start_job(spec, store, ["p1", "p2"], start=False, round_timeout_ms=5_000)
    sim.auto_train = False
    sim.coordinator.start(sim.now)
    sim.pump()
    assert sim.coordinator.next_timer() == sim.now + 5_000
    late = [item for item in sim.pending if item[0] == "p1"]
    sim.pending = [item for item in sim.pending if item[0] == "p2"]
    sim.finish()
    assert sim.rounds == [0]  # p1 still has time
    sim.advance(4_999)
    assert sim.rounds == [0]
    sim.advance(1)
    assert sim.rounds == [0, 1]
    p2_update = sim.messages(Update, src="p2")[0]
    assert sim.checkpoint(1).weights == sim.stores["p2"][p2_update.weights.sha256]  # p2 alone
    # round 2 is out; p1 is still busy with round 1, its new assignment waits
    assert sim.participants["p1"].pending is not None
    sim.pending = late + sim.pending
    sim.finish([0])
    assert sim.reasons() == ["late-update"]
    assert receipts(sim, "p1", accepted=False)[0].reason.startswith("late-update")
    assert sim.rounds == [0, 1]
    # the chunk of the missed deadline went back first in line
    assert assigns(sim, round_=2)[0].chunk.id == late[0][1].chunk.id
    sim.run_to_end()
    assert sim.coordinator.status == "completed" and not sim.coordinator.incomplete


def once(hook: Any) -> Any:
    """Apply a tamper hook to the peer's first Update only."""
    state = {"done": False}

    def wrapped(message: Any, blobs: dict[str, bytes]) -> Any:
        if isinstance(message, Update) and not state["done"]:
            state["done"] = True
            return hook(message, blobs)
        return [(message, blobs)]

    return wrapped


def _flip(data: bytes) -> bytes:
    return bytes([data[0] ^ 1]) + data[1:]


REJECTIONS = [
    ("non-finite-weights", replace_weights(nan_at(3))),
    ("non-finite-weights", replace_weights(lambda d: d[:-4] + floats([float("inf")]))),
    ("wrong-size", replace_weights(lambda d: d[:-4])),
    ("wrong-size", replace_weights(lambda d: d[:-4], claim_bytes=64)),
    ("hash-mismatch", replace_weights(_flip, rehash=False)),
    ("missing-weights", lambda m, b: [(m, {})]),
    ("stale-round", rewrite_update(round=2)),
    ("off-policy", rewrite_update(base_checkpoint=sha(b"older weights"))),
    ("inflated-count", rewrite_update(count=10_001)),
    ("no-examples", rewrite_update(count=0)),
    ("wrong-assignment", rewrite_update(assignment_id="r1-c003")),
    ("wrong-peer", rewrite_update(attempt_id="r1-c001-a2", assignment_id="r1-c001")),
    ("unknown-attempt", rewrite_update(attempt_id="r1-c000-a99")),
    ("wrong-job", rewrite_update(job_id="another-job")),
]


@pytest.mark.parametrize("code, hook", REJECTIONS, ids=[f"{c}-{i}" for i, (c, _) in enumerate(REJECTIONS)])
def test_bad_update_is_rejected_with_its_reason_and_the_job_goes_on(code: str, hook: Any) -> None:
    spec, store = dataset_spec(4, settings=settings())
    sim = Sim.create(spec, store, round_timeout_ms=5_000)
    sim.tamper["p1"] = once(hook)
    for peer in ("p1", "p2"):
        sim.join(peer)
    sim.coordinator.start(sim.now)
    sim.pump()
    if sim.rounds == [0]:  # the attempt is still open: its update went astray
        sim.advance(5_000)
    assert sim.reasons()[0] == code
    rejected = sim.coordinator.rejected[0]
    assert rejected.peer == "p1" and rejected.round == 1
    bad = receipts(sim, "p1", accepted=False)
    assert bad and bad[0].reason.startswith(code)
    # round 1 was averaged without p1's update: p2's weights alone
    p2_update = [u for u in sim.messages(Update, src="p2") if u.round == 1][0]
    assert receipts(sim, "p2", accepted=False) == []
    assert sim.checkpoint(1).weights == sim.stores["p2"][p2_update.weights.sha256]
    assert sim.coordinator.status == "completed" and not sim.coordinator.incomplete
    assert sim.checkpoint(sim.rounds[-1]).metadata.to_json()["trainedChunkIds"] == ["c000", "c001", "c002", "c003"]


def test_duplicate_update_counts_once() -> None:
    spec, store = dataset_spec(2, settings=settings())
    plain = Sim.start_job(spec, store, ["p1", "p2"])
    sim = Sim.create(spec, store)
    sim.tamper["p1"] = once(lambda m, b: [(m, b), (m, b)])
    for peer in ("p1", "p2"):
        sim.join(peer)
    sim.coordinator.start(sim.now)
    sim.pump()
    assert sim.reasons() == ["duplicate-update"]  # the first copy counted, the second did not
    assert [r.accepted for r in receipts(sim, "p1")] == [True, False]
    assert sim.checkpoint(1).weights == plain.checkpoint(1).weights


def test_update_from_a_stranger_is_ignored() -> None:
    spec, store = dataset_spec(2, settings=settings())
    sim = Sim.start_job(spec, store, ["p1"], start=False)
    sim.auto_train = False
    sim.coordinator.start(sim.now)
    sim.pump()
    peer, assign = sim.pending[0]
    update = Update(JOB_ID, 1, assign.assignment_id, assign.attempt_id, assign.checkpoint.sha256,
                    replace(assign.checkpoint, kind="update"), {}, 1)
    sim.coordinator.receive("stranger", update, {assign.checkpoint.sha256: sim.coord_store[assign.checkpoint.sha256]},
                            sim.now)
    assert sim.coordinator.rejected == [] and sim.rounds == [0]
    assert sim.coordinator.attempts.current[0].open


def test_failing_rounds_keep_the_checkpoint_and_retry_the_same_round() -> None:
    spec, store = dataset_spec(4, settings=settings())
    sim = Sim.create(spec, store)
    fails = {"n": 0}

    def flaky(assign: Assign, start: bytes, default: TrainOutcome) -> Any:
        if assign.round == 1 and fails["n"] < 4:
            fails["n"] += 1
            return "out of memory"
        return default

    for peer in ("p1", "p2"):
        sim.behaviour[peer] = flaky
        sim.join(peer)
    sim.coordinator.start(sim.now)
    sim.pump()
    r1 = assigns(sim, round_=1)
    # Four failed attempts, then the round trains (each peer is offered chunks it has not failed first).
    assert len(r1) == 6 and len({a.attempt_id for a in r1}) == 6
    assert {a.checkpoint.sha256 for a in r1} == {sim.coordinator.checkpoints[0]["artifact"]["sha256"]}
    assert sim.rounds == [0, 1, 2]
    assert sim.coordinator.status == "completed" and not sim.coordinator.incomplete
    assert any(log.event == "round.empty" for _, log in sim.logs)


def test_a_paused_job_names_the_cause_of_its_failed_attempts() -> None:
    """Attempts that fail in the model pause the job with the last failure in state.error (not only in the log)."""
    spec, store = dataset_spec(2, settings=settings())
    sim = Sim.create(spec, store, round_timeout_ms=1_000)
    sim.behaviour["p1"] = lambda a, s, d: "model: the loss is not finite (learning rate too high?)"
    sim.join("p1")
    sim.coordinator.start(sim.now)
    for _ in range(20):
        sim.pump()
        if sim.coordinator.status == "paused":
            break
        sim.advance(1_000)
    c = sim.coordinator
    assert c.status == "paused", c.error
    assert "no valid update" in c.error and "p1: model: the loss is not finite" in c.error, c.error
    assert "Resume" in c.error


def test_repeated_empty_rounds_pause_the_job() -> None:
    spec, store = dataset_spec(4, settings=settings())
    sim = Sim.create(spec, store, round_timeout_ms=1_000)
    for peer in ("p1", "p2"):
        sim.behaviour[peer] = lambda a, s, d: HANG
        sim.join(peer)
    sim.coordinator.start(sim.now)
    sim.pump()
    for _ in range(MAX_EMPTY_ROUNDS):
        assert sim.coordinator.status == "running"
        sim.advance(1_000)
    c = sim.coordinator
    assert c.status == "paused" and "no valid update in 5 attempts at round 1" in c.error
    assert sim.rounds == [0] and c.checkpoint_round == 0
    assert c.next_timer() is None and not any(s.open for s in c.attempts.current)
    assert {a.round for a in assigns(sim)} == {1}
    assert c.view(sim.now)["error"] == c.error
    # deadlines do not count against the chunks: nothing was dropped
    assert c.dataset.dropped == [] and sorted(c.view(sim.now)["queue"]) == ["c000", "c001", "c002", "c003"]
    sim.behaviour.clear()
    for peer in ("p1", "p2"):  # the hung Workers give up; the participants are free again
        for p, a in [h for h in sim.hung if h[0] == peer]:
            sim.participants[p].training_failed(a.attempt_id, "cancelled", sim.now)
    sim.hung.clear()
    sim.pump()
    c.resume_running(sim.now)
    sim.pump()
    assert c.status == "completed" and c.error is None and sim.rounds == [0, 1, 2]
    assert not c.incomplete
    # the queued stale assignments the participants ran meanwhile were refused, never averaged
    assert set(sim.reasons()) <= {"late-update"}


def test_chunk_failing_max_attempts_is_dropped_and_the_job_ends_incomplete() -> None:
    spec, store = dataset_spec(3, settings=settings())
    sim = Sim.create(spec, store)
    sim.behaviour["p1"] = lambda a, s, d: "cannot parse chunk" if a.chunk.id == "c001" else d
    sim.join("p1")
    sim.coordinator.start(sim.now)
    sim.pump()
    c = sim.coordinator
    tries = [a for a in assigns(sim) if a.chunk.id == "c001"]
    assert len(tries) == MAX_ATTEMPTS
    assert c.status == "completed" and c.incomplete
    assert sim.messages(JobFinished, dst="p1") == [JobFinished(JOB_ID, True)]
    last = sim.checkpoint(sim.rounds[-1]).metadata.to_json()
    assert last["incomplete"] is True
    assert "c001" not in last["trainedChunkIds"]
    assert c.dataset.dropped == ["c001"]


def test_model_load_failure_leaves_the_participant_out() -> None:
    spec, store = dataset_spec(2, settings=settings())
    sim = Sim.create(spec, store)
    sim.module_fails.add("p2")
    sim.join("p1")
    sim.join("p2")
    assert sim.coordinator.view(sim.now)["participants"]["p2"]["state"] == "modelLoadFailed"
    sim.coordinator.start(sim.now)
    sim.pump()
    assert assigns(sim, peer="p2") == [] and sim.coordinator.status == "completed"


# ------------------------------------------------------- determinism


def test_same_checkpoint_bits_whatever_the_arrival_order() -> None:
    spec, store = dataset_spec(4, settings=settings())
    files = set()
    hashes = set()
    for order in itertools.permutations(range(4)):
        sim = Sim.start_job(spec, store, ["p1", "p2", "p3", "p4"], start=False)
        sim.auto_train = False
        sim.coordinator.start(sim.now)
        sim.pump()
        sim.finish(list(order))
        hashes.add(sha(sim.checkpoint(1).weights))
        files.add(sim.saved[-1].file)
    assert len(hashes) == 1
    assert len(files) == 1  # metrics too: the whole file is the same


# -------------------------------------------------------- aggregation


def _f32(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float32).astype(np.float64)


def test_fedavgm_state_in_v2_checkpoints_and_method_change() -> None:
    spec, store = dataset_spec(6, settings=settings(aggregation={"method": "fedavgm", "momentum": 0.5}))
    sim = Sim.start_job(spec, store, ["p1", "p2"], start=False)
    sim.auto_train = False
    sim.coordinator.start(sim.now)
    sim.pump()
    sim.finish()
    sim.finish()
    ck0, ck1, ck2 = (sim.checkpoint(r) for r in range(3))
    assert ck0.metadata.version == 1 and ck0.state is None
    for r, ck in ((1, ck1), (2, ck2)):
        meta = ck.metadata.to_json()
        assert meta["version"] == 2
        assert meta["aggregationState"]["method"] == "fedavgm" and meta["aggregationState"]["step"] == r
        assert len(ck.state) == meta["aggregationState"]["bytes"] == spec.weight_bytes
        assert sim.coordinator.checkpoints[r]["aggregation"] == {"method": "fedavgm", "step": r,
                                                                 "bytes": spec.weight_bytes}
    # reference: v1 = d1, w1 = w0 + v1; v2 = 0.5 v1 + d2, w2 = w1 + v2 (float32 state, float64 arithmetic)
    avgs = []
    for r in (1, 2):
        ups = [u for u in sim.messages(Update) if u.round == r]
        peer_of = {u.attempt_id: d.src for d in sim.delivered(Update) for u in [d.message]}
        avgs.append(to_floats(fedavg_reference(
            [(u.count, sim.stores[peer_of[u.attempt_id]][u.weights.sha256]) for u in ups])).astype(np.float64))
    w0 = to_floats(ck0.weights).astype(np.float64)
    v1 = _f32(avgs[0] - w0)
    w1 = _f32(w0 + v1)
    assert np.allclose(to_floats(ck1.weights), w1, atol=1e-6)
    assert np.allclose(to_floats(ck1.state), v1, atol=1e-6)
    v2 = _f32(0.5 * v1 + (avgs[1] - to_floats(ck1.weights)))
    assert np.allclose(to_floats(ck2.state), v2, atol=1e-6)
    assert np.allclose(to_floats(ck2.weights), _f32(to_floats(ck1.weights) + v2), atol=1e-6)

    # another method starts from zero, from the next round: the open round 3 keeps the settings it opened with
    sim.coordinator.update_settings(TrainingSettings.from_json(settings(epochs=2, aggregation={"method": "fedadam"})),
                                    sim.now)
    sim.finish()
    meta3 = sim.checkpoint(3).metadata.to_json()
    assert meta3["aggregationState"]["method"] == "fedavgm" and meta3["aggregationState"]["step"] == 3
    assert meta3["settings"]["aggregation"] == {"method": "fedavgm", "momentum": 0.5}
    sim.finish()
    meta4 = sim.checkpoint(4).metadata.to_json()
    assert meta4["aggregationState"]["method"] == "fedadam" and meta4["aggregationState"]["step"] == 1
    assert meta4["aggregationState"]["bytes"] == 2 * spec.weight_bytes
    assert meta4["settings"]["aggregation"] == {"method": "fedadam"}


def test_fedadam_back_to_fedavg_writes_version_1() -> None:
    spec, store = dataset_spec(4, settings=settings(aggregation={"method": "fedadam"}))
    sim = Sim.start_job(spec, store, ["p1", "p2"], start=False)
    sim.auto_train = False
    sim.coordinator.start(sim.now)
    sim.pump()
    sim.finish()
    assert sim.checkpoint(1).metadata.version == 2
    sim.coordinator.update_settings(TrainingSettings.from_json(settings(epochs=2)), sim.now)
    sim.finish()  # the open round 2 keeps its method
    assert sim.checkpoint(2).metadata.version == 2
    sim.finish()
    ck = sim.checkpoint(3)
    assert ck.metadata.version == 1 and ck.state is None and "aggregation" not in sim.coordinator.checkpoints[3]


def test_method_the_model_does_not_allow_is_refused() -> None:
    from sim import dataset_info
    spec, store = dataset_spec(2, settings=settings(), info=dataset_info(aggregation={"methods": ["fedavgm"]}))
    sim = Sim.create(spec, store)
    with pytest.raises(SettingsError) as err:
        sim.coordinator.update_settings(TrainingSettings.from_json(settings(aggregation={"method": "fedadam"})),
                                        sim.now)
    assert err.value.reason == "method-not-allowed"


def test_non_finite_aggregate_pauses_the_job_and_keeps_the_checkpoint() -> None:
    spec, store = dataset_spec(4, settings=settings(aggregation={"method": "fedavgm", "serverLearningRate": 10}))
    big = floats([1e38] * 16)
    sim = Sim.create(spec, store, weights=big)
    for peer in ("p1", "p2"):
        sim.behaviour[peer] = lambda a, s, d: TrainOutcome(floats([3e38] * 16), {"loss": 1.0}, a.chunk.example_count)
        sim.join(peer)
    sim.coordinator.start(sim.now)
    sim.pump()
    c = sim.coordinator
    assert c.status == "paused" and c.error.startswith("round 1 failed")
    assert sim.rounds == [0] and c.checkpoint_round == 0 and c.weights == big
    assert sorted(c.view(sim.now)["queue"][:2]) == ["c000", "c001"]  # the trained chunks are trained again
    # a lower server learning rate, and round 1 succeeds
    c.update_settings(TrainingSettings.from_json(settings(aggregation={"method": "fedavgm", "momentum": 0,
                                                                      "serverLearningRate": 0.1})), sim.now)
    c.resume_running(sim.now)
    sim.pump()
    assert c.status == "completed" and sim.rounds == [0, 1, 2]
    assert all(np.isfinite(to_floats(sim.checkpoint(r).weights)).all() for r in (1, 2))


# ---------------------------------------------------- continue from a checkpoint


def _full_run(n: int = 10, epochs: int = 2, **kw: Any) -> tuple[Sim, Any, Any]:
    spec, store = dataset_spec(n, settings=settings(epochs=epochs, **kw))
    return Sim.start_job(spec, store, ["p1", "p2"]), spec, store


def test_resume_restores_the_dataset_queue_and_keeps_counting_rounds() -> None:
    original, spec, store = _full_run()
    ck3 = original.checkpoint(3)
    assert ck3.metadata.remaining_chunk_ids == ["c006", "c007", "c008", "c009"]
    sim = Sim.resume(spec, store, ck3, mode="resume")
    assert sim.rounds[0] == 4
    assert [a.chunk.id for a in assigns(sim, round_=4)] == ["c006", "c007"]
    assert sim.rounds == list(range(4, 11))  # the same 10 rounds as the original job
    assert sim.coordinator.status == "completed"
    assert sim.checkpoint(10).metadata.to_json()["datasetEpoch"] == 2
    # same inputs, same bits
    assert sim.checkpoint(10).weights == original.checkpoint(10).weights
    assert any(log.event == "job.continued" for _, log in sim.logs)


def test_resume_new_starts_a_fresh_queue() -> None:
    original, spec, store = _full_run()
    sim = Sim.resume(spec, store, original.checkpoint(3), mode="new")
    assert [a.chunk.id for a in assigns(sim, round_=4)] == ["c000", "c001"]
    assert sim.rounds == list(range(4, 14))  # two full passes more
    assert sim.checkpoint(13).metadata.to_json()["datasetEpoch"] == 2


def test_continue_a_completed_job_with_more_epochs() -> None:
    original, _, store = _full_run(n=4, epochs=1)
    assert original.rounds == [0, 1, 2]
    spec, _ = dataset_spec(4, settings=settings(epochs=3))
    sim = Sim.resume(spec, store, original.checkpoint(2), mode="resume")
    # datasetEpoch 1 is done: two more passes, not one
    assert sim.rounds == [3, 4, 5, 6]
    assert [ck["datasetEpoch"] for ck in sim.coordinator.checkpoints] == [1, 2, 2, 3]


def test_more_epochs_after_completion_train_the_extra_pass() -> None:
    sim, _, _ = _full_run(n=4, epochs=1)
    c = sim.coordinator
    assert c.status == "completed"
    with pytest.raises(UsageError):
        c.invite("p1", sim.now)
    c.update_settings(TrainingSettings.from_json(settings(epochs=2)), sim.now)
    assert c.status == "ready" and c.view(sim.now)["queue"] == ["c000", "c001", "c002", "c003"]
    c.start(sim.now)
    sim.pump()
    assert sim.rounds == [0, 1, 2] and c.status == "running"  # the participants stopped with the job
    sim.join("p1")  # re-invited: it trains the extra pass alone
    assert c.status == "completed" and sim.rounds == [0, 1, 2, 3, 4, 5, 6]
    assert [ck["datasetEpoch"] for ck in c.checkpoints] == [0, 0, 1, 1, 1, 1, 2]


def test_resume_restores_aggregation_state_unless_the_method_changes() -> None:
    original, spec, store = _full_run(n=4, epochs=2, aggregation={"method": "fedavgm"})
    ck2 = original.checkpoint(2)
    assert ck2.metadata.to_json()["aggregationState"]["step"] == 2
    same = Sim.resume(spec, store, ck2, mode="resume")
    assert same.checkpoint(3).metadata.to_json()["aggregationState"]["step"] == 3
    assert same.checkpoint(4).weights == original.checkpoint(4).weights
    spec_adam, _ = dataset_spec(4, settings=settings(epochs=2, aggregation={"method": "fedadam"}))
    other = Sim.resume(spec_adam, store, ck2, mode="resume")
    state = other.checkpoint(3).metadata.to_json()["aggregationState"]
    assert state["method"] == "fedadam" and state["step"] == 1


def test_resume_refuses_weights_of_another_size_and_bad_mode() -> None:
    original, spec, store = _full_run(n=2, epochs=1)
    other, _ = dataset_spec(2, settings=settings(), weight_count=8)
    with pytest.raises(UsageError):
        Sim.resume(other, store, original.checkpoint(1), mode="resume")
    with pytest.raises(UsageError):
        Sim.resume(spec, store, original.checkpoint(1), mode="restart")


# ------------------------------------------------------------ experience


def exp_settings(**kw: Any) -> dict[str, Any]:
    return settings(**{"epochs": 3, "experience": {"unitsPerAssignment": 8}, **kw})


def test_experience_units_and_seeds() -> None:
    spec, store = experience_spec(settings=exp_settings())
    sim = Sim.start_job(spec, store, ["p1", "p2"], job_seed=JOB_SEED)
    c = sim.coordinator
    assert c.status == "completed" and sim.rounds == [0, 1, 2, 3]
    starts = []
    for r in (1, 2, 3):
        for a in assigns(sim, round_=r):
            assert a.chunk is None and a.experience.unit_count == 8
            assert a.seed == a.experience.seed == assignment_seed(JOB_SEED, a.experience.unit_start)
            assert a.assignment_id == f"r{r}-u{a.experience.unit_start}"
            starts.append(a.experience.unit_start)
    assert starts == list(range(0, 48, 8))
    for r in range(4):
        meta = sim.checkpoint(r).metadata.to_json()
        assert meta["experience"] == {"jobSeed": str(JOB_SEED), "nextUnit": 16 * r}
        assert "remainingChunkIds" not in meta
    assert sim.checkpoint(3).metadata.to_json()["metrics"]["examplesProcessed"] == 16


def test_experience_job_needs_a_seed() -> None:
    spec, store = experience_spec(settings=exp_settings())
    with pytest.raises(UsageError):
        Sim.create(spec, store)


def test_retried_and_reassigned_ranges_keep_their_seed() -> None:
    spec, store = experience_spec(settings=exp_settings())
    sim = Sim.create(spec, store, job_seed=JOB_SEED)
    sim.auto_train = False
    for peer in ("p1", "p2"):
        sim.join(peer)
    sim.coordinator.start(sim.now)
    sim.pump()
    first = dict(sim.pending)
    sim.join("p3")  # joins mid-round: idle until someone's work comes free
    assert assigns(sim, peer="p3") == []
    sim.pending = [(p, a) for p, a in sim.pending if p != "p1"]
    sim.disconnect("p1")
    moved = assigns(sim, peer="p3")[0]
    assert moved.experience == first["p1"].experience and moved.seed == first["p1"].seed
    assert moved.assignment_id == first["p1"].assignment_id
    # p2 fails its range: no idle participant, so it is retried first next round, same seed
    sim.behaviour["p2"] = lambda a, s, d: "environment crashed"
    sim.finish()
    assert sim.rounds == [0, 1]
    sim.behaviour.clear()
    again = [a for a in assigns(sim, round_=2) if a.experience.unit_start == first["p2"].experience.unit_start]
    assert len(again) == 1 and again[0].seed == first["p2"].seed
    assert again[0].assignment_id == f"r2-u{first['p2'].experience.unit_start}"


def test_zero_completed_units_are_not_averaged() -> None:
    spec, store = experience_spec(settings=exp_settings(epochs=1))
    sim = Sim.create(spec, store, job_seed=JOB_SEED)
    sim.behaviour["p1"] = lambda a, s, d: replace(d, count=0)
    for peer in ("p1", "p2"):
        sim.join(peer)
    sim.coordinator.start(sim.now)
    sim.pump()
    assert sim.reasons() == ["no-examples"]
    p2 = sim.messages(Update, src="p2")[0]
    assert sim.checkpoint(1).weights == sim.stores["p2"][p2.weights.sha256]
    assert sim.checkpoint(1).metadata.to_json()["metrics"]["examplesProcessed"] == 8


def test_experience_units_beyond_the_assignment_are_refused() -> None:
    spec, store = experience_spec(settings=exp_settings(epochs=1))
    sim = Sim.create(spec, store, job_seed=JOB_SEED)
    sim.behaviour["p1"] = lambda a, s, d: replace(d, count=9)
    for peer in ("p1", "p2"):
        sim.join(peer)
    sim.coordinator.start(sim.now)
    sim.pump()
    assert sim.reasons() == ["inflated-count"]


def test_evaluation_uses_one_seed_for_the_whole_job() -> None:
    spec, store = experience_spec(settings=exp_settings(validationSchedule={"enabled": True, "unit": "round",
                                                                            "every": 1}))
    sim = Sim.start_job(spec, store, ["p1", "p2"], job_seed=JOB_SEED)
    assert [v.round for v in sim.validations] == [0, 1, 2, 3]  # round 0, the initial weights, at Start
    assert {v.experience for v in sim.validations} == {(0, 5, evaluation_seed(JOB_SEED))}
    assert [v.weights_sha256 for v in sim.validations] == [sha(sim.checkpoint(r).weights) for r in (0, 1, 2, 3)]
    sim.coordinator.validation_finished(2, {"episodeReturn": 42.0}, None, sim.now)
    assert sim.coordinator.checkpoints[2]["validationMetrics"]["values"] == {"episodeReturn": 42.0}
    sim.coordinator.validation_finished(3, None, "evaluation failed", sim.now)
    assert sim.coordinator.checkpoints[3]["validationError"] == "evaluation failed"
    assert "validationMetrics" not in sim.coordinator.checkpoints[3]


def test_experience_without_evaluation_capability_never_validates() -> None:
    spec, store = experience_spec(settings=exp_settings(validationSchedule={"enabled": True, "unit": "round",
                                                                            "every": 1}),
                                  info=experience_info(capabilities={}))
    sim = Sim.start_job(spec, store, ["p1"], job_seed=JOB_SEED)
    assert sim.validations == []
    with pytest.raises(UsageError):
        sim.coordinator.request_validation(sim.now)


def test_experience_resume_keeps_the_seed_and_next_unit() -> None:
    spec, store = experience_spec(settings=exp_settings(epochs=4))
    original = Sim.start_job(spec, store, ["p1", "p2"], job_seed=JOB_SEED)
    ck2 = original.checkpoint(2)
    sim = Sim.resume(spec, store, ck2, mode="resume", new_job_seed=99)
    r3 = assigns(sim, round_=3)
    assert [a.experience.unit_start for a in r3] == [32, 40]
    assert [a.seed for a in r3] == [assignment_seed(JOB_SEED, 32), assignment_seed(JOB_SEED, 40)]
    assert sim.rounds == [3, 4]
    assert sim.checkpoint(4).metadata.to_json()["experience"] == {"jobSeed": str(JOB_SEED), "nextUnit": 64}
    assert sim.checkpoint(4).weights == original.checkpoint(4).weights


def test_experience_continue_new_draws_a_new_seed() -> None:
    spec, store = experience_spec(settings=exp_settings(epochs=4))
    original = Sim.start_job(spec, store, ["p1", "p2"], job_seed=JOB_SEED)
    sim = Sim.resume(spec, store, original.checkpoint(2), mode="new", new_job_seed=7)
    r3 = assigns(sim, round_=3)
    assert [a.experience.unit_start for a in r3] == [0, 8]
    assert [a.seed for a in r3] == [assignment_seed(7, 0), assignment_seed(7, 8)]
    assert sim.checkpoint(3).metadata.to_json()["experience"] == {"jobSeed": "7", "nextUnit": 16}
    with pytest.raises(UsageError):
        Sim.resume(spec, store, original.checkpoint(2), mode="new")  # 'new' needs the new seed


@pytest.mark.parametrize("epochs", [1, 2])
def test_experience_continue_needs_rounds_above_the_checkpoint(epochs: int) -> None:
    spec, store = experience_spec(settings=exp_settings(epochs=4))
    original = Sim.start_job(spec, store, ["p1"], job_seed=JOB_SEED)
    short, _ = experience_spec(settings=exp_settings(epochs=epochs))
    with pytest.raises(SettingsError) as err:
        Sim.resume(short, store, original.checkpoint(2), mode="resume")
    assert err.value.reason == "epochs-not-above-checkpoint" and err.value.field == "epochs"


def test_experience_update_settings_refuses_rounds_not_above_the_current_one() -> None:
    spec, store = experience_spec(settings=exp_settings(epochs=4))
    sim = Sim.start_job(spec, store, ["p1"], job_seed=JOB_SEED, start=False)
    sim.auto_train = False
    sim.coordinator.start(sim.now)
    sim.pump()
    sim.finish()
    sim.finish()
    assert sim.coordinator.checkpoint_round == 2
    with pytest.raises(SettingsError):
        sim.coordinator.update_settings(TrainingSettings.from_json(exp_settings(epochs=2)), sim.now)
    with pytest.raises(SettingsError):
        sim.coordinator.update_settings(
            TrainingSettings.from_json(settings(epochs=9, experience={"unitsPerAssignment": 65})), sim.now)


# ------------------------------------------------------------ auxiliary


AUX_FILE = floats([1, 2, 3, 4])


def aux_slots(rounds_ago: int = 2) -> list[dict[str, Any]]:
    return [
        {"id": "reward", "role": "reward-model", "bytes": len(AUX_FILE), "sha256": sha(AUX_FILE)},
        {"id": "start", "role": "reference-policy", "bytes": 64, "source": {"kind": "initial"}},
        {"id": "old", "role": "opponent", "bytes": 64, "source": {"kind": "checkpoint", "roundsAgo": rounds_ago}},
    ]


def test_auxiliary_snapshots_follow_the_rule_and_travel_once() -> None:
    spec, store = experience_spec(settings=exp_settings(epochs=6, validationSchedule={
        "enabled": True, "unit": "round", "every": 3}), aux=aux_slots(2), aux_files={"reward": AUX_FILE})
    sim = Sim.create(spec, store, job_seed=JOB_SEED)
    sim.auto_train = False
    sim.join("p1")
    deliver = sim.delivered(Deliver, dst="p1")[0]
    assert deliver.message.auxiliary == {"reward": spec.auxiliary_files["reward"]}
    assert sorted(a.kind for a in deliver.attachments) == ["auxiliary", "module"]
    sim.coordinator.start(sim.now)
    sim.pump()
    for _ in range(3):
        sim.finish()
    sim.join("p2")  # a late joiner holds no checkpoint yet
    sim.finish()
    c = sim.coordinator
    hashes = {r: ck["artifact"]["sha256"] for r, ck in enumerate(c.checkpoints)}
    for d in sim.delivered(Assign):
        a = d.message
        r = a.round
        assert a.auxiliary["reward"] == spec.auxiliary_files["reward"]
        assert a.auxiliary["start"].sha256 == hashes[0] and a.auxiliary["start"].kind == "snapshot"
        assert a.auxiliary["old"].sha256 == hashes[max(0, r - 1 - 2)]
        shas = [x.sha256 for x in d.attachments]
        assert len(shas) == len(set(shas)), "the same bytes are attached twice"
        assert spec.auxiliary_files["reward"].sha256 not in shas  # files came with the module
    p1 = {d.message.round: {x.sha256 for x in d.attachments} for d in sim.delivered(Assign, dst="p1")}
    assert p1[1] == {hashes[0]}  # checkpoint 0 is the checkpoint and both snapshots
    assert p1[4] == {hashes[3]}  # p1 holds checkpoint 1 already (round 2's checkpoint)
    p2 = [d for d in sim.delivered(Assign, dst="p2")][0]
    assert p2.message.round == 5
    assert {x.sha256 for x in p2.attachments} == {hashes[4], hashes[0], hashes[2]}
    # evaluation of checkpoint 3 uses the rule of round 4
    v3 = [v for v in sim.validations if v.round == 3][0]
    assert v3.auxiliary["old"].sha256 == hashes[1] and v3.auxiliary["start"].sha256 == hashes[0]
    assert sim.checkpoint(3).metadata.to_json()["auxiliaryWeights"] == {"reward": sha(AUX_FILE)}


def test_continue_with_another_auxiliary_file_is_refused() -> None:
    spec, store = experience_spec(settings=exp_settings(epochs=2), aux=aux_slots(), aux_files={"reward": AUX_FILE})
    original = Sim.start_job(spec, store, ["p1"], job_seed=JOB_SEED)
    other_file = floats([4, 3, 2, 1])
    slots = aux_slots()
    slots[0]["sha256"] = sha(other_file)
    other, store2 = experience_spec(settings=exp_settings(epochs=4), aux=slots, aux_files={"reward": other_file})
    with pytest.raises(UsageError):
        Sim.resume(other, store2, original.checkpoint(2), mode="resume")


# ------------------------------------------------------------ validation


# 8 chunks, 2 peers: 4 rounds an epoch. 3 epochs can take 24 rounds (one chunk a round): past
# SHORT_JOB_ROUNDS, so the schedule's ``every`` decides. Round 0 is validated at Start.
@pytest.mark.parametrize("unit, every, epochs, expected", [
    ("round", 2, 3, [0, 2, 4, 6, 8, 10, 12]),
    ("round", 5, 3, [0, 5, 10, 12]),  # and always the last checkpoint
    ("epoch", 1, 3, [0, 4, 8, 12]),
    ("epoch", 2, 3, [0, 8, 12]),
    ("round", 5, 2, [0, 1, 2, 3, 4, 5, 6, 7, 8]),  # at most 16 rounds: a short job, validated every round
    ("epoch", 2, 2, [0, 1, 2, 3, 4, 5, 6, 7, 8]),
])
def test_validation_schedule(unit: str, every: int, epochs: int, expected: list[int]) -> None:
    spec, store = dataset_spec(8, settings=settings(epochs=epochs, validationSchedule={
        "enabled": True, "unit": unit, "every": every}), has_validation=True)
    sim = Sim.start_job(spec, store, ["p1", "p2"])
    assert [v.round for v in sim.validations] == expected
    assert all(v.experience is None for v in sim.validations)
    for v in sim.validations:
        sim.coordinator.validation_finished(v.round, {"loss": v.round / 10}, None, sim.now)
    summaries = {ck["artifact"]["round"]: ck for ck in sim.coordinator.checkpoints}
    for r, summary in summaries.items():
        if r in expected:
            assert summary["validationMetrics"] == {"values": {"loss": r / 10}, "examplesProcessed": 0}
        else:
            assert "validationMetrics" not in summary


def test_no_validation_without_a_file_or_when_disabled() -> None:
    spec, store = dataset_spec(4, settings=settings(validationSchedule={"enabled": True, "unit": "round",
                                                                        "every": 1}))
    sim = Sim.start_job(spec, store, ["p1", "p2"])
    assert sim.validations == []
    with pytest.raises(UsageError):
        sim.coordinator.request_validation(sim.now)
    spec, store = dataset_spec(4, settings=settings(validationSchedule={"enabled": False, "unit": "round",
                                                                        "every": 1}), has_validation=True)
    sim = Sim.start_job(spec, store, ["p1", "p2"])
    assert sim.validations == []
    sim.coordinator.request_validation(sim.now)
    sim.pump()
    assert [v.round for v in sim.validations] == [2]


def test_the_starting_checkpoint_is_validated_once_at_the_first_start() -> None:
    every_round = settings(validationSchedule={"enabled": True, "unit": "round", "every": 1})
    spec, store = dataset_spec(4, settings=every_round, has_validation=True)
    # runValidation() before Start (what the demo does): Start does not ask for round 0 again.
    sim = Sim.start_job(spec, store, ["p1", "p2"], start=False)
    sim.coordinator.request_validation(sim.now)
    sim.coordinator.start(sim.now)
    sim.pump()
    assert [v.round for v in sim.validations] == [0, 1, 2]
    # Its result lands on checkpoint 0, the chart's first point.
    sim = Sim.start_job(spec, store, ["p1", "p2"])
    sim.coordinator.validation_finished(0, {"loss": 2.0}, None, sim.now)
    assert sim.coordinator.checkpoints[0]["validationMetrics"]["values"] == {"loss": 2.0}
    # A job continued from checkpoint 2 validates that checkpoint at its Start; one reopened after a reload
    # (it trained already) does not.
    continued = Sim.resume(spec, store, sim.checkpoint(2), mode="new", start=False)
    continued.coordinator.start(continued.now)
    continued.pump()
    assert [v.round for v in continued.validations][:1] == [2]
    reopened = Coordinator.continue_from(spec, sim.checkpoint(2), mode="resume", my_peer_id=COORD,
                                         kernel=NumpyKernel(), now=sim.now, reopening=True)
    reopened.take_commands()
    reopened.start(sim.now)
    assert not [c for c in reopened.take_commands() if isinstance(c, RunValidation)]


# ------------------------------------------------------- invitations


def test_invitation_carries_descriptions_only() -> None:
    spec, store = dataset_spec(3, settings=settings())
    sim = Sim.create(spec, store)
    sim.add_peer("p1")
    sim.coordinator.invite("p1", sim.now)
    sim.pump()
    to_p1 = [d for d in sim.deliveries if d.dst == "p1"]
    assert len(to_p1) == 1 and isinstance(to_p1[0].message, Invitation) and to_p1[0].attachments == ()
    inv = to_p1[0].message
    assert inv.module == {"fileName": "model.wasm", "bytes": spec.module.bytes, "sha256": spec.module.sha256}
    assert inv.data_bytes == sum(ch.bytes for ch in spec.chunks) and inv.coordinator == COORD
    assert inv.settings == spec.settings.to_json() and inv.model_info == spec.info.raw
    assert sim.stores["p1"] == {}
    assert sim.coordinator.view(sim.now)["participants"]["p1"] == {"connected": True, "approved": False,
                                                                  "state": "invited"}
    sim.coordinator.start(sim.now)
    sim.pump()
    assert len([d for d in sim.deliveries if d.dst == "p1"]) == 1  # no work for an undecided peer
    sim.participants["p1"].decide(True, sim.now)
    sim.pump()
    deliver = sim.delivered(Deliver, dst="p1")[0]
    assert [a.kind for a in deliver.attachments] == ["module"]
    assert assigns(sim, peer="p1")


def test_declined_invitation() -> None:
    spec, store = dataset_spec(2, settings=settings())
    sim = Sim.create(spec, store)
    sim.add_peer("p2")
    sim.coordinator.invite("p2", sim.now)
    sim.pump()
    sim.participants["p2"].decide(False, sim.now)
    sim.pump()
    assert sim.coordinator.view(sim.now)["participants"]["p2"]["state"] == "declined"
    assert sim.messages(Deliver, dst="p2") == []
    sim.join("p1")
    sim.coordinator.start(sim.now)
    sim.pump()
    assert assigns(sim, peer="p2") == [] and sim.coordinator.status == "completed"
    # a declined peer may be invited again
    sim.coordinator.update_settings(TrainingSettings.from_json(settings(epochs=2)), sim.now)
    sim.coordinator.invite("p2", sim.now)


def test_invite_misuse() -> None:
    spec, store = dataset_spec(2, settings=settings())
    sim = Sim.create(spec, store)
    sim.join("p1")
    with pytest.raises(UsageError) as err:
        sim.coordinator.invite("p1", sim.now)
    assert err.value.reason == "already-participating"
    with pytest.raises(UsageError):
        sim.coordinator.invite(COORD, sim.now)
    sim.coordinator.start(sim.now)
    with pytest.raises(UsageError):
        sim.coordinator.start(sim.now)


def test_paused_contribution_gets_no_assignments() -> None:
    spec, store = dataset_spec(8, settings=settings())
    sim = Sim.start_job(spec, store, ["p1", "p2"], start=False)
    sim.auto_train = False
    sim.coordinator.start(sim.now)
    sim.pump()
    sim.participants["p1"].pause_contribution(True, sim.now)
    sim.pump()
    assert sim.coordinator.view(sim.now)["participants"]["p1"]["paused"] is True
    sim.finish()  # round 1 (p1 still finishes the one it had)
    sim.finish()  # round 2: p2 alone
    assert [len(assigns(sim, round_=r)) for r in (1, 2, 3)] == [2, 1, 1]
    assert assigns(sim, round_=3, peer="p1") == []
    sim.participants["p1"].pause_contribution(False, sim.now)
    sim.pump()
    sim.finish()
    assert len(assigns(sim, round_=4)) == 2
    sim.run_to_end()
    assert sim.coordinator.status == "completed"


def test_participant_leaving_mid_round() -> None:
    spec, store = dataset_spec(4, settings=settings())
    sim = Sim.start_job(spec, store, ["p1", "p2"], start=False)
    sim.auto_train = False
    sim.coordinator.start(sim.now)
    sim.pump()
    left = dict(sim.pending)["p1"]
    sim.pending = [(p, a) for p, a in sim.pending if p != "p1"]
    sim.participants["p1"].leave(sim.now)
    sim.pump()
    assert sim.coordinator.view(sim.now)["participants"]["p1"]["state"] == "stopped"
    sim.run_to_end()
    c = sim.coordinator
    assert c.status == "completed" and not c.incomplete
    assert assigns(sim, round_=2)[0].chunk.id == left.chunk.id
    assert {d.dst for d in sim.delivered(Assign) if d.message.round > 1} == {"p2"}
    # anything p1 still sends is ignored
    sim.coordinator.receive("p1", sim.messages(Update, src="p2")[0], {}, sim.now)
    assert c.rejected == []


def test_reconnect_catches_up_with_module_and_checkpoint() -> None:
    spec, store = dataset_spec(8, settings=settings())
    sim = Sim.start_job(spec, store, ["p1", "p2"], start=False)
    sim.auto_train = False
    sim.coordinator.start(sim.now)
    sim.pump()
    sim.finish()
    sim.pending = [(p, a) for p, a in sim.pending if p != "p1"]
    sim.disconnect("p1")
    sim.stores["p1"].clear()  # a reloaded page
    sim.finish()
    sim.reconnect("p1")
    assert len(sim.messages(Deliver, dst="p1")) == 2
    assert sim.participants["p1"].state == "modelLoaded"
    sim.finish()
    back = sim.delivered(Assign, dst="p1")[-1]
    assert back.message.round == 4 and "checkpoint" in [a.kind for a in back.attachments]
    sim.run_to_end()
    assert sim.coordinator.status == "completed"


def test_join_grace_waits_for_loading_participants() -> None:
    spec, store = dataset_spec(4, settings=settings())
    sim = Sim.create(spec, store)
    sim.join("p1")
    sim.slow_load.add("p2")
    sim.join("p2")
    sim.auto_train = False
    sim.coordinator.start(sim.now)
    sim.pump()
    assert assigns(sim) == [] and sim.coordinator.next_timer() == sim.now + JOIN_GRACE_MS
    sim.release_loads()
    assert sorted(p for p, _ in sim.pending) == ["p1", "p2"]


def test_join_grace_ends_at_its_deadline() -> None:
    spec, store = dataset_spec(4, settings=settings())
    sim = Sim.create(spec, store)
    sim.join("p1")
    sim.slow_load.add("p2")
    sim.join("p2")
    sim.auto_train = False
    sim.coordinator.start(sim.now)
    sim.pump()
    sim.advance(JOIN_GRACE_MS - 1)
    assert assigns(sim) == []
    sim.advance(1)
    assert [p for p, _ in sim.pending] == ["p1"]


def test_coordinator_pause_and_stop() -> None:
    spec, store = dataset_spec(6, settings=settings())
    sim = Sim.start_job(spec, store, ["p1", "p2"], start=False)
    sim.auto_train = False
    c = sim.coordinator
    c.start(sim.now)
    sim.pump()
    c.pause(sim.now)
    sim.finish()  # open attempts finish, the round closes, no new round
    assert sim.rounds == [0, 1] and assigns(sim, round_=2) == [] and c.status == "paused"
    with pytest.raises(UsageError):
        c.pause(sim.now)
    c.resume_running(sim.now)
    sim.pump()
    assert len(assigns(sim, round_=2)) == 2
    view = c.view(sim.now)
    assert [s["status"] for s in view["slots"]] == ["training", "training"]
    c.stop(sim.now)
    sim.pump()
    assert c.status == "completed" and c.incomplete and sim.rounds == [0, 1]
    assert sim.messages(JobFinished, dst="p1") == [JobFinished(JOB_ID, True)]
    with pytest.raises(UsageError):
        c.stop(sim.now)


def test_coordinator_participates_through_its_own_machine() -> None:
    spec, store = dataset_spec(6, settings=settings(coordinatorParticipates=True))
    sim = Sim.start_job(spec, store, ["p1"])
    assert sim.coordinator.status == "completed"
    assert {d.dst for d in sim.delivered(Assign, dst=COORD)} == {COORD}
    assert [a.round for a in assigns(sim, peer=COORD)] == [1, 2, 3]


def test_one_hostile_participant_can_neither_drop_chunks_nor_stall_the_pass() -> None:
    from sim import nan_at, replace_weights

    spec, store = dataset_spec(6, settings=settings())
    sim = Sim.create(spec, store)
    sim.tamper["p1"] = replace_weights(nan_at(0))  # every update of p1 is poisoned
    for peer in ("p1", "p2"):
        sim.join(peer)
    sim.coordinator.start(sim.now)
    sim.pump()
    c = sim.coordinator
    assert c.status == "completed" and not c.incomplete and c.dataset.dropped == []
    assert set(sim.reasons()) == {"non-finite-weights"}
    last = sim.checkpoint(sim.rounds[-1]).metadata.to_json()
    assert sorted(last["trainedChunkIds"]) == [f"c{i:03d}" for i in range(6)]
