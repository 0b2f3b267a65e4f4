"""Seeds of experience jobs, and how an assignment is split across Workers.

Theory of operation
-------------------
An experience job (a model with ``workSource.kind == "experience"``) has one
*job seed*, an unsigned 64-bit integer drawn when the job is created. Every
other seed is derived from it with SHA-256, so nothing random happens after
job creation and a retried or reassigned assignment repeats the same work:

* assignment seed = first 64 bits of
  ``SHA-256("weei-assignment-seed-v1\\0" || u64le(job seed) || u64le(unit start))``
* evaluation seed = first 64 bits of
  ``SHA-256("weei-evaluation-seed-v1\\0" || u64le(job seed))``

"First 64 bits" means the first 8 bytes of the digest read **big-endian**:
the seed is then the first 16 hex digits of the digest printed by
``sha256sum``, so anyone can check a seed by hand. The integers inside the
hashed message are **little-endian**, like every other number Weei writes
(checkpoint header, weights). The two domain tags differ, end in a NUL byte
and give messages of different lengths (40 and 32 bytes), so an assignment
seed can never equal an evaluation seed by construction of the input.

A seed travels as a decimal string (the ABI's ``"seed"``), because JSON
numbers lose precision above 2**53.

When a model declares ``maxWorkers`` above 1 and needs no input data, an
assignment is split into contiguous ranges (as many as the job and the model
say, whatever the device's Worker count: ``api.local_training.experience_parts``),
and each range's seed is the assignment seed formula applied to *its own*
first unit index. Range 0 starts at the assignment's first unit, so an
assignment in one range gets exactly the assignment seed.

The core never draws randomness itself: the host passes 8 random bytes
(``os.urandom(8)`` or ``crypto.getRandomValues``) to ``job_seed_from_bytes``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from itertools import pairwise
from typing import Literal

from ..errors import SettingsError, UsageError, WeeiError, SettingsReason, UsageReason, WeeiReason

__all__ = [
    "ASSIGNMENT_SEED_TAG",
    "EVALUATION_SEED_TAG",
    "SEED_BYTES",
    "MAX_SEED",
    "ExperienceProgress",
    "MAX_RETRY_RANGES",
    "WorkerRange",
    "job_seed_from_bytes",
    "format_seed",
    "parse_seed",
    "assignment_seed",
    "evaluation_seed",
    "split_assignment",
    "parse_retry",
    "continue_experience",
    "rounds_to_train",
]

ASSIGNMENT_SEED_TAG = b"weei-assignment-seed-v1\x00"
EVALUATION_SEED_TAG = b"weei-evaluation-seed-v1\x00"
SEED_BYTES = 8
MAX_SEED = 2**64 - 1


def _u64le(value: int, what: str) -> bytes:
    # Callers are our own code: a value outside u64 is a programming error.
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SEED:
        raise UsageError(UsageReason.BAD_SEED, f"{what} must be an integer from 0 to 2**64-1, got {value!r}")
    return value.to_bytes(8, "little")


def _first_64_bits(message: bytes) -> int:
    return int.from_bytes(hashlib.sha256(message).digest()[:8], "big")


def job_seed_from_bytes(random_bytes: bytes) -> int:
    """Turn 8 random bytes from the host into a job seed.

    Takes exactly 8 bytes (read little-endian, like every Weei integer) and
    returns an integer from 0 to 2**64-1. Raises ``UsageError`` (reason
    ``bad-seed``) for any other length, since the host supplies the bytes.
    """
    if not isinstance(random_bytes, (bytes, bytearray, memoryview)):
        raise UsageError(UsageReason.BAD_SEED, f"job seed source must be bytes, got {type(random_bytes).__name__}")
    raw = bytes(random_bytes)
    if len(raw) != SEED_BYTES:
        raise UsageError(UsageReason.BAD_SEED, f"job seed source must be {SEED_BYTES} bytes, got {len(raw)}")
    return int.from_bytes(raw, "little")


def format_seed(seed: int) -> str:
    """Return a seed as the decimal string the ABI and checkpoints carry.

    Raises ``UsageError`` (``bad-seed``) if ``seed`` is not a u64.
    """
    _u64le(seed, "seed")
    return str(seed)


def parse_seed(text: object) -> int:
    """Read a seed from its decimal string, for example ``experience.jobSeed``.

    Accepts only canonical decimal (digits, no sign, no leading zero except
    ``"0"``) from 0 to 2**64-1, so one seed has exactly one spelling. Returns
    the integer; raises ``WeeiError`` (``bad-seed``) otherwise, because the
    text comes from a file or a peer.
    """
    if not isinstance(text, str):
        raise WeeiError(WeeiReason.BAD_SEED, f"seed must be a decimal string, got {type(text).__name__}")
    # isdigit() would accept other Unicode digits; only ASCII is canonical.
    if not (0 < len(text) <= 20 and all("0" <= c <= "9" for c in text)):
        raise WeeiError(WeeiReason.BAD_SEED, f"seed must be a decimal string of 1 to 20 digits, got {text[:40]!r}")
    if len(text) > 1 and text[0] == "0":
        raise WeeiError(WeeiReason.BAD_SEED, f"seed must not have leading zeros, got {text!r}")
    value = int(text)
    if value > MAX_SEED:
        raise WeeiError(WeeiReason.BAD_SEED, f"seed must be at most 2**64-1, got {text}")
    return value


def assignment_seed(job_seed: int, unit_start: int) -> int:
    """Return the seed of the assignment (or Worker range) starting at ``unit_start``.

    Takes the job seed and the global index of the first unit, both u64.
    Returns a u64 (see the module docstring for the exact bytes hashed).
    Raises ``UsageError`` (``bad-seed``) for values outside u64.
    """
    message = ASSIGNMENT_SEED_TAG + _u64le(job_seed, "job seed") + _u64le(unit_start, "unit start")
    return _first_64_bits(message)


def evaluation_seed(job_seed: int) -> int:
    """Return the evaluation seed of a job: the same every round, so results compare.

    Raises ``UsageError`` (``bad-seed``) if ``job_seed`` is not a u64.
    """
    return _first_64_bits(EVALUATION_SEED_TAG + _u64le(job_seed, "job seed"))


@dataclass(frozen=True)
class WorkerRange:
    """One range of an assignment (``worker``: its index): ``unit_count`` units from ``unit_start``."""

    worker: int
    unit_start: int
    unit_count: int
    seed: int

    def to_json(self) -> dict[str, object]:
        """Return the ABI ``experience`` object for this Worker's ``train`` call."""
        return {"unitStart": self.unit_start, "unitCount": self.unit_count, "seed": format_seed(self.seed)}


