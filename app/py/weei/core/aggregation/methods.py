"""The aggregation methods, in one table.

Theory of operation: a method is one row of :data:`METHODS`: its name, its
options (JSON name, default, range), how many float32 copies of the weights
its optimizer state keeps, and its kernel entry (the server step, after the
round's FedAvg average). Everything that knows about methods reads this
table, so a new method is one row here plus its loop in the kernels:

* ``weei.core.formats.settings`` parses ``settings.aggregation`` (which
  options a method takes, their ranges, their defaults);
* ``weei.core.formats.modelinfo`` checks the model's ``aggregation.methods``;
* ``weei.core.formats.checkpoint`` sizes a checkpoint's aggregation state;
* ``weei.core.aggregation.aggregate`` runs the step and sizes the state;
* docs/api.md's table of methods is :func:`markdown_table` of it
  (tests/unit/test_methods.py fails when they differ).

This module sits below the formats (tests/unit/test_import_graph.py,
docs/architecture.md) because the parsers read it; so the kernel interface the
entries call is declared here too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from ..floats import BytesLike

__all__ = [
    "BytesLike",
    "Segment",
    "AggregationKernel",
    "Option",
    "Method",
    "Step",
    "METHODS",
    "FEDAVG",
    "markdown_table",
]

Segment = tuple[int, int]
"""A half-open element range ``[lo, hi)`` (elements, not bytes)."""


class AggregationKernel(Protocol):
    """The numeric loops; buffers are float32-le, already validated by the core.

    Implementations (numpy, native C, WebAssembly) must follow
    ``weei.core.aggregation.aggregate``'s docstring to the bit.
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
        nesterov: bool = False,
    ) -> tuple[bytes, bytes]:
        """Returns ``(weights, velocity)``: a step inside ``segments``, the
        average and the old velocity elsewhere; ``nesterov``: the step looks
        ahead along the new velocity."""
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

    def quantize(self, start: BytesLike, trained: BytesLike, residual: BytesLike, block: int,
                 bits: int) -> tuple[bytes, bytes, bytes]:
        """Block quantization of ``trained - start + residual`` (equal lengths, contiguous):
        returns ``(scales, codes, new residual)`` (weei.core.aggregation.compression)."""
        ...

    def dequantize(self, start: BytesLike, scales: BytesLike, codes: BytesLike, block: int, bits: int) -> BytesLike:
        """``f32(f64(start[i]) + f64(scale of i's block) * code[i])`` per element (a fresh buffer the caller owns:
        a kernel may hand over the one it wrote, where copying it to bytes would cost as much again)."""
        ...


Step = Callable[[AggregationKernel, BytesLike, BytesLike, BytesLike, Sequence[Segment], Sequence[float]],
                tuple[bytes, bytes]]
"""A kernel entry: ``(kernel, start, average, state, segments, option values in the row's order)``
returns ``(weights, state)``; ``state`` is ``state_copies`` times the weight bytes."""


@dataclass(frozen=True)
class Option:
    """One numeric option of a method: ``low <= x <= high`` (``x < high`` when ``below_high``)."""

    name: str  # the JSON name in settings.aggregation
    symbol: str  # the paper's letter (docs)
    default: float
    low: float
    high: float
    below_high: bool
    meaning: str
    whole: bool = False  # only whole numbers (a switch: 0 or 1)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.low) and math.isfinite(self.high) and self.low <= self.default <= self.high
                and not (self.below_high and self.default == self.high)):
            raise ValueError(f"option {self.name}: default {self.default} is outside its own range")

    def allows(self, value: float) -> bool:
        """Whether a finite ``value`` is in range."""
        if self.whole and value != int(value):
            return False
        return self.low <= value < self.high if self.below_high else self.low <= value <= self.high

    @property
    def range_text(self) -> str:
        """The range in words, as errors and the docs say it."""
        if self.whole:
            return " or ".join(f"{v:g}" for v in range(int(self.low), int(self.high) + 1))
        return f"from {self.low:g} to {'below ' if self.below_high else ''}{self.high:g}"


@dataclass(frozen=True)
class Method:
    """One aggregation method; ``step`` None means the FedAvg average is the result (no state)."""

    name: str
    label: str
    options: tuple[Option, ...]
    state_copies: int  # float32 copies of the weights in its state: the checkpoint's state is this x W bytes
    step: Step | None
    reference: str

    def __post_init__(self) -> None:
        if (self.step is None) != (self.state_copies == 0):
            raise ValueError(f"method {self.name}: a step needs state and state needs a step")

    def option(self, name: str) -> Option | None:
        """The option called ``name`` (JSON), or None when the method has none by that name."""
        return next((o for o in self.options if o.name == name), None)


def _fedavgm(kernel: AggregationKernel, start: BytesLike, average: BytesLike, state: BytesLike,
             segments: Sequence[Segment], values: Sequence[float]) -> tuple[bytes, bytes]:
    lr, momentum, nesterov = values
    return kernel.fedavgm(start, average, state, segments, lr, momentum, nesterov != 0)


def _fedadam(kernel: AggregationKernel, start: BytesLike, average: BytesLike, state: BytesLike,
             segments: Sequence[Segment], values: Sequence[float]) -> tuple[bytes, bytes]:
    lr, beta1, beta2, epsilon = values
    return kernel.fedadam(start, average, state, segments, lr, beta1, beta2, epsilon)


def _lr(default: float) -> Option:
    return Option("serverLearningRate", "η", default, 0.0, 10.0, False, "server step size")


# Ranges are the spec's; epsilon may be 0 ("from 0 to 1"): the kernels take 0/0 as a zero step.
_BETA = "decay of the mean of Δ"
METHODS: Mapping[str, Method] = {
    m.name: m
    for m in (
        Method("fedavg", "FedAvg", (), 0, None, "McMahan et al. 2017"),
        Method("fedavgm", "FedAvgM",
               (_lr(1.0), Option("momentum", "μ", 0.9, 0.0, 1.0, True, "server momentum"),
                Option("nesterov", "–", 0.0, 0.0, 1.0, False, "Nesterov momentum, 1 is on; DiLoCo: η 0.7, μ 0.9",
                       whole=True)),
               1, _fedavgm, "Hsu et al. 2019; Nesterov: Sutskever et al. 2013, DiLoCo (Douillard et al. 2023)"),
        Method("fedadam", "FedAdam",
               (_lr(0.01), Option("beta1", "β1", 0.9, 0.0, 1.0, True, _BETA),
                Option("beta2", "β2", 0.99, 0.0, 1.0, True, "decay of the mean of Δ²"),
                Option("epsilon", "ε", 0.001, 0.0, 1.0, False, "added to √v")),
               2, _fedadam, "Reddi et al. 2021, Alg. 2, no bias correction"),
    )
}
"""Every method by name, in the order the docs and error messages list them."""

FEDAVG = METHODS["fedavg"]


def markdown_table(methods: Mapping[str, Method] = METHODS) -> str:
    """The docs' table of methods (docs/api.md, "Aggregation methods"), one row per method."""
    lines = ["| method | options (default, range) | state | paper |", "|---|---|---|---|"]
    for m in methods.values():
        options = "; ".join(f"`{o.name}` {o.symbol} ({o.meaning}): {o.default:g}, {o.range_text}"
                            for o in m.options) or "–"
        state = f"{m.state_copies} × the weights" if m.state_copies else "none"
        lines.append(f"| `{m.name}` ({m.label}) | {options} | {state} | {m.reference} |")
    return "\n".join(lines) + "\n"
