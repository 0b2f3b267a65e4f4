"""Aggregation of a round: FedAvg, then optionally FedAvgM or FedAdam.

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, Union

from weei.core.errors import AggregationError, ManifestError, SettingsError
from weei.core.aggregation.robust import RobustReport, robust_average
from weei.core.formats.settings import COMBINES, DEFAULT_TRIM, MAX_NORM_CLIP

__all__ = [
    "METHODS",
    "DEFAULTS",
    "MAX_AVERAGE_ONLY_RANGES",
    "MAX_COUNT",
    "BytesLike",
    "Segment",
    "Contribution",
    "AggregationKernel",
    "AggregationSettingsLike",
    "AggregationState",
    "RoundAggregate",
    "ModelAggregationRules",
    "parse_model_aggregation_info",
    "canonical_contributions",
    "fedavg",
    "weighted_mean",
    "trainable_segments",
    "fedavgm_step",
    "fedadam_step",
    "check_finite",
    "aggregate_round",
]

BytesLike = Union[bytes, bytearray, memoryview]
"""A float32 little-endian buffer (a memoryview must be C-contiguous bytes)."""

Segment = tuple[int, int]
"""A half-open element range ``[lo, hi)`` (elements, not bytes)."""

Contribution = tuple[Union[str, int], int, BytesLike]
"""``(assignment_id, count, weights)`` as handed over by the coordinator."""

METHODS: tuple[str, ...] = ("fedavg", "fedavgm", "fedadam")

#: Effective defaults of the spec's AggregationSettings options.
DEFAULTS: Mapping[str, Mapping[str, float]] = {
    "fedavg": {},
    "fedavgm": {"server_learning_rate": 1.0, "momentum": 0.9},
    "fedadam": {"server_learning_rate": 0.01, "beta1": 0.9, "beta2": 0.99, "epsilon": 0.001},
}

MAX_AVERAGE_ONLY_RANGES = 4096
#: Counts and their total must stay exact as float64.
MAX_COUNT = 2**53

_STATE_FACTOR = {"fedavgm": 1, "fedadam": 2}


class AggregationKernel(Protocol):
    """The numeric loops; buffers are float32-le, already validated by the core.

    Implementations (numpy, native C, WebAssembly) must follow the module
    docstring to the bit.
    """

    def weighted_average(self, updates: Sequence[BytesLike], counts: Sequence[int]) -> bytes:
        """Takes equal-length updates in canonical order and positive counts;
        returns ``f32((Σ c_k·x_k) / Σ c_k)`` per element as bytes."""
        ...

    def fedavgm(
        self,
        start: BytesLike,
        average: BytesLike,
        velocity: BytesLike,
        segments: Sequence[Segment],
        lr: float,
        momentum: float,
    ) -> tuple[bytes, bytes]:
        """Returns ``(weights, velocity)``: a step inside ``segments``, the
        average and the old velocity elsewhere."""
        ...

    def fedadam(
        self,
        start: BytesLike,
        average: BytesLike,
        moments: BytesLike,
        segments: Sequence[Segment],
        lr: float,
        beta1: float,
        beta2: float,
        epsilon: float,
    ) -> tuple[bytes, bytes]:
        """``moments`` is m then v (twice the weight bytes); returns
        ``(weights, moments)`` as for :meth:`fedavgm`."""
        ...

    def first_non_finite(self, data: BytesLike) -> int:
        """Returns the element index of the first NaN/infinity, or -1."""
        ...

    def delta_sq_norms(self, start: BytesLike, updates: Sequence[BytesLike]) -> list[float]:
        """Squared float64 norm of each ``update - start`` (weei.core.aggregation.robust)."""
        ...

    def scale_delta(self, start: BytesLike, update: BytesLike, factor: float) -> bytes:
        """``f32(f64(s) + factor*(f64(x) - f64(s)))`` per element (norm clipping)."""
        ...

    def trimmed_mean(self, updates: Sequence[BytesLike], trim: int) -> bytes:
        """Per element: sort, drop ``trim`` values at each end, unweighted mean of the rest."""
        ...


class AggregationSettingsLike(Protocol):
    """What this module reads from ``weei.core.formats.settings.AggregationSettings``.

    ``method`` is required; each option is read as ``effective_<name>``
    when present, else ``<name>`` (None or absent: the spec's default), for
    ``server_learning_rate``, ``momentum``, ``beta1``, ``beta2``, ``epsilon``.
    """

    @property
    def method(self) -> str: ...


@dataclass(frozen=True)
class AggregationState:
    """Optimizer state after a round: float32-le ``data`` and a step count."""

    method: str
    step: int
    data: bytes

    def __post_init__(self) -> None:
        if self.method not in _STATE_FACTOR:
            raise AggregationError("invalid-state", f"state of unknown method {self.method!r}")
        if isinstance(self.step, bool) or not isinstance(self.step, int) or self.step < 0:
            raise AggregationError("invalid-state", f"state step must be an int >= 0, got {self.step!r}")
        if len(self.data) % 4:
            raise AggregationError("invalid-state", "state data is not whole float32 values")


@dataclass(frozen=True)
class RoundAggregate:
    """The next checkpoint's weights and optimizer state (None for FedAvg);
    ``report`` says what robust aggregation did (None when it is off)."""

    weights: bytes
    state: AggregationState | None
    report: RobustReport | None = None


@dataclass(frozen=True)
class ModelAggregationRules:
    """The model's aggregation info, normalised and checked.

    ``methods`` is None when every method is allowed; ``average_only`` holds
    sorted, non-overlapping ``(offset, bytes)`` byte ranges.
    """

    methods: frozenset[str] | None = None
    average_only: tuple[tuple[int, int], ...] = ()

    def allows(self, method: str) -> bool:
        """FedAvg is always allowed; otherwise the model's list decides."""
        return method == "fedavg" or self.methods is None or method in self.methods


def _field(obj: object, *names: str) -> object:
    for name in names:
        if isinstance(obj, Mapping):
            if name in obj:
                return obj[name]
        elif hasattr(obj, name):
            return getattr(obj, name)
    return None


def parse_model_aggregation_info(info: object) -> ModelAggregationRules:
    """Normalise the model's ``aggregation`` info.

    Takes None, the JSON mapping of ``getModelInfo().aggregation``, an object
    with ``methods``/``average_only`` attributes, or a ModelAggregationRules.
    Raises ManifestError (reason ``invalid-aggregation-info``) naming the
    field when a method is unknown or a range is misaligned, negative,
    overlapping or too many.
    """
    if info is None:
        return ModelAggregationRules()
    if isinstance(info, ModelAggregationRules):
        return info
    reason = "invalid-aggregation-info"
    raw_methods = _field(info, "methods")
    methods: frozenset[str] | None = None
    if raw_methods is not None:
        if isinstance(raw_methods, (str, bytes)) or not isinstance(raw_methods, Sequence | frozenset | set):
            raise ManifestError(reason, "aggregation.methods must be a list of method names")
        for m in raw_methods:
            if m not in METHODS:
                raise ManifestError(reason, f"aggregation.methods: unknown method {m!r}")
        methods = frozenset(raw_methods)
    raw_ranges = _field(info, "average_only", "averageOnly") or ()
    if not isinstance(raw_ranges, Sequence):
        raise ManifestError(reason, "aggregation.averageOnly must be a list")
    if len(raw_ranges) > MAX_AVERAGE_ONLY_RANGES:
        raise ManifestError(reason, f"aggregation.averageOnly has more than {MAX_AVERAGE_ONLY_RANGES} ranges")
    ranges: list[tuple[int, int]] = []
    for n, item in enumerate(raw_ranges):
        if isinstance(item, tuple) and len(item) == 2:
            offset, size = item
        else:
            offset, size = _field(item, "offset"), _field(item, "bytes")
        for name, value in (("offset", offset), ("bytes", size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0 or value % 4:
                raise ManifestError(reason, f"aggregation.averageOnly[{n}].{name} must be a multiple of 4 >= 0, got {value!r}")
        assert isinstance(offset, int) and isinstance(size, int)
        ranges.append((offset, size))
    ranges.sort()
    for (a_off, a_len), (b_off, _) in zip(ranges, ranges[1:]):
        if a_off + a_len > b_off:
            raise ManifestError(reason, f"aggregation.averageOnly ranges at {a_off} and {b_off} overlap")
    return ModelAggregationRules(methods, tuple(ranges))


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
        raise AggregationError("empty-average", "no contributions to average: an empty average has no value")
    try:
        ordered = sorted(contributions, key=lambda c: c[0])
    except TypeError as exc:
        raise AggregationError("invalid-contribution", f"assignment ids are not mutually comparable: {exc}") from None
    total = 0
    for n, (aid, count, weights) in enumerate(ordered):
        if n and ordered[n - 1][0] == aid:
            raise AggregationError("duplicate-contribution", f"assignment {aid!r} contributed twice")
        if isinstance(count, bool) or not isinstance(count, int) or not 0 < count <= MAX_COUNT:
            raise AggregationError("invalid-count", f"assignment {aid!r}: count must be an int in 1..2**53, got {count!r}")
        if _byte_len(weights) != weight_bytes:
            raise AggregationError(
                "invalid-contribution",
                f"assignment {aid!r}: {_byte_len(weights)} weight bytes, expected {weight_bytes}",
            )
        total += count
    if total > MAX_COUNT:
        raise AggregationError("invalid-count", f"total count {total} exceeds 2**53")
    return [c[2] for c in ordered], [c[1] for c in ordered]


def fedavg(kernel: AggregationKernel, contributions: Sequence[Contribution], weight_bytes: int) -> bytes:
    """The FedAvg average of validated contributions in canonical order.

    Returns float32-le bytes; raises AggregationError as
    :func:`canonical_contributions` does (an empty average is an error).
    """
    if weight_bytes % 4:
        raise AggregationError("invalid-contribution", f"weight bytes {weight_bytes} is not a multiple of 4")
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
                "invalid-aggregation-info",
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


def _option(settings: object, method: str, name: str) -> float:
    camel = {"server_learning_rate": "serverLearningRate"}.get(name, name)
    # weei.core.formats.settings.AggregationSettings gives effective_<name>; a plain
    # object or JSON mapping may give the raw option (None: the default).
    value = _field(settings, f"effective_{name}", name, camel)
    if value is None:
        value = DEFAULTS[method][name]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise SettingsError(f"aggregation.{camel}", f"must be a finite number, got {value!r}")
    return float(value)


def fedavgm_step(
    kernel: AggregationKernel,
    start: BytesLike,
    average: BytesLike,
    state: AggregationState | None,
    segments: Sequence[Segment],
    lr: float,
    momentum: float,
) -> RoundAggregate:
    """One FedAvgM server step (see the module docstring for the bits).

    A state of another method (or None) restarts from zero. Raises
    AggregationError ``invalid-state`` if the state's size does not fit.
    """
    velocity = _state_data(state, "fedavgm", _byte_len(start))
    weights, new_v = kernel.fedavgm(start, average, velocity, segments, lr, momentum)
    step = state.step + 1 if state is not None and state.method == "fedavgm" else 1
    return RoundAggregate(weights, AggregationState("fedavgm", step, new_v))


def fedadam_step(
    kernel: AggregationKernel,
    start: BytesLike,
    average: BytesLike,
    state: AggregationState | None,
    segments: Sequence[Segment],
    lr: float,
    beta1: float,
    beta2: float,
    epsilon: float,
) -> RoundAggregate:
    """One FedAdam server step (Reddi et al. 2021, Alg. 2, no bias correction).

    Same state rules as :func:`fedavgm_step`; the state is m then v.
    """
    moments = _state_data(state, "fedadam", _byte_len(start))
    weights, new_m = kernel.fedadam(start, average, moments, segments, lr, beta1, beta2, epsilon)
    step = state.step + 1 if state is not None and state.method == "fedadam" else 1
    return RoundAggregate(weights, AggregationState("fedadam", step, new_m))


def _state_data(state: AggregationState | None, method: str, weight_bytes: int) -> bytes:
    size = _STATE_FACTOR[method] * weight_bytes
    # A state of another method means the method changed: start from zero.
    if state is None or state.method != method:
        return bytes(size)
    if len(state.data) != size:
        raise AggregationError(
            "invalid-state", f"{method} state has {len(state.data)} bytes, expected {size} for these weights"
        )
    return state.data


def check_finite(kernel: AggregationKernel, result: RoundAggregate) -> RoundAggregate:
    """Returns ``result`` if its weights and state are all finite; raises
    AggregationError ``non-finite-result`` naming the first bad element."""
    bad = kernel.first_non_finite(result.weights)
    if bad >= 0:
        raise AggregationError(
            "non-finite-result",
            f"weight {bad} of the aggregate is not finite; the previous checkpoint stays "
            "(lower serverLearningRate and retry)",
        )
    if result.state is not None:
        bad = kernel.first_non_finite(result.state.data)
        if bad >= 0:
            raise AggregationError(
                "non-finite-result", f"{result.state.method} state value {bad} is not finite; the previous checkpoint stays"
            )
    return result


def aggregate_round(
    kernel: AggregationKernel,
    start_weights: BytesLike,
    contributions: Sequence[Contribution],
    settings: AggregationSettingsLike | None,
    state: AggregationState | None,
    model_aggregation_info: object = None,
) -> RoundAggregate:
    """Aggregate one round: FedAvg, then the configured server optimizer.

    Takes the round's start weights, ``(assignment_id, count, weights)``
    contributions in any order, the aggregation settings (None: FedAvg), the
    previous checkpoint's state (None at the start) and the model's
    aggregation info (see :func:`parse_model_aggregation_info`). Returns the
    new weights and state (state None for FedAvg).

    Raises SettingsError (``method-not-allowed`` / ``invalid-setting``) for a
    method the model does not allow or does not exist, ManifestError for bad
    aggregation info, AggregationError for bad contributions, an empty
    average, a state that does not fit, or a non-finite result.
    """
    method = "fedavg" if settings is None else settings.method
    if method not in METHODS:
        raise SettingsError("aggregation.method", f"unknown method {method!r}; expected one of {', '.join(METHODS)}")
    rules = parse_model_aggregation_info(model_aggregation_info)
    if not rules.allows(method):
        allowed = ", ".join(sorted(rules.methods or ()) or ["fedavg"])
        raise SettingsError(
            "aggregation.method",
            f"the model does not allow {method!r} (its aggregation.methods: {allowed}; fedavg is always allowed)",
            reason="method-not-allowed",
        )
    weight_bytes = _byte_len(start_weights)
    average, report = _average(kernel, start_weights, contributions, settings, weight_bytes)
    if method == "fedavg":
        return check_finite(kernel, RoundAggregate(average, None, report))
    # Options are read before the arithmetic so a bad one costs nothing.
    lr = _option(settings, method, "server_learning_rate")
    segments = trainable_segments(weight_bytes // 4, rules.average_only)
    if method == "fedavgm":
        result = fedavgm_step(kernel, start_weights, average, state, segments, lr, _option(settings, method, "momentum"))
    else:
        result = fedadam_step(
            kernel,
            start_weights,
            average,
            state,
            segments,
            lr,
            _option(settings, method, "beta1"),
            _option(settings, method, "beta2"),
            _option(settings, method, "epsilon"),
        )
    return check_finite(kernel, RoundAggregate(result.weights, result.state, report))


def _average(
    kernel: AggregationKernel,
    start: BytesLike,
    contributions: Sequence[Contribution],
    settings: object,
    weight_bytes: int,
) -> tuple[bytes, RobustReport | None]:
    """FedAvg, or the robust average when ``normClip`` or ``combine`` is set."""
    norm_clip = _field(settings, "norm_clip", "normClip")
    combine = _field(settings, "combine")
    if norm_clip is None and (combine is None or combine == "mean"):
        return fedavg(kernel, contributions, weight_bytes), None
    if combine is not None and combine not in COMBINES:
        raise SettingsError("aggregation.combine", f"must be one of {', '.join(COMBINES)}, got {combine!r}")
    if norm_clip is not None and (
        isinstance(norm_clip, bool) or not isinstance(norm_clip, (int, float)) or not 1 <= norm_clip <= MAX_NORM_CLIP
    ):
        raise SettingsError("aggregation.normClip", f"must be a number from 1 to {MAX_NORM_CLIP:g}, got {norm_clip!r}")
    trim = _field(settings, "effective_trim", "trim")
    trim = DEFAULT_TRIM if trim is None else trim
    if isinstance(trim, bool) or not isinstance(trim, (int, float)) or not 0 < trim < 0.5:
        raise SettingsError("aggregation.trim", f"must be above 0 and below 0.5, got {trim!r}")
    if weight_bytes % 4:
        raise AggregationError("invalid-contribution", f"weight bytes {weight_bytes} is not a multiple of 4")
    updates, counts = canonical_contributions(contributions, weight_bytes)
    ids = sorted(c[0] for c in contributions)  # type: ignore[type-var]  # comparable: checked above
    return robust_average(kernel, start, ids, updates, counts, norm_clip, combine or "mean", float(trim))
