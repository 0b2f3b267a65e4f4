"""What a round hands out, what closing it produces, and when a checkpoint is validated: pure functions.

Theory of operation
-------------------
Round ``r`` trains from checkpoint ``r - 1``. Each assignment
(:func:`make_assign`) carries the training settings, its seed, its work (a
chunk or a unit range) and the weights of every auxiliary slot
(:func:`auxiliary_for`). When the round closes, its valid
updates, in canonical order, go through :func:`close_round`: FedAvg, then
the configured server optimizer, plus the example-weighted mean of every
metric the model declares. Out comes a :class:`RoundRecord`, everything the
new checkpoint ``r`` needs. The coordinator writes it down; nothing here
changes the coordinator or the schedules, so a failed aggregation leaves
them as they were. Metric means cannot overflow (``aggregate.weighted_mean``):
a finite metric a peer reports never makes the checkpoint unwritable. :func:`validation_due` says whether the new checkpoint
is evaluated (every one of a short job), :func:`validation_command` what the host runs.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence

from ..aggregation.aggregate import AggregationKernel, AggregationState, BytesLike, DpRound, aggregate_round, weighted_mean
from ..privacy.dp_noise import DpReport
from .attempts import Attempt, Received
from .secure_round import ASSIGN_KEY, SecureTerms
from ..wire.commands import RunValidation
from ..errors import SettingsError, UsageError, SettingsReason, UsageReason
from .spec import JobSpec
from ..wire.messages import ArtifactRef, Assign, ChunkRef, UnitRange
from ..formats.modelinfo import AuxiliarySlot, ModelInfo
from ..aggregation.robust import RobustReport
from ..formats.seeds import evaluation_seed
from ..formats.settings import TrainingSettings

__all__ = [
    "Kernel", "RoundRecord", "close_round", "weighted_metrics", "check_method", "check_units", "chunk_seed",
    "make_assign", "secure_terms", "assignment_settings", "auxiliary_for", "snapshot_round", "snapshot_rounds", "held_round", "check_can_validate", "SHORT_JOB_ROUNDS", "most_rounds",
    "validating", "validation_due", "validation_command",
]


class Kernel(AggregationKernel, Protocol):
    """What the coordinator asks of a kernel (weei.kernel): the aggregation loops, a finite scan, the
    SHA-256 of the new weights (the round's other bulk work) and, for secure aggregation, X25519."""

    def first_non_finite(self, data: BytesLike) -> int:
        """The index of the first non-finite float32 value of ``data``, or -1."""
        ...

    def sha256_many(self, buffers: Sequence[BytesLike]) -> list[str]:
        """The hex SHA-256 of each buffer, in order (a CPython host spreads them over its cores)."""
        ...

    def x25519(self, k: bytes, u: bytes) -> bytes:
        """RFC 7748's X25519 (``weei.core.privacy.x25519.X25519``): the same bytes as the pure-Python ladder.
        Raises ValueError when an input is not 32 bytes."""
        ...


@dataclass(frozen=True)
class RoundRecord:
    """The checkpoint a closed round produced."""

    round: int
    weights: bytes
    weights_sha256: str
    aggregation_state: AggregationState | None
    metrics: dict[str, float]  # example-weighted mean of each declared metric some update reported
    examples: int  # examples (or units) behind the checkpoint
    contributors: list[str]  # peers whose update counted, sorted
    trained_chunks: list[str]  # dataset chunks the round trained, canonical order
    robust: RobustReport | None = None  # what robust aggregation did (None: off), by assignment id
    outliers: list[str] = field(default_factory=list)  # peers whose delta norm was an outlier, sorted
    clipped: list[str] = field(default_factory=list)  # peers whose update normClip scaled down, sorted
    dp: DpReport | None = None  # what DP's clipping and noise did (None: the job has no DP)


def close_round(kernel: Kernel, round_: int, weights: bytes, state: AggregationState | None,
                settings: TrainingSettings, info: ModelInfo, received: Sequence[Received],
                digest: Callable[[bytes], str] | None = None, dp: DpRound | None = None) -> RoundRecord:
    """Aggregate round ``round_``'s valid updates (canonical order, at least one) into its checkpoint.

    ``digest`` names the new weights (hex SHA-256); by default the kernel's
    ``sha256_many``. The coordinator passes its relay's, which hashes the
    pieces of a checkpoint it is about to relay at the same time.

    Raises:
        SettingsError: the model does not allow the configured method.
        AggregationError: the aggregate is not finite, or the kernel refused the inputs.
    """
    check_method(info, settings)
    contributions = [(r.attempt.assignment_id, r.update.count, r.weights) for r in received]
    result = aggregate_round(kernel, weights, contributions, settings.aggregation, state, info.aggregation, dp)
    # Keyed as the report names contributions (str | int); here every id is an assignment id (str).
    peer_of: dict[str | int, str] = {r.attempt.assignment_id: r.attempt.peer for r in received}
    report = result.report
    return RoundRecord(
        round=round_,
        weights=result.weights,
        weights_sha256=digest(result.weights) if digest is not None else kernel.sha256_many([result.weights])[0],
        aggregation_state=result.state,
        metrics=weighted_metrics([m.id for m in info.metrics], received),
        examples=sum(r.update.count for r in received),
        contributors=sorted(r.attempt.peer for r in received),
        trained_chunks=[r.attempt.chunk_id for r in received if r.attempt.chunk_id is not None],
        robust=report,
        outliers=sorted({peer_of[a] for a in report.outliers}) if report else [],
        clipped=sorted({peer_of[a] for a in report.clipped}) if report else [],
        dp=result.dp,
    )


def weighted_metrics(metric_ids: Sequence[str], received: Sequence[Received]) -> dict[str, float]:
    """Each metric's mean over the updates that report it, weighted by their example counts: finite,
    whatever finite values the updates report (``aggregate.weighted_mean``)."""
    out: dict[str, float] = {}
    for mid in metric_ids:
        pairs = [(r.update.metrics[mid], r.update.count) for r in received if mid in r.update.metrics]
        if pairs:
            out[mid] = weighted_mean(pairs)
    return out


def check_method(info: ModelInfo, settings: TrainingSettings) -> None:
    """Raises SettingsError (method-not-allowed) when the model does not allow the aggregation method."""
    method = settings.aggregation.method
    if method not in info.allowed_methods:
        raise SettingsError("aggregation.method", f"the model does not allow {method!r}; it allows "
                                                  f"{', '.join(info.allowed_methods)}",
                            reason=SettingsReason.METHOD_NOT_ALLOWED)


def check_units(info: ModelInfo, units: int) -> None:
    """Raises SettingsError when ``units`` per assignment is outside the model's range."""
    source = info.work_source
    assert source is not None, "check_units is for experience models only"
    if not source.minimum_units <= units <= source.maximum_units:
        raise SettingsError("experience.unitsPerAssignment",
                            f"must be from {source.minimum_units} to {source.maximum_units}")


def chunk_seed(job_id: str, assignment_id: str) -> int:
    """The seed of a dataset assignment: the same for every attempt of it."""
    return int.from_bytes(hashlib.sha256(f"{job_id}/{assignment_id}".encode()).digest()[:8], "little")


def make_assign(spec: JobSpec, attempt: Attempt, checkpoint: ArtifactRef, checkpoint_hashes: Mapping[int, str],
                job_seed: int | None, *, shader_archive: bool = False,
                secure: SecureTerms | None = None) -> tuple[Assign, list[ArtifactRef]]:
    """The Assign message of ``attempt`` and every artifact it refers to (checkpoint, files, chunk, and
    the WGSL archive for a participant that asked for it); ``secure``: the round's secure-aggregation terms."""
    chunk_ref = None
    if attempt.chunk_id is not None:
        chunk = spec.chunk(attempt.chunk_id)
        chunk_ref = ChunkRef(chunk.id, chunk.format, chunk.example_count, chunk.ref)
    units = attempt.units
    unit_range = UnitRange(units.start, units.count, attempt.seed, job_seed or 0) if units is not None else None
    aux = auxiliary_for(spec, checkpoint_hashes, attempt.round)
    archive = spec.gpu.ref if shader_archive and spec.gpu is not None else None
    settings = assignment_settings(spec.settings)
    if secure is not None:
        settings[ASSIGN_KEY] = secure.to_json()
    assign = Assign(spec.job_id, attempt.round, attempt.assignment_id, attempt.attempt_id, checkpoint,
                    settings, attempt.seed, chunk_ref, unit_range, aux, archive)
    attachments = [checkpoint, *aux.values(), *([archive] if archive is not None else [])]
    if chunk_ref is not None:
        attachments.append(chunk_ref.data)
    return assign, attachments


def secure_terms(spec: JobSpec, opening: int) -> SecureTerms | None:
    """The secure-aggregation terms of a round of ``spec`` (None: off). The largest weight is a bound every
    assignment of the job respects: the largest chunk's examples, the model's most units, or 1 under DP;
    the noise is σ under ``privacy.dp.noiseAt: "participants"``, else 0."""
    privacy = spec.settings.privacy
    if not privacy.secure_aggregation:
        return None
    assert privacy.participant_clip is not None  # the settings refuse secure aggregation without a clip
    if privacy.dp is not None:
        max_weight = 1.0
    elif spec.is_experience:
        assert spec.info.work_source is not None
        max_weight = float(spec.info.work_source.maximum_units)
    else:
        max_weight = float(max((c.example_count for c in spec.chunks), default=1))
    # With noise at the participants each adds its share of σ; otherwise the coordinator adds it to the mean.
    noise = privacy.dp.noise_multiplier if privacy.dp is not None and privacy.dp.participants_noise else 0.0
    return SecureTerms(privacy.participant_clip, max_weight, privacy.threshold, opening, privacy.dp is None, noise)


def assignment_settings(settings: TrainingSettings) -> dict[str, Any]:
    """The training settings an assignment carries."""
    out: dict[str, Any] = {"localEpochs": settings.local_epochs, "batchSize": settings.batch_size}
    if settings.learning_rate is not None:
        out["learningRate"] = settings.learning_rate
    if settings.privacy.dp is not None:  # the participant clips its own update (dp_noise.clip_to_norm)
        out["dpClip"] = settings.privacy.dp.clip
    return out


def auxiliary_for(spec: JobSpec, checkpoint_hashes: Mapping[int, str], round_: int) -> dict[str, ArtifactRef]:
    """Each auxiliary slot's weights for a round: files, or the snapshot its rule picks.

    ``checkpoint_hashes`` holds every checkpoint of the job (a reopened
    job restores them from its saved summaries). The job's first checkpoint
    f is 0, or the checkpoint a continued job started from: checkpoints
    before it belong to another job and are not held. An 'initial' slot is
    checkpoint f, the job's initial weights. A 'checkpoint' rule with
    roundsAgo k for round r (which trains from checkpoint r-1) picks
    checkpoint max(f, r-1-k), so a retried or reassigned attempt of the
    round plays against the same version. A checkpoint the job does not
    hold (its save was refused, so a reopened job never read it back)
    gives way to the newest held one before it (:func:`held_round`).
    """
    out: dict[str, ArtifactRef] = {}
    for slot in spec.info.auxiliary_weights:
        if slot.id in spec.auxiliary_files:
            out[slot.id] = spec.auxiliary_files[slot.id]
            continue
        target = held_round(checkpoint_hashes, snapshot_round(slot, min(checkpoint_hashes), round_))
        out[slot.id] = ArtifactRef("snapshot", checkpoint_hashes[target], spec.weight_bytes)
    return out


def held_round(checkpoint_hashes: Mapping[int, str], target: int) -> int:
    """``target``, or the newest checkpoint held before it (the first checkpoint is always held)."""
    return max(r for r in checkpoint_hashes if r <= target)


def snapshot_round(slot: AuxiliarySlot, first: int, round_: int) -> int:
    """The checkpoint a snapshot slot names for ``round_`` in a job whose first checkpoint is ``first``."""
    if slot.source_kind == "initial":
        return first
    return max(first, round_ - 1 - (slot.rounds_ago or 0))


def snapshot_rounds(spec: JobSpec, first: int, checkpoint_round: int) -> set[int]:
    """The checkpoints a snapshot slot may still name, now or in a later round (at checkpoint ``checkpoint_round``).

    The host keeps their weights in memory, and a reopened job reads them
    back from storage: the rule moves forward one checkpoint per round.
    """
    out: set[int] = set()
    for slot in spec.info.auxiliary_weights:
        if slot.id in spec.auxiliary_files:
            continue
        if slot.source_kind == "initial":
            out.add(first)
        else:
            out.update(range(snapshot_round(slot, first, checkpoint_round + 1), checkpoint_round + 1))
    return out


def check_can_validate(spec: JobSpec) -> None:
    """Raises UsageError when the job has nothing to validate with."""
    if spec.is_experience:
        if not spec.info.capabilities.get("evaluation"):
            raise UsageError(UsageReason.NO_EVALUATION, "this model does not declare the evaluation capability")
    elif not spec.has_validation:
        raise UsageError(UsageReason.NO_VALIDATION_FILE, "this job has no validation file")


#: A job that can take at most this many rounds is validated after every one, whatever its schedule's
#: ``every`` (issue 24, item 13): "every 5 rounds" of a 4-round job drew a chart of one point.
SHORT_JOB_ROUNDS = 20


def most_rounds(spec: JobSpec) -> int:
    """The most rounds the job can take from its start: an experience job's last round, or one chunk a round
    for every chunk of every epoch (a dataset job with more peers takes fewer)."""
    if spec.is_experience:
        return spec.settings.epochs
    return len(spec.chunks) * spec.settings.epochs


def validating(spec: JobSpec) -> bool:
    """Whether the job's validation schedule is on and it has something to validate with."""
    schedule = spec.settings.validation_schedule
    if schedule is None or not schedule.enabled:
        return False
    try:
        check_can_validate(spec)
    except UsageError:
        return False
    return True


def validation_due(spec: JobSpec, round_: int, *, dataset_epoch: int | None, epoch_done: bool,
                   work_done: bool) -> bool:
    """Whether checkpoint ``round_`` is evaluated by the job's validation schedule (the last one always is,
    and every one of a short job: :data:`SHORT_JOB_ROUNDS`)."""
    schedule = spec.settings.validation_schedule
    if schedule is None or not validating(spec):
        return False
    if most_rounds(spec) <= SHORT_JOB_ROUNDS:
        return True
    if schedule.unit == "round":
        due = round_ % schedule.every == 0
    else:
        due = epoch_done and dataset_epoch is not None and dataset_epoch % schedule.every == 0
    return due or work_done


def validation_command(spec: JobSpec, round_: int, weights_sha256: str, checkpoint_hashes: Mapping[int, str],
                       job_seed: int | None) -> RunValidation:
    """Evaluate checkpoint ``round_`` (an experience job: the evaluation units from the job seed)."""
    experience = None
    if spec.is_experience:
        source = spec.info.work_source
        assert job_seed is not None and source is not None
        units = source.evaluation_units or source.default_units
        experience = (0, units, evaluation_seed(job_seed))
    return RunValidation(round_, weights_sha256, experience, auxiliary_for(spec, checkpoint_hashes, round_ + 1))
