"""``settings.privacy`` for secure aggregation: parsed, refused by name where it cannot work, shown in the invitation."""

from __future__ import annotations

from typing import Any

import pytest

from weei.core.errors import SettingsError, SettingsReason
from weei.core.formats.settings import PrivacySettings, TrainingSettings

BASE: dict[str, Any] = {"epochs": 2, "localEpochs": 1, "batchSize": 8, "coordinatorParticipates": False}


def test_secure_aggregation_round_trips_and_sets_the_threshold() -> None:
    settings = TrainingSettings.from_json({**BASE, "privacy": {"secureAggregation": True, "clip": 5}})
    assert settings.privacy == PrivacySettings(True, 5, 0.6)
    assert settings.to_json()["privacy"] == {"secureAggregation": True, "clip": 5, "threshold": 0.6}
    assert TrainingSettings.from_json(settings.to_json()) == settings
    assert [settings.privacy.threshold_of(n) for n in (2, 3, 5, 10)] == [2, 2, 3, 6]
    assert "privacy" not in TrainingSettings.from_json(BASE).to_json()  # off: the spec's settings keep their bytes


@pytest.mark.parametrize("aggregation,named", [
    ({"method": "fedavg", "combine": "trimmedMean"}, "aggregation.combine"),
    ({"method": "fedavg", "combine": "median"}, "aggregation.combine"),
    ({"method": "fedavg", "normClip": 3}, "aggregation.normClip"),
    ({"method": "fedavgm"}, "aggregation.method 'fedavgm'"),
])
def test_secure_aggregation_refuses_what_needs_single_updates_by_name(aggregation: dict[str, Any], named: str) -> None:
    with pytest.raises(SettingsError) as err:
        TrainingSettings.from_json({**BASE, "aggregation": aggregation, "privacy": {"secureAggregation": True, "clip": 5}})
    assert err.value.reason == SettingsReason.CONFLICTING_SETTING and err.value.field == "privacy.secureAggregation"
    assert named in str(err.value)


@pytest.mark.parametrize("privacy,field,reason", [
    ({"secureAggregation": True}, "privacy.clip", SettingsReason.MISSING_SETTING),
    ({"secureAggregation": True, "clip": 0}, "privacy.clip", SettingsReason.OUT_OF_RANGE),
    ({"secureAggregation": True, "clip": 1, "threshold": 0.5}, "privacy.threshold", SettingsReason.OUT_OF_RANGE),
    ({"secureAggregation": "yes", "clip": 1}, "privacy.secureAggregation", SettingsReason.INVALID_SETTING),
    ({"secureAggregation": True, "clip": 1, "noise": 1}, "privacy.noise", SettingsReason.UNKNOWN_SETTING),
])
def test_bad_privacy_settings_are_refused_naming_the_field(privacy: dict[str, Any], field: str, reason: SettingsReason) -> None:
    with pytest.raises(SettingsError) as err:
        TrainingSettings.from_json({**BASE, "privacy": privacy})
    assert err.value.field == field and err.value.reason == reason


def test_a_coordinator_runs_a_job_with_secure_aggregation_and_the_assignments_state_its_terms() -> None:
    # Before the rounds carried the protocol, the coordinator refused such a job (unsupported-setting).
    from sim import Sim, dataset_spec
    spec, store = dataset_spec(3, settings={**BASE, "privacy": {"secureAggregation": True, "clip": 5}})
    sim = Sim.start_job(spec, store, peers=("p1", "p2", "p3"))
    assert sim.coordinator.status == "completed"
    assert sim.trained[0][1].settings["secureAggregation"] == {"clip": 5, "maxWeight": 12.0, "threshold": 0.6,
                                                              "opening": 1, "weighted": True}
    spec, store = dataset_spec(3, settings={**BASE, "privacy": {"secureAggregation": False, "clip": 5}})
    assert Sim.create(spec, store).coordinator.spec.settings.to_json()["privacy"] == {
        "secureAggregation": False, "clip": 5, "threshold": 0.6}


def test_secure_aggregation_refuses_compressed_updates_by_name() -> None:
    with pytest.raises(SettingsError) as err:
        TrainingSettings.from_json({**BASE, "compression": {"kind": "int8"},
                                    "privacy": {"secureAggregation": True, "clip": 5}})
    assert err.value.reason == SettingsReason.CONFLICTING_SETTING and "compression" in str(err.value)


DP = {"clip": 2.0, "noiseMultiplier": 1.0, "delta": 1e-5, "maxRounds": 3}


def test_one_privacy_setting_holds_secure_aggregation_and_dp_with_one_clip() -> None:
    from weei.core.job.invitations import planned_privacy

    both = TrainingSettings.from_json({**BASE, "privacy": {"secureAggregation": True, "dp": DP}})
    assert both.privacy.participant_clip == 2.0  # DP's clip satisfies secure aggregation's need for one
    assert TrainingSettings.from_json(both.to_json()) == both
    assert both.to_json()["privacy"] == {"secureAggregation": True, "threshold": 0.6, "dp": DP}
    assert TrainingSettings.from_json({**BASE, "privacy": {"dp": DP}}).to_json()["privacy"] == {"dp": DP}
    shown = planned_privacy(both.to_json())
    assert shown is not None and shown["secureAggregation"] == {"clip": 2.0, "threshold": 0.6}
    assert shown["dp"]["clip"] == 2.0 and shown["dp"]["maxRounds"] == 3
    with pytest.raises(SettingsError) as err:  # two clips: one would be a promise nobody keeps
        TrainingSettings.from_json({**BASE, "privacy": {"secureAggregation": True, "clip": 5, "dp": DP}})
    assert err.value.field == "privacy.clip" and err.value.reason == SettingsReason.CONFLICTING_SETTING
    assert TrainingSettings.from_json({**BASE, "privacy": {"clip": 2.0, "dp": DP}}).privacy.participant_clip == 2.0


def test_review_settings_notes_what_secure_aggregation_asks_of_a_round() -> None:
    from weei.core.job.settings_review import WorkFacts, review_settings

    review = review_settings(TrainingSettings.from_json({**BASE, "privacy": {"secureAggregation": True, "dp": DP}}),
                             WorkFacts()).to_json()
    assert review["privacy"]["secureAggregation"] == {"clip": 2.0, "threshold": 0.6}
    assert "plannedEpsilon" in review["privacy"]["dp"]
    assert [w["field"] for w in review["warnings"]] == ["privacy.secureAggregation", "privacy.dp"]
    assert not review["needsConfirmation"]
