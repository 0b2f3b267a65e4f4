"""Weei frames and arrays in Flower's records, and back.

A Flower ``Message`` carries a ``RecordDict``. One Weei message per frame:
``ConfigRecord`` ``"frame.<i>"`` holds ``{"from": peer id, "message": the wire
message's JSON text}`` (the same text the in-memory and WebRTC transports move,
decoded by the one decode table); the attachments travel once per Flower
message in the ``ArrayRecord`` ``"blobs"``, keyed by SHA-256, each a 1-D
``uint8`` numpy array. Float32 weight vectors have their own pair
(:func:`weights_to_array` / :func:`array_to_weights`) for Flower users who read
the weights as arrays: little-endian bytes in, the same bytes out, -0.0,
subnormals and +-max included.

Everything decoded here came from another process: a wrong record type,
dtype, shape or stype, a hash that does not match, or too many bytes is
refused with a named :class:`~weei.flower.errors.FlowerError`, never a crash.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from .errors import FlowerError, FlowerReason
from ..core.wire.framing import referenced_artifacts
from ..core.wire.messages import Message, decode_message, encode_message

__all__ = ["Frame", "encode_frames", "decode_frames", "weights_to_array", "array_to_weights",
           "MAX_RECORD_BYTES", "NEEDS_KEY"]

Frame = tuple[str, Message, dict[str, bytes]]

# One Flower message carries at most what one WebRTC job ever moves at once (a module, a chunk, weights).
MAX_RECORD_BYTES = 512 * 1024 * 1024
# A node asks for attachments it was expected to hold but does not (its cache was emptied).
NEEDS_KEY = "weei.needs"
_STYPE = "numpy.ndarray"


def _array(data: bytes, dtype: str) -> Array:
    return Array(np.frombuffer(data, dtype=np.dtype(dtype)))


def _npy_header(length: int) -> bytes:
    """The .npy header ``np.save`` writes for a 1-D uint8 array of ``length`` (format 1.0; the header is
    padded for growth along the axis, then to 64 bytes with the magic and length; test_flower_codec holds
    it to ``np.save``'s for every length that moves the padding)."""
    text = f"{{'descr': '|u1', 'fortran_order': False, 'shape': ({length},), }}" + " " * (21 - len(str(length)))
    size = len(text) + 1
    pad = 64 - (10 + size) % 64
    return b"\x93NUMPY\x01\x00" + (size + pad).to_bytes(2, "little") + text.encode("latin1") + b" " * pad + b"\n"


def _blob_array(data: bytes) -> Array:
    # What Flower's Array(ndarray) makes of the bytes (np.save into a buffer), without the buffer and
    # numpy's header writer: that was most of a message's encoding (~0.3 ms an attachment).
    return Array(dtype="uint8", shape=(len(data),), stype=_STYPE, data=_npy_header(len(data)) + data)


def _blob_bytes(array: Any, at: str) -> bytes:
    """An attachment's bytes: past the header when it is the one Weei writes for its length (no parsing,
    nothing the header could say is read), else through numpy's loader and every check."""
    if isinstance(array, Array) and array.stype == _STYPE and array.dtype == "uint8" \
            and isinstance(array.shape, tuple) and len(array.shape) == 1 and type(array.shape[0]) is int \
            and isinstance(array.data, bytes):
        header = _npy_header(array.shape[0])
        if len(array.data) == len(header) + array.shape[0] and array.data.startswith(header):
            if len(array.data) > MAX_RECORD_BYTES + 1024:  # as _check_array says it
                raise FlowerError(FlowerReason.TOO_LARGE, f"{at} holds {len(array.data)} bytes")
            return array.data[len(header):]
    return _check_array(array, "uint8", None, at).tobytes()


def _check_array(array: Any, dtype: str, length: int | None, at: str) -> np.ndarray:
    if not isinstance(array, Array):
        raise FlowerError(FlowerReason.WRONG_RECORD, f"{at} is a {type(array).__name__}, not a Flower Array")
    if array.stype != _STYPE:
        raise FlowerError(FlowerReason.WRONG_STYPE, f"{at} has stype {array.stype!r}, expected {_STYPE!r}")
    if array.dtype != np.dtype(dtype).name:
        raise FlowerError(FlowerReason.WRONG_DTYPE, f"{at} has dtype {array.dtype!r}, expected {np.dtype(dtype).name!r}")
    shape = tuple(array.shape)
    if len(shape) != 1 or (length is not None and shape[0] != length):
        raise FlowerError(FlowerReason.WRONG_SHAPE, f"{at} has shape {shape}, expected ({'n' if length is None else length},)")
    if len(array.data) > MAX_RECORD_BYTES + 1024:
        raise FlowerError(FlowerReason.TOO_LARGE, f"{at} holds {len(array.data)} bytes")
    try:
        value = array.numpy()
    except Exception as exc:  # numpy's loader raises several types on a malformed .npy payload
        raise FlowerError(FlowerReason.BAD_ARRAY, f"{at} does not decode: {exc}") from None
    # The header inside the data is the sender's too: it must agree with the metadata Flower shows.
    if value.dtype != np.dtype(dtype) or value.shape != shape:
        raise FlowerError(FlowerReason.WRONG_DTYPE if value.dtype != np.dtype(dtype) else FlowerReason.WRONG_SHAPE,
                          f"{at}'s data is {value.dtype}{value.shape}, its record says {array.dtype}{shape}")
    return value


def weights_to_array(weights: bytes) -> Array:
    """Little-endian float32 bytes as a 1-D float32 Array; raises FlowerError wrong-shape on a partial float."""
    if len(weights) % 4:
        raise FlowerError(FlowerReason.WRONG_SHAPE, f"{len(weights)} bytes are not whole float32 values")
    return _array(weights, "<f4")


def array_to_weights(array: Any, count: int | None = None) -> bytes:
    """The little-endian float32 bytes of a 1-D float32 Array of ``count`` values (any count when None).
    Raises FlowerError: wrong-record, wrong-stype, wrong-dtype, wrong-shape, bad-array, too-large."""
    return _check_array(array, "<f4", count, "the weights array").astype("<f4", copy=False).tobytes()


def encode_frames(frames: list[Frame], *, omit: frozenset[str] = frozenset()) -> RecordDict:
    """Weei messages with their attachments as one RecordDict; attachments in ``omit`` stay out
    (the receiver holds them)."""
    records: dict[str, Any] = {}
    blobs: dict[str, Array] = {}
    for i, (src, message, attached) in enumerate(frames):
        records[f"frame.{i}"] = ConfigRecord({"from": src, "message": json.dumps(encode_message(message))})
        for sha, data in attached.items():
            if sha not in omit:
                blobs[sha] = _blob_array(data)
    records["blobs"] = ArrayRecord(blobs)
    return RecordDict(records)


def decode_frames(content: Any, held: Mapping[str, bytes] = {}) -> tuple[list[Frame], list[str]]:
    """The frames a RecordDict carries, with their attachments (from the record, else from ``held``), and
    the SHA-256s of the attachments that are missing from both. Raises FlowerError on anything malformed."""
    if not isinstance(content, RecordDict):
        raise FlowerError(FlowerReason.WRONG_RECORD, "the message content is not a RecordDict")
    blob_record = content.get("blobs", ArrayRecord())
    if not isinstance(blob_record, ArrayRecord):
        raise FlowerError(FlowerReason.WRONG_RECORD, "'blobs' is not an ArrayRecord")
    blobs: dict[str, bytes] = {}
    total = 0
    for sha, array in blob_record.items():
        data = _blob_bytes(array, f"attachment {sha[:12]}")
        total += len(data)
        if total > MAX_RECORD_BYTES:
            raise FlowerError(FlowerReason.TOO_LARGE, f"the attachments exceed {MAX_RECORD_BYTES} bytes")
        if hashlib.sha256(data).hexdigest() != sha:
            raise FlowerError(FlowerReason.HASH_MISMATCH, f"attachment {sha[:12]} does not match its SHA-256")
        blobs[sha] = data
    frames: list[Frame] = []
    missing: list[str] = []
    names = sorted((k for k in content if k.startswith("frame.")), key=lambda k: int(k.split(".")[1]))
    for name in names:
        record = content[name]
        if not isinstance(record, ConfigRecord) or not isinstance(record.get("from"), str) \
                or not isinstance(record.get("message"), str):
            raise FlowerError(FlowerReason.WRONG_RECORD, f"{name} is not a ConfigRecord of 'from' and 'message' text")
        try:
            message = decode_message(json.loads(record["message"]))
        except ValueError as exc:
            raise FlowerError(FlowerReason.BAD_JSON, f"{name}: {exc}") from None
        attached: dict[str, bytes] = {}
        for ref in referenced_artifacts(message):
            data = blobs.get(ref.sha256, held.get(ref.sha256))
            if data is None:
                missing.append(ref.sha256)
            elif len(data) != ref.bytes:
                raise FlowerError(FlowerReason.HASH_MISMATCH, f"attachment {ref.sha256[:12]} is {len(data)} bytes, "
                                                 f"the message says {ref.bytes}")
            else:
                attached[ref.sha256] = data
        frames.append((record["from"], message, attached))
    return frames, missing
