"""``privacy.dp.noiseAt: "participants"`` (docs/privacy.md): with secure aggregation each participant adds its
share of the DP noise, N(0, (σ·C/√t)²) per weight, to its clipped delta before masking, from a seed of its own
random source; the coordinator unmasks a noised sum and adds nothing. In memory under simulated time, with the
real coordinator and participants; each participant's random source is injected, so the test re-derives its noise.
"""

from __future__ import annotations

import hashlib
import json
import math
from array import array
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from sim import Sim, dataset_spec, default_outcome, to_floats
from weei.core.errors import SettingsError, SettingsReason
from weei.core.formats.settings import TrainingSettings
from weei.core.job.invitations import planned_privacy
from weei.core.job.settings_review import WorkFacts, review_settings
from weei.core.job.secure_round import SECAGG_PHASE_TIMEOUT_MS, SecureTerms
from weei.core.privacy import fixedpoint
from weei.core.privacy.dp_noise import GAUSSIAN_BOUND, gaussians, ln, noise_key
from weei.core.privacy.secagg import weighted_vector
from weei.core.wire.messages import (
    MAX_SECAGG_PEERS, Assign, Message, SecAggKeys, SecAggMasked, SecAggRoster, SecAggSharesFor, encode_message,
)

BASE: dict[str, Any] = {"epochs": 1, "localEpochs": 1, "batchSize": 4, "coordinatorParticipates": False}
PEERS = [f"p{i}" for i in range(1, 6)]
CLIP, SIGMA = 0.035, 1.0
DP = {"clip": CLIP, "noiseMultiplier": SIGMA, "delta": 1e-5, "maxRounds": 2, "noiseAt": "participants"}
T = 3  # max(2, ceil(0.6 * 5)): the least number of survivors a round of five completes with


