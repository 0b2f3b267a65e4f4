"""Secure aggregation in a job's rounds (docs/privacy.md), in memory under simulated time.

The coordinator sees keys, sealed shares, masked vectors and revealed shares; the checkpoints it writes are,
bit for bit, FedAvg of the participants' clipped, fixed-point-encoded updates: f32(start + Σ enc(c_i·clip(δ_i)) /
Σ c_i), the ring sum decoded exactly. Against the floating-point FedAvg of the same updates only the grid's
rounding differs (at most n half-steps of 2^-bits per coordinate before the division).
"""

from __future__ import annotations

from array import array
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from sim import Sim, dataset_spec, default_outcome, sha, to_floats
from secure_sim import BASE, CLIP, PEERS, events, expected_round, lose, secure_spec
from weei.core.job.secure_round import SECAGG_PHASE_TIMEOUT_MS, SecureTerms
from weei.core.privacy.dp_noise import gaussians, noise_key
from weei.core.privacy.secagg import UnmaskShares
from weei.core.wire.messages import ArtifactRef, Message, SecAggKeys, SecAggMasked, SecAggReveal, SecAggRoster, Update
from weei.kernel.native import NativeKernel


def test_a_secure_job_completes_and_its_checkpoints_are_fixed_point_fedavg_bit_for_bit() -> None:
    spec, store = secure_spec()
    sim = Sim.start_job(spec, store, peers=PEERS)
    assert sim.coordinator.status == "completed" and sim.rounds == [0, 1, 2]
    for round_ in (1, 2):
        assert sim.checkpoint(round_).weights == expected_round(sim, round_, PEERS)
    # Nothing left a participant in the clear: no Update, only keys, shares, masked vectors and reveals.
    assert not sim.messages(Update, dst="coord")
    assert len(sim.messages(SecAggMasked, dst="coord")) == 10 and len(sim.messages(SecAggKeys, dst="coord")) == 10
    # Against the float FedAvg of the same clipped updates: the grid's rounding only.
    before = sim.checkpoint(0).weights
    start = to_floats(before).astype(np.float64)
    outcomes = [default_outcome(a, before) for _, a in sim.trained if a.round == 1]
    deltas = [to_floats(o.weights).astype(np.float64) - start for o in outcomes]
    clipped = [d * min(1.0, CLIP / np.linalg.norm(d)) for d in deltas]
    counts = np.array([o.count for o in outcomes], dtype=np.float64)
    fedavg = start + sum(c * d for c, d in zip(counts, clipped)) / counts.sum()
    assert np.max(np.abs(fedavg.astype(np.float32) - to_floats(sim.checkpoint(1).weights))) <= 1e-6
    assert sim.checkpoint(1).metadata.to_json()["metrics"]["values"] == {}  # per-participant metrics stay home


class CountingKernel(NativeKernel):
    """The native kernel, counting the X25519 calls made through it."""

    def __init__(self) -> None:
        super().__init__()
        self.x25519_calls = 0

    def x25519(self, k: bytes, u: bytes) -> bytes:
        self.x25519_calls += 1
        return super().x25519(k, u)


def test_the_key_agreements_run_on_the_kernel_and_write_the_same_checkpoints_as_the_pure_python_ladder() -> None:
    spec, store = secure_spec()
    kernel = CountingKernel()
    sim = Sim.start_job(spec, store, peers=PEERS, kernel=kernel)
    reference = Sim.start_job(spec, store, peers=PEERS)  # NumpyKernel: the pure-Python ladder
    assert sim.coordinator.status == reference.coordinator.status == "completed" and sim.rounds == [0, 1, 2]
    for round_ in (1, 2):
        assert sim.checkpoint(round_).weights == reference.checkpoint(round_).weights == expected_round(sim, round_, PEERS)
    # Every X25519 of the protocol went through the kernel: a round's 10 per participant (two key pairs, four
    # sealing agreements, four mask agreements) and the coordinator's 2 per participant (its keys' low-order
    # probe, once: the server does not check them again).
    assert kernel.x25519_calls == 2 * len(PEERS) * (10 + 2)


def test_with_a_clip_no_update_reaches_the_plain_fedavg_job_matches_to_the_grid() -> None:
    spec, store = secure_spec(clip=1000)
    secure = Sim.start_job(spec, store, peers=PEERS)
    plain_spec, plain_store = dataset_spec(10, settings=BASE)
    plain = Sim.start_job(plain_spec, plain_store, peers=PEERS)
    for round_ in (1, 2):
        a, b = to_floats(secure.checkpoint(round_).weights), to_floats(plain.checkpoint(round_).weights)
        assert secure.checkpoint(round_).weights == expected_round(secure, round_, PEERS, clip=1000)
        assert np.max(np.abs(a - b)) <= 2 * np.spacing(np.float32(2.0))  # a float32 ulp or two near the weights


