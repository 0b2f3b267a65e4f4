"""A securely aggregated round that loses a peer or gets a sum it must not write (docs/privacy.md, "In a job's
rounds"): the coordinator's side of the protocol (core/job/secure_aggregator.py) against what the job does with
its attempts, its work and its round (core/job/coordinator.py). In memory under simulated time.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from sim import Sim, dataset_spec, sha
from weei.core.job.secure_round import SECAGG_PHASE_TIMEOUT_MS
from weei.core.privacy.secagg import AdvertiseKeys
from weei.core.wire.messages import ArtifactRef, Message, SecAggKeys, SecAggMasked, SecAggShares

PEERS = [f"p{i}" for i in range(1, 6)]
Hook = Any


def secure_sim(**settings: Any) -> Sim:
    """Five participants, one chunk each; round 1 not started yet."""
    spec, store = dataset_spec(5, settings={"epochs": 1, "localEpochs": 1, "batchSize": 4,
                                            "coordinatorParticipates": False,
                                            "privacy": {"secureAggregation": True, "clip": 0.035}, **settings})
    return Sim.start_job(spec, store, peers=PEERS, start=False)


def events(sim: Sim, name: str) -> list[dict[str, Any]]:
    return [log.details for peer, log in sim.logs if peer == sim.coordinator.my_peer_id and log.event == name]


def lose(kind: type) -> Hook:
    return lambda message, blobs: [] if isinstance(message, kind) else [(message, blobs)]


def chunks_trained(sim: Sim, round_: int) -> dict[str, str]:
    return {peer: a.chunk.id for peer, a in sim.trained if a.round == round_ and a.chunk is not None}


def test_keys_that_are_not_keys_end_that_attempt_and_the_round_aggregates_the_others() -> None:
    sim = secure_sim()
    # All-zero public keys are of low order: agreeing with them would give away the shared secret.
    sim.tamper["p2"] = lambda m, b: [(replace(m, keys=AdvertiseKeys(bytes(32), bytes(32)))
                                      if isinstance(m, SecAggKeys) else m, b)]
    sim.coordinator.start(sim.now)
    sim.pump()
    refused = events(sim, "secagg.refused")
    assert [(e["peer"], e["reason"]) for e in refused] == [("p2", "secagg-bad-key")]
    assert events(sim, "secagg.started")[0]["participants"] == ["p1", "p3", "p4", "p5"]
    assert events(sim, "secagg.finished")[0]["contributors"] == ["p1", "p3", "p4", "p5"]
    assert sim.rounds == [0, 1]
    # p2's chunk failed with its attempt: it goes back and round 2 trains it.
    assert list(chunks_trained(sim, 2).values()) == [chunks_trained(sim, 1)["p2"]]


def test_a_peer_whose_channel_closes_mid_protocol_is_left_out_at_once_and_its_work_goes_back() -> None:
    sim = secure_sim()
    sim.tamper["p2"] = lose(SecAggShares)  # keyed, then silent
    sim.coordinator.start(sim.now)
    sim.pump()
    assert sim.rounds == [0] and sim.coordinator.round is not None and sim.coordinator.round.securing
    deadline = sim.coordinator.next_timer()
    assert deadline is not None and deadline > sim.now
    sim.disconnect("p2")  # the share stage stops waiting for it: no need to reach the deadline
    finished = events(sim, "secagg.finished")
    assert [(e["contributors"], e["dropped"]) for e in finished] == [(["p1", "p3", "p4", "p5"], ["p2"])]
    assert sim.rounds == [0, 1]
    assert list(chunks_trained(sim, 2).values()) == [chunks_trained(sim, 1)["p2"]]


def test_a_keyed_peer_gone_before_the_protocol_starts_is_dropped_when_it_starts() -> None:
    sim = secure_sim()
    sim.auto_train = False
    sim.coordinator.start(sim.now)
    sim.pump()
    first = sim.pending[0][0]
    sim.finish([0])  # its keys are in: its attempt ended
    sim.disconnect(first)
    sim.finish()  # the last keys close training: the protocol starts without waiting for the gone peer
    assert events(sim, "secagg.started")[0]["participants"] == PEERS
    assert [e["dropped"] for e in events(sim, "secagg.finished")] == [[first]]
    assert sim.rounds == [0, 1]


def test_a_sum_beyond_the_clip_fails_the_round_by_name_keeps_the_checkpoint_and_gives_the_work_back() -> None:
    def inflate(message: Message, blobs: dict[str, bytes]) -> list[tuple[Message, dict[str, bytes]]]:
        if not isinstance(message, SecAggMasked):
            return [(message, blobs)]
        data = bytearray(blobs[message.masked.sha256])
        data[7] ^= 0x20  # the first ring element (u64, little-endian) moves by 2^61: far beyond any clipped delta
        ref = ArtifactRef(message.masked.kind, sha(bytes(data)), len(data))
        return [(replace(message, masked=ref), {ref.sha256: bytes(data)})]

    sim = secure_sim()
    sim.tamper["p3"] = inflate
    sim.coordinator.start(sim.now)
    sim.pump()
    c = sim.coordinator
    assert [(e["round"], e["reason"]) for e in events(sim, "round.failed")] == [(1, "secagg-sum-out-of-range")]
    assert events(sim, "job.paused")[-1]["reason"] == "round-failed"
    assert c.status == "paused" and c.checkpoint_round == 0 and sim.rounds == [0]
    assert c.error is not None and "secagg-sum-out-of-range" in c.error
    # Every contributor's chunk is queued again, not counted against it: the person fixes the cause and resumes.
    assert c.dataset is not None and not c.dataset.in_flight and not c.dataset.failures
    assert sorted(c.dataset.queue) == sorted(chunks_trained(sim, 1).values())


def test_stop_abandons_a_running_protocol() -> None:
    sim = secure_sim()
    sim.tamper["p2"] = lose(SecAggShares)
    sim.coordinator.start(sim.now)
    sim.pump()
    c = sim.coordinator
    assert c.round is not None and c.round.securing
    c.stop(sim.now)
    sim.pump()
    assert c.status == "completed" and c.incomplete and not c.round.securing and c.next_timer() is None
    sim.advance(SECAGG_PHASE_TIMEOUT_MS)  # the share stage's deadline passes: nothing is aggregated
    assert sim.rounds == [0] and not events(sim, "secagg.finished") and not events(sim, "secagg.failed")
