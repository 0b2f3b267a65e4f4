"""The hostile inputs of issue 9 §4: each parser of outside input refuses them by name, in linear time.

Before the fix each of these escaped as RecursionError, TypeError or
ValueError, or took quadratic time. Timings are relative: the large input is
measured against a tenth of it in the same test (linear: ~10x; the old
quadratic checks: ~100x), on the thread's CPU clock, so a loaded machine slows neither.
"""

from __future__ import annotations

import copy
import hashlib
import json
import struct
import time
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from core_samples import dataset_info, experience_info, package

from weei.api.controller import _parse_json
from weei.core import _check
from weei.core.formats.checkpoint import CheckpointMetadata, read_checkpoint
from weei.core.errors import CheckpointError, ManifestError, SettingsError
from weei.core.formats.manifest import parse_manifest_file, parse_package
from weei.core.formats.modelinfo import ModelInfo
from weei.core.formats.settings import TrainingSettings

N = 114
WEIGHTS = struct.pack(f"<{N}f", *[i / 7 - 3 for i in range(N)])
SETTINGS = {"epochs": 3, "localEpochs": 1, "batchSize": 16, "coordinatorParticipates": True,
            "experience": {"unitsPerAssignment": 32}}


def deep(depth: int, leaf: Any = 0) -> Any:
    """``depth`` nested arrays and objects, built without recursion."""
    value = leaf
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


def metadata(**changes: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "version": 1,
        "jobId": "job-1",
        "modelInfo": experience_info(),
        "settings": copy.deepcopy(SETTINGS),
        "round": 3,
        "checkpoint": {"kind": "checkpoint", "format": "float32-le", "round": 3, "bytes": len(WEIGHTS),
                       "sha256": hashlib.sha256(WEIGHTS).hexdigest()},
        "metrics": {"values": {"episodeReturn": 21.5}, "examplesProcessed": 96},
        "experience": {"jobSeed": "18446744073709551615", "nextUnit": 96},
    }
    meta.update(changes)
    return meta


def file_of(meta: dict[str, Any] | bytes, state: bytes = b"") -> bytes:
    text = meta if isinstance(meta, bytes) else json.dumps(meta).encode()
    return struct.pack("<I", len(text)) + text + WEIGHTS + state


def checkpoint_reason(meta: dict[str, Any] | bytes, state: bytes = b"") -> str:
    with pytest.raises(CheckpointError) as err:
        read_checkpoint(file_of(meta, state))
    return err.value.reason


def test_valid_samples_parse() -> None:
    # The refusals below are of the changed field, not of a broken sample.
    read_checkpoint(file_of(metadata()))
    ModelInfo.from_json(dataset_info())
    parse_package(package())
    TrainingSettings.from_json(SETTINGS)


# ------------------------------------------------------------------ depth


def deep_text(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("depth", [65, 500, 900])
def test_deep_checkpoint_metadata_is_refused(depth: int) -> None:
    assert checkpoint_reason(metadata(extra=deep(depth))) == "invalid-metadata-json"
    text = json.dumps(metadata(extra="DEEP")).replace('"DEEP"', deep_text(depth * 10))
    assert checkpoint_reason(text.encode()) == "invalid-metadata-json"
    with pytest.raises(CheckpointError) as err:
        CheckpointMetadata.from_json(metadata(extra=deep(depth)))
    assert err.value.reason == "invalid-metadata"
    assert "nests deeper than 64" in str(err.value)


def test_metadata_of_only_brackets_is_refused() -> None:
    assert checkpoint_reason(b"[" * 100000) == "invalid-metadata-json"


def test_nesting_at_the_limit_is_kept() -> None:
    meta = metadata(extra=deep(_check.MAX_JSON_DEPTH - 1))
    assert read_checkpoint(file_of(meta)).metadata.to_json()["extra"] == meta["extra"]


@pytest.mark.parametrize("depth", [65, 500, 5000])
def test_deep_model_info_is_refused(depth: int) -> None:
    with pytest.raises(ManifestError) as err:
        ModelInfo.from_json({**dataset_info(), "extra": deep(depth)})
    assert err.value.reason == "invalid-model-info"


@pytest.mark.parametrize("depth", [65, 500, 5000])
def test_deep_package_is_refused(depth: int) -> None:
    obj = package()
    obj["inlineJson"]["compatibility.json"]["extra"] = deep(depth)
    with pytest.raises(ManifestError) as err:
        parse_manifest_file(obj)
    assert err.value.reason == "invalid-package"
    with pytest.raises(ManifestError) as err:
        parse_manifest_file([deep(depth)])
    assert err.value.reason == "invalid-dataset-manifest"


@pytest.mark.parametrize("data", [b"[" * 100000, b"{\"a\":" * 100000, json.dumps(deep(500)).encode()])
def test_controller_json_refuses_deep_input(data: bytes) -> None:
    with pytest.raises(ManifestError) as err:
        _parse_json(data, "manifest")
    assert err.value.reason == "invalid-json"


def _depth(value: Any) -> int:
    children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else None
    return 0 if children is None else 1 + max((_depth(c) for c in children), default=0)


@given(st.recursive(st.none() | st.integers() | st.text(alphabet='[]{}"\\,:ab'),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                        st.text(alphabet='[]{}"\\ab', max_size=4), inner, max_size=3), max_leaves=30))
@settings(max_examples=300, derandomize=True, deadline=None)  # a linear-time check; wall time on a shared machine is noise
def test_the_depth_measured_on_the_text_is_the_values(value: Any) -> None:
    # parse_json measures nesting on the text only; brackets inside strings and escaped quotes must not count.
    text = json.dumps(value)
    assert _check._text_depth(text, 1000) == _depth(value)
    assert _check.parse_json(text, pytest.fail, _depth(value)) == value
    if _depth(value) > 0:
        limit = _depth(value) - 1
        with pytest.raises(ValueError, match=f"^nests deeper than {limit} levels$"):
            _check.parse_json(text, lambda m: (_ for _ in ()).throw(ValueError(m)), limit)


