"""The record codec: Weei bytes in Flower's records and back, exactly; anything else refused by name."""

from __future__ import annotations

import struct

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict  # noqa: E402

from weei.core.errors import WeeiError  # noqa: E402
from weei.flower.codec import array_to_weights, decode_frames, weights_to_array  # noqa: E402

EDGES = [0.0, -0.0, 1.4e-45, -1.4e-45, 1.1754942e-38, 3.4028235e38, -3.4028235e38, 1.0, float("inf")]


def test_weights_round_trip_bit_exact() -> None:
    raw = struct.pack(f"<{len(EDGES)}f", *EDGES) + bytes.fromhex("0100c07f")  # a NaN payload too
    array = weights_to_array(raw)
    assert array.dtype == "float32" and tuple(array.shape) == (len(EDGES) + 1,)
    assert array_to_weights(array, len(EDGES) + 1) == raw
    assert struct.unpack("<f", array_to_weights(array)[4:8])[0] == 0.0
    assert array_to_weights(array)[4:8] == b"\x00\x00\x00\x80"  # -0.0 kept its sign


@pytest.mark.parametrize(("array", "count", "reason"), [
    (Array(np.zeros(3, dtype="<f8")), 3, "wrong-dtype"),
    (Array(np.zeros(3, dtype="uint8")), 3, "wrong-dtype"),
    (Array(np.zeros((3, 1), dtype="<f4")), 3, "wrong-shape"),
    (Array(np.zeros(4, dtype="<f4")), 3, "wrong-shape"),
    (Array(dtype="float32", shape=(3,), stype="torch.raw", data=b"\0" * 12), 3, "wrong-stype"),
    (Array(dtype="float32", shape=(3,), stype="numpy.ndarray", data=b"not npy"), 3, "bad-array"),
    # the metadata says float32[3]; the .npy header inside says float64[3]
    (Array(dtype="float32", shape=(3,), stype="numpy.ndarray", data=Array(np.zeros(3)).data), 3, "wrong-dtype"),
    ("not an array", 3, "wrong-record"),
])
def test_refused_by_name(array: object, count: int, reason: str) -> None:
    with pytest.raises(WeeiError) as info:
        array_to_weights(array, count)
    assert info.value.reason == reason


def test_partial_float_refused() -> None:
    with pytest.raises(WeeiError) as info:
        weights_to_array(b"\0" * 5)
    assert info.value.reason == "wrong-shape"


def test_frames_refused_by_name() -> None:
    bad_hash = RecordDict({"blobs": ArrayRecord({"ab" * 32: Array(np.zeros(4, dtype="uint8"))})})
    with pytest.raises(WeeiError) as info:
        decode_frames(bad_hash)
    assert info.value.reason == "hash-mismatch"
    not_text = RecordDict({"frame.0": ConfigRecord({"from": "x", "message": 3})})
    with pytest.raises(WeeiError) as info:
        decode_frames(not_text)
    assert info.value.reason == "wrong-record"
    not_json = RecordDict({"frame.0": ConfigRecord({"from": "x", "message": "{"})})
    with pytest.raises(WeeiError) as info:
        decode_frames(not_json)
    assert info.value.reason == "bad-json"
