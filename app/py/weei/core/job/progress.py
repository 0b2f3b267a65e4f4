"""The job's work: its schedule, started fresh or restored from a checkpoint, and what a checkpoint records of it.

Theory of operation
-------------------
A dataset job works through a :class:`DatasetSchedule` (chunks, epochs), an
experience job through an :class:`ExperienceSchedule` (unit ranges from a
job seed). A new job starts one fresh (:func:`new_schedules`). A job that
continues from a checkpoint (:func:`restore`) either picks up where the
checkpoint left off (``mode`` 'resume': the remaining chunks in their
order, or the job seed, next unit and the unit ranges waiting for a retry) or starts a fresh pass ('new'), and
always keeps the checkpoint's weights and aggregation state.
:func:`recorded` is the reverse: the fields a checkpoint writes down so a
later ``restore`` finds the same place; :func:`checkpoint_metadata` builds the
whole metadata of a checkpoint from the job spec, that progress and the
aggregation state (here, not in the file format, which knows no job).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ..aggregation.aggregate import AggregationState
from .attempts import Attempt
from ..formats.checkpoint import Checkpoint, checkpoint_file_name
from ..errors import ManifestError, UsageError, UsageReason
from .spec import JobSpec
from ..formats.manifest import check_recorded_auxiliary
from .schedule import DatasetSchedule, ExperienceSchedule, UnitWork
from ..formats.seeds import ExperienceProgress, rounds_to_train

__all__ = ["Restored", "new_schedules", "restore", "recorded", "checkpoint_metadata", "work_done", "dropped_work",
           "give_back"]


@dataclass(frozen=True)
class Restored:
    """Where a job continued from a checkpoint stands."""

    round: int
    job_seed: int | None
    dataset: DatasetSchedule | None
    experience: ExperienceSchedule | None
    aggregation_state: AggregationState | None


def new_schedules(spec: JobSpec, job_seed: int | None, next_unit: int = 0, retry: tuple[UnitWork, ...] = (),
                  ) -> tuple[DatasetSchedule | None, ExperienceSchedule | None]:
    """A fresh schedule for ``spec``: (dataset, None) or (None, experience); an experience
    schedule hands out the ranges of ``retry`` first, then units from ``next_unit``.

    Raises:
        UsageError: an experience job without ``job_seed``, or a dataset job without chunks.
    """
    if spec.is_experience:
        if job_seed is None:
            raise UsageError(UsageReason.MISSING_JOB_SEED, "an experience job needs a job seed")
        source = spec.info.work_source
        assert source is not None  # is_experience: the model has a workSource
        units = spec.settings.experience.units_per_assignment if spec.settings.experience else source.default_units
        return None, ExperienceSchedule(units, next_unit, retry)
    if not spec.chunks:
        raise UsageError(UsageReason.NO_CHUNKS, "a dataset job needs at least one chunk")
    return DatasetSchedule([c.id for c in spec.chunks], planned_epochs=spec.settings.epochs), None


def restore(spec: JobSpec, checkpoint: Checkpoint, *, mode: str, new_job_seed: int | None,
            reopening: bool) -> Restored:
    """Where ``spec`` continues from ``checkpoint`` (see ``Coordinator.continue_from``).

    Raises:
        UsageError: bad mode, weights of the wrong size, other auxiliary
            files than the checkpoint's, a missing job seed, or an
            experience job whose last round is not above the checkpoint's.
    """
    if mode not in ("new", "resume"):
        raise UsageError(UsageReason.BAD_DATASET_MODE, "datasetMode must be 'new' or 'resume'")
    meta = checkpoint.metadata.to_json()  # CheckpointMetadata: its checked JSON
    round_ = int(meta["round"])
    if len(checkpoint.weights) != spec.weight_bytes:
        raise UsageError(UsageReason.WRONG_WEIGHT_SIZE, f"the checkpoint holds {len(checkpoint.weights)} bytes of weights, "
                                              f"the model creates {spec.weight_bytes}")
    # Reopening a saved (possibly completed) job is not a request to train more.
    if spec.is_experience and not reopening:
        rounds_to_train(round_, spec.settings.epochs)
    try:  # "continuing from a checkpoint with other files is rejected"
        check_recorded_auxiliary(checkpoint.metadata.auxiliary_weights, spec.info.auxiliary_weights)
    except ManifestError as exc:
        raise UsageError(UsageReason(exc.reason), exc.message) from exc
    job_seed: int | None = None
    next_unit = 0
    retry: tuple[UnitWork, ...] = ()
    if spec.is_experience:
        exp = meta.get("experience") or {}
        if mode == "resume" and exp:
            # The reader checked these fields (and let others pass): this cannot fail.
            saved = ExperienceProgress.from_json({k: v for k, v in exp.items() if k in ("jobSeed", "nextUnit", "retry")})
            job_seed, next_unit = saved.job_seed, saved.next_unit
            retry = tuple(UnitWork(start, count) for start, count in saved.retry)
        else:
            if new_job_seed is None:
                raise UsageError(UsageReason.MISSING_JOB_SEED, "an experience job needs a job seed")
            job_seed = new_job_seed
    dataset, experience = new_schedules(spec, job_seed, next_unit=next_unit, retry=retry)
    if dataset is not None and mode == "resume" and meta.get("remainingChunkIds") is not None:
        known = {c.id for c in spec.chunks}
        order = [c for c in (meta.get("chunkOrder") or [c.id for c in spec.chunks]) if c in known]
        order += [c for c in (c.id for c in spec.chunks) if c not in set(order)]
        dataset = DatasetSchedule(
            [c.id for c in spec.chunks], planned_epochs=spec.settings.epochs, order=order,
            epoch=int(meta.get("datasetEpoch", 0)), remaining=list(meta["remainingChunkIds"]),
            shuffled=meta.get("chunkOrder") is not None)
        # remaining is empty only after a pass that datasetEpoch already counts.
        dataset.continue_passes()
    state = None
    agg = meta.get("aggregationState")
    if agg is not None and checkpoint.state is not None:
        state = AggregationState(agg["method"], int(agg["step"]), bytes(checkpoint.state))
    return Restored(round_, job_seed, dataset, experience, state)


def recorded(dataset: DatasetSchedule | None, experience: ExperienceSchedule | None,
             job_seed: int | None) -> dict[str, Any]:
    """The work done so far, as a checkpoint records it (``checkpoint_metadata``'s ``progress``)."""
    out: dict[str, Any] = {}
    if dataset is not None:
        if dataset.shuffled:
            out["chunkOrder"] = list(dataset.order)
        remaining = dataset.remaining if not dataset.finished else []
        # A dropped chunk was never trained: it is neither trained nor remaining.
        untrained = set(remaining) | set(dataset.dropped)
        out["trainedChunkIds"] = [c for c in dataset.order if c not in untrained]
        out["remainingChunkIds"] = remaining
        out["datasetEpoch"] = dataset.epoch
    if experience is not None:
        assert job_seed is not None
        # Ranges failed or lost in the closed round wait for the next one: resuming must not skip them.
        retry = tuple((work.start, work.count) for work in experience.retry)
        out["experience"] = ExperienceProgress(job_seed, experience.next_unit, retry).to_json()
    return out


def work_done(dataset: DatasetSchedule | None, checkpoint_round: int, epochs: int) -> bool:
    """Every planned epoch trained (dataset), or the last round reached (experience)."""
    if dataset is not None:
        return dataset.finished
    return checkpoint_round >= epochs


def dropped_work(dataset: DatasetSchedule | None, experience: ExperienceSchedule | None) -> bool:
    """Some work failed too often and was dropped: the job ends incomplete."""
    if dataset is not None:
        return bool(dataset.dropped)
    return bool(experience is not None and experience.dropped)


def give_back(dataset: DatasetSchedule | None, experience: ExperienceSchedule | None, attempt: Attempt, *,
              failed: bool, peers_available: int = 1) -> None:
    """``attempt``'s work goes back to the front of its schedule (``failed`` counts against the work)."""
    if dataset is not None and attempt.chunk_id is not None:
        dataset.give_back(attempt.chunk_id, failed=failed, peer=attempt.peer, peers_available=peers_available)
    elif experience is not None and attempt.units is not None:
        experience.give_back(attempt.units, failed=failed)


def checkpoint_metadata(spec: JobSpec, *, round_: int, weights_sha256: str, weight_bytes: int,
                        metrics: Mapping[str, float], examples: int, incomplete: bool,
                        progress: Mapping[str, Any], aggregation: AggregationState | None,
                        privacy: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The metadata of checkpoint ``round_`` of the job ``spec``, as :func:`~weei.core.formats.checkpoint.write_checkpoint`
    takes it (its file name: ``checkpoint_file_name``).

    ``progress`` is the work the job has done: a dataset job's
    ``chunkOrder`` (when shuffled), ``trainedChunkIds``,
    ``remainingChunkIds`` and ``datasetEpoch``, an experience job's
    ``experience``. The key order is the file's (``JSON.stringify`` keeps it).
    """
    metadata: dict[str, Any] = {
        "version": 2 if aggregation is not None else 1,
        "jobId": spec.job_id,
        "module": spec.module.to_json(),
        "modelInfo": spec.info.raw,
        "settings": spec.settings.to_json(),
        "round": round_,
        "checkpoint": {"artifactId": f"checkpoint-{weights_sha256[:16]}", "kind": "checkpoint",
                       "fileName": checkpoint_file_name(spec.info.id, round_), "format": "float32-le",
                       "bytes": weight_bytes, "sha256": weights_sha256, "round": round_},
        "metrics": {"values": dict(metrics), "examplesProcessed": examples},
        "incomplete": incomplete,
        **progress,
    }
    if spec.auxiliary_files:
        metadata["auxiliaryWeights"] = {k: v.sha256 for k, v in spec.auxiliary_files.items()}
    if privacy is not None:
        metadata["privacy"] = dict(privacy)  # what DP has spent so far (weei.core.privacy.dp_accountant)
    if aggregation is not None:
        metadata["aggregationState"] = {"method": aggregation.method, "step": aggregation.step,
                                        "bytes": len(aggregation.data)}
    return metadata
