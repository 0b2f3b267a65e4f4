"""Aggregation of a round: FedAvg, then the method's server step (FedAvgM, FedAdam).

The methods, their options and their state are one table,
:mod:`weei.core.aggregation.methods`; this module runs a row of it.

Pure functions over a small :class:`AggregationKernel` (the numeric loops),
stdlib only, no clock and no I/O: the same code runs in CPython (numpy or
native kernel) and in Pyodide (the WebAssembly kernel). Weights are flat
float32 little-endian byte buffers; a kernel never sees anything else.

Exact arithmetic (every implementation must do exactly this)
------------------------------------------------------------
All operations are IEEE-754 basic operations in round-to-nearest-even, with
no fused multiply-add anywhere (C is built with ``-ffp-contract=off``), so C
(wasm32 SIMD or native), numpy and a plain Python loop give the same bits.
``f64(x)`` widens a float32 (exact); ``f32(y)`` rounds a float64 to float32.

FedAvg (McMahan et al. 2017, eq. "w = sum_k n_k/n w_k"). Contributions are
sorted by assignment id first (the canonical order ``k = 0..N-1``), counts
``c_k`` are ints of at most 2**53 so ``float(c_k)`` and the total ``C`` are
exact::

    acc   = c_0 * f64(x_0[i])                  # first product, not 0.0 + ...
    acc   = acc + c_k * f64(x_k[i])            # k = 1..N-1, in that order
    avg_i = f32(acc / C)                       # one division, then one rounding

Δ is taken from the float32 average the round publishes (not from ``acc``),
so the optimizer step only needs float32 inputs::

    d = f64(avg[i]) - f64(start[i])

FedAvgM (server momentum; Hsu et al. 2019; Reddi et al. 2021 with β=μ)::

    v[i]   = f32(μ * f64(v[i]) + d)            # stored state, float32
    out[i] = f32(f64(start[i]) + η * f64(v[i]))   # uses the stored v

FedAdam (Reddi et al. 2021, "Adaptive Federated Optimization", Alg. 2, no
bias correction); ``b1c = 1.0 - β1`` and ``b2c = 1.0 - β2`` in float64::

    m[i]   = f32(β1 * f64(m[i]) + b1c * d)
    v[i]   = f32(β2 * f64(v[i]) + b2c * (d * d))
    out[i] = f32(f64(start[i]) + (η * f64(m[i])) / (sqrt(f64(v[i])) + ε))

where ``sqrt`` is the correctly rounded float64 square root and m, v are the
values just stored. State is float32: ``v`` for FedAvgM, ``m`` then ``v``
(one buffer of twice the weight bytes) for FedAdam, plus a step count.

Elements inside the model's ``averageOnly`` byte ranges take ``avg`` as it
is and keep their state unchanged. A non-finite value anywhere in the new
weights or state fails the round (``AggregationError('non-finite-result')``)
and nothing is returned, so the caller keeps the previous checkpoint.

Metrics (``weighted_mean``): the example-weighted mean of the values the
updates report. Any finite float64 is a value a model may report (a
diverging loss has no bound we could name), so the mean must not overflow
where ``sum(v_k * c_k)`` would (one ``loss: 1e308`` over 11 examples is
already infinite). Every value is first scaled by ``2**-e``, ``e`` the
exponent of the largest magnitude (``frexp``), so each scaled value lies in
(-1, 1) and the sums stay within the total count; scaling by a power of two
is exact, so values that do not overflow give the bits of
``sum(v_k * c_k) / C``. A weighted mean lies between the smallest and the
largest value: the result is clamped there (a rounding step past them could
overflow the scaling back) and then scaled back by ``2**e``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Union

from weei.core.errors import AggregationError, ManifestError, SettingsError
from weei.core.errors import AggregationReason, ModelInfoReason, SettingsReason
from weei.core.aggregation.methods import METHODS, AggregationKernel, BytesLike, Method, Segment
from weei.core.aggregation.robust import RobustReport, robust_average
from weei.core.formats.modelinfo import ModelAggregation
from weei.core.formats.settings import AggregationSettings
from weei.core.privacy.dp_noise import DpReport, dp_average
from weei.core.privacy.dp_settings import DpSettings

__all__ = [
    "MAX_COUNT",
    "BytesLike",
    "Segment",
    "Contribution",
    "AggregationKernel",
    "AggregationState",
    "RoundAggregate",
    "canonical_contributions",
    "fedavg",
    "weighted_mean",
    "trainable_segments",
    "server_step",
    "check_finite",
    "DpRound",
    "aggregate_round",
]

Contribution = tuple[Union[str, int], int, BytesLike]
"""``(assignment_id, count, weights)`` as handed over by the coordinator."""

#: Counts and their total must stay exact as float64.
MAX_COUNT = 2**53


@dataclass(frozen=True)
class AggregationState:
    """Optimizer state after a round: float32-le ``data`` and a step count."""

    method: str
    step: int
    data: bytes

    def __post_init__(self) -> None:
        row = METHODS.get(self.method) if isinstance(self.method, str) else None
        if row is None or not row.state_copies:
            raise AggregationError(AggregationReason.INVALID_STATE, f"state of {self.method!r}, not a method that keeps state")
        if isinstance(self.step, bool) or not isinstance(self.step, int) or self.step < 0:
            raise AggregationError(AggregationReason.INVALID_STATE, f"state step must be an int >= 0, got {self.step!r}")
        if len(self.data) % 4:
            raise AggregationError(AggregationReason.INVALID_STATE, "state data is not whole float32 values")


@dataclass(frozen=True)
class RoundAggregate:
    """The next checkpoint's weights and optimizer state (None for FedAvg);
    ``report`` says what robust aggregation did (None when it is off)."""

    weights: bytes
    state: AggregationState | None
    report: RobustReport | None = None
    dp: DpReport | None = None


@dataclass(frozen=True)
class DpRound:
    """Differential privacy for one round: the settings and the round's noise key
    (``weei.core.privacy.dp_noise.noise_key``; the coordinator's secret, never sent)."""

    settings: DpSettings
    key: bytes


def _byte_len(buf: BytesLike) -> int:
    # memoryview(...).nbytes is right for any buffer (len() of a numpy array
    # counts elements, not bytes).
    return buf.nbytes if isinstance(buf, memoryview) else memoryview(buf).nbytes


def canonical_contributions(
    contributions: Sequence[Contribution], weight_bytes: int
) -> tuple[list[BytesLike], list[int]]:
    """Validate contributions and sort them by assignment id.

    Returns ``(updates, counts)`` in canonical order. Raises AggregationError:
    ``empty-average`` (none given), ``duplicate-contribution``,
    ``invalid-count`` (not an int in 1..2**53, or total above 2**53),
    ``invalid-contribution`` (byte length differs from ``weight_bytes``).
    """
    if len(contributions) == 0:
        raise AggregationError(AggregationReason.EMPTY_AVERAGE, "no contributions to average: an empty average has no value")
    try:
        ordered = sorted(contributions, key=lambda c: c[0])
    except TypeError as exc:
        raise AggregationError(AggregationReason.INVALID_CONTRIBUTION, f"assignment ids are not mutually comparable: {exc}") from None
    total = 0
    for n, (aid, count, weights) in enumerate(ordered):
        if n and ordered[n - 1][0] == aid:
            raise AggregationError(AggregationReason.DUPLICATE_CONTRIBUTION, f"assignment {aid!r} contributed twice")
        if isinstance(count, bool) or not isinstance(count, int) or not 0 < count <= MAX_COUNT:
            raise AggregationError(AggregationReason.INVALID_COUNT, f"assignment {aid!r}: count must be an int in 1..2**53, got {count!r}")
        if _byte_len(weights) != weight_bytes:
            raise AggregationError(
                AggregationReason.INVALID_CONTRIBUTION,
                f"assignment {aid!r}: {_byte_len(weights)} weight bytes, expected {weight_bytes}",
            )
        total += count
    if total > MAX_COUNT:
        raise AggregationError(AggregationReason.INVALID_COUNT, f"total count {total} exceeds 2**53")
    return [c[2] for c in ordered], [c[1] for c in ordered]


def fedavg(kernel: AggregationKernel, contributions: Sequence[Contribution], weight_bytes: int) -> bytes:
    """The FedAvg average of validated contributions in canonical order.

    Returns float32-le bytes; raises AggregationError as
    :func:`canonical_contributions` does (an empty average is an error).
    """
    if weight_bytes % 4:
        raise AggregationError(AggregationReason.INVALID_CONTRIBUTION, f"weight bytes {weight_bytes} is not a multiple of 4")
    updates, counts = canonical_contributions(contributions, weight_bytes)
    return kernel.weighted_average(updates, counts)


def weighted_mean(values: Sequence[tuple[float, int]]) -> float:
    """The mean of finite ``(value, count)`` pairs weighted by their counts, finite for any finite values
    (see "Metrics" above).

    Raises: ValueError when there is no pair or a count is below 1.
    """
    if not values or any(count < 1 for _, count in values):
        raise ValueError("a weighted mean needs at least one value, each with a count of 1 or more")
    _, exponent = math.frexp(max(abs(v) for v, _ in values))
    scaled = [(math.ldexp(v, -exponent), count) for v, count in values]
    mean = sum(x * count for x, count in scaled) / sum(count for _, count in scaled)
    low, high = min(x for x, _ in scaled), max(x for x, _ in scaled)
    return math.ldexp(min(max(mean, low), high), exponent)


def trainable_segments(n_elems: int, average_only: Sequence[tuple[int, int]]) -> list[Segment]:
    """Element ranges outside the sorted, non-overlapping ``average_only``
    byte ranges. Raises ManifestError if a range ends past the weights."""
    segments: list[Segment] = []
    lo = 0
    for offset, size in average_only:
        if offset + size > n_elems * 4:
            raise ManifestError(
                ModelInfoReason.INVALID_AGGREGATION_INFO,
                f"aggregation.averageOnly range {offset}+{size} ends past the {n_elems * 4} weight bytes",
            )
        if size == 0:
            continue  # an empty range must not split a segment
        if offset // 4 > lo:
            segments.append((lo, offset // 4))
        lo = max(lo, (offset + size) // 4)
    if lo < n_elems:
        segments.append((lo, n_elems))
    return segments


def server_step(
    kernel: AggregationKernel,
    method: Method,
    start: BytesLike,
    average: BytesLike,
    state: AggregationState | None,
    segments: Sequence[Segment],
    values: Sequence[float],
) -> RoundAggregate:
    """One server step of a method with state (its kernel entry; see the module docstring for the bits).

    ``values`` are its options in the table's order. A state of another method
    (or None) restarts from zero. Raises AggregationError ``invalid-state`` if
    the state's size does not fit.
    """
    if method.step is None:
        raise ValueError(f"{method.name} has no server step")
    data = _state_data(state, method, _byte_len(start))
    weights, new_state = method.step(kernel, start, average, data, segments, values)
    step = state.step + 1 if state is not None and state.method == method.name else 1
    return RoundAggregate(weights, AggregationState(method.name, step, new_state))


def _state_data(state: AggregationState | None, method: Method, weight_bytes: int) -> bytes:
    size = method.state_copies * weight_bytes
    # A state of another method means the method changed: start from zero.
    if state is None or state.method != method.name:
        return bytes(size)
    if len(state.data) != size:
        raise AggregationError(
            AggregationReason.INVALID_STATE, f"{method.name} state has {len(state.data)} bytes, expected {size} for these weights"
        )
    return state.data


def check_finite(kernel: AggregationKernel, result: RoundAggregate) -> RoundAggregate:
    """Returns ``result`` if its weights and state are all finite; raises
    AggregationError ``non-finite-result`` naming the first bad element."""
    bad = kernel.first_non_finite(result.weights)
    if bad >= 0:
        raise AggregationError(
            AggregationReason.NON_FINITE_RESULT,
            f"weight {bad} of the aggregate is not finite; the previous checkpoint stays "
            "(lower serverLearningRate and retry)",
        )
    if result.state is not None:
        bad = kernel.first_non_finite(result.state.data)
        if bad >= 0:
            raise AggregationError(
                AggregationReason.NON_FINITE_RESULT, f"{result.state.method} state value {bad} is not finite; the previous checkpoint stays"
            )
    return result


def aggregate_round(
    kernel: AggregationKernel,
    start_weights: BytesLike,
    contributions: Sequence[Contribution],
    settings: AggregationSettings | None,
    state: AggregationState | None,
    model: ModelAggregation | None = None,
    dp: DpRound | None = None,
) -> RoundAggregate:
    """Aggregate one round: FedAvg (or with ``dp`` the clipped, noised, unweighted average of
    weei.core.privacy.dp_noise), then the configured method's server step.

    Takes the round's start weights, ``(assignment_id, count, weights)``
    contributions in any order, the aggregation settings (None: FedAvg), the
    previous checkpoint's state (None at the start) and the model's
    aggregation info (``ModelInfo.aggregation``; None: every method, no
    averageOnly range). Returns the new weights and state (state None for a
    method without state).

    Raises SettingsError ``method-not-allowed`` for a method the model does
    not allow, ManifestError for an averageOnly range past the weights,
    AggregationError for bad contributions, an empty average, a state that
    does not fit, or a non-finite result.
    """
    settings = settings or _FEDAVG
    method = settings.method_entry
    model = model or _ANY_MODEL
    if method.name not in model.allowed_methods:
        raise SettingsError(
            "aggregation.method",
            f"the model does not allow {method.name!r} (its aggregation.methods: "
            f"{', '.join(sorted(model.methods or ())) or 'fedavg'}; fedavg is always allowed)",
            reason=SettingsReason.METHOD_NOT_ALLOWED,
        )
    weight_bytes = _byte_len(start_weights)
    dp_report = None
    if dp is not None:
        if weight_bytes % 4:
            raise AggregationError(AggregationReason.INVALID_CONTRIBUTION, f"weight bytes {weight_bytes} is not a multiple of 4")
        updates, _ = canonical_contributions(contributions, weight_bytes)
        average, dp_report = dp_average(kernel, start_weights, updates, dp.settings.clip,
                                        dp.settings.noise_multiplier, dp.key)
        report = None
    else:
        average, report = _average(kernel, start_weights, contributions, settings, weight_bytes)
    if method.step is None:
        return check_finite(kernel, RoundAggregate(average, None, report, dp_report))
    average_only = sorted((r.offset, r.bytes) for r in model.average_only)
    segments = trainable_segments(weight_bytes // 4, average_only)
    result = server_step(kernel, method, start_weights, average, state, segments, settings.option_values())
    return check_finite(kernel, RoundAggregate(result.weights, result.state, report, dp_report))


_FEDAVG = AggregationSettings()
_ANY_MODEL = ModelAggregation()


def _average(
    kernel: AggregationKernel,
    start: BytesLike,
    contributions: Sequence[Contribution],
    settings: AggregationSettings,
    weight_bytes: int,
) -> tuple[bytes, RobustReport | None]:
    """FedAvg, or the robust average when ``normClip`` or ``combine`` is set."""
    if settings.norm_clip is None and settings.combine in (None, "mean"):
        return fedavg(kernel, contributions, weight_bytes), None
    if weight_bytes % 4:
        raise AggregationError(AggregationReason.INVALID_CONTRIBUTION, f"weight bytes {weight_bytes} is not a multiple of 4")
    updates, counts = canonical_contributions(contributions, weight_bytes)
    ids = sorted(c[0] for c in contributions)  # comparable: canonical_contributions checked
    return robust_average(kernel, start, ids, updates, counts, settings.norm_clip, settings.combine or "mean",
                          settings.effective_trim)
