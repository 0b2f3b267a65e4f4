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


# Bit patterns, not values: a float compare would call -0.0 == 0.0 and every NaN unequal.
PATTERNS = [0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x007FFFFF, 0x807FFFFF, 0x00800000, 0x7F7FFFFF,
            0xFF7FFFFF, 0x7F800000, 0xFF800000, 0x7FC00001, 0xFFBFFFFF, 0x3F800000]


def _update_frame(weights: bytes) -> tuple[str, object, dict[str, bytes]]:
    import hashlib

    from weei.core.wire.messages import ArtifactRef, Update

    sha = hashlib.sha256(weights).hexdigest()
    update = Update("job-1", 1, "as-1", "as-1-a1", "00" * 32, ArtifactRef("update", sha, len(weights)), {}, 1)
    return "node-1", update, {sha: weights}


def test_update_weights_survive_flowers_wire_bit_for_bit() -> None:
    """An update's weights through the codec and Flower's own protobuf serialization (what a SuperNode's
    reply becomes on the wire): -0.0, the smallest and largest subnormals, +-max, +-inf and NaN payloads
    come back bit for bit. Refusing a NaN is the coordinator's (non-finite-weights), not the codec's."""
    from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
    from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict

    from weei.flower.codec import encode_frames

    weights = struct.pack(f"<{len(PATTERNS)}I", *PATTERNS)
    wire = recorddict_to_proto(encode_frames([_update_frame(weights)])).SerializeToString()
    proto = ProtoRecordDict()
    proto.ParseFromString(wire)
    frames, missing = decode_frames(recorddict_from_proto(proto))
    assert missing == [] and len(frames) == 1
    (_, message, blobs), = frames
    assert list(blobs.values()) == [weights] and message.weights.sha256 in blobs
    assert array_to_weights(weights_to_array(weights), len(PATTERNS)) == weights


@pytest.mark.parametrize(("array", "reason"), [
    (Array(np.zeros(8, dtype="<f4")), "wrong-dtype"),
    (Array(np.zeros(32, dtype="int8")), "wrong-dtype"),
    (Array(np.zeros((4, 8), dtype="uint8")), "wrong-shape"),
    (Array(np.zeros((), dtype="uint8")), "wrong-shape"),
    (Array(dtype="uint8", shape=(32,), stype="torch.raw", data=b"\0" * 32), "wrong-stype"),
    (Array(dtype="uint8", shape=(32,), stype="numpy.ndarray", data=Array(np.zeros(32, dtype="int8")).data),
     "wrong-dtype"),
    (Array(dtype="uint8", shape=(32,), stype="numpy.ndarray", data=Array(np.zeros(16, dtype="uint8")).data),
     "wrong-shape"),
])
def test_attachments_of_another_kind_refused_by_name(array: Array, reason: str) -> None:
    """An attachment is a 1-D uint8 numpy array: another dtype, shape or stype, in Flower's metadata or in
    the .npy header inside it, is refused by name before its hash is even computed."""
    from weei.flower.errors import FlowerError, FlowerReason

    content = RecordDict({"blobs": ArrayRecord({"ab" * 32: array})})
    with pytest.raises(WeeiError) as info:
        decode_frames(content)
    assert isinstance(info.value, FlowerError) and info.value.reason == FlowerReason(reason)


def test_every_attachment_a_message_names_travels_and_a_missing_one_is_named() -> None:
    """Whatever field names an artifact (a secure-aggregation masked update, a relayed checkpoint piece) is
    attached and checked like an update's weights, not only the fields a list once named."""
    import hashlib

    from weei.core.wire.messages import ArtifactRef, RelayPiece, SecAggMasked
    from weei.flower.codec import encode_frames

    masked, piece = bytes(range(16)), b"checkpoint piece"
    sha_m, sha_p = hashlib.sha256(masked).hexdigest(), hashlib.sha256(piece).hexdigest()
    frames = [("node-1", SecAggMasked("job-1", 1, 1, ArtifactRef("update", sha_m, len(masked))), {sha_m: masked}),
              ("coord", RelayPiece("job-1", 1, "ab" * 32, 0, ArtifactRef("checkpoint", sha_p, len(piece))),
               {sha_p: piece})]
    decoded, missing = decode_frames(encode_frames(frames))
    assert missing == [] and [blobs for _, _, blobs in decoded] == [{sha_m: masked}, {sha_p: piece}]
    _, missing = decode_frames(encode_frames(frames, omit=frozenset({sha_m})))
    assert missing == [sha_m]


def test_attachments_are_the_arrays_flower_itself_makes() -> None:
    """encode_frames writes an attachment's Array without numpy's writer: the same bytes as Flower's
    Array(ndarray) (np.save), for every length that changes the header's padding."""
    import io

    from weei.flower.codec import _blob_array, _npy_header

    for n in [*range(0, 300), 4095, 65536, 10**6 + 7]:
        data = bytes(i % 251 for i in range(n))
        ours, flowers = _blob_array(data), Array(np.frombuffer(data, dtype=np.uint8))
        assert (ours.dtype, ours.shape, ours.stype, ours.data) == (flowers.dtype, flowers.shape, flowers.stype,
                                                                  flowers.data)
    for digits in range(1, 20):  # lengths too long to allocate here: numpy's own header writer
        for n in (10 ** (digits - 1), 10**digits - 1):
            buffer = io.BytesIO()
            np.lib.format.write_array_header_1_0(buffer, {"descr": "|u1", "fortran_order": False, "shape": (n,)})
            assert _npy_header(n) == buffer.getvalue()


def test_an_attachment_in_another_valid_npy_form_still_decodes() -> None:
    """Weei reads past a header it wrote itself; another writer's valid .npy (format 2.0 here) goes through
    numpy's loader and its checks, and gives the same bytes."""
    import hashlib
    import io

    from weei.core.wire.messages import ArtifactRef, Update
    from weei.flower.codec import encode_frames

    weights = bytes(range(40))
    sha = hashlib.sha256(weights).hexdigest()
    update = Update("job-1", 1, "as-1", "as-1-a1", "00" * 32, ArtifactRef("update", sha, len(weights)), {}, 1)
    content = encode_frames([("node-1", update, {sha: weights})])
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, np.frombuffer(weights, dtype=np.uint8), version=(2, 0))
    assert buffer.getvalue() != content["blobs"][sha].data
    content["blobs"][sha] = Array(dtype="uint8", shape=(40,), stype="numpy.ndarray", data=buffer.getvalue())
    (_, _, blobs), = decode_frames(content)[0]
    assert blobs == {sha: weights}
