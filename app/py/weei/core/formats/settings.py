"""Training and aggregation settings: parsed from the API's JSON into frozen objects.

The JSON is the spec's ``TrainingSettings`` as page JavaScript passes it to
``createJob`` / ``updateSettings`` and as checkpoints store it (camelCase
names). Parsing refuses anything the spec does not allow, each time with a
:class:`~weei.core.errors.SettingsError` whose ``field`` names the culprit
(``"aggregation.momentum"``), so invalid settings never reach the job logic.

Decisions where the spec is silent (see also docs/checkpoint-format.md):

* counts (epochs, localEpochs, batchSize, every, unitsPerAssignment,
  workers) are integers from 1 to 2**53 - 1; ``3.0`` counts as 3, because
  JavaScript has no separate integer type;
* learningRate, when given, is a finite number above 0;
* epsilon may be 0, as the spec's "from 0 to 1" says (the aggregation step
  must then treat 0/0 as a zero step);
* unknown keys are refused at every level;
* :meth:`TrainingSettings.to_json` writes ``epochs`` (never ``rounds``) and
  omits ``aggregation`` when it is plain FedAvg, the spec's default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import Any, Literal, NoReturn

from .. import _check
from ..aggregation.methods import METHODS, Method
from ..errors import SettingsError, SettingsReason
from .qdelta import MAX_BLOCK, MIN_BLOCK
from ..privacy.dp_settings import DpSettings

__all__ = [
    "AggregationSettings",
    "COMBINES",
    "DEFAULT_TRIM",
    "MAX_NORM_CLIP",
    "MAX_EXCLUDE_AFTER",
    "ValidationSchedule",
    "ExperienceSettings",
    "CompressionSettings",
    "COMPRESSION_KINDS",
    "PrivacySettings",
    "TrainingSettings",
]

# Robust options (additive to the spec, any method; docs/api.md): absent means
# off, so the spec's settings and every existing checkpoint keep their bits.
COMBINES: tuple[str, ...] = ("mean", "trimmedMean", "median")
_ROBUST_OPTIONS: dict[str, str] = {"normClip": "norm_clip", "combine": "combine", "trim": "trim",
                                   "excludeOutliersAfter": "exclude_outliers_after"}
MAX_NORM_CLIP = 1000.0
MAX_EXCLUDE_AFTER = 1000  # rounds
DEFAULT_TRIM = 0.25


def _failer(field_name: str) -> _check.Fail:
    def fail(message: str) -> NoReturn:
        raise SettingsError(field_name, message)

    return fail


def _unknown(prefix: str) -> _check.Fail:
    def fail(key: str) -> NoReturn:
        raise SettingsError(prefix + key, "is not a known setting", SettingsReason.UNKNOWN_SETTING)

    return fail


def _count(obj: dict[str, Any], key: str, path: str) -> int:
    if key not in obj:
        raise SettingsError(path, "is required", SettingsReason.MISSING_SETTING)
    return _check.as_int(obj[key], _failer(path), minimum=1)


def _method_names() -> str:
    return ", ".join(METHODS)


def _method_row(method: object) -> Method:
    row = METHODS.get(method) if isinstance(method, str) else None
    if row is None:
        raise SettingsError("aggregation.method", f"must be one of {_method_names()}, not {method!r}")
    return row


def _refuse_foreign_option(name: str, method: str) -> NoReturn:
    """A key that is not an option of ``method``: another method's, or nobody's."""
    if any(row.option(name) is not None for row in METHODS.values()):
        raise SettingsError(f"aggregation.{name}", f"does not belong to method {method}", SettingsReason.OPTION_NOT_FOR_METHOD)
    raise SettingsError(f"aggregation.{name}", "is not a known setting", SettingsReason.UNKNOWN_SETTING)


@dataclass(frozen=True)
class AggregationSettings:
    """How a round's average is formed and applied: a method of
    ``weei.core.aggregation.methods.METHODS`` and its options.

    ``options`` holds the options that were given, ``(JSON name, value)`` in
    the method's order (a mapping is accepted and normalised); :meth:`option`
    gives the value in force (the given one, else the method's default). The
    robust options (``norm_clip``, ``combine``, ``trim``;
    weei.core.aggregation.robust) go with any method and are off when None;
    ``exclude_outliers_after`` (rounds in a row a participant's update was an
    outlier before it is excluded from the job) needs one of ``norm_clip``
    and ``combine``.
    """

    method: str = "fedavg"
    options: tuple[tuple[str, float], ...] = ()
    norm_clip: float | None = None
    combine: str | None = None
    trim: float | None = None
    exclude_outliers_after: int | None = None

    def __post_init__(self) -> None:
        # Constructed in Python too, so the same checks as from_json apply.
        row = _method_row(self.method)
        pairs = list(self.options.items() if isinstance(self.options, Mapping) else self.options)
        given = dict(pairs)
        if len(given) != len(pairs):
            raise SettingsError("aggregation", "names an option twice")
        for name, value in given.items():
            option = row.option(name)
            if option is None:
                _refuse_foreign_option(name, self.method)
            path = f"aggregation.{name}"
            number = _check.as_number(value, _failer(path))
            if not option.allows(number):
                raise SettingsError(path, f"must be {option.range_text}, not {number}", SettingsReason.OUT_OF_RANGE)
        object.__setattr__(self, "options", tuple((o.name, given[o.name]) for o in row.options if o.name in given))
        self._check_robust()

    @property
    def method_entry(self) -> Method:
        """The method's row of the table."""
        return _method_row(self.method)

    def option(self, name: str) -> float:
        """The value in force of option ``name`` (JSON name): the given one, else the default.

        Raises KeyError when the method has no such option (a caller's mistake).
        """
        option = self.method_entry.option(name)
        if option is None:
            raise KeyError(f"method {self.method} has no option {name!r}")
        given = dict(self.options)
        return float(given[name]) if name in given else option.default

    def option_values(self) -> tuple[float, ...]:
        """Every option's value in force, in the method's order (what its kernel entry takes)."""
        return tuple(self.option(o.name) for o in self.method_entry.options)

    @property
    def state_copies(self) -> int:
        """Copies of the weights the method keeps as state (the table's ``state_copies``)."""
        return self.method_entry.state_copies

    def _check_robust(self) -> None:
        if self.norm_clip is not None:
            number = _check.as_number(self.norm_clip, _failer("aggregation.normClip"))
            if not 1 <= number <= MAX_NORM_CLIP:
                raise SettingsError("aggregation.normClip", f"must be from 1 to {MAX_NORM_CLIP:g}, not {number}", SettingsReason.OUT_OF_RANGE)
        if self.combine is not None:
            _check.as_choice(self.combine, _failer("aggregation.combine"), COMBINES)
        if self.trim is not None:
            if self.combine != "trimmedMean":
                raise SettingsError("aggregation.trim", "belongs to combine \"trimmedMean\" only", SettingsReason.OPTION_NOT_FOR_METHOD)
            number = _check.as_number(self.trim, _failer("aggregation.trim"))
            if not 0 < number < 0.5:
                raise SettingsError("aggregation.trim", f"must be above 0 and below 0.5, not {number}", SettingsReason.OUT_OF_RANGE)
        if self.exclude_outliers_after is not None:
            path = "aggregation.excludeOutliersAfter"
            if self.norm_clip is None and self.combine is None:
                raise SettingsError(path, "needs normClip or combine (outliers are found by robust aggregation)",
                                    SettingsReason.OPTION_NOT_FOR_METHOD)
            _check.as_int(self.exclude_outliers_after, _failer(path), minimum=1)
            if self.exclude_outliers_after > MAX_EXCLUDE_AFTER:
                raise SettingsError(path, f"must be from 1 to {MAX_EXCLUDE_AFTER}, not {self.exclude_outliers_after}",
                                    SettingsReason.OUT_OF_RANGE)

    @classmethod
    def from_json(cls, obj: Any) -> AggregationSettings:
        """Parse ``{method, ...options}``.

        Takes: the JSON value of ``settings.aggregation``.
        Returns: the settings. Raises: SettingsError naming the field.
        """
        obj = _check.as_object(obj, _failer("aggregation"))
        if "method" not in obj:
            raise SettingsError("aggregation.method", "is required", SettingsReason.MISSING_SETTING)
        method = obj["method"]
        row = _method_row(method)
        options: list[tuple[str, float]] = []
        robust: dict[str, Any] = {}
        for key, value in obj.items():
            if key == "method":
                continue
            if key in _ROBUST_OPTIONS:  # any method; values checked by __post_init__
                if value is None:
                    raise SettingsError(f"aggregation.{key}", "must not be null (leave it out for the default)")
                robust[_ROBUST_OPTIONS[key]] = value
                continue
            if row.option(key) is None:
                _refuse_foreign_option(key, method)
            # null is not "absent": the spec's options are numbers when present.
            _check.as_number(value, _failer(f"aggregation.{key}"))
            options.append((key, value))
        return cls(method=method, options=tuple(options), **robust)

    def to_json(self) -> dict[str, Any]:
        """The JSON form: method, then the options that were given."""
        out: dict[str, Any] = {"method": self.method, **dict(self.options)}
        for json_name, attr in _ROBUST_OPTIONS.items():
            value = getattr(self, attr)
            if value is not None:
                out[json_name] = value
        return out

    @property
    def effective_trim(self) -> float:
        """Fraction trimmed at each end by combine "trimmedMean": 0.25 unless given."""
        return DEFAULT_TRIM if self.trim is None else float(self.trim)


FEDAVG = AggregationSettings()


@dataclass(frozen=True)
class ValidationSchedule:
    """When the coordinator validates: every ``every`` rounds or epochs."""

    enabled: bool
    unit: Literal["round", "epoch"]
    every: int

    @classmethod
    def from_json(cls, obj: Any) -> ValidationSchedule:
        """Parse ``{enabled, unit, every}`` (all required). Raises: SettingsError."""
        obj = _check.as_object(obj, _failer("validationSchedule"))
        _check.no_unknown_keys(obj, {"enabled", "unit", "every"}, _unknown("validationSchedule."))
        for key in ("enabled", "unit", "every"):
            if key not in obj:
                raise SettingsError(f"validationSchedule.{key}", "is required", SettingsReason.MISSING_SETTING)
        enabled = _check.as_bool(obj["enabled"], _failer("validationSchedule.enabled"))
        unit = obj["unit"]
        if unit not in ("round", "epoch"):
            raise SettingsError("validationSchedule.unit", f"must be 'round' or 'epoch', not {unit!r}")
        every = _count(obj, "every", "validationSchedule.every")
        return cls(enabled, unit, every)

    def to_json(self) -> dict[str, Any]:
        """The JSON form."""
        return {"enabled": self.enabled, "unit": self.unit, "every": self.every}


@dataclass(frozen=True)
class ExperienceSettings:
    """Experience jobs: how many units (episodes...) one assignment plays."""

    units_per_assignment: int

    @classmethod
    def from_json(cls, obj: Any) -> ExperienceSettings:
        """Parse ``{unitsPerAssignment}``. Raises: SettingsError."""
        obj = _check.as_object(obj, _failer("experience"))
        _check.no_unknown_keys(obj, {"unitsPerAssignment"}, _unknown("experience."))
        return cls(_count(obj, "unitsPerAssignment", "experience.unitsPerAssignment"))

    def to_json(self) -> dict[str, Any]:
        """The JSON form."""
        return {"unitsPerAssignment": self.units_per_assignment}


#: ``compression.kind`` -> bits of a code (weei.core.formats.qdelta).
COMPRESSION_KINDS: dict[str, int] = {"int8": 8, "int4": 4}
DEFAULT_COMPRESSION_BLOCK = 256


@dataclass(frozen=True)
class CompressionSettings:
    """Compressed updates (additive, off when absent; docs/methods.md, "Compressed updates"): each
    participant sends its delta quantized to ``kind`` with one float32 scale per ``block`` weights, the
    codes deflated (lossless) when ``deflate`` and that makes them smaller."""

    kind: str
    block: int = DEFAULT_COMPRESSION_BLOCK
    deflate: bool = False

    def __post_init__(self) -> None:
        _check.as_choice(self.kind, _failer("compression.kind"), tuple(COMPRESSION_KINDS))
        block = _check.as_int(self.block, _failer("compression.block"), minimum=1)
        if not MIN_BLOCK <= block <= MAX_BLOCK:
            raise SettingsError("compression.block", f"must be from {MIN_BLOCK} to {MAX_BLOCK}, not {block}",
                                SettingsReason.OUT_OF_RANGE)
        object.__setattr__(self, "block", block)
        _check.as_bool(self.deflate, _failer("compression.deflate"))

    @property
    def bits(self) -> int:
        """Bits of one code: 8 or 4."""
        return COMPRESSION_KINDS[self.kind]

    @classmethod
    def from_json(cls, obj: Any) -> CompressionSettings:
        """Parse ``{kind, block?}``. Raises: SettingsError naming the field."""
        obj = _check.as_object(obj, _failer("compression"))
        _check.no_unknown_keys(obj, {"kind", "block", "deflate"}, _unknown("compression."))
        if "kind" not in obj:
            raise SettingsError("compression.kind", "is required", SettingsReason.MISSING_SETTING)
        return cls(obj["kind"], obj.get("block", DEFAULT_COMPRESSION_BLOCK), obj.get("deflate", False))

    def to_json(self) -> dict[str, Any]:
        """The JSON form (the block always written, so a checkpoint says what was used; ``deflate`` when on,
        so a job without it keeps the form it had before the option existed)."""
        out: dict[str, Any] = {"kind": self.kind, "block": self.block}
        if self.deflate:
            out["deflate"] = True
        return out


DEFAULT_SECAGG_THRESHOLD = 0.6


@dataclass(frozen=True)
class PrivacySettings:
    """``privacy`` (additive, docs/privacy.md): secure aggregation, the clip each participant applies,
    and ``dp``, client-level differential privacy.

    ``threshold`` is the fraction of a round's participants whose shares
    rebuild a dropped peer's masks: t = max(2, ceil(threshold * n)); above
    one half, so two disjoint groups can never both unmask. With ``dp`` on, its
    clip is the one participants apply; ``clip``, when also given, must equal it.
    """

    secure_aggregation: bool = False
    clip: float | None = None
    threshold: float = DEFAULT_SECAGG_THRESHOLD
    dp: DpSettings | None = None

    def __post_init__(self) -> None:
        _check.as_bool(self.secure_aggregation, _failer("privacy.secureAggregation"))
        if self.clip is not None:
            _check.as_number(self.clip, _failer("privacy.clip"))
            if not 0 < self.clip <= MAX_NORM_CLIP:
                raise SettingsError("privacy.clip", f"must be above 0 and at most {MAX_NORM_CLIP:g}, not {self.clip}",
                                    SettingsReason.OUT_OF_RANGE)
        _check.as_number(self.threshold, _failer("privacy.threshold"))
        if not 0.5 < self.threshold <= 1:
            raise SettingsError("privacy.threshold", f"must be above 0.5 and at most 1, not {self.threshold}",
                                SettingsReason.OUT_OF_RANGE)
        if self.dp is not None and self.clip is not None and self.clip != self.dp.clip:
            # Two clips would leave one of them a promise the participants do not keep.
            raise SettingsError("privacy.clip", f"must equal privacy.dp.clip ({self.dp.clip:g}) when both are given, "
                                f"not {self.clip:g}", SettingsReason.CONFLICTING_SETTING)
        if self.dp is not None and self.dp.participants_noise and not self.secure_aggregation:
            # Alone, a participant's share of the noise (σ·C/√t) would leave its update readable in the clear.
            raise SettingsError("privacy.dp.noiseAt", "'participants' needs privacy.secureAggregation: true (without "
                                "it each update arrives in the clear with only its share of the noise)",
                                SettingsReason.CONFLICTING_SETTING)
        if self.secure_aggregation and self.participant_clip is None:
            raise SettingsError("privacy.clip", "is required with secureAggregation (each participant clips its own update)",
                                SettingsReason.MISSING_SETTING)

    @property
    def participant_clip(self) -> float | None:
        """The L2 norm each participant clips its own update to: ``dp.clip``, else ``clip``."""
        return self.dp.clip if self.dp is not None else self.clip

    @classmethod
    def from_json(cls, obj: Any) -> PrivacySettings:
        """Parse ``{secureAggregation, clip, threshold, dp}``. Raises: SettingsError."""
        obj = _check.as_object(obj, _failer("privacy"))
        _check.no_unknown_keys(obj, {"secureAggregation", "clip", "threshold", "dp"}, _unknown("privacy."))
        dp = DpSettings.from_json(obj["dp"]) if "dp" in obj else None
        return cls(obj.get("secureAggregation", False), obj.get("clip"), obj.get("threshold", DEFAULT_SECAGG_THRESHOLD),
                   dp)

    def to_json(self) -> dict[str, Any]:
        """The JSON form: secure aggregation's fields, all of them when any is set (the invitation shows what a
        participant agrees to), and ``dp`` when set."""
        out: dict[str, Any] = {}
        if self.secure_aggregation or self.clip is not None or self.threshold != DEFAULT_SECAGG_THRESHOLD:
            out.update({"secureAggregation": self.secure_aggregation, "threshold": self.threshold})
            if self.clip is not None:
                out["clip"] = self.clip
        if self.dp is not None:
            out["dp"] = self.dp.to_json()
        return out

    def threshold_of(self, participants: int) -> int:
        """t for a round of ``participants``: max(2, ceil(threshold * participants))."""
        return max(2, math.ceil(self.threshold * participants))


NO_PRIVACY = PrivacySettings()


def _check_secure_aggregation(aggregation: AggregationSettings, compression: CompressionSettings | None) -> None:
    # The coordinator sees only the sum: nothing that needs each update (a robust combine, a clip or an
    # exclusion it applies, a server step of another method, a compressed update it decodes) can run.
    per_update = [f"aggregation.{json}" for json, attr in _ROBUST_OPTIONS.items() if getattr(aggregation, attr) is not None]
    if aggregation.method != FEDAVG.method:
        per_update.insert(0, f"aggregation.method {aggregation.method!r}")
    if compression is not None:
        per_update.append("compression")
    if per_update:
        raise SettingsError("privacy.secureAggregation", f"works with plain FedAvg only, not with {', '.join(per_update)}",
                            SettingsReason.CONFLICTING_SETTING)


_TOP_KEYS = frozenset(
    {
        "epochs",
        "rounds",
        "localEpochs",
        "batchSize",
        "learningRate",
        "validationSchedule",
        "coordinatorParticipates",
        "aggregation",
        "experience",
        "workers",
        "compression",
        "privacy",
    }
)


@dataclass(frozen=True)
class TrainingSettings:
    """The spec's TrainingSettings.

    ``epochs`` is the planned dataset epochs, or for an experience job the
    last round. ``workers`` is the requested local Workers per device
    (``localWorkers.requested``), None when not given.
    """

    epochs: int
    local_epochs: int
    batch_size: int
    coordinator_participates: bool
    learning_rate: float | None = None
    validation_schedule: ValidationSchedule | None = None
    aggregation: AggregationSettings = field(default=FEDAVG)
    experience: ExperienceSettings | None = None
    workers: int | None = None
    compression: CompressionSettings | None = None
    privacy: PrivacySettings = field(default=NO_PRIVACY)

    def __post_init__(self) -> None:
        # Objects built in Python get the same count checks as parsed ones.
        for attr, path in (("epochs", "epochs"), ("local_epochs", "localEpochs"), ("batch_size", "batchSize")):
            _check.as_int(getattr(self, attr), _failer(path), minimum=1)
        if self.workers is not None:
            _check.as_int(self.workers, _failer("workers"), minimum=1)
        _check.as_bool(self.coordinator_participates, _failer("coordinatorParticipates"))
        if self.privacy.secure_aggregation:
            _check_secure_aggregation(self.aggregation, self.compression)
        if self.privacy.dp is not None and (self.aggregation.norm_clip is not None
                                            or self.aggregation.combine not in (None, "mean")):
            # Robust statistics make one participant's effect depend on the others' updates:
            # the sensitivity DP's noise is scaled to would no longer be the clip.
            raise SettingsError("privacy.dp", "cannot be combined with aggregation.normClip or a trimmed "
                                "mean or median (DP clips each update to privacy.dp.clip itself)",
                                SettingsReason.CONFLICTING_SETTING)

    @classmethod
    def from_json(cls, obj: Any) -> TrainingSettings:
        """Parse the API's settings object.

        Takes: the JSON value; ``rounds`` is accepted for ``epochs`` (both
        only with the same value).
        Returns: the settings.
        Raises: SettingsError naming the field.
        """
        if not isinstance(obj, dict):
            raise SettingsError("settings", "must be an object", SettingsReason.INVALID_SETTING)
        _check.no_unknown_keys(obj, _TOP_KEYS, _unknown(""))
        if "epochs" in obj and "rounds" in obj:
            epochs = _count(obj, "epochs", "epochs")
            if _count(obj, "rounds", "rounds") != epochs:
                raise SettingsError("rounds", "differs from epochs; pass only epochs", SettingsReason.CONFLICTING_SETTING)
        elif "rounds" in obj:
            epochs = _count(obj, "rounds", "rounds")
        else:
            epochs = _count(obj, "epochs", "epochs")
        local_epochs = _count(obj, "localEpochs", "localEpochs")
        batch_size = _count(obj, "batchSize", "batchSize")
        if "coordinatorParticipates" not in obj:
            raise SettingsError("coordinatorParticipates", "is required", SettingsReason.MISSING_SETTING)
        participates = _check.as_bool(obj["coordinatorParticipates"], _failer("coordinatorParticipates"))
        learning_rate = None
        if "learningRate" in obj:
            learning_rate = _check.as_number(obj["learningRate"], _failer("learningRate"))
            if learning_rate <= 0:
                raise SettingsError("learningRate", f"must be above 0, not {learning_rate}", SettingsReason.OUT_OF_RANGE)
        schedule = None
        if "validationSchedule" in obj:
            schedule = ValidationSchedule.from_json(obj["validationSchedule"])
        aggregation = FEDAVG
        if "aggregation" in obj:
            aggregation = AggregationSettings.from_json(obj["aggregation"])
        experience = None
        if "experience" in obj:
            experience = ExperienceSettings.from_json(obj["experience"])
        workers = _count(obj, "workers", "workers") if "workers" in obj else None
        compression = CompressionSettings.from_json(obj["compression"]) if "compression" in obj else None
        privacy = PrivacySettings.from_json(obj["privacy"]) if "privacy" in obj else NO_PRIVACY
        return cls(
            epochs=epochs,
            local_epochs=local_epochs,
            batch_size=batch_size,
            coordinator_participates=participates,
            learning_rate=learning_rate,
            validation_schedule=schedule,
            aggregation=aggregation,
            experience=experience,
            workers=workers,
            compression=compression,
            privacy=privacy,
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON form (camelCase), omitting absent optionals and plain FedAvg."""
        out: dict[str, Any] = {
            "epochs": self.epochs,
            "localEpochs": self.local_epochs,
            "batchSize": self.batch_size,
        }
        if self.learning_rate is not None:
            out["learningRate"] = self.learning_rate
        if self.validation_schedule is not None:
            out["validationSchedule"] = self.validation_schedule.to_json()
        out["coordinatorParticipates"] = self.coordinator_participates
        if self.aggregation != FEDAVG:
            out["aggregation"] = self.aggregation.to_json()
        if self.experience is not None:
            out["experience"] = self.experience.to_json()
        if self.workers is not None:
            out["workers"] = self.workers
        if self.compression is not None:
            out["compression"] = self.compression.to_json()
        if self.privacy != NO_PRIVACY:
            out["privacy"] = self.privacy.to_json()
        return out
