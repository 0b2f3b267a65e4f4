"""Seeds of experience jobs: test vectors, an independent re-computation, splits."""

from __future__ import annotations

import hashlib
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from weei.core.errors import SettingsError, UsageError, WeeiError
from weei.core.formats.seeds import (
    MAX_SEED,
    ExperienceProgress,
    assignment_seed,
    continue_experience,
    evaluation_seed,
    format_seed,
    job_seed_from_bytes,
    parse_seed,
    rounds_to_train,
    split_assignment,
)

# The same vectors are printed in docs/experience.md.
ASSIGNMENT_VECTORS = [
    # (job seed, first unit index, assignment seed)
    (0, 0, 3817092277649762016),
    (0, 32, 15052388795678843996),
    (1, 0, 2610780247291539660),
    (0x0123456789ABCDEF, 96, 11906484135727511594),
    (12345678901234567890, 0, 9496894702840012403),
    (12345678901234567890, 32, 3026538092887856980),
    (12345678901234567890, 96, 6184044807246409449),
    (12345678901234567890, 4096, 7148431876916406709),
    (18446744073709551615, 0, 1380952053211418358),
]
EVALUATION_VECTORS = [
    (0, 7228924798923535106),
    (1, 1649517374833619889),
    (12345678901234567890, 603730079661476634),
    (18446744073709551615, 11699038441760346092),
]


def reference_assignment_seed(job_seed: int, unit_start: int) -> int:
    # Written from the documented format, with struct and hex rather than the module's helpers.
    message = b"weei-assignment-seed-v1" + b"\x00" + struct.pack("<QQ", job_seed, unit_start)
    return int(hashlib.sha256(message).hexdigest()[:16], 16)


def reference_evaluation_seed(job_seed: int) -> int:
    message = b"weei-evaluation-seed-v1" + b"\x00" + struct.pack("<Q", job_seed)
    return int(hashlib.sha256(message).hexdigest()[:16], 16)


@pytest.mark.parametrize(("job_seed", "unit", "expected"), ASSIGNMENT_VECTORS)
def test_assignment_seed_vectors(job_seed: int, unit: int, expected: int) -> None:
    assert assignment_seed(job_seed, unit) == expected
    assert reference_assignment_seed(job_seed, unit) == expected


@pytest.mark.parametrize(("job_seed", "expected"), EVALUATION_VECTORS)
def test_evaluation_seed_vectors(job_seed: int, expected: int) -> None:
    assert evaluation_seed(job_seed) == expected
    assert reference_evaluation_seed(job_seed) == expected


@given(st.integers(0, MAX_SEED), st.integers(0, MAX_SEED))
def test_seeds_match_reference(job_seed: int, unit: int) -> None:
    assert assignment_seed(job_seed, unit) == reference_assignment_seed(job_seed, unit)
    assert evaluation_seed(job_seed) == reference_evaluation_seed(job_seed)


def test_job_seed_from_bytes_is_little_endian() -> None:
    assert job_seed_from_bytes(bytes(range(8))) == 506097522914230528
    assert job_seed_from_bytes(bytes.fromhex("d20a1feb8ca954ab")) == 12345678901234567890
    assert job_seed_from_bytes(b"\xff" * 8) == MAX_SEED
    for bad in (b"", b"\x00" * 7, b"\x00" * 9):
        with pytest.raises(UsageError) as info:
            job_seed_from_bytes(bad)
        assert info.value.reason == "bad-seed"


@given(st.integers(0, MAX_SEED))
def test_format_parse_round_trip(seed: int) -> None:
    assert parse_seed(format_seed(seed)) == seed


@pytest.mark.parametrize("text", ["", "-1", "+1", "01", "1.0", " 1", "18446744073709551616", "١", 12, None, "1e3"])
def test_parse_seed_refuses_non_canonical(text: object) -> None:
    with pytest.raises(WeeiError) as info:
        parse_seed(text)
    assert info.value.reason == "bad-seed"


