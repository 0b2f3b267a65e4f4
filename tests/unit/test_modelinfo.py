"""weei.core.formats.modelinfo: getModelInfo() parsing and the rules that need the weight size."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from core_samples import dataset_info, experience_info, info_aux
from hypothesis import given, settings
from hypothesis import strategies as st

from weei.core.errors import ManifestError, SettingsError
from weei.core.formats.modelinfo import (
    ModelInfo,
    check_settings_for_model,
    check_weight_size,
    effective_units_per_assignment,
    parse_auxiliary_weights,
)
from weei.core.formats.settings import TrainingSettings


def refused(obj: Any, reason: str, text: str | None = None) -> ManifestError:
    with pytest.raises(ManifestError) as info:
        ModelInfo.from_json(obj)
    assert info.value.reason == reason, str(info.value)
    if text is not None:
        assert text in str(info.value)
    return info.value


def edited(base: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    obj = copy.deepcopy(base)
    *parents, last = path.split(".")
    target: Any = obj
    for key in parents:
        target = target[int(key)] if isinstance(target, list) else target[key]
    if value is ...:
        del target[last]
    elif isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value
    return obj


def test_spec_examples_parse_and_keep_raw() -> None:
    d = ModelInfo.from_json(dataset_info())
    assert not d.is_experience and d.allowed_methods == ("fedavg", "fedavgm", "fedadam")
    assert d.average_only[0].offset == 1048576 and d.metric_ids == ("loss",)
    assert d.raw == dataset_info() and d.to_json() == dataset_info()
    e = ModelInfo.from_json(experience_info(info_aux()))
    assert e.is_experience and e.work_source is not None and e.work_source.default_units == 32
    assert e.max_chunk_bytes is None and [s.id for s in e.auxiliary_weights] == ["reward", "start", "old"]
    assert e.auxiliary_weights[2].rounds_ago == 5 and e.auxiliary_weights[0].sha256 is not None


def test_allowed_methods() -> None:
    info = ModelInfo.from_json(edited(dataset_info(), "aggregation.methods", ["fedadam"]))
    assert info.allowed_methods == ("fedavg", "fedadam")
    info = ModelInfo.from_json(edited(dataset_info(), "aggregation", ...))
    assert info.allowed_methods == ("fedavg", "fedavgm", "fedadam") and info.average_only == ()


@pytest.mark.parametrize(
    ("path", "value", "reason"),
    [
        ("id", "", "invalid-model-info"),
        ("id", ..., "invalid-model-info"),
        ("version", 1, "invalid-model-info"),
        ("name", None, "invalid-model-info"),
        ("abiVersion", 2, "unsupported-abi"),
        ("abiVersion", True, "unsupported-abi"),
        ("abiVersion", ..., "unsupported-abi"),
        ("weightFormat", "float16", "unsupported-weight-format"),
        ("maxWorkers", 0, "invalid-model-info"),
        ("maxWorkers", 1.5, "invalid-model-info"),
        ("maxChunkBytes", ..., "invalid-model-info"),
        ("maxChunkBytes", 0, "invalid-model-info"),
        ("maxExamplesPerChunk", "10", "invalid-model-info"),
        ("dataFormats", [], "invalid-model-info"),
        ("dataFormats", [{"id": "a"}, {"id": "a"}], "invalid-model-info"),
        ("metrics.0.direction", "up", "invalid-model-info"),
        ("metrics", [{"id": "a", "label": "", "direction": "minimize"}] * 2, "invalid-model-info"),
        ("metrics", ..., "invalid-model-info"),
        ("capabilities", {"evaluation": "yes"}, "invalid-model-info"),
        ("aggregation.methods", ["sgd"], "invalid-aggregation-info"),
        ("aggregation.methods", ["fedavgm", "fedavgm"], "invalid-aggregation-info"),
        ("aggregation.averageOnly.0.offset", 2, "invalid-aggregation-info"),
        ("aggregation.averageOnly.0.bytes", 6, "invalid-aggregation-info"),
        ("aggregation.averageOnly.0.offset", -4, "invalid-aggregation-info"),
        ("aggregation.averageOnly", [{"offset": 0, "bytes": 8}, {"offset": 4, "bytes": 8}], "invalid-aggregation-info"),
        ("aggregation.averageOnly", [{"offset": 0, "bytes": 4}] * 4097, "invalid-aggregation-info"),
        ("aggregation.other", 1, "invalid-aggregation-info"),
    ],
)
def test_dataset_model_refusals(path: str, value: Any, reason: str) -> None:
    refused(edited(dataset_info(), path, value), reason)


def test_average_only_limits_accept() -> None:
    ranges = [{"offset": 8 * i, "bytes": 4} for i in range(4096)]
    info = ModelInfo.from_json(edited(dataset_info(), "aggregation.averageOnly", ranges))
    assert len(info.average_only) == 4096
    # Adjacent ranges touch but do not overlap; an empty range is ignored.
    ModelInfo.from_json(edited(dataset_info(), "aggregation.averageOnly", [{"offset": 4, "bytes": 4}, {"offset": 0, "bytes": 4}, {"offset": 0, "bytes": 0}]))


def test_unknown_top_level_keys_are_kept() -> None:
    info = ModelInfo.from_json(edited(dataset_info(), "description", "newer field"))
    assert info.raw["description"] == "newer field"


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("workSource.kind", "dataset"),
        ("workSource.inputs", "records"),
        ("workSource.unit.id", ""),
        ("workSource.unit", ...),
        ("workSource.unitsPerAssignment.default", 0),
        ("workSource.unitsPerAssignment.minimum", 64),
        ("workSource.unitsPerAssignment.maximum", 16),
        ("workSource.unitsPerAssignment.maximum", ...),
        ("workSource.evaluationUnits", 0),
        ("workSource.extra", 1),
        ("workSource", []),
    ],
)
def test_work_source_refusals(path: str, value: Any) -> None:
    refused(edited(experience_info(), path, value), "invalid-work-source")


@pytest.mark.parametrize(
    ("slot", "text"),
    [
        ({"id": "a", "role": "r", "bytes": 8}, "either sha256 or source"),
        ({"id": "a", "role": "r", "bytes": 8, "sha256": "0" * 64, "source": {"kind": "initial"}}, "never both"),
        ({"id": "a", "role": "r", "bytes": 6, "source": {"kind": "initial"}}, "float32"),
        ({"id": "a", "role": "r", "bytes": 0, "source": {"kind": "initial"}}, "bytes"),
        ({"id": "a", "role": "r", "bytes": 2 * 1024**3 + 4, "sha256": "0" * 64}, "at most"),
        ({"id": "a", "role": "r", "bytes": 8, "sha256": "0" * 63}, "hex"),
        ({"id": "a", "role": "r", "bytes": 8, "sha256": "A" * 64}, "hex"),
        ({"id": "a", "role": "r", "bytes": 8, "source": {"kind": "checkpoint"}}, "roundsAgo"),
        ({"id": "a", "role": "r", "bytes": 8, "source": {"kind": "checkpoint", "roundsAgo": 0}}, "roundsAgo"),
        ({"id": "a", "role": "r", "bytes": 8, "source": {"kind": "latest"}}, "kind"),
        ({"id": "a", "role": "r", "bytes": 8, "source": {"kind": "initial", "x": 1}}, "x"),
        ({"id": "", "role": "r", "bytes": 8, "source": {"kind": "initial"}}, "id"),
        ({"id": "a", "bytes": 8, "source": {"kind": "initial"}}, "role"),
        ({"id": "a", "role": "r", "bytes": 8, "sha256": "0" * 64, "fileName": "a.bin"}, "fileName"),
    ],
)
def test_auxiliary_slot_refusals(slot: dict[str, Any], text: str) -> None:
    refused(experience_info([slot]), "invalid-auxiliary-weights", text)


def test_auxiliary_limits() -> None:
    slots = [{"id": f"s{i}", "role": "r", "bytes": 2 * 1024**3, "sha256": "0" * 64} for i in range(8)]
    assert len(ModelInfo.from_json(experience_info(slots)).auxiliary_weights) == 8
    refused(experience_info(slots + [{"id": "s9", "role": "r", "bytes": 4, "sha256": "0" * 64}]), "invalid-auxiliary-weights", "at most 8")
    refused(experience_info([slots[0], slots[0]]), "invalid-auxiliary-weights", "duplicate")


def test_package_form_of_slots() -> None:
    file_slot = {"id": "a", "role": "r", "bytes": 8, "sha256": "0" * 64}
    with pytest.raises(ManifestError, match="fileName"):
        parse_auxiliary_weights([file_slot], in_package=True)
    assert parse_auxiliary_weights([{**file_slot, "fileName": "a.bin"}], in_package=True)[0].file_name == "a.bin"
    with pytest.raises(ManifestError, match="no file"):
        parse_auxiliary_weights([{"id": "b", "role": "r", "bytes": 8, "source": {"kind": "initial"}, "fileName": "b.bin"}], in_package=True)
    with pytest.raises(ManifestError, match="duplicate file"):
        parse_auxiliary_weights([{**file_slot, "fileName": "a.bin"}, {**file_slot, "id": "b", "fileName": "a.bin"}], in_package=True)


def test_check_weight_size() -> None:
    info = ModelInfo.from_json(experience_info(info_aux()))
    check_weight_size(info, 456)
    with pytest.raises(ManifestError) as exc:
        check_weight_size(info, 460)
    assert exc.value.reason == "auxiliary-size-mismatch" and "start" in str(exc.value)
    for bad in (0, 6):
        with pytest.raises(ManifestError, match="float32"):
            check_weight_size(info, bad)
    d = ModelInfo.from_json(dataset_info())
    check_weight_size(d, 1048576 + 4096)
    with pytest.raises(ManifestError) as exc:
        check_weight_size(d, 1048576 + 4092)
    assert exc.value.reason == "invalid-aggregation-info"


def _settings(**extra: Any) -> TrainingSettings:
    return TrainingSettings.from_json({"epochs": 3, "localEpochs": 1, "batchSize": 4, "coordinatorParticipates": True, **extra})


def test_settings_against_model() -> None:
    exp = ModelInfo.from_json(experience_info())
    assert effective_units_per_assignment(_settings(), exp) == 32
    assert effective_units_per_assignment(_settings(experience={"unitsPerAssignment": 4096}), exp) == 4096
    with pytest.raises(SettingsError) as err:
        check_settings_for_model(_settings(experience={"unitsPerAssignment": 4097}), exp)
    assert err.value.field == "experience.unitsPerAssignment"
    small = ModelInfo.from_json(edited(experience_info(), "workSource.unitsPerAssignment", {"default": 8, "minimum": 4, "maximum": 8}))
    with pytest.raises(SettingsError):
        check_settings_for_model(_settings(experience={"unitsPerAssignment": 3}), small)
    data = ModelInfo.from_json(edited(dataset_info(), "aggregation.methods", ["fedavgm"]))
    with pytest.raises(SettingsError) as err:
        check_settings_for_model(_settings(aggregation={"method": "fedadam"}), data)
    assert err.value.field == "aggregation.method"
    check_settings_for_model(_settings(aggregation={"method": "fedavg"}), data)
    with pytest.raises(SettingsError) as err:
        check_settings_for_model(_settings(experience={"unitsPerAssignment": 3}), data)
    assert err.value.field == "experience"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 2**40) | st.floats() | st.text(max_size=6),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=10), c, max_size=3),
    max_leaves=8,
)
paths = st.sampled_from(
    ["id", "abiVersion", "maxWorkers", "dataFormats", "metrics", "aggregation", "aggregation.methods",
     "aggregation.averageOnly", "capabilities", "workSource", "workSource.unit", "workSource.unitsPerAssignment",
     "workSource.unitsPerAssignment.maximum", "auxiliaryWeights", "maxChunkBytes"]
)


@settings(max_examples=500, deadline=None)
@given(paths, json_values, st.booleans())
def test_fuzz_only_manifest_errors(path: str, value: Any, exp: bool) -> None:
    base = experience_info(info_aux()) if exp else dataset_info()
    try:
        obj = edited(base, path, value)
    except (KeyError, TypeError, IndexError, ValueError):
        return
    try:
        info = ModelInfo.from_json(obj)
    except ManifestError as exc:
        assert exc.reason
    else:
        assert info.raw == obj
