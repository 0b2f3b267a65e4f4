"""``settings.privacy.dp``: client-level differential privacy (DP-FedAvg), parsed into a frozen object.

``{"clip": C, "noiseMultiplier": σ, "delta": δ, "maxRounds": R}``. Every contribution's delta
from the round's checkpoint is clipped to L2 norm ``C``; Gaussian noise of
standard deviation ``σ·C`` is added to each round's sum of clipped deltas
(weei.core.privacy.dp_noise); ε is reported at ``δ`` after every round
(weei.core.privacy.dp_accountant). The job trains at most ``R`` rounds under
DP and then completes: the planned ε (:attr:`DpSettings.planned_epsilon`) is
ε after ``R`` rounds, a bound every participant computes from the settings
its invitation carries, without trusting the coordinator's figure. ``σ = 0`` is allowed (clipping only, ε
infinite: the reports say so). The noise seed is not a setting: settings travel
to participants, the seed stays with the coordinator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..errors import SettingsError, SettingsReason
from .dp_accountant import epsilon_after

__all__ = ["MAX_NOISE_MULTIPLIER", "MAX_DP_ROUNDS", "DpSettings"]

#: Beyond this the update is noise; a larger value is a typo, not a plan.
MAX_NOISE_MULTIPLIER = 1000.0
MAX_DP_ROUNDS = 1_000_000
_KEYS = ("clip", "noiseMultiplier", "delta", "maxRounds")
_PATH = "privacy.dp"


def _number(obj: dict[str, Any], key: str) -> float:
    if key not in obj:
        raise SettingsError(f"{_PATH}.{key}", "is required", SettingsReason.MISSING_SETTING)
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SettingsError(f"{_PATH}.{key}", f"must be a number, not {type(value).__name__}")
    if not math.isfinite(value):
        raise SettingsError(f"{_PATH}.{key}", f"must be finite, not {value}", SettingsReason.OUT_OF_RANGE)
    return float(value)


@dataclass(frozen=True)
class DpSettings:
    """Clip norm ``clip`` (> 0), noise multiplier ``noise_multiplier`` (σ, 0..1000), ``delta`` (0 < δ < 1),
    ``max_rounds`` (1..10**6)."""

    clip: float
    noise_multiplier: float
    delta: float
    max_rounds: int

    def __post_init__(self) -> None:
        if not (math.isfinite(self.clip) and self.clip > 0):
            raise SettingsError(f"{_PATH}.clip", f"must be a finite number above 0, not {self.clip}",
                                SettingsReason.OUT_OF_RANGE)
        if not (math.isfinite(self.noise_multiplier) and 0 <= self.noise_multiplier <= MAX_NOISE_MULTIPLIER):
            raise SettingsError(f"{_PATH}.noiseMultiplier",
                                f"must be from 0 to {MAX_NOISE_MULTIPLIER:g}, not {self.noise_multiplier}",
                                SettingsReason.OUT_OF_RANGE)
        if not (0 < self.delta < 1):
            raise SettingsError(f"{_PATH}.delta", f"must be above 0 and below 1, not {self.delta}",
                                SettingsReason.OUT_OF_RANGE)
        if (isinstance(self.max_rounds, bool) or not isinstance(self.max_rounds, int)
                or not 1 <= self.max_rounds <= MAX_DP_ROUNDS):
            raise SettingsError(f"{_PATH}.maxRounds", f"must be an integer from 1 to {MAX_DP_ROUNDS}, "
                                f"not {self.max_rounds!r}", SettingsReason.OUT_OF_RANGE)

    @property
    def planned_epsilon(self) -> float:
        """ε at δ after ``max_rounds`` rounds (inf when σ is 0)."""
        return epsilon_after(self.noise_multiplier, self.max_rounds, self.delta)

    @classmethod
    def from_json(cls, obj: Any) -> DpSettings:
        """Parse ``privacy.dp``; raises SettingsError naming the field (unknown keys refused)."""
        if not isinstance(obj, dict):
            raise SettingsError(_PATH, "must be an object")
        for key in obj:
            if key not in _KEYS:
                raise SettingsError(f"{_PATH}.{key}", f"is not a setting (known: {', '.join(_KEYS)})",
                                    SettingsReason.UNKNOWN_SETTING)
        rounds = _number(obj, "maxRounds")
        if rounds != int(rounds):
            raise SettingsError(f"{_PATH}.maxRounds", f"must be an integer, not {rounds}", SettingsReason.OUT_OF_RANGE)
        return cls(_number(obj, "clip"), _number(obj, "noiseMultiplier"), _number(obj, "delta"), int(rounds))

    def to_json(self) -> dict[str, Any]:
        return {"clip": self.clip, "noiseMultiplier": self.noise_multiplier, "delta": self.delta,
                "maxRounds": self.max_rounds}