@pytest.mark.parametrize("gone", [{"p2"}, {"p2", "p5"}])
def test_one_or_two_participants_that_vanish_after_masking_do_not_ruin_the_round(gone: set[str]) -> None:
    # n = 5, t = max(2, ceil(0.6 * 5)) = 3: their masked vectors came, their shares do not.
    spec, store = secure_spec(chunks=5)
    sim = Sim.start_job(spec, store, peers=PEERS, start=False)
    sim.tamper.update(lose(SecAggReveal, gone))
    sim.coordinator.start(sim.now)
    sim.pump()
    assert sim.rounds == [0] and sim.coordinator.transitioning
    sim.advance(SECAGG_PHASE_TIMEOUT_MS)
    assert sim.coordinator.status == "completed" and sim.rounds == [0, 1]
    assert sim.checkpoint(1).weights == expected_round(sim, 1, PEERS)  # their self masks rebuilt from shares
    assert sim.messages(SecAggRoster, dst="p1")[0].threshold == 3


def test_participants_that_vanish_before_masking_are_left_out_and_their_work_goes_back() -> None:
    spec, store = secure_spec(chunks=5)
    sim = Sim.start_job(spec, store, peers=PEERS, start=False)
    sim.tamper.update(lose(SecAggMasked, {"p1", "p4"}))
    sim.coordinator.start(sim.now)
    sim.pump()
    sim.advance(SECAGG_PHASE_TIMEOUT_MS)
    assert sim.rounds == [0, 1]
    assert sim.checkpoint(1).weights == expected_round(sim, 1, ["p2", "p3", "p5"])  # pairwise masks rebuilt
    assert events(sim, "secagg.finished")[0]["dropped"] == ["p1", "p4"]
    sim.tamper.clear()  # round 2 (their two chunks) opened meanwhile: at worst it fails once below t and is retried
    sim.advance(SECAGG_PHASE_TIMEOUT_MS)
    assert sim.coordinator.status == "completed" and sim.rounds == [0, 1, 2]
    assert {a.chunk.id for _, a in sim.trained if a.round == 2 and a.chunk is not None} == {"c000", "c003"}


def test_below_the_threshold_the_round_fails_by_name_and_is_retried_with_fresh_keys() -> None:
    spec, store = secure_spec(chunks=5)
    sim = Sim.start_job(spec, store, peers=PEERS, start=False)
    sim.tamper.update(lose(SecAggReveal, {"p1", "p2", "p3"}))
    sim.coordinator.start(sim.now)
    sim.pump()
    keys_before = {bytes(m.keys.s_pk) for m in sim.messages(SecAggKeys, dst="coord")}
    sim.tamper.clear()
    sim.advance(SECAGG_PHASE_TIMEOUT_MS)
    failed = events(sim, "secagg.failed")
    assert [(f["round"], f["opening"], f["reason"]) for f in failed] == [(1, 1, "secagg-below-threshold")]
    assert sim.coordinator.status == "completed" and sim.rounds == [0, 1]
    second = [m for m in sim.messages(SecAggKeys, dst="coord") if m.attempt == 2]
    assert len(second) == 5 and not keys_before & {bytes(m.keys.s_pk) for m in second}
    assert sim.checkpoint(1).weights == expected_round(sim, 1, PEERS)


def test_a_participant_that_reveals_a_bad_share_is_named_and_left_out_of_later_rounds() -> None:
    def corrupt(message: Message, blobs: dict[str, bytes]) -> list[tuple[Message, dict[str, bytes]]]:
        if isinstance(message, SecAggReveal):
            (dealer, y, salt), *rest = message.reveal.seed_shares
            message = replace(message, reveal=UnmaskShares(message.reveal.key_shares, ((dealer, y + 1, salt), *rest)))
        return [(message, blobs)]

    spec, store = secure_spec()
    sim = Sim.start_job(spec, store, peers=PEERS, start=False)
    sim.tamper["p3"] = corrupt
    sim.coordinator.start(sim.now)
    sim.pump()
    assert [(e["peer"], e["reason"]) for e in events(sim, "secagg.bad-peer")] == [("p3", "secagg-bad-share")]
    assert sim.checkpoint(1).weights == expected_round(sim, 1, PEERS)  # four good shares of each seed: enough
    assert sim.coordinator.peers["p3"].excluded
    assert sorted(p for p, a in sim.trained if a.round == 2) == ["p1", "p2", "p4", "p5"]


