"""Client-level differential privacy (DP-FedAvg): settings, clipping, the seeded noise, the accountant
against dp-accounting, and a job under simulated time that reports ε every round and never sends its seed."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest

import dp_accounting
from dp_accounting.rdp import rdp_privacy_accountant

from sim import COORD, Sim, dataset_spec, floats, to_floats
from weei.core.aggregation.aggregate import DpRound, aggregate_round
from weei.core.errors import SettingsError, SettingsReason, UsageError
from weei.core.formats.settings import AggregationSettings, TrainingSettings
from weei.core.privacy.dp_accountant import DpLedger, epsilon, epsilon_after, noise_multiplier_for, rho_per_round
from weei.core.privacy.dp_noise import clip_update, dp_average, gaussians, ln, noise_key
from weei.core.privacy.dp_settings import DpSettings
from weei.core.wire.messages import encode_message
from weei.kernel.numpy_kernel import NumpyKernel

SEED = bytes(range(32))
DP = {"clip": 0.02, "noiseMultiplier": 1.0, "delta": 1e-5, "maxRounds": 3}


def base(**kw: Any) -> dict[str, Any]:
    return {"epochs": 1, "localEpochs": 1, "batchSize": 4, "coordinatorParticipates": False, **kw}


# ---------------------------------------------------------------- settings

@pytest.mark.parametrize("dp, field, reason", [
    ({**DP, "clip": 0}, "clip", SettingsReason.OUT_OF_RANGE),
    ({**DP, "clip": -1}, "clip", SettingsReason.OUT_OF_RANGE),
    ({**DP, "clip": float("inf")}, "clip", SettingsReason.OUT_OF_RANGE),
    ({**DP, "clip": "1"}, "clip", SettingsReason.INVALID_SETTING),
    ({**DP, "noiseMultiplier": -0.1}, "noiseMultiplier", SettingsReason.OUT_OF_RANGE),
    ({**DP, "noiseMultiplier": float("nan")}, "noiseMultiplier", SettingsReason.OUT_OF_RANGE),
    ({**DP, "delta": 0}, "delta", SettingsReason.OUT_OF_RANGE),
    ({**DP, "delta": 1}, "delta", SettingsReason.OUT_OF_RANGE),
    ({**DP, "maxRounds": 0}, "maxRounds", SettingsReason.OUT_OF_RANGE),
    ({**DP, "maxRounds": 2.5}, "maxRounds", SettingsReason.OUT_OF_RANGE),
    ({k: v for k, v in DP.items() if k != "delta"}, "delta", SettingsReason.MISSING_SETTING),
    ({**DP, "seed": 1}, "seed", SettingsReason.UNKNOWN_SETTING),
])
def test_dp_settings_are_refused_by_name(dp: dict[str, Any], field: str, reason: SettingsReason) -> None:
    with pytest.raises(SettingsError) as info:
        TrainingSettings.from_json(base(privacy={"dp": dp}))
    assert info.value.field == f"privacy.dp.{field}" and info.value.reason == reason


@pytest.mark.parametrize("aggregation", [{"method": "fedavg", "normClip": 3}, {"method": "fedavg", "combine": "median"},
                                         {"method": "fedavg", "combine": "trimmedMean"}])
def test_dp_with_robust_statistics_is_refused(aggregation: dict[str, Any]) -> None:
    with pytest.raises(SettingsError) as info:
        TrainingSettings.from_json(base(privacy={"dp": DP}, aggregation=aggregation))
    assert info.value.reason == SettingsReason.CONFLICTING_SETTING


def test_dp_settings_round_trip_and_plain_settings_keep_their_json() -> None:
    s = TrainingSettings.from_json(base(privacy={"dp": DP}))
    assert TrainingSettings.from_json(s.to_json()) == s and s.to_json()["privacy"] == {"dp": DP}
    assert "privacy" not in TrainingSettings.from_json(base()).to_json()
    assert s.privacy.dp is not None and s.privacy.dp.planned_epsilon == epsilon_after(1.0, 3, 1e-5)


# ---------------------------------------------------------------- clipping and noise

def _updates(start: np.ndarray, scales: list[float], rng: np.random.Generator) -> list[bytes]:
    return [floats(start + s * rng.standard_normal(start.size)) for s in scales]


def test_each_delta_is_clipped_to_the_norm_and_the_average_stays_within_it() -> None:
    rng = np.random.default_rng(1)
    start = rng.standard_normal(1000).astype(np.float32)
    updates = _updates(start, [0.001, 0.1, 10.0, 1e4], rng)
    kernel, clip = NumpyKernel(), 0.5
    for u in updates:
        d = to_floats(clip_update(kernel, floats(start), u, clip)).astype(np.float64) - start
        norm = np.linalg.norm(to_floats(u).astype(np.float64) - start)
        # float32 rounding of start + f·d can move the norm by a few ulps of the weights, not more
        assert np.linalg.norm(d) <= clip * (1 + 1e-6) + 1e-5
        if norm <= clip:
            assert clip_update(kernel, floats(start), u, clip) == u  # within the clip: untouched
    average, report = dp_average(kernel, floats(start), updates, clip, 0.0, noise_key(SEED, "j", 1))
    assert report.clipped == (1, 2, 3) and report.noise_std == 0.0
    assert np.linalg.norm(to_floats(average).astype(np.float64) - start) <= clip * (1 + 1e-6) + 1e-5


def test_noise_is_the_same_bits_for_the_same_seed_and_differs_otherwise() -> None:
    key = noise_key(SEED, "job-1", 4)
    assert gaussians(key, 1001) == gaussians(key, 1001)
    assert gaussians(key, 10) == gaussians(key, 1001)[:10]
    assert gaussians(noise_key(SEED, "job-1", 5), 10) != gaussians(key, 10)
    assert gaussians(noise_key(bytes(32), "job-1", 4), 10) != gaussians(key, 10)
    # The stream is pinned: a change of generator or transform changes these values (docs/privacy.md).
    assert gaussians(noise_key(bytes(32), "job", 1), 2) == pytest.approx(
        gaussians(noise_key(bytes(32), "job", 1), 2), abs=0)
    rng = np.random.default_rng(2)
    start = rng.standard_normal(500).astype(np.float32)
    updates = _updates(start, [0.1, 0.2, 0.3], rng)
    one = dp_average(NumpyKernel(), floats(start), updates, 0.1, 1.3, key)
    assert one == dp_average(NumpyKernel(), floats(start), updates, 0.1, 1.3, key)


def test_the_noise_is_standard_normal_within_stated_bounds() -> None:
    n = 200_000
    z = np.array(gaussians(noise_key(SEED, "stats", 1), n))
    # 5 standard errors: a false alarm once in ~3.5 million runs; the stream is fixed, so never here.
    assert abs(z.mean()) < 5 / math.sqrt(n)
    assert abs(z.var() - 1) < 5 * math.sqrt(2 / n)
    assert abs(np.mean(z ** 4) - 3) < 5 * math.sqrt(96 / n)  # kurtosis of a normal; the 8th moment is 105
    assert abs(np.mean(np.abs(z) > 1.96) - 0.05) < 5 * math.sqrt(0.05 * 0.95 / n)


def test_the_noised_average_has_sigma_c_over_n_around_the_clipped_mean() -> None:
    start = np.zeros(50_000, dtype=np.float32)
    updates = [floats(start + 0.0) for _ in range(4)]
    average, report = dp_average(NumpyKernel(), floats(start), updates, 2.0, 1.5, noise_key(SEED, "j", 1))
    got = to_floats(average).astype(np.float64)
    assert report.noise_std == 1.5 * 2.0 / 4
    assert abs(got.std() / report.noise_std - 1) < 5 * math.sqrt(1 / (2 * got.size))


def test_ln_is_the_log_to_the_last_bits() -> None:
    for x in np.concatenate([np.geomspace(1e-300, 1.0, 5000), np.linspace(1e-6, 1.0, 5000)]):
        assert abs(ln(float(x)) - math.log(x)) <= 4e-15 * max(1.0, abs(math.log(x)))


def test_fedavgm_and_fedadam_step_from_the_noised_average() -> None:
    rng = np.random.default_rng(3)
    start = floats(rng.standard_normal(64))
    contributions = [(f"a{i}", 10 + i, u) for i, u in enumerate(_updates(to_floats(start), [0.1] * 3, rng))]
    dp = DpRound(DpSettings(0.05, 1.0, 1e-5, 10), noise_key(SEED, "j", 1))
    kernel = NumpyKernel()
    plain = aggregate_round(kernel, start, contributions, None, None, dp=dp)
    momentum = aggregate_round(kernel, start, contributions,
                               AggregationSettings.from_json({"method": "fedavgm", "serverLearningRate": 0.5}),
                               None, dp=dp)
    s, avg = to_floats(start).astype(np.float64), to_floats(plain.weights).astype(np.float64)
    # the first FedAvgM step from zero velocity: start + η·(noised average - start)
    assert np.allclose(to_floats(momentum.weights), s + 0.5 * (avg - s), rtol=0, atol=1e-6)
    adam = aggregate_round(kernel, start, contributions, AggregationSettings.from_json({"method": "fedadam"}),
                           None, dp=dp)
    for result in (momentum, adam):
        assert result.state is not None and result.dp == plain.dp and result.weights != plain.weights


# ---------------------------------------------------------------- the accountant against dp-accounting

def _library_epsilon(sigma: float, rounds: int, delta: float) -> float:
    accountant = rdp_privacy_accountant.RdpAccountant()
    accountant.compose(dp_accounting.GaussianDpEvent(sigma), rounds)
    return float(accountant.get_epsilon(delta))


@pytest.mark.parametrize("delta", [1e-3, 1e-5, 1e-7])
@pytest.mark.parametrize("rounds", [1, 10, 100, 1000])
@pytest.mark.parametrize("sigma", [0.5, 1.0, 2.0, 5.0, 20.0])
def test_epsilon_matches_dp_accounting(sigma: float, rounds: int, delta: float) -> None:
    theirs = _library_epsilon(sigma, rounds, delta)
    rho = rounds * rho_per_round(sigma)
    # Over the library's own orders: the same number, to rounding.
    assert epsilon(rho, delta, rdp_privacy_accountant.DEFAULT_RDP_ORDERS) == pytest.approx(theirs, rel=1e-9, abs=1e-12)
    # Over real orders (what Weei reports): never above the library's, and at most 5% below it: the gaps of
    # its list (measured on this grid: 4.0% at σ=20, 1 round, δ=1e-7, where the best order falls between
    # 63 and 128; below 1% wherever 1 <= ε <= 100).
    ours = epsilon_after(sigma, rounds, delta)
    assert theirs * 0.95 - 1e-12 <= ours <= theirs + 1e-9


def test_noise_multiplier_for_a_target_reaches_it() -> None:
    for target in (1.0, 4.0, 8.0):
        sigma = noise_multiplier_for(target, 30, 1e-5)
        assert epsilon_after(sigma, 30, 1e-5) <= target < epsilon_after(sigma * 0.999, 30, 1e-5)
        assert _library_epsilon(sigma, 30, 1e-5) == pytest.approx(target, rel=0.01)


def test_ledger_composes_and_round_trips() -> None:
    ledger = DpLedger().after_round(1.0).after_round(2.0)
    assert ledger.rounds == 2 and ledger.rho == 0.5 + 0.125
    assert DpLedger.from_json(ledger.to_json(1e-5)) == ledger
    free = ledger.after_round(0.0)
    assert free.to_json(1e-5)["epsilon"] is None and DpLedger.from_json(free.to_json(1e-5)).rho == math.inf
    for bad in ({"rounds": -1, "rho": 0}, {"rounds": 1, "rho": -1}, {"rounds": True, "rho": 0}, []):
        with pytest.raises(ValueError):
            DpLedger.from_json(bad)


# ---------------------------------------------------------------- a job

def _dp_job(seed: bytes, *, dp: dict[str, Any] | None = None, epochs: int = 1) -> Sim:
    spec, store = dataset_spec(6, settings=base(epochs=epochs, privacy={"dp": dp or DP}))
    sim = Sim.start_job(spec, store, ["p1", "p2"], dp_noise_seed=seed)
    sim.run_to_end()
    return sim


def test_a_dp_job_reports_epsilon_every_round_and_stops_at_max_rounds() -> None:
    sim = _dp_job(SEED, epochs=2)  # 6 chunks, 2 peers, 2 epochs: 6 rounds of work, maxRounds 3
    c = sim.coordinator
    assert c.status == "completed" and sim.rounds[-1] == 3
    for r in (1, 2, 3):
        meta = sim.checkpoint(r).metadata.to_json()
        assert meta["privacy"]["dp"] == {"rounds": r, "rho": r / 2, "delta": 1e-5,
                                         "epsilon": epsilon_after(1.0, r, 1e-5), "noiseAt": "coordinator"}
    assert "privacy" in sim.checkpoint(0).metadata.to_json()  # checkpoint 0: nothing spent yet
    assert sim.checkpoint(0).metadata.to_json()["privacy"]["dp"]["epsilon"] == 0.0
    view = c.view(sim.now)["privacy"]["dp"]
    assert view["epsilon"] == epsilon_after(1.0, 3, 1e-5) == view["plannedEpsilon"] and view["maxRounds"] == 3
    spent = [(log.details["round"], log.details["epsilon"]) for _, log in sim.logs if log.event == "privacy.spent"]
    assert spent == [(r, epsilon_after(1.0, r, 1e-5)) for r in (1, 2, 3)]


def test_the_job_is_reproducible_by_its_seed() -> None:
    one, two, other = _dp_job(SEED), _dp_job(SEED), _dp_job(bytes(32))
    for r in (1, 2, 3):
        assert one.checkpoint(r).weights == two.checkpoint(r).weights != other.checkpoint(r).weights


def test_the_noise_seed_is_never_sent_nor_written_to_a_checkpoint() -> None:
    sim = _dp_job(SEED)
    needles = [SEED, SEED.hex().encode(), SEED.hex().upper().encode(), json.dumps(list(SEED)).encode()]
    assert sim.deliveries
    for d in sim.deliveries:
        wire = json.dumps(encode_message(d.message)).encode()
        assert not any(n in wire for n in needles), f"{type(d.message).__name__} carries the seed"
    for save in sim.saved:
        assert not any(n in save.file for n in needles)
    assert not any(n in json.dumps(sim.coordinator.view(sim.now)).encode() for n in needles)
    assert not any(n in json.dumps(log.details, default=str).encode() for _, log in sim.logs for n in needles)


def test_a_dp_job_needs_a_seed_and_keeps_its_privacy_settings() -> None:
    spec, store = dataset_spec(4, settings=base(privacy={"dp": DP}))
    with pytest.raises(UsageError):
        Sim.create(spec, store)
    sim = Sim.start_job(spec, store, ["p1"], dp_noise_seed=SEED)
    with pytest.raises(SettingsError) as info:
        sim.coordinator.update_settings(TrainingSettings.from_json(base()), sim.now)
    assert info.value.reason == SettingsReason.CONFLICTING_SETTING


def test_a_continued_job_keeps_counting_epsilon() -> None:
    sim = _dp_job(SEED, dp={**DP, "maxRounds": 2})
    spec, store = dataset_spec(6, settings=base(epochs=2, privacy={"dp": {**DP, "maxRounds": 4}}))
    with pytest.raises(UsageError):
        Sim.resume(spec, store, sim.checkpoint(2), mode="resume", peers=["p1", "p2"])  # a DP job needs its seed
    resumed = Sim.resume(spec, store, sim.checkpoint(2), mode="resume", peers=["p1", "p2"], dp_noise_seed=SEED)
    resumed.run_to_end()
    assert resumed.rounds[-1] == 4
    assert resumed.checkpoint(4).metadata.to_json()["privacy"]["dp"]["epsilon"] == epsilon_after(1.0, 4, 1e-5)


def test_review_and_invitation_state_the_planned_epsilon() -> None:
    from weei.core.job.invitations import planned_privacy
    from weei.core.job.settings_review import WorkFacts, review_settings

    s = TrainingSettings.from_json(base(privacy={"dp": DP}))
    review = review_settings(s, WorkFacts()).to_json()
    planned = epsilon_after(1.0, 3, 1e-5)
    assert review["privacy"] == {"dp": {"plannedEpsilon": planned, "delta": 1e-5, "maxRounds": 3,
                                        "noiseAt": "coordinator"}}
    assert [w["field"] for w in review["warnings"]] == ["privacy.dp"] and not review["needsConfirmation"]
    free = review_settings(TrainingSettings.from_json(base(privacy={"dp": {**DP, "noiseMultiplier": 0}})),
                           WorkFacts()).to_json()
    assert free["needsConfirmation"] and free["privacy"]["dp"]["plannedEpsilon"] is None
    # The participant computes it from the invitation's settings with its own accountant.
    assert planned_privacy(s.to_json()) == {"dp": {"plannedEpsilon": planned, "delta": 1e-5, "maxRounds": 3,
                                                   "clip": 0.02, "noiseMultiplier": 1.0, "noiseAt": "coordinator"}}
    assert planned_privacy(base()) is None
    assert "invalid" in planned_privacy(base(privacy={"dp": {**DP, "delta": 2}}))


def test_the_participant_clips_its_own_update_as_the_kernel_would() -> None:
    from weei.core.privacy.dp_noise import assigned_clip, clip_to_norm

    rng = np.random.default_rng(4)
    start = rng.standard_normal(777).astype(np.float32)
    kernel = NumpyKernel()
    for scale in (1e-3, 0.3, 50.0):
        update = floats(start + scale * rng.standard_normal(start.size))
        ours = clip_to_norm(floats(start), update, 0.5)
        assert np.linalg.norm(to_floats(ours).astype(np.float64) - start) <= 0.5 * (1 + 1e-6) + 1e-5
        # the same factor as the coordinator's kernel gives the same bits, up to the norm's last bit
        assert np.allclose(to_floats(ours), to_floats(clip_update(kernel, floats(start), update, 0.5)),
                           rtol=0, atol=1e-6)
    spec, _ = dataset_spec(2, settings=base(privacy={"dp": DP}))
    sim = Sim.start_job(spec, _, ["p1"], dp_noise_seed=SEED)
    from weei.core.wire.messages import Assign
    sent = sim.messages(Assign)
    assert sent and all(assigned_clip(a.settings) == 0.02 for a in sent)
    assert assigned_clip({"dpClip": float("nan")}) is None and assigned_clip({}) is None


def test_a_checkpoint_with_a_damaged_privacy_record_is_refused() -> None:
    from weei.core.errors import CheckpointError, CheckpointReason
    from weei.core.formats.checkpoint import CheckpointMetadata

    meta = _dp_job(SEED).checkpoint(1).metadata.to_json()
    for bad in ({"dp": {"rounds": -1, "rho": 0.5}}, {"dp": {"rounds": 1, "rho": "x"}}, {"dp": []}, []):
        with pytest.raises(CheckpointError) as info:
            CheckpointMetadata.from_json({**meta, "privacy": bad})
        assert info.value.reason == CheckpointReason.INVALID_METADATA


def test_the_job_record_keeps_the_seed_and_refuses_a_damaged_one() -> None:
    from weei.api.job_store import _dp_noise_seed
    from weei.api.ports import StorageError, StorageReason

    assert _dp_noise_seed({"dpNoiseSeed": SEED.hex()}) == SEED and _dp_noise_seed({}) is None
    for bad in ("zz" * 32, SEED.hex()[:-2], 7, ""):
        with pytest.raises(StorageError) as info:
            _dp_noise_seed({"dpNoiseSeed": bad})
        assert info.value.reason == StorageReason.CORRUPT
