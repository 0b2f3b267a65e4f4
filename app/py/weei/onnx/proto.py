"""A small protobuf reader and writer for the ONNX ModelProto subset Weei uses.

Pure Python, so the importer runs the same in CPython and in Pyodide without
the ``onnx`` package. Reading is bounded: a message is a list of fields
``(number, wire_type, value)`` where a length-delimited value is a
memoryview of the input (nothing is copied), and every length is checked
against what is left. Writing re-encodes a field list, so the exporter can
replace initializers and keep every other byte of the user's file.
"""

from __future__ import annotations

import struct
from typing import Any

from .errors import OnnxError, OnnxReason

__all__ = ["Field", "read_fields", "varint", "encode_varint", "encode_fields", "signed64"]

Field = tuple[int, int, Any]

#: A file over this is refused before it is read (the largest module Weei ships is far below).
MAX_FIELDS = 4_000_000


def varint(data: memoryview, pos: int) -> tuple[int, int]:
    """Decode one varint at ``pos``; (value, new position)."""
    result = shift = 0
    while True:
        if pos >= len(data):
            raise OnnxError(OnnxReason.MALFORMED_ONNX, "a varint runs past the end of its message")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise OnnxError(OnnxReason.MALFORMED_ONNX, "a varint is longer than 10 bytes")


def signed64(value: int) -> int:
    if not isinstance(value, int):
        raise OnnxError(OnnxReason.MALFORMED_ONNX, "an integer field has the wrong wire type")
    return value - (1 << 64) if value >= 1 << 63 else value


def read_fields(data: memoryview | bytes, limits: dict[int, tuple[int, OnnxReason, str]] | None = None) -> list[Field]:
    """The fields of one message, in file order. ``limits`` maps a field number to
    (most occurrences, reason, message): one more is refused at once, so a file of
    a million nodes costs no more than the limit's worth of reading."""
    seen: dict[int, int] = {}
    if not isinstance(data, (memoryview, bytes)):
        raise OnnxError(OnnxReason.MALFORMED_ONNX, "a message field has the wrong wire type")
    view = memoryview(data) if not isinstance(data, memoryview) else data
    fields: list[Field] = []
    pos, end = 0, len(view)
    while pos < end:
        key, pos = varint(view, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = varint(view, pos)
        elif wire == 1:
            if pos + 8 > end:
                raise OnnxError(OnnxReason.MALFORMED_ONNX, "a fixed64 field runs past the end of its message")
            value, pos = view[pos:pos + 8], pos + 8
        elif wire == 2:
            size, pos = varint(view, pos)
            if size > end - pos:
                raise OnnxError(OnnxReason.MALFORMED_ONNX, f"field {number} claims {size} bytes, {end - pos} are left")
            value, pos = view[pos:pos + size], pos + size
        elif wire == 5:
            if pos + 4 > end:
                raise OnnxError(OnnxReason.MALFORMED_ONNX, "a fixed32 field runs past the end of its message")
            value, pos = view[pos:pos + 4], pos + 4
        else:
            raise OnnxError(OnnxReason.MALFORMED_ONNX, f"wire type {wire} (groups) is not ONNX")
        if number == 0:
            raise OnnxError(OnnxReason.MALFORMED_ONNX, "field number 0")
        fields.append((number, wire, value))
        if limits and number in limits:
            seen[number] = seen.get(number, 0) + 1
            if seen[number] > limits[number][0]:
                raise OnnxError(limits[number][1], limits[number][2])
        if len(fields) > MAX_FIELDS:
            raise OnnxError(OnnxReason.ONNX_TOO_LARGE, f"a message has more than {MAX_FIELDS} fields")
    return fields


def packed_varints(value: Any, wire: int) -> list[int]:
    """A repeated integer field's values: packed (wire 2) or one (wire 0)."""
    if wire == 0:
        return [value]
    out: list[int] = []
    pos = 0
    while pos < len(value):
        v, pos = varint(value, pos)
        out.append(v)
    return out


def packed_floats(value: Any, wire: int) -> list[float]:
    if wire == 5:
        return [struct.unpack("<f", value)[0]]
    if len(value) % 4:
        raise OnnxError(OnnxReason.MALFORMED_ONNX, "packed floats are not a whole number of float32")
    return list(struct.unpack(f"<{len(value) // 4}f", value))


def encode_varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def encode_fields(fields: list[Field]) -> bytes:
    out = bytearray()
    for number, wire, value in fields:
        out += encode_varint(number << 3 | wire)
        if wire == 0:
            out += encode_varint(value)
        elif wire == 2:
            out += encode_varint(len(value)) + bytes(value)
        else:
            out += bytes(value)
    return bytes(out)
