"""The privacy accountant of DP-FedAvg: the Gaussian mechanism composed over rounds, as (ε, δ).

Pure Python (runs in Pyodide as in CPython). Every Weei round takes every
participant's update (no subsampling), so one round is the Gaussian
mechanism on the sum of clipped deltas, L2 sensitivity ``C`` (one participant
added or removed), noise ``σ·C``. Its Rényi DP is ``ε_α = α / (2σ²)`` at every
order α > 1 (Mironov 2017, Prop. 7), i.e. ρ-zCDP with ``ρ = 1/(2σ²)``;
composition adds ρ over rounds, so the whole job's loss is one number,
``rho``, kept in the checkpoint (rounds with another σ compose the same way).

RDP to (ε, δ): the improved conversion (Canonne, Kamath & Steinke 2020,
arXiv:2004.00010 Prop. 12; Asoodeh et al. 2020, arXiv:2001.05990 eq. 20),
the one ``dp-accounting``'s ``RdpAccountant.get_epsilon`` uses::

    ε(α) = ρα + log((α-1)/α) - (log δ + log α) / (α - 1)      (α > 1.01)

and ε = 0 where the KL bound already gives δ (``δ² + expm1(-ρα) > 0``).
:func:`epsilon` minimizes it over real α in [1.01, 10⁷] (below 1.01 the
formula is unstable, as the library notes); the library minimizes over its
fixed list of orders, so its ε is never below ours. Pass ``orders`` to
minimize over a list instead: with the library's ``DEFAULT_RDP_ORDERS`` the
two agree to rounding (tests/unit/test_dp.py). The search: a log-spaced scan
of 2,000 orders brackets the minimum, golden section refines it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["rho_per_round", "epsilon", "epsilon_after", "noise_multiplier_for", "DpLedger", "epsilon_json"]

_ALPHA_MIN = 1.01
_ALPHA_MAX = 1e7


def rho_per_round(noise_multiplier: float) -> float:
    """ρ (zCDP) of one round with noise multiplier σ; infinite at σ = 0."""
    return math.inf if noise_multiplier == 0 else 1.0 / (2.0 * noise_multiplier * noise_multiplier)


def _eps_at(rho: float, delta: float, alpha: float) -> float:
    r = rho * alpha
    if delta * delta + math.expm1(-r) > 0:
        return 0.0
    return r + math.log1p(-1.0 / alpha) - math.log(delta * alpha) / (alpha - 1.0)


def epsilon(rho: float, delta: float, orders: Sequence[float] | None = None) -> float:
    """ε at ``delta`` of a composed loss ``rho`` (0 when ρ is 0, inf when ρ is inf), minimized over real
    orders in [1.01, 10⁷], or over ``orders`` (each above 1.01) when given.

    Raises ValueError for ρ < 0 or δ outside (0, 1).
    """
    if not (rho >= 0) or not (0 < delta < 1):
        raise ValueError(f"need rho >= 0 and 0 < delta < 1, got rho={rho}, delta={delta}")
    if rho == 0:
        return 0.0
    if math.isinf(rho):
        return math.inf
    if orders is not None:
        return max(0.0, min(_eps_at(rho, delta, a) for a in orders if a > _ALPHA_MIN))
    steps = 2000
    lo_log, hi_log = math.log(_ALPHA_MIN), math.log(_ALPHA_MAX)
    grid = [math.exp(lo_log + (hi_log - lo_log) * i / steps) for i in range(steps + 1)]
    values = [_eps_at(rho, delta, a) for a in grid]
    k = min(range(len(values)), key=values.__getitem__)
    a, b = grid[max(k - 1, 0)], grid[min(k + 1, steps)]
    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    for _ in range(100):
        if _eps_at(rho, delta, c) < _eps_at(rho, delta, d):
            b = d
        else:
            a = c
        c, d = b - ratio * (b - a), a + ratio * (b - a)
    return max(0.0, min(values[k], _eps_at(rho, delta, (a + b) / 2.0)))


def epsilon_after(noise_multiplier: float, rounds: int, delta: float) -> float:
    """ε at ``delta`` after ``rounds`` rounds of noise multiplier σ."""
    if rounds < 0:
        raise ValueError(f"rounds must be >= 0, got {rounds}")
    if rounds == 0:
        return 0.0
    return epsilon(rounds * rho_per_round(noise_multiplier), delta)


def noise_multiplier_for(target_epsilon: float, rounds: int, delta: float) -> float:
    """The smallest σ (to 1e-6 relative) whose ε after ``rounds`` rounds is at most ``target_epsilon``."""
    if not (target_epsilon > 0) or rounds < 1:
        raise ValueError("need target_epsilon > 0 and rounds >= 1")
    lo, hi = 1e-3, 1.0
    while epsilon_after(hi, rounds, delta) > target_epsilon:
        lo, hi = hi, hi * 2.0
        if hi > 1e6:
            raise ValueError(f"no noise multiplier below 1e6 reaches ε={target_epsilon}")
    while hi - lo > 1e-6 * hi:
        mid = (lo + hi) / 2.0
        if epsilon_after(mid, rounds, delta) > target_epsilon:
            lo = mid
        else:
            hi = mid
    return hi


def epsilon_json(value: float) -> float | None:
    """ε as JSON carries it: None for infinite (no noise)."""
    return None if math.isinf(value) else value


@dataclass(frozen=True)
class DpLedger:
    """The privacy a job has spent: ``rounds`` closed under DP and their composed ``rho`` (inf: a round
    without noise). Checkpoints keep it (``privacy.dp``), so a continued job keeps counting."""

    rounds: int = 0
    rho: float = 0.0

    def after_round(self, noise_multiplier: float) -> DpLedger:
        return DpLedger(self.rounds + 1, self.rho + rho_per_round(noise_multiplier))

    def epsilon(self, delta: float) -> float:
        return epsilon(self.rho, delta)

    def to_json(self, delta: float) -> dict[str, Any]:
        """``{rounds, rho, delta, epsilon}``; rho and epsilon null when infinite."""
        return {"rounds": self.rounds, "rho": epsilon_json(self.rho), "delta": delta,
                "epsilon": epsilon_json(self.epsilon(delta))}

    @classmethod
    def from_json(cls, obj: Any) -> DpLedger:
        """Read what :meth:`to_json` wrote; raises ValueError saying what is wrong."""
        if not isinstance(obj, dict):
            raise ValueError("privacy.dp must be an object")
        rounds, rho = obj.get("rounds"), obj.get("rho")
        if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0:
            raise ValueError(f"privacy.dp.rounds must be an int >= 0, not {rounds!r}")
        if rho is None:
            return cls(rounds, math.inf)
        if isinstance(rho, bool) or not isinstance(rho, (int, float)) or not (0 <= rho < math.inf):
            raise ValueError(f"privacy.dp.rho must be a finite number >= 0 or null, not {rho!r}")
        return cls(rounds, float(rho))