class Source:
    """A participant's random source, deterministic and recorded: the test knows every secret it handed out."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.draws: list[bytes] = []
        self.contributions: list[int] = []  # the draw each contribution started at

    def __call__(self, n: int) -> bytes:
        out = hashlib.shake_256(f"{self.name}/{len(self.draws)}".encode()).digest(n)
        self.draws.append(out)
        return out

    def noise_seeds(self) -> list[bytes]:
        # A contribution draws its noise seed first (SecureContribution), then the protocol's secrets.
        return [self.draws[i] for i in self.contributions]


def inject(sim: Sim, sources: dict[str, Source]) -> None:
    """Each participant draws its secrets from its source; the source notes where each contribution begins."""
    for peer, source in sources.items():
        participant = sim.participants[peer]
        participant.random_bytes = source
        finish = participant.training_finished

        def finished(*args: Any, _finish: Any = finish, _source: Source = source, **kwargs: Any) -> None:
            _source.contributions.append(len(_source.draws))
            _finish(*args, **kwargs)

        participant.training_finished = finished  # type: ignore[method-assign]


def noised_job(chunks: int = 10, weight_count: int = 16, dp: dict[str, Any] | None = None,
               coordinator_seed: bytes = bytes(range(32)), start: bool = True) -> tuple[Sim, dict[str, Source]]:
    spec, store = dataset_spec(chunks, weight_count=weight_count,
                               settings={**BASE, "privacy": {"secureAggregation": True, "dp": dp or DP}})
    sim = Sim.start_job(spec, store, peers=PEERS, start=False, dp_noise_seed=coordinator_seed)
    sources = {peer: Source(f"{peer}/{coordinator_seed.hex()}") for peer in PEERS}
    inject(sim, sources)
    if start:
        sim.coordinator.start(sim.now)
        sim.pump()
    return sim, sources


def clipped_deltas(sim: Sim, round_: int, contributors: list[str]) -> dict[str, list[float]]:
    start = array("f", sim.checkpoint(round_ - 1).weights)
    assigns = {peer: a for peer, a in sim.trained if a.round == round_}
    out = {}
    for peer in contributors:
        trained = array("f", default_outcome(assigns[peer], sim.checkpoint(round_ - 1).weights).weights)
        out[peer] = weighted_vector([b - a for a, b in zip(start, trained)], 1.0, CLIP)
    return out


def expected_round(sim: Sim, round_: int, contributors: list[str], seeds: dict[str, bytes]) -> bytes:
    """f32(start + decode(Σ enc(clip(δ_i) + noise_i)) / n), noise_i re-derived from participant i's own seed."""
    start = sim.checkpoint(round_ - 1).weights
    # The largest coordinate: a noised one at any t >= 2, or the weight, 1.
    bound = max(CLIP + GAUSSIAN_BOUND * SIGMA * CLIP / math.sqrt(2), 1.0)
    bits = fixedpoint.frac_bits(bound, MAX_SECAGG_PEERS)
    total = [0] * (len(start) // 4 + 1)
    for peer, vector in clipped_deltas(sim, round_, contributors).items():
        noise = gaussians(noise_key(seeds[peer], sim.coordinator.spec.job_id, round_), len(vector) - 1)
        noised = [v + SIGMA * CLIP / math.sqrt(T) * z for v, z in zip(vector, noise)] + [vector[-1]]
        total = [(t + e) % fixedpoint.MODULUS for t, e in zip(total, fixedpoint.encode(noised, bits, bound))]
    decoded = fixedpoint.decode(total, bits)
    assert decoded[-1] == len(contributors)
    return array("f", [a + v / decoded[-1] for a, v in zip(array("f", start), decoded[:-1])]).tobytes()


def events(sim: Sim, name: str) -> list[dict[str, Any]]:
    return [log.details for peer, log in sim.logs if peer == sim.coordinator.my_peer_id and log.event == name]


# ------------------------------------------------------------------ settings


@pytest.mark.parametrize("privacy,reason", [
    ({"dp": DP}, SettingsReason.CONFLICTING_SETTING),  # no secure aggregation: each update would arrive in the clear
    ({"secureAggregation": False, "dp": DP}, SettingsReason.CONFLICTING_SETTING),
    ({"secureAggregation": True, "dp": {**DP, "noiseAt": "server"}}, SettingsReason.INVALID_SETTING),
    ({"secureAggregation": True, "dp": {**DP, "noiseAt": 1}}, SettingsReason.INVALID_SETTING),
])
def test_noise_at_participants_is_refused_by_name_without_secure_aggregation_or_when_unknown(
        privacy: dict[str, Any], reason: SettingsReason) -> None:
    with pytest.raises(SettingsError) as err:
        TrainingSettings.from_json({**BASE, "privacy": privacy})
    assert err.value.field == "privacy.dp.noiseAt" and err.value.reason == reason


def test_noise_at_round_trips_and_the_invitation_says_where_the_noise_is_added() -> None:
    settings = TrainingSettings.from_json({**BASE, "privacy": {"secureAggregation": True, "dp": DP}})
    assert settings.privacy.dp is not None and settings.privacy.dp.participants_noise
    assert settings.to_json()["privacy"]["dp"]["noiseAt"] == "participants"
    assert TrainingSettings.from_json(settings.to_json()) == settings
    default = {k: v for k, v in DP.items() if k != "noiseAt"}
    coordinator = TrainingSettings.from_json({**BASE, "privacy": {"dp": default}})
    assert "noiseAt" not in coordinator.to_json()["privacy"]["dp"]  # the default: settings keep their bytes
    assert planned_privacy(settings.to_json())["dp"]["noiseAt"] == "participants"
    assert planned_privacy(coordinator.to_json())["dp"]["noiseAt"] == "coordinator"
    review = review_settings(settings, WorkFacts()).to_json()
    assert review["privacy"]["dp"]["noiseAt"] == "participants"
    assert any("each participant adds its share" in w["message"] for w in review["warnings"])


# ------------------------------------------------------------------ the grid


def test_no_normal_of_the_generator_exceeds_its_bound() -> None:
    # The polar step on the smallest uniforms' offsets (odd multiples of 2**-53 from 1/2): s is smallest there.
    largest = 0.0
    for m in range(1, 2001, 2):
        for n in range(1, 61, 2):
            a, b = m * 2.0 ** -53, n * 2.0 ** -53
            s = a * a + b * b
            largest = max(largest, abs(a * math.sqrt(-2.0 * ln(s) / s)))
    assert 11.6 < largest < GAUSSIAN_BOUND  # about 11.68: the bound sqrt(210 ln 2) = 12.06 leaves room for rounding
    assert max(abs(z) for z in gaussians(noise_key(bytes(32), "job", 1), 200_000)) < GAUSSIAN_BOUND


@pytest.mark.parametrize("clip,sigma", [(CLIP, SIGMA), (1e-3, 1000.0), (1e4, 1000.0), (5.0, 0.01)])
def test_a_sum_of_the_most_contributions_at_the_largest_noise_cannot_wrap(clip: float, sigma: float) -> None:
    terms = SecureTerms(clip, 1.0, 0.6, 1, False, sigma)
    params = terms.params("job", 1, 3, threshold=2)  # t = 2: the largest noise one participant adds
    extreme = clip + GAUSSIAN_BOUND * terms.noise_std(2)  # a clipped coordinate plus the largest normal's noise
    assert extreme <= params.bound
    acc = fixedpoint.RingSum(3)
    one = fixedpoint.encode_bytes([extreme, -extreme, 1.0], params.bits, params.bound)
    for _ in range(MAX_SECAGG_PEERS):
        acc.add(one)
    top, bottom, weight = fixedpoint.decode(fixedpoint.from_bytes(acc.value()), params.bits)
    step = 2.0 ** -params.bits
    assert weight == MAX_SECAGG_PEERS and top == -bottom
    assert abs(top - MAX_SECAGG_PEERS * extreme) <= MAX_SECAGG_PEERS * step  # exact to the grid: no wrap


# ------------------------------------------------------------------ rounds


def test_each_participant_noises_its_own_contribution_and_the_checkpoint_is_their_noised_sum_bit_for_bit() -> None:
    runs = [noised_job(coordinator_seed=seed) for seed in (bytes(range(32)), bytes(32))]
    for sim, sources in runs:
        assert sim.coordinator.status == "completed" and sim.rounds == [0, 1, 2]
        terms = SecureTerms.from_settings(sim.trained[0][1].settings)
        assert terms is not None and terms.noise == SIGMA and not terms.weighted
        assert all(m.threshold == T for m in sim.messages(SecAggRoster))
        seeds = {peer: source.noise_seeds() for peer, source in sources.items()}
        assert all(len(s) == 2 for s in seeds.values())  # one fresh seed per round
        for round_ in (1, 2):
            expected = expected_round(sim, round_, PEERS, {p: s[round_ - 1] for p, s in seeds.items()})
            assert sim.checkpoint(round_).weights == expected
        meta = sim.checkpoint(2).metadata.to_json()["privacy"]["dp"]
        assert meta["noiseAt"] == "participants" and meta["rounds"] == 2
        assert sim.coordinator.view(sim.now)["privacy"]["dp"]["noiseAt"] == "participants"
    # The coordinator's seeded stream is not used: the same participants' sources, another coordinator seed,
    # the same checkpoints (the sources are named by the coordinator seed only to tell the runs apart).
    (one, one_sources), (two, _) = runs
    again, _ = noised_job(coordinator_seed=bytes(32), start=False)
    inject(again, {peer: Source(source.name) for peer, source in one_sources.items()})
    again.coordinator.start(again.now)
    again.pump()
    assert [again.checkpoint(r).weights for r in (1, 2)] == [one.checkpoint(r).weights for r in (1, 2)]
    assert one.checkpoint(1).weights != two.checkpoint(1).weights  # other participants' randomness, other noise


def test_no_message_artifact_checkpoint_or_log_carries_a_participants_noise_seed() -> None:
    sim, sources = noised_job()
    seeds = [seed for source in sources.values() for seed in source.noise_seeds()]
    assert len(seeds) == 10
    needles = [n for seed in seeds for n in (seed, seed.hex().encode(), seed.hex().upper().encode(),
                                             json.dumps(list(seed)).encode())]
    assert sim.deliveries
    for d in sim.deliveries:
        wire = json.dumps(encode_message(d.message)).encode()
        assert not any(n in wire for n in needles), f"{type(d.message).__name__} carries a noise seed"
    blobs = [*sim.coord_store.values(), *(b for store in sim.stores.values() for b in store.values())]
    assert not any(n in blob for blob in blobs for n in needles)
    assert not any(n in save.file for save in sim.saved for n in needles)
    assert not any(n in json.dumps(log.details, default=str).encode() for _, log in sim.logs for n in needles)
    assert all(p._secure is None or p._secure._noise_seed is None for p in sim.participants.values())


def _lose_masked(peers: set[str]) -> dict[str, Any]:
    def hook(message: Message, blobs: dict[str, bytes]) -> list[tuple[Message, dict[str, bytes]]]:
        return [] if isinstance(message, SecAggMasked) else [(message, blobs)]
    return {peer: hook for peer in peers}


@pytest.mark.parametrize("gone", [{"p2"}, {"p2", "p5"}])
def test_with_dropouts_the_sum_still_carries_at_least_sigma_c_of_noise(gone: set[str]) -> None:
    # n = 5, t = 3; k = 4 or 3 survivors: the sum's noise has variance k·σ²C²/t per weight, >= σ²C².
    d = 6000
    sim, _ = noised_job(chunks=5, weight_count=d, start=False)
    sim.tamper.update(_lose_masked(gone))
    sim.coordinator.start(sim.now)
    sim.pump()
    sim.advance(SECAGG_PHASE_TIMEOUT_MS)
    assert sim.rounds[:2] == [0, 1]  # round 2 (the chunks of those gone) opened meanwhile
    survivors = [p for p in PEERS if p not in gone]
    assert events(sim, "secagg.finished")[0]["contributors"] == survivors
    k = len(survivors)
    start = to_floats(sim.checkpoint(0).weights).astype(np.float64)
    noisy_sum = (to_floats(sim.checkpoint(1).weights).astype(np.float64) - start) * k
    clean_sum = np.sum([np.array(v[:-1]) for v in clipped_deltas(sim, 1, survivors).values()], axis=0)
    diff = noisy_sum - clean_sum
    variance, expected = float(np.mean(diff ** 2)), k * SIGMA ** 2 * CLIP ** 2 / T
    standard_error = expected * math.sqrt(2 / d)  # of a mean of d squared normals of that variance
    assert abs(variance - expected) < 4 * standard_error, (variance, expected)
    assert variance > (SIGMA * CLIP) ** 2 - 4 * standard_error
    assert abs(float(np.mean(diff))) < 4 * math.sqrt(expected / d)


def test_a_participant_that_ignores_its_clip_far_beyond_the_noise_fails_the_round_by_name() -> None:
    sim, _ = noised_job(chunks=5, start=False)
    cheat = sim.participants["p1"]
    deliver = cheat.on_message

    def inflate(src: str, message: Message, now: float) -> None:
        if isinstance(message, SecAggSharesFor) and cheat._secure is not None:
            vector = cheat._secure._vector  # its noised, clipped delta, about to be masked
            vector[:-1] = [1000.0 * v for v in vector[:-1]]
        deliver(src, message, now)

    cheat.on_message = inflate  # type: ignore[method-assign]
    sim.coordinator.start(sim.now)
    sim.pump()
    failed = events(sim, "round.failed")
    assert failed and failed[0]["reason"] == "secagg-sum-out-of-range"
    assert "noise's bound" in failed[0]["error"]


@pytest.mark.parametrize("noise,error", [(None, "asks for 0"), (0.5, "asks for 0.5")])
def test_a_participant_holds_the_coordinator_to_the_noise_its_invitation_promised(noise: float | None,
                                                                                   error: str) -> None:
    sim, _ = noised_job(chunks=5, start=False)

    def weaken(message: Message) -> Message:
        if isinstance(message, Assign):
            terms = {k: v for k, v in message.settings["secureAggregation"].items() if k != "noiseMultiplier"}
            if noise is not None:
                terms["noiseMultiplier"] = noise
            return replace(message, settings={**message.settings, "secureAggregation": terms})
        return message

    deliver = sim.participants["p1"].on_message
    sim.participants["p1"].on_message = lambda src, message, now: deliver(src, weaken(message), now)  # type: ignore
    sim.coordinator.start(sim.now)
    sim.pump()
    assert not sim.messages(SecAggKeys, src="p1")
    assert "the invitation said participants add noise of multiplier 1" in (sim.participants["p1"].last_error or "")
    assert error in (sim.participants["p1"].last_error or "")
