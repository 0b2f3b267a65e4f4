"""Robust aggregation: norm clipping against the median, trimmed mean, median.

The kernels (numpy, native, wasm) must agree to the bit; the core's rules
(weei.core.aggregation.robust) are checked against a plain-Python reading of the rule.
"""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest

from weei.core.aggregation.aggregate import AggregationKernel, aggregate_round
from weei.core.errors import SettingsError
from weei.core.aggregation.robust import median, trim_count
from weei.core.formats.settings import AggregationSettings, TrainingSettings
from weei.kernel.numpy_kernel import NumpyKernel


@pytest.fixture(scope="module")
def kernels() -> list[AggregationKernel]:
    from weei.kernel.native import NativeKernel
    from weei.kernel.wasm_kernel import WasmKernel

    return [NumpyKernel(block=1000), NativeKernel(), WasmKernel()]


def f32(values: list[float]) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


def floats(buf: bytes) -> list[float]:
    return list(struct.unpack(f"<{len(buf) // 4}f", buf))


def spiky(rng: np.random.Generator, n: int, scale: float) -> np.ndarray:
    x = (rng.standard_normal(n) * scale).astype("<f4")
    if n >= 4:
        x[:4] = np.array([0.0, -0.0, 1e-45, -3e38], "<f4")
    return x


