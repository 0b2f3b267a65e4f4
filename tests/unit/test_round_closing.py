"""Closing a round is all or nothing (issue 20, finding 2): a peer's finite but huge metric cannot stall
the job, and any error while closing leaves the previous checkpoint and a job paused by name.

Coordinator and participants in memory under simulated time (tests/unit/sim.py).
"""

from __future__ import annotations

import math
from dataclasses import replace
from fractions import Fraction
from typing import Any

import pytest
from sim import Sim, dataset_spec

from weei.core.formats import checkpoint as ckpt
from weei.core.aggregation.aggregate import weighted_mean
from weei.core.errors import CheckpointError, CheckpointReason
from weei.core.wire.messages import Update

PEERS = ("p1", "p2", "p3")


def three_peers(**settings: Any) -> Sim:
    spec, store = dataset_spec(6, settings={"epochs": 1, "localEpochs": 1, "batchSize": 4,
                                            "coordinatorParticipates": False, **settings})
    sim = Sim.create(spec, store)
    sim.auto_train = False  # each round waits for sim.finish(): the test sees the next round go out
    for peer in PEERS:
        sim.join(peer)
    return sim


def logged(sim: Sim, event: str) -> list[dict[str, Any]]:
    return [log.details for peer, log in sim.logs if peer == sim.coordinator.my_peer_id and log.event == event]


@pytest.mark.parametrize("aggregation", [{}, {"aggregation": {"method": "fedavg", "normClip": 3,
                                                               "combine": "trimmedMean"}}], ids=["fedavg", "robust"])
def test_a_1e308_metric_from_one_of_three_participants_closes_the_round_and_the_job_goes_on(
        aggregation: dict[str, Any]) -> None:
    sim = three_peers(**aggregation)
    sim.behaviour["p2"] = lambda assign, start, default: replace(default, metrics={"loss": 1e308})
    sim.coordinator.start(sim.now)
    sim.pump()
    sim.finish()
    c = sim.coordinator
    assert c.status == "running" and c.error is None and c.rejected == [] and c.checkpoint_round == 1
    # The example-weighted mean, finite, and as exact as float64 allows.
    updates = [m for m in sim.messages(Update) if m.round == 1]
    exact = sum(Fraction(u.metrics["loss"]) * u.count for u in updates) / sum(u.count for u in updates)
    loss = sim.checkpoint(1).metadata.to_json()["metrics"]["values"]["loss"]
    assert math.isfinite(loss) and loss == pytest.approx(float(exact), rel=1e-15)
    # Round 2 is out, under a deadline, and the job runs to its end.
    assert len(sim.pending) == 3 and c.next_timer() is not None
    sim.run_to_end()
    assert c.status == "completed" and sim.rounds == [0, 1, 2]


def test_the_weighted_mean_is_finite_for_any_finite_values() -> None:
    big = 1.7976931348623157e308
    assert weighted_mean([(big, 2**53), (big, 2**53 - 1)]) == big
    assert weighted_mean([(big, 3), (-big, 1)]) == pytest.approx(big / 2, rel=1e-15)
    assert weighted_mean([(5e-324, 7), (0.0, 1)]) == 5e-324
    assert weighted_mean([(0.0, 4)]) == 0.0
    # Where nothing overflows, the very bits of sum(v * c) / sum(c).
    pairs = [(0.1, 10), (0.7, 11), (1e-3, 12)]
    assert weighted_mean(pairs) == sum(v * c for v, c in pairs) / 33
    with pytest.raises(ValueError):
        weighted_mean([(1.0, 0)])


@pytest.mark.parametrize("error", [CheckpointError(CheckpointReason.FILE_TOO_LARGE, "checkpoint: too large for the test"),
                                   OSError("the writer broke")], ids=["checkpoint-error", "any-error"])
def test_an_error_while_closing_keeps_the_last_checkpoint_and_pauses_the_job_by_name(
        monkeypatch: pytest.MonkeyPatch, error: Exception) -> None:
    sim = three_peers()
    c = sim.coordinator
    real = ckpt.prepare_checkpoint

    def writer(metadata: Any, *args: Any, **kwargs: Any) -> Any:
        if metadata["round"] == 1:
            raise error
        return real(metadata, *args, **kwargs)

    monkeypatch.setattr(ckpt, "prepare_checkpoint", writer)
    c.start(sim.now)
    sim.pump()
    before = (c.weights, c.weights_sha256, dict(c.checkpoint_hashes), [dict(s) for s in c.checkpoints])
    trained = sorted(assign.chunk.id for _, assign in sim.pending)
    sim.finish()

    reason = "file-too-large" if isinstance(error, CheckpointError) else "OSError"
    assert c.status == "paused" and c.error.startswith("round 1 failed") and f"({reason})" in c.error
    assert logged(sim, "job.paused")[-1] == {"reason": "round-failed"}
    assert logged(sim, "round.failed")[-1]["reason"] == reason
    # Nothing of round 1 was written down: counter, weights, checkpoints, what was saved.
    assert c.checkpoint_round == 0 and sim.rounds == [0]
    assert (c.weights, c.weights_sha256, c.checkpoint_hashes, c.checkpoints) == before
    assert sorted(c.view(sim.now)["queue"][:3]) == trained  # its chunks are trained again
    assert c.next_timer() is None and not sim.pending  # paused, not running without a timer

    monkeypatch.setattr(ckpt, "prepare_checkpoint", real)
    c.resume_running(sim.now)
    sim.pump()
    sim.run_to_end()
    assert c.status == "completed" and sim.rounds == [0, 1, 2]
