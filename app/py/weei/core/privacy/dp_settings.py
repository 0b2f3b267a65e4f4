"""``settings.privacy.dp``: client-level differential privacy (DP-FedAvg), parsed into a frozen object.

``{"clip": C, "noiseMultiplier": σ, "delta": δ, "maxRounds": R, "noiseAt": where}``. Every
contribution's delta from the round's checkpoint is clipped to L2 norm ``C``;
Gaussian noise of standard deviation ``σ·C`` (at least) is added to each
round's sum of clipped deltas (weei.core.privacy.dp_noise). ``noiseAt`` says
who adds it: ``"coordinator"`` (the default) to the mean it computes, from
its seeded stream; ``"participants"``, only with secure aggregation (the
settings refuse it otherwise, weei.core.formats.settings), each participant
of a round to its own clipped delta before masking, so the coordinator never
sees a noise-free sum (weei.core.job.secure_round). ε is reported at ``δ`` after every round
(weei.core.privacy.dp_accountant). The job trains at most ``R`` rounds under
DP and then completes: the planned ε (:attr:`DpSettings.planned_epsilon`) is
ε after ``R`` rounds, a bound every participant computes from the settings
its invitation carries, without trusting the coordinator's figure. ``σ = 0`` is allowed (clipping only, ε
infinite: the reports say so). The noise seed is not a setting: settings travel
to participants, the seed stays with the coordinator (or, with noise at the
participants, each participant's seed stays with it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..errors import SettingsError, SettingsReason
from .dp_accountant import DpLedger, epsilon_after

__all__ = ["MAX_NOISE_MULTIPLIER", "MAX_DP_ROUNDS", "NOISE_AT_COORDINATOR", "NOISE_AT_PARTICIPANTS", "DpSettings"]

#: Beyond this the update is noise; a larger value is a typo, not a plan.
MAX_NOISE_MULTIPLIER = 1000.0
MAX_DP_ROUNDS = 1_000_000
NOISE_AT_COORDINATOR = "coordinator"
NOISE_AT_PARTICIPANTS = "participants"
_NOISE_AT = (NOISE_AT_COORDINATOR, NOISE_AT_PARTICIPANTS)
_KEYS = ("clip", "noiseMultiplier", "delta", "maxRounds", "noiseAt")
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
    ``max_rounds`` (1..10**6), ``noise_at`` (who adds the noise: "coordinator" or "participants")."""

    clip: float
    noise_multiplier: float
    delta: float
    max_rounds: int
    noise_at: str = NOISE_AT_COORDINATOR

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
        if self.noise_at not in _NOISE_AT:
            raise SettingsError(f"{_PATH}.noiseAt", f"must be one of {', '.join(map(repr, _NOISE_AT))}, "
                                f"not {self.noise_at!r}", SettingsReason.INVALID_SETTING)

    @property
    def participants_noise(self) -> bool:
        """Whether each participant noises its own contribution (``noiseAt: "participants"``)."""
        return self.noise_at == NOISE_AT_PARTICIPANTS

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
        noise_at = obj.get("noiseAt", NOISE_AT_COORDINATOR)
        if not isinstance(noise_at, str):
            raise SettingsError(f"{_PATH}.noiseAt", f"must be a string, not {type(noise_at).__name__}")
        return cls(_number(obj, "clip"), _number(obj, "noiseMultiplier"), _number(obj, "delta"), int(rounds),
                   noise_at[:64])

    def to_json(self) -> dict[str, Any]:
        """The JSON form; ``noiseAt`` only when not the default (settings without it keep their bytes)."""
        out: dict[str, Any] = {"clip": self.clip, "noiseMultiplier": self.noise_multiplier, "delta": self.delta,
                               "maxRounds": self.max_rounds}
        if self.noise_at != NOISE_AT_COORDINATOR:
            out["noiseAt"] = self.noise_at
        return out

    def ledger_json(self, ledger: DpLedger) -> dict[str, Any]:
        """What a checkpoint's and the state's ``privacy.dp`` record: the ledger at ``delta`` and where the
        noise was added."""
        return {**ledger.to_json(self.delta), "noiseAt": self.noise_at}