@pytest.mark.parametrize("n", [1, 7, 8, 9, 1003, 2049])
@pytest.mark.parametrize("k", [1, 2, 3, 4, 7])
def test_robust_loops_bit_identical(kernels: list[AggregationKernel], n: int, k: int) -> None:
    rng = np.random.default_rng(n * 31 + k)
    start = spiky(rng, n, 1.0)
    ups = [spiky(rng, n, 10.0 ** rng.integers(-3, 30)).tobytes() for _ in range(k)]
    if k > 1 and n > 2:  # ties of -0 and +0 across contributions: the sort is a total order
        ups[1] = f32([-0.0, 0.0]) + ups[1][8:]
    s = start.tobytes()
    norms = [kern.delta_sq_norms(s, ups) for kern in kernels]
    assert norms[0] == norms[1] == norms[2]
    assert all(math.isfinite(v) for v in norms[0])
    scaled = [kern.scale_delta(s, ups[0], 0.37) for kern in kernels]
    assert scaled[0] == scaled[1] == scaled[2]
    for t in range((k - 1) // 2 + 1):
        out = [kern.trimmed_mean(ups, t) for kern in kernels]
        assert out[0] == out[1] == out[2], t


def test_trimmed_mean_and_median_values(kernels: list[AggregationKernel]) -> None:
    ups = [f32([1.0, -0.0]), f32([100.0, 0.0]), f32([2.0, -0.0]), f32([3.0, 5.0])]
    for kern in kernels:
        assert floats(kern.trimmed_mean(ups, 1)) == [2.5, 0.0]  # drops 1 and 100; -0 < +0
        assert floats(kern.trimmed_mean(ups, 0)) == [26.5, 1.25]
        assert floats(kern.trimmed_mean(ups[:3], 1)) == [2.0, -0.0]  # the median of -0, 0, -0


def test_squared_norm_is_the_lane_sum(kernels: list[AggregationKernel]) -> None:
    start = f32([0.5] * 11)
    x = f32([float(i) for i in range(11)])
    lanes = [0.0] * 8
    for i in range(11):
        d = float(i) - 0.5
        lanes[i % 8] += d * d
    expected = lanes[0]
    for lane in lanes[1:]:
        expected += lane
    for kern in kernels:
        assert kern.delta_sq_norms(start, [x]) == [expected]


def test_median_and_trim_counts() -> None:
    assert median([3.0]) == 3.0
    assert median([4.0, 1.0]) == 2.5
    assert median([5.0, 1.0, 2.0]) == 2.0
    assert [trim_count(n, "trimmedMean", 0.25) for n in (1, 2, 3, 4, 7, 8)] == [0, 0, 1, 1, 2, 2]
    assert [trim_count(n, "median", 0.25) for n in (1, 2, 3, 4, 7)] == [0, 0, 1, 1, 3]
    assert trim_count(9, "mean", 0.25) == 0


def contribution(aid: str, start: list[float], delta: list[float], count: int = 10) -> tuple[str, int, bytes]:
    return (aid, count, f32([s + d for s, d in zip(start, delta)]))


START = [1.0, 2.0, 3.0, 4.0]


def test_clip_scales_the_outlier_to_three_medians(kernels: list[AggregationKernel]) -> None:
    contribs = [
        contribution("a", START, [0.1, 0, 0, 0]),
        contribution("b", START, [0, 0.2, 0, 0]),
        contribution("c", START, [0, 0, 0.3, 0]),
        contribution("d", START, [0, 0, 0, 400.0]),  # the attacker
    ]
    settings = AggregationSettings(norm_clip=3)
    results = [aggregate_round(k, f32(START), contribs, settings, None) for k in kernels]
    assert results[0] == results[1] == results[2]
    report = results[0].report
    assert report is not None and report.clipped == ("d",) and report.outliers == ("d",)
    med = (float(np.float32(2.2)) - 2.0 + float(np.float32(3.3)) - 3.0) / 2  # median of the 4 norms
    assert report.median_norm == pytest.approx(med, rel=1e-6)
    # The attacker's delta is now 3 * median long, so the average moves by a quarter of it.
    avg = floats(results[0].weights)
    assert avg[3] - 4.0 == pytest.approx(3 * med / 4, rel=1e-5)
    plain = aggregate_round(kernels[0], f32(START), contribs, None, None)
    assert plain.report is None and floats(plain.weights)[3] == pytest.approx(104.0)


def test_clip_at_one_and_two_contributions_changes_nothing(kernels: list[AggregationKernel]) -> None:
    one = [contribution("a", START, [5.0, 0, 0, 0])]
    two = [contribution("a", START, [0.1, 0, 0, 0]), contribution("b", START, [0, 0, 0, 400.0])]
    settings = AggregationSettings(norm_clip=3)
    for contribs in (one, two):
        robust = aggregate_round(kernels[0], f32(START), contribs, settings, None)
        plain = aggregate_round(kernels[0], f32(START), contribs, None, None)
        assert robust.weights == plain.weights
        assert robust.report is not None and robust.report.clipped == ()


def test_median_zero_clips_without_dividing_by_zero(kernels: list[AggregationKernel]) -> None:
    contribs = [
        contribution("a", START, [0, 0, 0, 0]),
        contribution("b", START, [0, 0, 0, 0]),
        contribution("c", START, [0, 0, 0, 1e30]),
    ]
    for kern in kernels:
        result = aggregate_round(kern, f32(START), contribs, AggregationSettings(norm_clip=3), None)
        assert floats(result.weights) == START
        assert result.report is not None and result.report.median_norm == 0.0 and result.report.clipped == ("c",)
        trimmed = aggregate_round(kern, f32(START), contribs, AggregationSettings(combine="median"), None)
        assert floats(trimmed.weights) == START


def test_median_combine_ignores_one_attacker_of_four(kernels: list[AggregationKernel]) -> None:
    contribs = [contribution(a, START, [0.5, 0.5, 0.5, 0.5]) for a in "abc"]
    contribs.append(contribution("z", START, [1e30, -1e30, 1e30, 0]))
    for combine in ("median", "trimmedMean"):
        results = [
            aggregate_round(k, f32(START), contribs, AggregationSettings(method="fedavgm", combine=combine), None)
            for k in kernels
        ]
        assert results[0] == results[1] == results[2]
        assert results[0].report is not None and results[0].report.outliers == ("z",)
        assert results[0].report.trimmed == 1


def test_settings_parse_record_and_refuse() -> None:
    s = AggregationSettings.from_json({"method": "fedadam", "normClip": 3, "combine": "trimmedMean", "trim": 0.3})
    assert s.to_json() == {"method": "fedadam", "normClip": 3, "combine": "trimmedMean", "trim": 0.3}
    assert AggregationSettings.from_json(s.to_json()) == s
    ts = TrainingSettings.from_json({"epochs": 1, "localEpochs": 1, "batchSize": 8, "coordinatorParticipates": True, "aggregation": {"method": "fedavg", "normClip": 3}})
    assert ts.to_json()["aggregation"] == {"method": "fedavg", "normClip": 3}
    assert "aggregation" not in TrainingSettings.from_json({"epochs": 1, "localEpochs": 1, "batchSize": 8, "coordinatorParticipates": True}).to_json()
    bad = [
        ({"method": "fedavg", "normClip": 0.5}, "aggregation.normClip", "out-of-range"),
        ({"method": "fedavg", "normClip": None}, "aggregation.normClip", "invalid-setting"),
        ({"method": "fedavg", "normClip": "3"}, "aggregation.normClip", "invalid-setting"),
        ({"method": "fedavg", "normClip": True}, "aggregation.normClip", "invalid-setting"),
        ({"method": "fedavg", "normClip": float("inf")}, "aggregation.normClip", "invalid-setting"),
        ({"method": "fedavg", "combine": ["median"]}, "aggregation.combine", "invalid-setting"),
        ({"method": "fedavg", "combine": {}}, "aggregation.combine", "invalid-setting"),
        ({"method": "fedavg", "combine": "mode"}, "aggregation.combine", "invalid-setting"),
        ({"method": "fedavg", "trim": 0.2}, "aggregation.trim", "option-not-for-method"),
        ({"method": "fedavg", "combine": "trimmedMean", "trim": 0.5}, "aggregation.trim", "out-of-range"),
    ]
    for obj, field, reason in bad:
        with pytest.raises(SettingsError) as info:
            AggregationSettings.from_json(obj)
        assert (info.value.field, info.value.reason) == (field, reason), obj
    # Settings objects that did not come through the parser are checked too (a named field, no crash).
    for raw, field in (({"combine": {}}, "aggregation.combine"),
                       ({"norm_clip": 0}, "aggregation.normClip"),
                       ({"combine": "trimmedMean", "trim": 0.7}, "aggregation.trim")):
        with pytest.raises(SettingsError) as info:
            AggregationSettings(method="fedavg", **raw)
        assert info.value.field == field


def test_exclude_outliers_after_parses_records_and_refuses() -> None:
    obj = {"method": "fedavg", "normClip": 3, "combine": "trimmedMean", "excludeOutliersAfter": 3}
    s = AggregationSettings.from_json(obj)
    assert s.exclude_outliers_after == 3 and s.to_json() == obj and AggregationSettings.from_json(s.to_json()) == s
    assert AggregationSettings.from_json({"method": "fedavg", "combine": "median", "excludeOutliersAfter": 1})
    assert AggregationSettings().exclude_outliers_after is None  # off by default
    bad = [
        ({"method": "fedavg", "excludeOutliersAfter": 3}, "option-not-for-method"),  # no robust aggregation
        ({"method": "fedavg", "normClip": 3, "excludeOutliersAfter": 0}, "invalid-setting"),
        ({"method": "fedavg", "normClip": 3, "excludeOutliersAfter": 2.5}, "invalid-setting"),
        ({"method": "fedavg", "normClip": 3, "excludeOutliersAfter": True}, "invalid-setting"),
        ({"method": "fedavg", "normClip": 3, "excludeOutliersAfter": "3"}, "invalid-setting"),
        ({"method": "fedavg", "normClip": 3, "excludeOutliersAfter": 1001}, "out-of-range"),
        ({"method": "fedavg", "normClip": 3, "excludeOutliersAfter": None}, "invalid-setting"),
    ]
    for bad_obj, reason in bad:
        with pytest.raises(SettingsError) as info:
            AggregationSettings.from_json(bad_obj)
        assert (info.value.field, info.value.reason) == ("aggregation.excludeOutliersAfter", reason), bad_obj
