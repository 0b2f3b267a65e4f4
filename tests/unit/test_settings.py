"""weei.core.formats.settings: every rule of the spec's TrainingSettings and AggregationSettings."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weei.core.errors import SettingsError
from weei.core.formats.settings import AggregationSettings, TrainingSettings

BASE: dict[str, Any] = {"epochs": 3, "localEpochs": 1, "batchSize": 32, "coordinatorParticipates": True}

FULL: dict[str, Any] = {
    "epochs": 30,
    "localEpochs": 2,
    "batchSize": 16,
    "learningRate": 0.01,
    "validationSchedule": {"enabled": True, "unit": "round", "every": 5},
    "coordinatorParticipates": False,
    "aggregation": {"method": "fedadam", "serverLearningRate": 0.02, "beta1": 0.8, "beta2": 0.95, "epsilon": 0.0001},
    "experience": {"unitsPerAssignment": 32},
    "workers": 4,
}


def parse(**changes: Any) -> TrainingSettings:
    obj = dict(BASE)
    for key, value in changes.items():
        if value is ...:
            obj.pop(key, None)
        else:
            obj[key] = value
    return TrainingSettings.from_json(obj)


def refused(field: str, reason: str | None = None, **changes: Any) -> SettingsError:
    with pytest.raises(SettingsError) as info:
        parse(**changes)
    assert info.value.field == field, str(info.value)
    if reason is not None:
        assert info.value.reason == reason
    return info.value


def test_round_trip_full_and_minimal() -> None:
    for obj in (FULL, BASE):
        s = TrainingSettings.from_json(obj)
        assert s.to_json() == obj
        assert TrainingSettings.from_json(s.to_json()) == s


def test_fields_parsed() -> None:
    s = TrainingSettings.from_json(FULL)
    assert (s.epochs, s.local_epochs, s.batch_size, s.learning_rate, s.workers) == (30, 2, 16, 0.01, 4)
    assert s.validation_schedule is not None and s.validation_schedule.every == 5
    assert s.experience is not None and s.experience.units_per_assignment == 32
    assert s.aggregation.method == "fedadam" and s.aggregation.option("beta2") == 0.95


def test_rounds_alias() -> None:
    s = parse(epochs=..., rounds=7)
    assert s.epochs == 7 and "rounds" not in s.to_json() and s.to_json()["epochs"] == 7
    assert parse(rounds=3).epochs == 3  # both, same value
    refused("rounds", "conflicting-setting", rounds=4)
    refused("epochs", "missing-setting", epochs=...)


@pytest.mark.parametrize("key", ["epochs", "localEpochs", "batchSize"])
def test_counts(key: str) -> None:
    for bad in (0, -1, 1.5, True, "3", None, float("nan"), 2**53):
        refused(key, **{key: bad})
    assert getattr(parse(**{key: 4.0}), {"epochs": "epochs", "localEpochs": "local_epochs", "batchSize": "batch_size"}[key]) == 4
    refused(key, "missing-setting", **{key: ...})


def test_other_top_level_fields() -> None:
    refused("coordinatorParticipates", "missing-setting", coordinatorParticipates=...)
    refused("coordinatorParticipates", coordinatorParticipates=1)
    refused("learningRate", learningRate=0)
    refused("learningRate", learningRate=-0.1)
    refused("learningRate", learningRate=True)
    refused("learningRate", learningRate=float("inf"))
    assert parse(learningRate=3).learning_rate == 3
    refused("workers", workers=0)
    refused("workers", workers=1.5)
    refused("shuffle", "unknown-setting", shuffle=True)
    with pytest.raises(SettingsError):
        TrainingSettings.from_json([1])


def test_validation_schedule() -> None:
    assert parse(validationSchedule={"enabled": False, "unit": "epoch", "every": 1}).validation_schedule is not None
    refused("validationSchedule.unit", validationSchedule={"enabled": True, "unit": "step", "every": 1})
    refused("validationSchedule.every", validationSchedule={"enabled": True, "unit": "round", "every": 0})
    refused("validationSchedule.enabled", validationSchedule={"enabled": "yes", "unit": "round", "every": 1})
    refused("validationSchedule.every", "missing-setting", validationSchedule={"enabled": True, "unit": "round"})
    refused("validationSchedule.x", "unknown-setting", validationSchedule={"enabled": True, "unit": "round", "every": 1, "x": 1})
    refused("validationSchedule", validationSchedule=[])


def test_experience() -> None:
    refused("experience.unitsPerAssignment", experience={"unitsPerAssignment": 0})
    refused("experience.unitsPerAssignment", "missing-setting", experience={})
    refused("experience.episodes", "unknown-setting", experience={"unitsPerAssignment": 1, "episodes": 3})


def test_aggregation_methods_and_defaults() -> None:
    assert parse().aggregation.method == "fedavg"
    assert "aggregation" not in parse(aggregation={"method": "fedavg"}).to_json()
    m = parse(aggregation={"method": "fedavgm"}).aggregation
    assert m.options == ()
    assert (m.option("serverLearningRate"), m.option("momentum"), m.state_copies) == (1.0, 0.9, 1)
    a = parse(aggregation={"method": "fedadam"}).aggregation
    assert a.option_values() == (0.01, 0.9, 0.99, 0.001)
    assert a.state_copies == 2
    refused("aggregation.method", aggregation={"method": "fedprox"})
    refused("aggregation.method", "missing-setting", aggregation={})
    refused("aggregation", aggregation="fedavg")


@pytest.mark.parametrize(
    ("method", "option", "good", "bad"),
    [
        ("fedavgm", "serverLearningRate", [0, 10, 0.5], [-0.01, 10.01, True, "1"]),
        ("fedadam", "serverLearningRate", [0, 10], [-1, 11]),
        ("fedavgm", "momentum", [0, 0.999], [1, -0.1, 1.5]),
        ("fedadam", "beta1", [0, 0.5], [1, -0.1]),
        ("fedadam", "beta2", [0, 0.9999], [1.0, -1e-9]),
        ("fedadam", "epsilon", [0, 1, 1e-8], [-1e-9, 1.01, None]),
    ],
)
def test_aggregation_ranges(method: str, option: str, good: list[Any], bad: list[Any]) -> None:
    for value in good:
        parse(aggregation={"method": method, option: value})
    for value in bad:
        err = refused(f"aggregation.{option}", aggregation={"method": method, option: value})
        assert err.field == f"aggregation.{option}"


@pytest.mark.parametrize(
    ("method", "option"),
    [("fedavg", "momentum"), ("fedavg", "serverLearningRate"), ("fedavgm", "beta1"), ("fedavgm", "epsilon"), ("fedadam", "momentum")],
)
def test_option_not_for_method(method: str, option: str) -> None:
    refused(f"aggregation.{option}", "option-not-for-method", aggregation={"method": method, option: 0.5})


def test_unknown_aggregation_key() -> None:
    refused("aggregation.lr", "unknown-setting", aggregation={"method": "fedavgm", "lr": 0.5})


def test_python_construction_is_checked() -> None:
    with pytest.raises(SettingsError):
        AggregationSettings(method="fedavgm", options=(("momentum", 1.0),))
    with pytest.raises(SettingsError):
        AggregationSettings(method="fedavg", options=(("beta1", 0.5),))
    with pytest.raises(SettingsError):
        TrainingSettings(epochs=0, local_epochs=1, batch_size=1, coordinator_participates=True)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 2**60) | st.floats() | st.text(max_size=8),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3),
    max_leaves=10,
)
keys = st.sampled_from(
    ["epochs", "rounds", "localEpochs", "batchSize", "learningRate", "validationSchedule", "coordinatorParticipates",
     "aggregation", "experience", "workers", "other"]
)


@settings(max_examples=500, deadline=None)
@given(st.dictionaries(keys, json_values | st.fixed_dictionaries({"method": st.sampled_from(["fedavg", "fedavgm", "fedadam"])},
                                                               optional={"momentum": st.floats(), "beta1": st.floats(), "epsilon": st.floats()})))
def test_fuzz_only_settings_errors(obj: dict[str, Any]) -> None:
    merged = {**BASE, **obj}
    for candidate in (obj, merged):
        try:
            s = TrainingSettings.from_json(candidate)
        except SettingsError as exc:
            assert exc.field and exc.reason
        else:
            assert TrainingSettings.from_json(s.to_json()) == s
