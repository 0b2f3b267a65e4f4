"""Snapshot slots (initial, roundsAgo) keep their rule across a reload and a continue; other files are refused."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from weei.api.job_store import JobStore
from weei.core.job.coordinator import Coordinator
from weei.core.errors import UsageError
from weei.core.wire.messages import Assign
from weei.host.memory_storage import MemoryStorage
from weei.kernel.numpy_kernel import NumpyKernel

from sim import COORD, JOB_ID, Sim, experience_spec, floats, sha

JOB_SEED = 0x1234_5678_9ABC_DEF0
AUX_FILE = floats([1, 2, 3, 4])
ROUNDS_AGO = 2


def slots() -> list[dict[str, Any]]:
    return [
        {"id": "reward", "role": "reward-model", "bytes": len(AUX_FILE), "sha256": sha(AUX_FILE)},
        {"id": "start", "role": "reference-policy", "bytes": 64, "source": {"kind": "initial"}},
        {"id": "old", "role": "opponent", "bytes": 64, "source": {"kind": "checkpoint", "roundsAgo": ROUNDS_AGO}},
    ]


def exp_settings(epochs: int) -> dict[str, Any]:
    return {"epochs": epochs, "localEpochs": 1, "batchSize": 4, "coordinatorParticipates": False}


def original_job(rounds: int, epochs: int = 10) -> Sim:
    spec, store = experience_spec(settings=exp_settings(epochs), aux=slots(), aux_files={"reward": AUX_FILE})
    sim = Sim.start_job(spec, store, ["p1"], job_seed=JOB_SEED, start=False)
    sim.auto_train = False
    sim.coordinator.start(sim.now)
    sim.pump()
    for _ in range(rounds):
        sim.finish()
    assert sim.coordinator.checkpoint_round == rounds
    return sim


def saved_hashes(sim: Sim) -> dict[int, str]:
    return {s.round: s.weights_sha256 for s in sim.saved}


def assigns_by_round(sim: Sim) -> dict[int, Assign]:
    return {d.message.round: d.message for d in sim.delivered(Assign)}


def reopen(original: Sim, summaries: list[dict]) -> Coordinator:
    """The page reloads: the job is rebuilt from its last checkpoint and the summaries it saved."""
    last = original.checkpoint(original.coordinator.checkpoint_round)
    reopened = Coordinator.continue_from(original.coordinator.spec, last, mode="resume",
                                  my_peer_id=COORD, kernel=NumpyKernel(), now=original.now, reopening=True)
    reopened.restore_checkpoints(summaries)
    return reopened


def run_again(original: Sim, reopened: Coordinator) -> Sim:
    """The reopened job, started with p1 back, up to its first hand-out."""
    sim = Sim(reopened, dict(original.coord_store), now=original.now)
    sim.auto_train = False
    sim.pump()
    sim.join("p1")
    reopened.start(sim.now)
    sim.pump()
    return sim


def test_a_reopened_job_names_the_snapshots_its_rule_picks() -> None:
    original = original_job(5)
    hashes = saved_hashes(original)
    reopened = reopen(original, original.coordinator.checkpoints)
    assert reopened.checkpoint_hashes == hashes
    # Checkpoints 3..5 may still be named by roundsAgo 2, checkpoint 0 by initial.
    assert reopened.snapshot_checkpoints() == {r: hashes[r] for r in (0, 3, 4, 5)}
    sim = run_again(original, reopened)
    sim.finish()
    sim.finish()
    hashes = saved_hashes(original) | saved_hashes(sim)
    assigns = assigns_by_round(sim)
    assert sorted(assigns) == [6, 7, 8]
    for r, a in assigns.items():
        assert a.auxiliary["start"].sha256 == hashes[0], f"round {r}: initial is checkpoint 0"
        assert a.auxiliary["old"].sha256 == hashes[r - 1 - ROUNDS_AGO], f"round {r}: two rounds before its checkpoint"
        assert a.auxiliary["reward"].sha256 == sha(AUX_FILE)
    assert assigns[6].auxiliary["old"].sha256 != hashes[5]  # not the newest checkpoint


def test_a_continued_job_counts_its_snapshots_from_the_checkpoint_it_continued_from() -> None:
    original = original_job(4)
    spec, store = experience_spec(settings=exp_settings(10), aux=slots(), aux_files={"reward": AUX_FILE})
    sim = Sim.resume(spec, store, original.checkpoint(4), mode="resume", peers=["p1"], start=False)
    sim.auto_train = False
    sim.coordinator.start(sim.now)
    sim.pump()
    for _ in range(4):
        sim.finish()
    first = sha(original.checkpoint(4).weights)
    hashes = {4: first, **saved_hashes(sim)}  # the host saves the imported checkpoint, the coordinator the rest
    assert sim.coordinator.checkpoint_hashes == hashes
    assigns = assigns_by_round(sim)
    assert sorted(assigns) == [5, 6, 7, 8, 9]
    for r, a in assigns.items():
        # The job's initial weights are the checkpoint it started from: earlier ones belong to another job.
        assert a.auxiliary["start"].sha256 == first
        assert a.auxiliary["old"].sha256 == hashes[max(4, r - 1 - ROUNDS_AGO)]
    assert assigns[8].auxiliary["old"].sha256 == hashes[5]
    assert assigns[9].auxiliary["old"].sha256 == hashes[6]
    assert sim.coordinator.snapshot_checkpoints() == {r: hashes[r] for r in (4, 6, 7, 8)}


@pytest.mark.parametrize("recorded_file, continued_file", [
    (AUX_FILE, floats([4, 3, 2, 1])),  # another file
    (None, AUX_FILE),  # the checkpoint recorded none
    (AUX_FILE, None),  # the continuing model has no such file slot
])
def test_continuing_with_other_auxiliary_files_is_refused_by_name(recorded_file: bytes | None,
                                                                  continued_file: bytes | None) -> None:
    def job(file: bytes | None, epochs: int) -> tuple[Any, dict[str, bytes]]:
        aux = slots()[1:] if file is None else [{**slots()[0], "sha256": sha(file)}, *slots()[1:]]
        return experience_spec(settings=exp_settings(epochs), aux=aux,
                               aux_files={} if file is None else {"reward": file})

    spec, store = job(recorded_file, 2)
    original = Sim.start_job(spec, store, ["p1"], job_seed=JOB_SEED)
    other, store2 = job(continued_file, 4)
    with pytest.raises(UsageError) as caught:
        Sim.resume(other, store2, original.checkpoint(2), mode="resume")
    assert caught.value.reason == "auxiliary-files-differ"
    assert "'reward'" in caught.value.message


def test_reopen_reads_back_the_snapshot_weights_from_storage() -> None:
    original = original_job(5)

    async def main() -> None:
        storage = MemoryStorage()
        writer = JobStore(storage)
        await writer.put_artifacts({k: v for k, v in original.coord_store.items()
                                    if k in (original.coordinator.spec.module.sha256, sha(AUX_FILE))})
        for command in original.saved:
            await writer.save_checkpoint(JOB_ID, command)
        await writer.save_job_record(original.coordinator, job_seed=JOB_SEED, validation_sha256=None,
                                     now=original.now, status="running")
        store = JobStore(storage)  # a new page
        await store.load()
        reopened = await store.reopen(JOB_ID, my_peer_id=COORD, kernel=NumpyKernel(), now=original.now)
        hashes = saved_hashes(original)
        for r in (0, 3, 4, 5):
            assert sha(store.artifact(hashes[r])) == hashes[r]
        assert hashes[1] not in store.artifacts and hashes[2] not in store.artifacts  # no rule names them again
        assert reopened.coordinator.checkpoint_hashes == hashes

    asyncio.run(main())


def test_a_checkpoint_that_was_never_saved_gives_way_to_the_one_before_it() -> None:
    original = original_job(5)
    hashes = saved_hashes(original)
    summaries = [s for s in original.coordinator.checkpoints if s["artifact"]["round"] != 3]  # its save was refused
    reopened = reopen(original, summaries)
    assert 3 not in reopened.checkpoint_hashes
    assert reopened.snapshot_checkpoints() == {r: hashes[r] for r in (0, 2, 4, 5)}
    sim = run_again(original, reopened)
    (assign,) = [d.message for d in sim.delivered(Assign)]
    assert assign.round == 6 and assign.auxiliary["old"].sha256 == hashes[2]
