"""weei.core.aggregation.aggregate against an independent plain-Python reference.

The reference below is written from the formulas in the spec and the
module docstring, element by element with ``struct`` and Python floats
(IEEE float64), sharing no code with the kernels.
"""

from __future__ import annotations

import math
import random
import struct
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weei.core.aggregation.aggregate import (
    AggregationKernel,
    AggregationState,
    aggregate_round,
    trainable_segments,
)
from weei.core.errors import AggregationError, ManifestError, SettingsError
from weei.core.formats.modelinfo import ModelAggregation
from weei.core.formats.settings import AggregationSettings
from weei.kernel.numpy_kernel import NumpyKernel

# ------------------------------------------------------------------ reference


def f32(x: float) -> float:
    """Round a float64 to float32 (nearest-even), infinities kept."""
    try:
        return struct.unpack("<f", struct.pack("<f", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


def unpack(b: bytes) -> list[float]:
    return list(struct.unpack(f"<{len(b) // 4}f", b))


def pack(xs: Sequence[float]) -> bytes:
    return struct.pack(f"<{len(xs)}f", *xs)


def ref_average(contribs: Sequence[tuple[str, int, bytes]]) -> list[float]:
    ordered = sorted(contribs, key=lambda c: c[0])
    total = sum(c[1] for c in ordered)
    xs = [unpack(c[2]) for c in ordered]
    out = []
    for i in range(len(xs[0])):
        acc = float(ordered[0][1]) * xs[0][i]
        for (_, count, _), x in zip(ordered[1:], xs[1:]):
            acc = acc + float(count) * x[i]
        out.append(f32(acc / float(total)))
    return out


def ref_trainable(n: int, average_only: Sequence[tuple[int, int]]) -> list[bool]:
    mask = [True] * n
    for off, size in average_only:
        for i in range(off // 4, (off + size) // 4):
            mask[i] = False
    return mask


def ref_fedavgm(start, avg, v, mask, lr, mu):
    w, nv = list(avg), list(v)
    for i in range(len(avg)):
        if not mask[i]:
            continue
        d = avg[i] - start[i]
        nv[i] = f32(mu * v[i] + d)
        w[i] = f32(start[i] + lr * nv[i])
    return w, nv


def ref_fedadam(start, avg, m, v, mask, lr, b1, b2, eps):
    w, nm, nv = list(avg), list(m), list(v)
    for i in range(len(avg)):
        if not mask[i]:
            continue
        d = avg[i] - start[i]
        nm[i] = f32(b1 * m[i] + (1.0 - b1) * d)
        nv[i] = f32(b2 * v[i] + (1.0 - b2) * (d * d))
        w[i] = f32(start[i] + (lr * nm[i]) / (math.sqrt(nv[i]) + eps))
    return w, nm, nv


# ------------------------------------------------------------------- helpers


def Plain(method: str, **options: float) -> AggregationSettings:
    """Settings of ``method`` with the given options (JSON names)."""
    return AggregationSettings.from_json({"method": method, **options})


def info_of(obj: dict) -> ModelAggregation:
    """The model's parsed aggregation info."""
    return ModelAggregation.from_json(obj)


def rand_weights(rng: random.Random, n: int, scale: float = 1.0) -> bytes:
    return pack([f32(rng.gauss(0.0, scale)) for _ in range(n)])


def make_round(seed: int, n: int = 37, k: int = 4):
    rng = random.Random(seed)
    start = rand_weights(rng, n)
    contribs = [(f"a{j:03d}", rng.randint(1, 500), rand_weights(rng, n)) for j in range(k)]
    return start, contribs


@pytest.fixture(params=["numpy", "native", "wasm"])
def kernel(request: pytest.FixtureRequest) -> AggregationKernel:
    if request.param == "numpy":
        return NumpyKernel(block=8)  # tiny blocks: block edges are exercised
    if request.param == "native":
        from weei.kernel.native import NativeKernel

        return NativeKernel()
    from weei.kernel.wasm_kernel import WasmKernel

    return WasmKernel()


AVG_ONLY = [(8, 12), (100, 4)]  # elements 2..4 and 25


# --------------------------------------------------------------------- FedAvg


def test_fedavg_matches_reference(kernel: AggregationKernel) -> None:
    start, contribs = make_round(1)
    out = aggregate_round(kernel, start, contribs, None, None)
    assert out.state is None
    assert unpack(out.weights) == ref_average(contribs)


@settings(max_examples=40, deadline=None)
@given(st.permutations(list(range(6))), st.integers(0, 2**16))
def test_fedavg_same_bits_whatever_the_arrival_order(order: list[int], seed: int) -> None:
    start, contribs = make_round(seed, n=19, k=6)
    kernel = NumpyKernel(block=5)
    canonical = aggregate_round(kernel, start, contribs, None, None).weights
    shuffled = [contribs[i] for i in order]
    assert aggregate_round(kernel, start, shuffled, None, None).weights == canonical
    fedadam = AggregationSettings(method="fedadam")
    assert (
        aggregate_round(kernel, start, shuffled, fedadam, None)
        == aggregate_round(kernel, start, contribs, fedadam, None)
    )


def test_fedavg_is_exact_for_identical_updates(kernel: AggregationKernel) -> None:
    w = pack([1.5, -0.0, 3.25e-40, -7.0])
    out = aggregate_round(kernel, w, [("b", 3, w), ("a", 5, w)], None, None)
    assert out.weights == w  # including -0.0 and a subnormal


# ----------------------------------------------------------- FedAvgM/FedAdam


def test_fedavgm_matches_reference_over_rounds(kernel: AggregationKernel) -> None:
    n = 37
    info = info_of({"averageOnly": [{"offset": o, "bytes": b} for o, b in AVG_ONLY]})
    mask = ref_trainable(n, AVG_ONLY)
    cfg = Plain("fedavgm", serverLearningRate=0.7, momentum=0.85)
    state, weights = None, None
    v = [0.0] * n
    for r in range(4):
        start, contribs = make_round(100 + r, n)
        if weights is not None:
            start = weights
        out = aggregate_round(kernel, start, contribs, cfg, state, info)
        w_ref, v = ref_fedavgm(unpack(start), ref_average(contribs), v, mask, 0.7, 0.85)
        assert unpack(out.weights) == w_ref
        assert out.state is not None and out.state.method == "fedavgm" and out.state.step == r + 1
        assert unpack(out.state.data) == v
        state, weights = out.state, out.weights


def test_fedadam_matches_reference_over_rounds(kernel: AggregationKernel) -> None:
    n = 37
    mask = ref_trainable(n, AVG_ONLY)
    info = info_of({"methods": ["fedadam"], "averageOnly": [{"offset": o, "bytes": b} for o, b in AVG_ONLY]})
    cfg = Plain("fedadam", serverLearningRate=0.05, beta1=0.8, beta2=0.95, epsilon=1e-4)
    state, weights = None, None
    m, v = [0.0] * n, [0.0] * n
    for r in range(4):
        start, contribs = make_round(200 + r, n)
        if weights is not None:
            start = weights
        out = aggregate_round(kernel, start, contribs, cfg, state, info)
        w_ref, m, v = ref_fedadam(unpack(start), ref_average(contribs), m, v, mask, 0.05, 0.8, 0.95, 1e-4)
        assert unpack(out.weights) == w_ref
        assert out.state is not None and out.state.step == r + 1
        assert unpack(out.state.data) == m + v
        state, weights = out.state, out.weights


def test_defaults_are_the_spec_defaults(kernel: AggregationKernel) -> None:
    start, contribs = make_round(7)
    n = len(start) // 4
    mask = [True] * n
    avg = ref_average(contribs)
    out = aggregate_round(kernel, start, contribs, Plain("fedavgm"), None)
    assert unpack(out.weights) == ref_fedavgm(unpack(start), avg, [0.0] * n, mask, 1.0, 0.9)[0]
    out = aggregate_round(kernel, start, contribs, Plain("fedadam"), None)
    assert unpack(out.weights) == ref_fedadam(unpack(start), avg, [0.0] * n, [0.0] * n, mask, 0.01, 0.9, 0.99, 0.001)[0]


def test_average_only_ranges_take_the_plain_average(kernel: AggregationKernel) -> None:
    start, contribs = make_round(3)
    avg = ref_average(contribs)
    info = info_of({"averageOnly": [{"offset": 8, "bytes": 12}, {"offset": 100, "bytes": 4}]})
    prev = AggregationState("fedadam", 5, pack([0.5] * (2 * 37)))
    out = aggregate_round(kernel, start, contribs, Plain("fedadam"), prev, info)
    w, state = unpack(out.weights), unpack(out.state.data)  # type: ignore[union-attr]
    for i in (2, 3, 4, 25):
        assert w[i] == avg[i]
        assert state[i] == 0.5 and state[37 + i] == 0.5  # state unchanged
    for i in (0, 1, 5, 24, 26, 36):
        assert w[i] != avg[i] and state[i] != 0.5


def test_trainable_segments() -> None:
    assert trainable_segments(10, []) == [(0, 10)]
    assert trainable_segments(10, [(0, 8), (36, 4)]) == [(2, 9)]
    assert trainable_segments(10, [(0, 40)]) == []
    assert trainable_segments(10, [(4, 0)]) == [(0, 10)]
    with pytest.raises(ManifestError):
        trainable_segments(10, [(36, 8)])


# ----------------------------------------------------- settings and state rules


def test_method_allowlist(kernel: AggregationKernel) -> None:
    start, contribs = make_round(4)
    info = info_of({"methods": ["fedavgm"]})
    with pytest.raises(SettingsError) as err:
        aggregate_round(kernel, start, contribs, Plain("fedadam"), None, info)
    assert err.value.reason == "method-not-allowed" and "fedadam" in str(err.value)
    assert err.value.field == "aggregation.method"
    # FedAvg is always allowed, even when not listed.
    aggregate_round(kernel, start, contribs, Plain("fedavg"), None, info_of({"methods": []}))
    aggregate_round(kernel, start, contribs, Plain("fedavgm"), None, info)
    with pytest.raises(SettingsError):
        aggregate_round(kernel, start, contribs, Plain("sgd"), None)  # refused by the settings already


def test_method_change_restarts_state(kernel: AggregationKernel) -> None:
    start, contribs = make_round(5)
    n = len(start) // 4
    momentum_state = AggregationState("fedavgm", 9, pack([0.25] * n))
    fresh = aggregate_round(kernel, start, contribs, Plain("fedadam"), None)
    switched = aggregate_round(kernel, start, contribs, Plain("fedadam"), momentum_state)
    assert switched == fresh and switched.state is not None and switched.state.step == 1
    adam_state = AggregationState("fedadam", 3, pack([0.25] * (2 * n)))
    back = aggregate_round(kernel, start, contribs, Plain("fedavgm"), adam_state)
    assert back == aggregate_round(kernel, start, contribs, Plain("fedavgm"), None)
    # FedAvg keeps no state.
    assert aggregate_round(kernel, start, contribs, Plain("fedavg"), adam_state).state is None


def test_option_change_keeps_state(kernel: AggregationKernel) -> None:
    start, contribs = make_round(6)
    n = len(start) // 4
    v = [f32(random.Random(1).uniform(-1, 1)) for _ in range(n)]
    prev = AggregationState("fedavgm", 4, pack(v))
    out = aggregate_round(kernel, start, contribs, Plain("fedavgm", serverLearningRate=2.0, momentum=0.5), prev)
    w_ref, v_ref = ref_fedavgm(unpack(start), ref_average(contribs), v, [True] * n, 2.0, 0.5)
    assert unpack(out.weights) == w_ref and unpack(out.state.data) == v_ref  # type: ignore[union-attr]
    assert out.state.step == 5  # type: ignore[union-attr]


def test_state_of_wrong_size_is_refused(kernel: AggregationKernel) -> None:
    start, contribs = make_round(8)
    with pytest.raises(AggregationError) as err:
        aggregate_round(kernel, start, contribs, Plain("fedavgm"), AggregationState("fedavgm", 1, bytes(8)))
    assert err.value.reason == "invalid-state"


# ----------------------------------------------------------------- failures


def test_non_finite_result_fails_the_round(kernel: AggregationKernel) -> None:
    start = pack([0.0, 1.0])
    big = pack([3.0e38, 1.0])
    with pytest.raises(AggregationError) as err:
        aggregate_round(kernel, start, [("a", 1, big)], Plain("fedavgm", serverLearningRate=10.0), None)
    assert err.value.reason == "non-finite-result" and "weight 0" in str(err.value)
    nan = pack([1.0, math.nan])
    with pytest.raises(AggregationError) as err:
        aggregate_round(kernel, start, [("a", 1, nan), ("b", 1, start)], None, None)
    assert err.value.reason == "non-finite-result" and "weight 1" in str(err.value)


def test_non_finite_state_fails_the_round(kernel: AggregationKernel) -> None:
    start = pack([0.0, 1.0])
    # The weight lands in an average-only range, the bad state value does not.
    prev = AggregationState("fedavgm", 1, pack([math.inf, 0.0]))
    with pytest.raises(AggregationError) as err:
        aggregate_round(kernel, start, [("a", 1, start)], Plain("fedavgm"), prev, info_of({"averageOnly": [{"offset": 0, "bytes": 4}]}))
    assert err.value.reason == "non-finite-result" and "state" in str(err.value)


@pytest.mark.parametrize(
    ("contribs", "reason"),
    [
        ([], "empty-average"),
        ([("a", 0, pack([1.0, 2.0]))], "invalid-count"),
        ([("a", -3, pack([1.0, 2.0]))], "invalid-count"),
        ([("a", True, pack([1.0, 2.0]))], "invalid-count"),
        ([("a", 2.0, pack([1.0, 2.0]))], "invalid-count"),
        ([("a", 2**53, pack([1.0, 2.0])), ("b", 1, pack([1.0, 2.0]))], "invalid-count"),
        ([("a", 1, pack([1.0]))], "invalid-contribution"),
        ([("a", 1, pack([1.0, 2.0]) + b"\0")], "invalid-contribution"),
        ([("a", 1, pack([1.0, 2.0])), ("a", 2, pack([1.0, 2.0]))], "duplicate-contribution"),
        ([("a", 1, pack([1.0, 2.0])), (7, 2, pack([1.0, 2.0]))], "invalid-contribution"),
    ],
)
def test_bad_contributions_are_refused(contribs: list, reason: str) -> None:
    with pytest.raises(AggregationError) as err:
        aggregate_round(NumpyKernel(), pack([0.0, 0.0]), contribs, None, None)
    assert err.value.reason == reason


def test_memoryview_and_bytearray_inputs() -> None:
    start, contribs = make_round(9)
    as_views = [(a, c, memoryview(bytearray(w))) for a, c, w in contribs]
    k = NumpyKernel()
    assert aggregate_round(k, memoryview(start), as_views, Plain("fedavgm"), None) == aggregate_round(
        k, start, contribs, Plain("fedavgm"), None
    )


@pytest.mark.parametrize(
    "info",
    [
        {"methods": ["fedsgd"]},
        {"methods": "fedavgm"},
        {"averageOnly": [{"offset": 2, "bytes": 4}]},
        {"averageOnly": [{"offset": 0, "bytes": 6}]},
        {"averageOnly": [{"offset": -4, "bytes": 4}]},
        {"averageOnly": [{"offset": 0, "bytes": 8}, {"offset": 4, "bytes": 4}]},
        {"averageOnly": [{"offset": 0, "bytes": 4}] * 4097},
    ],
)
def test_bad_model_aggregation_info_is_refused(info: dict) -> None:
    with pytest.raises(ManifestError) as err:
        ModelAggregation.from_json(info)
    assert err.value.reason == "invalid-aggregation-info"


def test_average_only_past_the_weights_is_refused() -> None:
    start, contribs = make_round(10, n=4)
    with pytest.raises(ManifestError):
        aggregate_round(NumpyKernel(), start, contribs, Plain("fedavgm"), None, info_of({"averageOnly": [{"offset": 12, "bytes": 8}]}))


def test_average_only_ranges_in_any_order_and_empty() -> None:
    """The model info keeps its ranges as given; the step sorts them and skips empty ones."""
    start, contribs = make_round(11)
    k = NumpyKernel()
    ordered = info_of({"averageOnly": [{"offset": 8, "bytes": 12}, {"offset": 100, "bytes": 4}]})
    shuffled = info_of({"averageOnly": [{"offset": 100, "bytes": 4}, {"offset": 40, "bytes": 0}, {"offset": 8, "bytes": 12}]})
    assert aggregate_round(k, start, contribs, Plain("fedadam"), None, shuffled) == aggregate_round(
        k, start, contribs, Plain("fedadam"), None, ordered
    )