def test_seed_values_outside_u64_are_usage_errors() -> None:
    for args in ((-1, 0), (2**64, 0), (0, 2**64), (True, 0)):
        with pytest.raises(UsageError):
            assignment_seed(*args)


def test_split_sizes_and_seeds() -> None:
    ranges = split_assignment(12345678901234567890, 96, 32, 3)
    assert [(r.unit_start, r.unit_count) for r in ranges] == [(96, 11), (107, 11), (118, 10)]
    assert [r.seed for r in ranges] == [6184044807246409449, 2196353978312082791, 2830719598442459241]
    # Worker 0's seed is the assignment seed: one Worker repeats the undivided assignment.
    assert ranges[0].seed == assignment_seed(12345678901234567890, 96)
    assert ranges[1].to_json() == {"unitStart": 107, "unitCount": 11, "seed": "2196353978312082791"}


def test_split_never_makes_idle_workers() -> None:
    assert [r.unit_count for r in split_assignment(1, 0, 2, 8)] == [1, 1]


@given(st.integers(0, MAX_SEED), st.integers(0, 2**40), st.integers(1, 5000), st.integers(1, 64))
def test_split_covers_the_assignment_exactly(job_seed: int, start: int, count: int, workers: int) -> None:
    ranges = split_assignment(job_seed, start, count, workers)
    assert len(ranges) == min(workers, count)
    assert ranges[0].unit_start == start
    for a, b in zip(ranges, ranges[1:]):
        assert b.unit_start == a.unit_start + a.unit_count
        assert a.unit_count - b.unit_count in (0, 1)
    assert sum(r.unit_count for r in ranges) == count
    assert all(r.seed == reference_assignment_seed(job_seed, r.unit_start) for r in ranges)


@pytest.mark.parametrize(("count", "workers"), [(0, 1), (1, 0), (-3, 2)])
def test_split_refuses_empty(count: int, workers: int) -> None:
    with pytest.raises(UsageError) as info:
        split_assignment(1, 0, count, workers)
    assert info.value.reason == "bad-split"


def test_split_refuses_units_beyond_u64() -> None:
    with pytest.raises(UsageError):
        split_assignment(1, MAX_SEED, 2, 1)


def test_experience_progress_round_trip_and_refusals() -> None:
    progress = ExperienceProgress(12345678901234567890, 416)
    assert progress.to_json() == {"jobSeed": "12345678901234567890", "nextUnit": 416}
    assert ExperienceProgress.from_json(progress.to_json()) == progress
    for bad in (None, {}, {"jobSeed": "1"}, {"jobSeed": 1, "nextUnit": 0}, {"jobSeed": "1", "nextUnit": -1},
                {"jobSeed": "1", "nextUnit": True}, {"jobSeed": "1", "nextUnit": 0, "x": 1}):
        with pytest.raises(WeeiError):
            ExperienceProgress.from_json(bad)


def test_continue_resume_keeps_the_sequence_and_new_draws_a_seed() -> None:
    saved = ExperienceProgress(7, 640)
    assert continue_experience(saved, "resume") == saved
    fresh = continue_experience(saved, "new", bytes.fromhex("d20a1feb8ca954ab"))
    assert fresh == ExperienceProgress(12345678901234567890, 0)
    with pytest.raises(UsageError):
        continue_experience(saved, "new")
    with pytest.raises(UsageError):
        continue_experience(saved, "restart")  # type: ignore[arg-type]


def test_rounds_count_from_the_checkpoint() -> None:
    assert rounds_to_train(397, 500) == 103
    assert rounds_to_train(0, 30) == 30
    for last in (397, 100):
        with pytest.raises(SettingsError) as info:
            rounds_to_train(397, last)
        assert info.value.reason == "epochs-not-above-checkpoint"
        assert info.value.field == "epochs"
