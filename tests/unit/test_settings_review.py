"""Legal settings that are likely mistakes: the review's warnings, levels and estimated time."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from weei.core.errors import SettingsError
from weei.core.formats.settings import TrainingSettings
from weei.core.job.settings_review import WarningCode, WorkFacts, facts_from_manifest, review_settings

MODELS = Path(__file__).resolve().parents[2] / "app" / "static" / "models"


def settings(**kw: Any) -> TrainingSettings:
    obj: dict[str, Any] = {"epochs": 1, "localEpochs": 1, "batchSize": 32, "coordinatorParticipates": True}
    obj.update(kw)
    return TrainingSettings.from_json(obj)


DIGITS = WorkFacts(examples=1500, largest_chunk=100, peers=2)


def fields(review: Any, level: str) -> set[str]:
    return {w.field for w in review.warnings if w.level == level}


def test_the_demo_defaults_raise_nothing() -> None:
    review = review_settings(settings(), DIGITS)
    assert review.warnings == () and not review.needs_confirmation and review.work == 1500


@pytest.mark.parametrize("kw, field", [
    ({"epochs": 10**9}, "epochs"),
    ({"batchSize": 10**9}, "batchSize"),
    ({"localEpochs": 10**6}, "localEpochs"),
    ({"learningRate": 1e9}, "learningRate"),
])
def test_absurd_values_need_a_confirmation_naming_the_field(kw: dict[str, Any], field: str) -> None:
    review = review_settings(settings(**kw), DIGITS)
    assert review.needs_confirmation and field in fields(review, "confirm")
    assert review.to_json()["needsConfirmation"] is True


def test_unusual_but_plausible_values_are_notes() -> None:
    review = review_settings(settings(batchSize=500, learningRate=2.0), DIGITS)
    assert not review.needs_confirmation
    assert fields(review, "note") == {"batchSize", "learningRate"}


def test_the_estimate_comes_from_the_measured_speed() -> None:
    fast = review_settings(settings(epochs=10), WorkFacts(examples=1500, examples_per_second=500.0))
    assert fast.estimated_ms == 30_000 and not fast.needs_confirmation
    assert any("about 30 s" in w.message for w in fast.warnings)
    # 200 passes at 1 example/s is days: confirm, though every value alone is ordinary.
    slow = review_settings(settings(epochs=200), WorkFacts(examples=1500, examples_per_second=1.0))
    assert slow.needs_confirmation and "epochs" in fields(slow, "confirm")
    assert any("days" in w.message for w in slow.warnings)


def test_without_a_speed_the_amount_of_work_decides() -> None:
    review = review_settings(settings(epochs=900, localEpochs=90), WorkFacts(examples=10**6))
    assert review.estimated_ms is None and review.needs_confirmation and "epochs" in fields(review, "confirm")


def test_experience_jobs_speak_in_the_models_unit() -> None:
    manifest = json.loads((MODELS / "cartpole-reinforce" / "manifest.json").read_text())
    facts = facts_from_manifest(manifest)
    assert facts.default_units == 32 and facts.unit_label == "Episodes" and facts.examples is None
    review = review_settings(settings(epochs=20, experience={"unitsPerAssignment": 4096}),
                             WorkFacts(default_units=32, unit_label="Episodes", examples_per_second=100.0))
    units = [w for w in review.warnings if w.field == "experience.unitsPerAssignment"]
    assert units and units[0].level == "confirm" and "episodes per round" in units[0].message
    assert review.work == 20 * 4096 and any("episodes/s" in w.message for w in review.warnings)


def test_facts_of_a_dataset_package_and_of_an_invalid_manifest() -> None:
    manifest = json.loads((MODELS / "digits-mlp" / "manifest.json").read_text())
    facts = facts_from_manifest(manifest)
    assert facts.examples and facts.largest_chunk and facts.largest_chunk <= facts.examples
    assert facts_from_manifest({"schema": "nonsense"}) == WorkFacts()


def test_hard_limits_stay_errors() -> None:
    with pytest.raises(SettingsError) as err:
        settings(epochs=2**53)
    assert err.value.field == "epochs"
    with pytest.raises(SettingsError) as err:
        settings(learningRate=-1)
    assert err.value.field == "learningRate"


def outer_step_warnings(aggregation: dict[str, Any]) -> list[Any]:
    review = review_settings(settings(aggregation=aggregation), DIGITS)
    return [w for w in review.warnings if w.code is not None]


def test_fedavgm_momentum_measured_to_overshoot_is_noted_by_code() -> None:
    # The defaults (μ 0.9, η 1: up to 10 x the round's change) ended above FedAvg's loss on both
    # reference models (docs/methods.md); a note, not a confirmation: it helps with small local steps.
    (warning,) = outer_step_warnings({"method": "fedavgm"})
    assert warning.code == WarningCode.OUTER_MOMENTUM_OVERSHOOTS and warning.level == "note"
    assert warning.field == "aggregation.momentum" and "10 x" in warning.message
    assert warning.to_json()["code"] == "outer-momentum-overshoots"
    assert not review_settings(settings(aggregation={"method": "fedavgm"}), DIGITS).needs_confirmation
    (smaller,) = outer_step_warnings({"method": "fedavgm", "momentum": 0.9, "serverLearningRate": 0.3})
    assert "3 x" in smaller.message  # still above FedAvg's loss on digits-mlp, 3 seeds


def test_nesterov_first_step_measured_to_overshoot_is_noted_by_code() -> None:
    # Nesterov μ 0.5 η 1.2 moves a round by 1.8 x its change at once: above FedAvg's loss on digits-mlp at
    # every local setting tried and on the byte-transformer; heavy-ball μ 0.5 η 1.2 helped (docs/methods.md).
    (warning,) = outer_step_warnings({"method": "fedavgm", "momentum": 0.5, "serverLearningRate": 1.2, "nesterov": 1})
    assert warning.code == WarningCode.OUTER_MOMENTUM_OVERSHOOTS and warning.level == "note"
    assert warning.field == "aggregation.nesterov" and "1.8 x" in warning.message
    assert outer_step_warnings({"method": "fedavgm", "momentum": 0.5, "serverLearningRate": 1.2}) == []
    # DiLoCo's μ 0.9 η 0.7: a first step of 1.33, but a long-run step of 7: the long-run note, once.
    (diloco,) = outer_step_warnings({"method": "fedavgm", "momentum": 0.9, "serverLearningRate": 0.7, "nesterov": 1})
    assert diloco.field == "aggregation.momentum" and "7 x" in diloco.message


@pytest.mark.parametrize("aggregation", [
    {"method": "fedavg"},
    {"method": "fedadam"},
    {"method": "fedavgm", "momentum": 0.5, "serverLearningRate": 1},  # measured to help on both models
    {"method": "fedavgm", "momentum": 0.7, "serverLearningRate": 0.5},  # 1.7 x, helped on digits-mlp
    {"method": "fedavgm", "momentum": 0.5, "serverLearningRate": 1.2},  # 2.4 x, helped on both models
    {"method": "fedavgm", "momentum": 0.5, "serverLearningRate": 1, "nesterov": 1},  # 1.5 x at once: mixed
])
def test_outer_steps_not_measured_to_overshoot_raise_no_code(aggregation: dict[str, Any]) -> None:
    assert outer_step_warnings(aggregation) == []
    assert all("code" not in w.to_json() for w in review_settings(settings(aggregation=aggregation), DIGITS).warnings)


def test_compression_notes_small_blocks_and_the_cost_of_deflate() -> None:
    def notes(compression: dict[str, Any]) -> dict[str, str]:
        review = review_settings(settings(compression=compression), DIGITS)
        assert not review.needs_confirmation
        return {w.field: w.message for w in review.warnings if w.field.startswith("compression")}

    assert notes({"kind": "int8"}) == {} and notes({"kind": "int4", "block": 64}) == {}
    small = notes({"kind": "int8", "block": 8})
    assert list(small) == ["compression.block"] and "2.67 x" in small["compression.block"]
    assert "3.94 x" in small["compression.block"]
    deflate = notes({"kind": "int4", "deflate": True})
    assert list(deflate) == ["compression.deflate"] and "CPU" in deflate["compression.deflate"]