def test_check_depth_is_iterative() -> None:
    _check.check_depth(deep(64), lambda m: pytest.fail(m))
    with pytest.raises(ValueError):
        _check.check_depth(deep(100000), lambda m: (_ for _ in ()).throw(ValueError(m)))


# ------------------------------------------------------------------ types before hashing


def test_unhashable_aggregation_method_in_settings() -> None:
    with pytest.raises(SettingsError) as err:
        TrainingSettings.from_json({**SETTINGS, "aggregation": {"method": {}}})
    assert err.value.field == "aggregation.method"


def test_unhashable_aggregation_method_in_checkpoint_settings() -> None:
    meta = metadata(settings={**SETTINGS, "aggregation": {"method": {}}})
    assert checkpoint_reason(meta) == "invalid-settings"


@pytest.mark.parametrize("method", [{}, [], [[]]])
def test_unhashable_aggregation_state_method(method: Any) -> None:
    meta = metadata(version=2, aggregationState={"method": method, "step": 1, "bytes": 0, "sha256": "a" * 64})
    assert checkpoint_reason(meta) == "invalid-aggregation-state"


@pytest.mark.parametrize("entry", [[], {}, ["cpu-wasm-simd"]])
def test_unhashable_backend_preference(entry: Any) -> None:
    obj = package()
    obj["execution"]["policy"]["preference"] = [entry]
    with pytest.raises(ManifestError) as err:
        parse_package(obj)
    assert err.value.reason == "invalid-package"


# ------------------------------------------------------------------ bounded integers


@pytest.mark.parametrize("seed", ["1" * 5000, "1" * 21, "0" * 100000, "18446744073709551616"])
def test_long_job_seed_is_refused_by_name(seed: str) -> None:
    assert checkpoint_reason(metadata(experience={"jobSeed": seed, "nextUnit": 0})) == "invalid-metadata"


# ------------------------------------------------------------------ linear duplicate checks


def ratio_bound(run: Callable[[int], None], small: int) -> tuple[float, float]:
    """Best-of-5 CPU seconds of ``run(small)`` and of ``run(10 * small)``: this thread's own CPU clock,
    which other processes on a loaded machine do not stretch (the wall clock did, in a full run)."""

    def best(n: int) -> float:
        times = []
        for _ in range(5):
            start = time.thread_time()
            run(n)
            times.append(time.thread_time() - start)
        return min(times)

    return best(small), best(10 * small)


def assert_linear(run: Callable[[int], None], small: int) -> None:
    t_small, t_large = ratio_bound(run, small)
    # Linear: ~10x. The old checks were quadratic: ~100x.
    assert t_large <= 20 * t_small + 0.05, f"{10 * small} items took {t_large:.3f}s, {small} took {t_small:.3f}s"


def test_duplicate_chunk_ids_linear() -> None:
    def run(n: int) -> None:
        ids = [f"c{i:06d}" for i in range(n)]
        meta = metadata(trainedChunkIds=ids + [ids[-1]], remainingChunkIds=[])
        assert checkpoint_reason(meta) == "duplicate-chunk-id"

    assert_linear(run, 8000)


def test_many_trained_chunk_ids_inside_the_metadata_cap() -> None:
    ids = [f"c{i:06d}" for i in range(80000)]
    meta = metadata(trainedChunkIds=ids + [ids[-1]], remainingChunkIds=[])
    assert len(json.dumps(meta)) < 1 << 20
    start = time.process_time()
    assert checkpoint_reason(meta) == "duplicate-chunk-id"
    assert time.process_time() - start < 5  # was 244 s


def test_many_format_ids_linear() -> None:
    def run(n: int) -> None:
        info = dataset_info()
        info["dataFormats"] = [{"id": f"f{i}"} for i in range(n)] + [{"id": f"f{n - 1}"}]
        with pytest.raises(ManifestError, match="duplicate"):
            ModelInfo.from_json(info)

    assert_linear(run, 1000)


def test_many_metric_ids_are_refused_by_their_count_before_any_is_read() -> None:
    info = dataset_info()
    info["metrics"] = [{"id": f"m{i}", "label": "", "direction": "minimize"} for i in range(10_000)]
    with pytest.raises(ManifestError, match="at most 64 metrics") as refused:
        ModelInfo.from_json(info)
    assert refused.value.reason == "invalid-model-info"


def test_first_duplicate() -> None:
    assert _check.first_duplicate(["a", "b", "a", "b"]) == "a"
    assert _check.first_duplicate(["a", "b"]) is None
