"""weei.core.floats: the byte-mask finite check against struct + math."""

from __future__ import annotations

import math
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weei.core.floats import first_non_finite


def reference(data: bytes) -> int | None:
    for i, (value,) in enumerate(struct.iter_unpack("<f", data)):
        if not math.isfinite(value):
            return i
    return None


SPECIAL = [0.0, -0.0, 1.0, -1.0, 3.4028234663852886e38, -3.4028234663852886e38, 1e-45, -1e-45, 1.1754943508222875e-38,
           float("inf"), float("-inf"), float("nan")]


def test_special_values() -> None:
    for i, value in enumerate(SPECIAL):
        data = struct.pack("<f", 1.0) * 3 + struct.pack("<f", value)
        assert first_non_finite(data) == (None if math.isfinite(value) else 3), value
    # Every NaN payload, signalling or quiet, of either sign.
    for bits in (0x7F800001, 0x7FC00000, 0xFFFFFFFF, 0xFF800000, 0x7FBFFFFF):
        assert first_non_finite(struct.pack("<I", bits)) == 0
    for bits in (0x7F7FFFFF, 0xFF7FFFFF, 0x00800000, 0x807FFFFF):
        assert first_non_finite(struct.pack("<I", bits)) is None
    assert first_non_finite(b"") is None


def test_input_types_and_errors() -> None:
    data = struct.pack("<3f", 1, float("nan"), 2)
    assert first_non_finite(bytearray(data)) == 1
    assert first_non_finite(memoryview(data)) == 1
    assert first_non_finite(memoryview(data)[4:]) == 0
    assert first_non_finite(memoryview(struct.pack("<4f", 1, 2, 3, float("inf"))).cast("f")) == 3
    with pytest.raises(ValueError):
        first_non_finite(b"123")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400).map(lambda b: b[: len(b) // 4 * 4]))
def test_matches_reference_on_random_bytes(data: bytes) -> None:
    assert first_non_finite(data) == reference(data)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(width=32) | st.sampled_from(SPECIAL), max_size=200))
def test_matches_reference_on_floats(values: list[float]) -> None:
    data = struct.pack(f"<{len(values)}f", *values)
    assert first_non_finite(data) == reference(data)


def test_64_mib_on_the_slow_path_is_exact() -> None:
    # Every high byte a candidate: the slow path over 64 MiB (its speed is bench_aggregate's, not a test's).
    n = 16 * 1024 * 1024
    finite = struct.pack("<f", -3.0e38) * n
    assert first_non_finite(finite) is None
    last = bytearray(finite)
    last[-4:] = struct.pack("<f", float("nan"))
    assert first_non_finite(last) == n - 1