def test_a_plain_update_in_a_secure_job_is_refused_unread() -> None:
    spec, store = secure_spec(chunks=5)
    sim = Sim.start_job(spec, store, peers=PEERS, start=False)
    sim.auto_train = False
    sim.coordinator.start(sim.now)
    sim.pump()
    (peer, assign), (other, second) = sim.pending[:2]
    outcome = default_outcome(assign, sim.checkpoint(0).weights)
    ref = ArtifactRef("update", sha(outcome.weights), len(outcome.weights))
    update = Update(assign.job_id, assign.round, assign.assignment_id, assign.attempt_id, assign.checkpoint.sha256,
                    ref, dict(outcome.metrics), outcome.count)
    sim.coordinator.receive(peer, update, {ref.sha256: outcome.weights}, sim.now)
    sim.pump()
    assert sim.reasons() == ["secure-aggregation"]
    # A host that does not say what it trained from cannot mask: the attempt fails rather than leak.
    sim.participants[other].training_finished(second.attempt_id, default_outcome(second, sim.checkpoint(0).weights),
                                              sim.now)
    assert "secure aggregation needs the weights" in (sim.participants[other].last_error or "")


def test_dp_with_secure_aggregation_noises_the_unmasked_mean_reproducibly() -> None:
    dp = {"clip": CLIP, "noiseMultiplier": 1.0, "delta": 1e-5, "maxRounds": 2}
    spec, store = dataset_spec(10, settings={**BASE, "privacy": {"secureAggregation": True, "dp": dp}})
    runs = [Sim.start_job(spec, store, peers=PEERS, dp_noise_seed=bytes(range(32))) for _ in range(2)]
    for sim in runs:
        assert sim.coordinator.status == "completed" and sim.rounds == [0, 1, 2]
        assert sim.checkpoint(2).metadata.to_json()["privacy"]["dp"]["rounds"] == 2
        terms = SecureTerms.from_settings(sim.trained[0][1].settings)
        assert terms is not None and not terms.weighted and terms.max_weight == 1.0
    assert runs[0].checkpoint(2).weights == runs[1].checkpoint(2).weights
    # The unweighted mean of the clipped deltas, unmasked, then N(0, (σ·C/n)²) per weight from the job's stream.
    sim = runs[0]
    mean = array("f", expected_round(sim, 1, PEERS, weighted=False))
    noise = gaussians(noise_key(bytes(range(32)), spec.job_id, 1), len(mean))
    assert sim.checkpoint(1).weights == array("f", [m + CLIP / 5 * z for m, z in zip(mean, noise)]).tobytes()


def test_an_experience_job_is_securely_aggregated_with_the_models_most_units_as_the_largest_weight() -> None:
    from sim import experience_spec
    spec, store = experience_spec(settings={**BASE, "epochs": 2, "privacy": {"secureAggregation": True, "clip": CLIP}})
    sim = Sim.start_job(spec, store, peers=PEERS, job_seed=11)
    assert sim.coordinator.status == "completed" and sim.rounds == [0, 1, 2]
    terms = SecureTerms.from_settings(sim.trained[0][1].settings)
    assert terms is not None and terms.max_weight == 64.0  # experience_info's unitsPerAssignment maximum
    for round_ in (1, 2):
        assert sim.checkpoint(round_).weights == expected_round(sim, round_, PEERS)


def test_a_participant_invited_to_secure_aggregation_never_sends_its_update_in_the_clear() -> None:
    # A coordinator whose assignments drop the terms the invitation promised: the participant fails the attempt.
    spec, store = secure_spec(chunks=5)
    sim = Sim.start_job(spec, store, peers=PEERS, start=False)

    def strip(message: Message) -> Message:
        from weei.core.wire.messages import Assign
        if isinstance(message, Assign):
            settings = {k: v for k, v in message.settings.items() if k != "secureAggregation"}
            return replace(message, settings=settings)
        return message

    deliver = sim.participants["p1"].on_message
    sim.participants["p1"].on_message = lambda src, message, now: deliver(src, strip(message), now)  # type: ignore
    sim.coordinator.start(sim.now)
    sim.pump()
    assert not [m for m in sim.messages(Update, dst="coord")]
    assert "asks for the update in the clear" in (sim.participants["p1"].last_error or "")
