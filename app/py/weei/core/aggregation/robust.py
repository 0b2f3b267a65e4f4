"""Robust aggregation: norm clipping against the round's median, trimmed mean, median.

Additive options of ``settings.aggregation`` (weei.core.formats.settings; off when
absent, so plain FedAvg keeps its bits). They change how the round's average
is formed, before FedAvgM/FedAdam apply it:

* ``normClip: c`` (the rule of ../shared/spec/002): with ``d_k = x_k - start``
  the delta of contribution k and ``m`` the median of the ``|d_k|``, a
  contribution with ``|d_k| > c·m`` is replaced by ``start + (c·m/|d_k|)·d_k``
  (its delta scaled down to ``c·m``). Robust statistics need an honest
  majority: at 1 contribution the median is its own norm, so nothing is
  clipped; at 2 the median is the mean of the two norms, which one norm can
  never exceed 3 times (with c >= 2 nothing is clipped, and an attacker moves
  the average freely); from 3 on, one outlier among honest peers is capped
  at c times an honest norm. A median of 0 (most deltas zero) caps every
  other delta at 0: the factor is ``0/|d_k|`` with ``|d_k| > 0``, never a
  division by zero.
* ``combine: "trimmedMean" | "median"``: per weight, the contributions'
  values are sorted and ``t`` are dropped at each end, the rest averaged
  without counts (``t = min(ceil(trim·N), (N-1)//2)``; the median is
  ``t = (N-1)//2``, the mean of the two middle values for even N). At N <= 2
  nothing is trimmed (an unweighted mean); one attacker of N needs t >= 1.

Exact arithmetic: squared norms come from the kernel (``delta_sq_norms``,
eight fixed lanes), norms are ``math.sqrt`` of them and the median and
factors are Python float64 operations in canonical (assignment id) order, so
every platform computes the same factors; scaling and the trimmed mean are
kernel loops (c/kernel/aggregate.c) with the bits of the numpy oracle.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, Union

from ..errors import AggregationError, AggregationReason

__all__ = ["OUTLIER_MULTIPLE", "RobustKernel", "RobustReport", "median", "trim_count", "robust_average"]

#: A contribution whose delta norm exceeds this multiple of the median is
#: reported as an outlier when ``normClip`` is off (the spec's multiple).
OUTLIER_MULTIPLE = 3.0

_Buf = Union[bytes, bytearray, memoryview]


class RobustKernel(Protocol):
    """The kernel loops robust aggregation needs (weei.kernel implements them)."""

    def weighted_average(self, updates: Sequence[_Buf], counts: Sequence[int]) -> bytes: ...

    def delta_sq_norms(self, start: _Buf, updates: Sequence[_Buf]) -> list[float]:
        """Squared float64 norm of each ``update - start`` (eight lanes, see the C)."""
        ...

    def scale_delta(self, start: _Buf, update: _Buf, factor: float) -> bytes:
        """``f32(f64(s) + factor·(f64(x) - f64(s)))`` per element."""
        ...

    def trimmed_mean(self, updates: Sequence[_Buf], trim: int) -> bytes:
        """Per element: sort the values, drop ``trim`` at each end, average the rest."""
        ...


@dataclass(frozen=True)
class RobustReport:
    """What robust aggregation did to one round, in canonical order.

    ``norms`` are the delta norms by assignment id, ``median_norm`` their
    median; ``clipped`` the assignment ids scaled down by ``normClip``;
    ``outliers`` those whose norm exceeds the clip multiple (``normClip`` or
    3) times the median, clipped or not; ``trimmed`` the number of values
    dropped at each end of every weight (0: a mean).
    """

    norms: tuple[tuple[Union[str, int], float], ...]
    median_norm: float
    clipped: tuple[Union[str, int], ...]
    outliers: tuple[Union[str, int], ...]
    trimmed: int


def median(values: Sequence[float]) -> float:
    """The median of finite floats (mean of the middle two for an even count).

    Raises AggregationError ``empty-average`` for no values."""
    if not values:
        raise AggregationError(AggregationReason.EMPTY_AVERAGE, "no delta norms: nothing to take the median of")
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2.0


def trim_count(n: int, combine: str, trim: float) -> int:
    """Values dropped at each end of every weight for ``n`` contributions."""
    if combine == "median":
        return (n - 1) // 2
    if combine == "trimmedMean":
        return min(math.ceil(trim * n), (n - 1) // 2)
    return 0


def robust_average(
    kernel: RobustKernel,
    start: _Buf,
    ids: Sequence[Union[str, int]],
    updates: Sequence[_Buf],
    counts: Sequence[int],
    norm_clip: float | None,
    combine: str,
    trim: float,
) -> tuple[bytes, RobustReport]:
    """Clip (when ``norm_clip``) then combine validated, canonically ordered updates.

    Returns the round's average and its report. Raises AggregationError
    ``non-finite-norm`` if a norm is not finite (the coordinator refuses
    non-finite updates before this, so it is a bug guard) and
    ``unknown-combine`` for a combine this module does not know.
    """
    if combine not in ("mean", "trimmedMean", "median"):
        raise AggregationError(AggregationReason.UNKNOWN_COMBINE, f"combine {combine!r} is not mean, trimmedMean or median")
    norms = [math.sqrt(sq) for sq in kernel.delta_sq_norms(start, updates)]
    if not all(math.isfinite(n) for n in norms):
        raise AggregationError(AggregationReason.NON_FINITE_NORM, "a contribution's delta norm is not finite")
    med = median(norms)
    multiple = OUTLIER_MULTIPLE if norm_clip is None else float(norm_clip)
    cap = multiple * med
    outliers = [k for k, n in enumerate(norms) if n > cap]
    clipped: list[int] = []
    work = list(updates)
    if norm_clip is not None:
        for k in outliers:
            # norms[k] > cap >= 0, so the divisor is positive even when the median is 0.
            work[k] = kernel.scale_delta(start, updates[k], cap / norms[k])
            clipped.append(k)
    trimmed = trim_count(len(work), combine, trim)
    if combine == "mean":
        average = kernel.weighted_average(work, counts)
    else:
        average = kernel.trimmed_mean(work, trimmed)
    report = RobustReport(
        norms=tuple(zip(ids, norms)),
        median_norm=med,
        clipped=tuple(ids[k] for k in clipped),
        outliers=tuple(ids[k] for k in outliers),
        trimmed=trimmed,
    )
    return average, report