def split_assignment(job_seed: int, unit_start: int, unit_count: int, workers: int) -> tuple[WorkerRange, ...]:
    """Split an assignment into ``workers`` contiguous ranges that the local Workers play.

    ``workers`` is the number of ranges, not of Workers: the job and the
    model fix it, so the ranges (and the result) are the same on any device.
    Uses ``min(workers, unit_count)`` ranges (none empty); sizes differ by
    at most one, the larger ranges first, so 32 units in 3 ranges give 11,
    11 and 10. Each range's seed is
    ``assignment_seed(job_seed, range start)``. Returns the ranges in unit
    order. Raises ``UsageError`` (``bad-split``) if ``unit_count`` or
    ``workers`` is below 1, or (``bad-seed``) if the last unit leaves u64.
    """
    for name, value in (("unit_count", unit_count), ("workers", workers)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UsageError(UsageReason.BAD_SPLIT, f"{name} must be an integer of at least 1, got {value!r}")
    _u64le(unit_start, "unit start")
    _u64le(unit_start + unit_count - 1, "last unit index")
    used = min(workers, unit_count)
    base, extra = divmod(unit_count, used)
    ranges: list[WorkerRange] = []
    start = unit_start
    for worker in range(used):
        count = base + (1 if worker < extra else 0)
        ranges.append(WorkerRange(worker, start, count, assignment_seed(job_seed, start)))
        start += count
    return tuple(ranges)


# A retry range per participant that failed in the checkpoint's round, at most; the file's metadata
# limit bounds it too, this keeps the check's work small whatever the file says.
MAX_RETRY_RANGES = 4096


@dataclass(frozen=True)
class ExperienceProgress:
    """What a checkpoint saves of an experience job: ``experience: {jobSeed, nextUnit, retry?}``.

    ``retry``: unit ranges ``(unit_start, unit_count)`` handed out before and
    not played yet (their attempt failed or was lost), first to go first.
    They lie below ``next_unit``, so without them a resumed job would never
    play those units; written only when there are some, so a checkpoint
    without retries is what it was before the field existed.
    """

    job_seed: int
    next_unit: int
    retry: tuple[tuple[int, int], ...] = ()

    def to_json(self) -> dict[str, object]:
        """Return the checkpoint metadata's ``experience`` object."""
        out: dict[str, object] = {"jobSeed": format_seed(self.job_seed), "nextUnit": self.next_unit}
        if self.retry:
            out["retry"] = [{"unitStart": start, "unitCount": count} for start, count in self.retry]
        return out

    @classmethod
    def from_json(cls, value: object) -> ExperienceProgress:
        """Read a checkpoint's ``experience`` object.

        Raises ``WeeiError`` (``bad-seed`` or ``bad-experience``) when it is
        not ``{jobSeed: decimal u64 string, nextUnit: integer >= 0, retry?}``
        (``parse_retry``).
        """
        if not isinstance(value, dict) or not {"jobSeed", "nextUnit"} <= set(value) <= {"jobSeed", "nextUnit", "retry"}:
            raise WeeiError(WeeiReason.BAD_EXPERIENCE, "experience must be an object with jobSeed, nextUnit and an optional retry")
        next_unit = value["nextUnit"]
        if isinstance(next_unit, bool) or not isinstance(next_unit, int) or not 0 <= next_unit <= MAX_SEED:
            raise WeeiError(WeeiReason.BAD_EXPERIENCE, f"experience.nextUnit must be an integer from 0, got {next_unit!r}")
        return cls(parse_seed(value["jobSeed"]), next_unit, parse_retry(value.get("retry", []), next_unit))


def parse_retry(value: object, next_unit: int) -> tuple[tuple[int, int], ...]:
    """Read ``experience.retry``: at most ``MAX_RETRY_RANGES`` objects ``{unitStart, unitCount}``, each
    range at least one unit, below ``next_unit`` (handed out before) and apart from the others.

    Returns ``(unit_start, unit_count)`` pairs in the file's order; raises ``WeeiError``
    (``bad-experience``) otherwise, because the text comes from a file.
    """
    if not isinstance(value, list) or len(value) > MAX_RETRY_RANGES:
        raise WeeiError(WeeiReason.BAD_EXPERIENCE, f"experience.retry must be an array of at most {MAX_RETRY_RANGES} ranges")
    ranges: list[tuple[int, int]] = []
    for i, item in enumerate(value):
        if not isinstance(item, dict) or set(item) != {"unitStart", "unitCount"}:
            raise WeeiError(WeeiReason.BAD_EXPERIENCE, f"experience.retry[{i}] must be an object with unitStart and unitCount")
        start, count = item["unitStart"], item["unitCount"]
        if any(isinstance(v, bool) or not isinstance(v, int) for v in (start, count)) or start < 0 or count < 1 \
                or start + count > next_unit:
            raise WeeiError(WeeiReason.BAD_EXPERIENCE, f"experience.retry[{i}] must be units handed out before "
                                              f"(from 0, at least one, below nextUnit {next_unit})")
        ranges.append((start, count))
    ordered = sorted(ranges)
    if any(a_start + a_count > b_start for (a_start, a_count), (b_start, _) in pairwise(ordered)):
        raise WeeiError(WeeiReason.BAD_EXPERIENCE, "experience.retry ranges must not overlap")
    return tuple(ranges)


def continue_experience(
    saved: ExperienceProgress,
    dataset_mode: Literal["resume", "new"],
    random_bytes: bytes | None = None,
) -> ExperienceProgress:
    """Return where a job continued from a checkpoint starts its units.

    ``resume`` keeps the saved job seed and next unit, so the sequence of
    assignment seeds goes on exactly as if the job had not stopped. ``new``
    draws a new job seed from ``random_bytes`` (8 bytes from the host) and
    starts again at unit 0: a new seed makes a new sequence, and counting
    from 0 keeps unit indexes small. Raises ``UsageError`` for another mode,
    or for ``new`` without 8 random bytes.
    """
    if dataset_mode == "resume":
        return saved
    if dataset_mode == "new":
        if random_bytes is None:
            raise UsageError(UsageReason.BAD_SEED, "datasetMode 'new' needs 8 random bytes for the new job seed")
        return ExperienceProgress(job_seed_from_bytes(random_bytes), 0)
    raise UsageError(UsageReason.BAD_DATASET_MODE, f"datasetMode must be 'resume' or 'new', got {dataset_mode!r}")


def rounds_to_train(checkpoint_round: int, last_round: int) -> int:
    """Return how many rounds a continued experience job still trains.

    ``last_round`` is ``settings.epochs``: the last round of the job, counted
    from the job's start, not from the checkpoint. A checkpoint of round 397
    with 500 rounds trains 103 more. Raises ``SettingsError`` on ``epochs``
    (reason ``epochs-not-above-checkpoint``) when ``last_round`` is not above
    ``checkpoint_round``, since there would be nothing to train.
    """
    if isinstance(checkpoint_round, bool) or not isinstance(checkpoint_round, int) or checkpoint_round < 0:
        raise UsageError(UsageReason.BAD_ROUND, f"checkpoint round must be an integer of at least 0, got {checkpoint_round!r}")
    if isinstance(last_round, bool) or not isinstance(last_round, int):
        raise SettingsError("epochs", f"must be a whole number of rounds, got {last_round!r}")
    if last_round <= checkpoint_round:
        raise SettingsError(
            "epochs",
            f"is the last round of the job and must be above the checkpoint's round {checkpoint_round}, got {last_round}",
            reason=SettingsReason.EPOCHS_NOT_ABOVE_CHECKPOINT,
        )
    return last_round - checkpoint_round
