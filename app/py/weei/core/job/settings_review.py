"""Settings that parse but are likely mistakes: warnings, before a job runs with them.

:class:`~weei.core.formats.settings.TrainingSettings` refuses what the spec forbids
(hard errors, a ``SettingsError`` naming the field). Past that, a value can be
legal and still absurd: 10^9 epochs, a batch of 10^9, a learning rate of
10^9. :func:`review_settings` says so, per field, at two levels:

* ``note``: worth knowing (the estimated time of the job, a batch larger
  than any chunk); nothing to confirm;
* ``confirm``: far outside the model's defaults or a job that would run for
  days; the window asks before it creates the job or applies the settings.

A warning may carry a ``code`` (:class:`WarningCode`) where a program may
want to act on it: the outer-optimizer advice of docs/methods.md
("Where server momentum and server Adam help") is one.

The estimate is the job's work (examples, or the model's units, times local
epochs) over a measured speed (examples per second of the job's peers, when
one is known: ``state.progress[peer].recordsPerSecond``); without one, the
amount of work alone decides. Thresholds are module constants (docs/api.md,
``reviewSettings``). Sans-I/O and pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable, Literal, Mapping

from .coordinator import Coordinator
from ..errors import WeeiError
from ..observe.live_progress import LiveProgress
from ..formats.manifest import ModelPackage, parse_manifest_file
from ..formats.settings import TrainingSettings
from ..privacy.dp_accountant import epsilon_json

__all__ = [
    "CONFIRM_EPOCHS", "CONFIRM_ROUNDS", "CONFIRM_LOCAL_EPOCHS", "CONFIRM_BATCH_SIZE", "NOTE_LEARNING_RATE",
    "CONFIRM_LEARNING_RATE", "CONFIRM_UNITS_FACTOR", "CONFIRM_WORK", "CONFIRM_MS", "NOTE_OUTER_STEP",
    "NOTE_COMPRESSION_BLOCK", "NOTE_NESTEROV_STEP",
    "WarningCode", "SettingsWarning", "WorkFacts", "Review", "review_settings", "facts_from_manifest", "facts_from_job",
]

CONFIRM_EPOCHS = 1_000            # dataset passes
CONFIRM_ROUNDS = 100_000          # rounds of an experience job
CONFIRM_LOCAL_EPOCHS = 100        # passes over a chunk per round
CONFIRM_BATCH_SIZE = 65_536
NOTE_LEARNING_RATE = 1.0          # above: unusual for SGD-like steps
CONFIRM_LEARNING_RATE = 10.0
CONFIRM_UNITS_FACTOR = 16         # units per round above 16 x the model's default
CONFIRM_WORK = 10**10             # examples (or units) processed by the whole job, without a measured speed
CONFIRM_MS = 24 * 3600 * 1000     # an estimated job longer than a day
# FedAvgM's long-run step is η / (1 - μ) times the round's average change. Measured (docs/methods.md):
# 10 (μ 0.9, η 1) ends above FedAvg's loss on both reference models at their default local Adam, 3
# (μ 0.9, η 0.3) still above on digits-mlp; 2 (μ 0.5, η 1) below on both, 1.7 (μ 0.7, η 0.5) below on
# digits-mlp. The threshold lies between the measured points.
NOTE_OUTER_STEP = 2.5
# compression.block below this: the float32 scale per block costs 4/block bytes a weight, and int8 sends
# under 3.8 times fewer bytes than float32 (3.94 at the default 256; 2.67 at 8).
NOTE_COMPRESSION_BLOCK = 64
# Nesterov FedAvgM moves a round by η (1 + μ) x its average change at once (momentum at rest). Measured
# (docs/methods.md): 1.8 (μ 0.5, η 1.2) ended above FedAvg's loss on digits-mlp at every local setting
# tried (3 seeds) and on the byte-transformer, where heavy-ball μ 0.5 η 1.2 (a first step of 1.2) helped
# on both; 1.5 (μ 0.5, η 1) was mixed on digits-mlp. DiLoCo's μ 0.9 η 0.7 (1.33 at once, 7 in the long
# run) gets the long-run note: above FedAvg on digits-mlp, behind it at round 22 on 2 of 3 byte-transformer seeds.
NOTE_NESTEROV_STEP = 1.5


class WarningCode(str, Enum):
    """Names of warnings a program may act on (docs/api.md, ``reviewSettings``)."""

    #: FedAvgM whose long-run step η / (1 - μ) is above NOTE_OUTER_STEP, or Nesterov FedAvgM whose
    #: first step η (1 + μ) is above NOTE_NESTEROV_STEP: measured to overshoot when participants
    #: train with Adam at the model's default learning rate.
    OUTER_MOMENTUM_OVERSHOOTS = "outer-momentum-overshoots"

Level = Literal["note", "confirm"]


@dataclass(frozen=True)
class SettingsWarning:
    """One warning: the settings field it is about (``learningRate``), its level, a sentence,
    and a code where one is defined."""

    field: str
    level: Level
    message: str
    code: WarningCode | None = None

    def to_json(self) -> dict[str, Any]:
        out = {"field": self.field, "level": self.level, "message": self.message}
        if self.code is not None:
            out["code"] = self.code.value
        return out


@dataclass(frozen=True)
class WorkFacts:
    """What the review knows of the job besides its settings (None: unknown).

    ``examples``: examples in the dataset (all chunks); ``largest_chunk``:
    examples of the largest chunk; ``default_units``: an experience model's
    default units per round; ``unit_label``: its unit in its own words
    ("Episodes"); ``peers``: peers expected to train each round;
    ``examples_per_second``: the measured speed of those peers together.
    """

    examples: int | None = None
    largest_chunk: int | None = None
    default_units: int | None = None
    unit_label: str | None = None
    peers: int = 1
    examples_per_second: float | None = None


@dataclass(frozen=True)
class Review:
    warnings: tuple[SettingsWarning, ...]
    work: int | None  # examples (or units) the whole job processes, when known
    estimated_ms: int | None  # work over the measured speed, when both are known
    # privacy's plan: {secureAggregation?: {clip, threshold}, dp?: {plannedEpsilon, delta, maxRounds}}
    privacy: dict[str, Any] | None = None

    @property
    def needs_confirmation(self) -> bool:
        return any(w.level == "confirm" for w in self.warnings)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"warnings": [w.to_json() for w in self.warnings],
                               "needsConfirmation": self.needs_confirmation}
        if self.work is not None:
            out["work"] = self.work
        if self.estimated_ms is not None:
            out["estimatedMs"] = self.estimated_ms
        if self.privacy is not None:
            out["privacy"] = self.privacy
        return out


def _duration(ms: float) -> str:
    s = ms / 1000.0
    if s < 90:
        return f"{max(1, round(s))} s"
    if s < 90 * 60:
        return f"{round(s / 60)} min"
    if s < 48 * 3600:
        return f"{s / 3600:.1f} h"
    days = s / 86400
    return f"{days:.1f} days" if days < 3650 else f"{days / 365:.3g} years"


def review_settings(settings: TrainingSettings, facts: WorkFacts) -> Review:
    """Warnings for ``settings`` (already parsed: the hard limits have passed) given ``facts``."""
    out: list[SettingsWarning] = []
    experience = settings.experience is not None or facts.default_units is not None
    unit = (facts.unit_label or "units").lower() if experience else "examples"

    def warn(field: str, level: Level, message: str, code: WarningCode | None = None) -> None:
        out.append(SettingsWarning(field, level, message, code))

    if experience:
        if settings.epochs > CONFIRM_ROUNDS:
            warn("epochs", "confirm", f"{settings.epochs:,} rounds is far more than a training run needs "
                                      f"(above {CONFIRM_ROUNDS:,}); a job can be continued from its checkpoint later")
    elif settings.epochs > CONFIRM_EPOCHS:
        warn("epochs", "confirm", f"{settings.epochs:,} passes over the dataset (above {CONFIRM_EPOCHS:,}); "
                                  "a job can be continued from its checkpoint later")
    if settings.local_epochs > CONFIRM_LOCAL_EPOCHS:
        warn("localEpochs", "confirm", f"{settings.local_epochs:,} local epochs: each participant passes over its "
                                       f"chunk that often per round (above {CONFIRM_LOCAL_EPOCHS}); its update then "
                                       "drifts far from the others'")
    if settings.batch_size > CONFIRM_BATCH_SIZE:
        warn("batchSize", "confirm", f"a batch of {settings.batch_size:,} examples (above {CONFIRM_BATCH_SIZE:,})")
    elif facts.largest_chunk is not None and settings.batch_size > facts.largest_chunk and not experience:
        warn("batchSize", "note", f"a batch of {settings.batch_size:,} is larger than any chunk "
                                  f"({facts.largest_chunk:,} examples): each step uses a whole chunk")
    lr = settings.learning_rate
    if lr is not None and lr > CONFIRM_LEARNING_RATE:
        warn("learningRate", "confirm", f"a learning rate of {lr:g} is far above usual values (0.0001 to 1); "
                                        "training will most likely diverge (leave it empty for the model's default)")
    elif lr is not None and lr > NOTE_LEARNING_RATE:
        warn("learningRate", "note", f"a learning rate of {lr:g} is above usual values (0.0001 to 1)")
    _review_outer_step(settings, warn)
    _review_compression(settings, warn)
    if settings.experience is not None and facts.default_units is not None and \
            settings.experience.units_per_assignment > CONFIRM_UNITS_FACTOR * facts.default_units:
        warn("experience.unitsPerAssignment", "confirm",
             f"{settings.experience.units_per_assignment:,} {unit} per round, the model suggests "
             f"{facts.default_units:,}")

    work = _work(settings, facts, experience)
    estimated = None
    if work is not None and facts.examples_per_second is not None and facts.examples_per_second > 0:
        estimated = round(1000.0 * work / facts.examples_per_second)
        level: Level = "confirm" if estimated > CONFIRM_MS else "note"
        warn("epochs", level, f"about {_duration(estimated)} at the measured speed "
                              f"({facts.examples_per_second:,.4g} {unit}/s): {work:,} {unit} in all")
    elif work is not None and work > CONFIRM_WORK:
        warn("epochs", "confirm", f"the job processes {work:,} {unit} in all (above {CONFIRM_WORK:.0e}): "
                                  "days or years of training")
    privacy = {**(_review_secure(settings, warn) or {}), **(_review_dp(settings, warn) or {})}
    return Review(tuple(out), work, estimated, privacy or None)


def _review_secure(settings: TrainingSettings, warn: Callable[..., None]) -> dict[str, Any] | None:
    """What secure aggregation asks of a round, said as a note."""
    privacy = settings.privacy
    if not privacy.secure_aggregation:
        return None
    warn("privacy.secureAggregation", "note",
         f"secure aggregation: each participant clips its update to {privacy.participant_clip:g} and masks it; the "
         f"coordinator sees only each round's sum, which counts only when max(2, {privacy.threshold:g} x n) of the "
         "round's n participants stay to its end (a round of one always fails); no training metrics are collected")
    return {"secureAggregation": {"clip": privacy.participant_clip, "threshold": privacy.threshold}}


def _review_dp(settings: TrainingSettings, warn: Callable[[str, Level, str], None]) -> dict[str, Any] | None:
    """The planned ε of privacy.dp, said as a note (a confirmation without noise: no guarantee at all)."""
    dp = settings.privacy.dp
    if dp is None:
        return None
    planned = dp.planned_epsilon
    if planned == float("inf"):
        warn("privacy.dp.noiseMultiplier", "confirm", "a noise multiplier of 0 clips updates but adds no noise: "
                                                      "no differential privacy (ε is infinite)")
    else:
        where = ("each participant adds its share to its masked update: the coordinator never sees a noise-free sum"
                 if dp.participants_noise else "the coordinator adds it to each round's mean")
        warn("privacy.dp", "note", f"differential privacy: ε ≤ {planned:.3g} at δ = {dp.delta:g} for each "
                                   f"participant over at most {dp.max_rounds:,} rounds (clip {dp.clip:g}, "
                                   f"noise multiplier {dp.noise_multiplier:g}; {where})")
    return {"dp": {"plannedEpsilon": epsilon_json(planned), "delta": dp.delta, "maxRounds": dp.max_rounds,
                   "noiseAt": dp.noise_at}}


def _review_outer_step(settings: TrainingSettings, warn: Any) -> None:
    aggregation = settings.aggregation
    if aggregation.method != "fedavgm":
        return
    eta, mu = aggregation.option("serverLearningRate"), aggregation.option("momentum")
    step = eta / (1.0 - mu)
    if step > NOTE_OUTER_STEP:
        warn("aggregation.momentum", "note",
             f"FedAvgM with momentum {mu:g} and server step {eta:g} moves up to {step:.3g} x the round's average "
             "change; with local Adam at the model's default learning rate this was measured to end above "
             "FedAvg's loss (docs/methods.md: on digits-mlp, and at momentum 0.9 step 1 on the byte-transformer). "
             "Momentum 0.5 with step 1 to 1.2 helped on both reference models; "
             "0.9 helps only when local training moves little (a local learning rate well below the default)",
             WarningCode.OUTER_MOMENTUM_OVERSHOOTS)
    elif aggregation.option("nesterov") and eta * (1.0 + mu) > NOTE_NESTEROV_STEP:
        warn("aggregation.nesterov", "note",
             f"Nesterov FedAvgM with momentum {mu:g} and server step {eta:g} moves a round by {eta * (1.0 + mu):.3g} x "
             "its average change at once; above 1.5 this was measured to end above FedAvg's loss on both reference "
             "models (docs/methods.md). Without nesterov the same momentum and step move it by "
             f"{eta:g} x at first",
             WarningCode.OUTER_MOMENTUM_OVERSHOOTS)


def _review_compression(settings: TrainingSettings, warn: Any) -> None:
    compression = settings.compression
    if compression is None:
        return
    bits, block = compression.bits, compression.block
    if block < NOTE_COMPRESSION_BLOCK:
        warn("compression.block", "note",
             f"a float32 scale per {block} weights costs {4 / block:.3g} bytes a weight: int{bits} updates are "
             f"{4 / (bits / 8 + 4 / block):.2f} x smaller than float32, {4 / (bits / 8 + 4 / 256):.2f} x at the "
             "default block of 256 (whose final loss was measured within 1% of float32's, docs/methods.md)")
    if compression.deflate:
        warn("compression.deflate", "note",
             "deflating the codes made digits-mlp's int8 updates a fifth smaller (4.58 instead of 3.63 x fewer "
             "bytes than float32), the byte-transformer's 5% (its int4 ones an eighth), and cost the coordinator "
             "2 to 3.4 x a float32 update's CPU to inflate them (docs/methods.md): worth it where uploads, not "
             "the coordinator's CPU, limit a round")


def _work(settings: TrainingSettings, facts: WorkFacts, experience: bool) -> int | None:
    if experience:
        units = settings.experience.units_per_assignment if settings.experience is not None else facts.default_units
        if units is None:
            return None
        return settings.epochs * units * max(1, facts.peers)
    if facts.examples is None:
        return None
    return settings.epochs * settings.local_epochs * facts.examples


def facts_from_manifest(manifest: Any, speeds: Mapping[str, float] | None = None) -> WorkFacts:
    """WorkFacts from a selected manifest's JSON (a package or a chunk list); an invalid one
    gives no facts (createJob names its problem). ``speeds``: this device's last measured
    speed by model id (a package names its model; one device, so an upper bound)."""
    try:
        parsed = parse_manifest_file(manifest)
    except WeeiError:
        return WorkFacts()
    dataset = parsed.dataset_manifest if isinstance(parsed, ModelPackage) else parsed
    work = parsed.work_source if isinstance(parsed, ModelPackage) else None
    counts = [e.example_count for e in dataset.entries]
    speed = speeds.get(parsed.model_id) if speeds and isinstance(parsed, ModelPackage) else None
    return WorkFacts(examples=sum(counts) if counts else None, largest_chunk=max(counts) if counts else None,
                     default_units=work.default_units if work is not None else None,
                     unit_label=work.unit_label if work is not None else None, examples_per_second=speed)


def facts_from_job(coordinator: Coordinator, live: LiveProgress) -> WorkFacts:
    """WorkFacts of the active job: its chunks or units, its approved peers and their measured speed."""
    spec = coordinator.spec
    counts = [c.example_count for c in spec.chunks]
    work = spec.info.work_source
    peers = [p for p, r in coordinator.peers.items() if r.approved]
    return WorkFacts(examples=sum(counts) if counts else None, largest_chunk=max(counts) if counts else None,
                     default_units=work.default_units if work is not None else None,
                     unit_label=work.unit_label if work is not None else None,
                     peers=max(1, len(peers)), examples_per_second=live.records_per_second(peers))
