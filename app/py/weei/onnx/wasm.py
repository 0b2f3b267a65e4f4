"""Append the graph blob to the runtime module (docs/onnx.md, "The package").

The runtime (c/onnx/runtime.c) holds a 24-byte slot in its data section:
the magic ``WEEI-ONNX-SLOT-1``, then the blob's u32 offset and length, both 0.
This module, in pure Python, adds the blob as one more active data segment
at the end of the compiled memory, raises the memory's minimum to hold it,
writes its place into the slot and counts the segment in the data count
section. No compiler is needed.
"""

from __future__ import annotations

import struct

from .errors import OnnxError, OnnxReason

__all__ = ["SLOT_MAGIC", "attach_blob", "read_blob"]

SLOT_MAGIC = b"WEEI-ONNX-SLOT-1"
PAGE = 65536
MEMORY_SECTION, DATA_SECTION, DATACOUNT_SECTION = 5, 11, 12


def _uleb(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _sleb(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            if byte & 0x40:
                result -= 1 << shift
            return result, pos


def _enc_uleb(v: int) -> bytes:
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def _enc_sleb(v: int) -> bytes:
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        done = (v == 0 and not b & 0x40) or (v == -1 and b & 0x40)
        out.append(b | (0 if done else 0x80))
        if done:
            return bytes(out)


def _sections(wasm: bytes) -> list[tuple[int, bytes]]:
    if wasm[:8] != b"\0asm\1\0\0\0":
        raise OnnxError(OnnxReason.BAD_RUNTIME, "the graph runtime is not a WebAssembly module")
    out, pos = [], 8
    while pos < len(wasm):
        sid = wasm[pos]
        size, pos = _uleb(wasm, pos + 1)
        out.append((sid, wasm[pos:pos + size]))
        pos += size
    return out


def _segments(body: bytes) -> list[tuple[int | None, bytes, int]]:
    """(memory offset or None for passive, bytes, where the bytes start in body) per segment."""
    count, pos = _uleb(body, 0)
    out = []
    for _ in range(count):
        flags, pos = _uleb(body, pos)
        offset = None
        if flags in (0, 2):
            if flags == 2:
                _, pos = _uleb(body, pos)
            if body[pos] != 0x41:
                raise OnnxError(OnnxReason.BAD_RUNTIME, "a data segment's offset is not an i32.const")
            offset, pos = _sleb(body, pos + 1)
            if body[pos] != 0x0B:
                raise OnnxError(OnnxReason.BAD_RUNTIME, "a data segment's offset expression is not one constant")
            pos += 1
        size, pos = _uleb(body, pos)
        out.append((offset, body[pos:pos + size], pos))
        pos += size
    return out


def attach_blob(runtime: bytes, blob: bytes) -> bytes:
    """The runtime with ``blob`` in its memory and its slot pointing at it."""
    sections = _sections(runtime)
    rebuilt: list[tuple[int, bytes]] = []
    memory_pages = None
    for sid, body in sections:
        if sid == MEMORY_SECTION:
            count, pos = _uleb(body, 0)
            flags, pos = _uleb(body, pos)
            if count != 1 or flags not in (0, 1):
                raise OnnxError(OnnxReason.BAD_RUNTIME, "the runtime must have one 32-bit memory")
            memory_pages, pos = _uleb(body, pos)
    if memory_pages is None:
        raise OnnxError(OnnxReason.BAD_RUNTIME, "the runtime has no memory section")
    address = memory_pages * PAGE
    end = address + len(blob)
    if end >= 1 << 31:
        raise OnnxError(OnnxReason.TENSOR_TOO_LARGE, "the graph and its weights do not fit a 2 GiB memory")
    pages = -(-end // PAGE)
    found = 0
    for sid, body in sections:
        if sid == MEMORY_SECTION:
            _, pos = _uleb(body, 0)
            flags, pos = _uleb(body, pos)
            _, pos = _uleb(body, pos)
            limits = _enc_uleb(0) + _enc_uleb(pages)
            if flags == 1:
                maximum, _ = _uleb(body, pos)
                if maximum < pages:
                    raise OnnxError(OnnxReason.TENSOR_TOO_LARGE, "the graph does not fit the runtime's maximum memory")
                limits = _enc_uleb(1) + _enc_uleb(pages) + _enc_uleb(maximum)
            body = _enc_uleb(1) + limits
        elif sid == DATA_SECTION:
            patched = bytearray(body)
            for _, data, start in _segments(body):
                at = data.find(SLOT_MAGIC)
                while at >= 0:
                    found += 1
                    struct.pack_into("<II", patched, start + at + len(SLOT_MAGIC), address, len(blob))
                    at = data.find(SLOT_MAGIC, at + 1)
            count, pos = _uleb(body, 0)
            segment = b"\0\x41" + _enc_sleb(address) + b"\x0b" + _enc_uleb(len(blob)) + blob
            body = _enc_uleb(count + 1) + bytes(patched[pos:]) + segment
        elif sid == DATACOUNT_SECTION:
            count, _ = _uleb(body, 0)
            body = _enc_uleb(count + 1)
        rebuilt.append((sid, body))
    if found != 1:
        raise OnnxError(OnnxReason.BAD_RUNTIME, f"the runtime's graph slot appears {found} times, expected once")
    out = bytearray(runtime[:8])
    for sid, body in rebuilt:
        out += bytes([sid]) + _enc_uleb(len(body)) + body
    return bytes(out)


def read_blob(wasm: bytes) -> bytes:
    """The blob attach_blob added (the exporter reads the graph's layout back from a package)."""
    for sid, body in _sections(wasm):
        if sid == DATA_SECTION:
            segments = _segments(body)
            for _, data, _ in segments:
                at = data.find(SLOT_MAGIC)
                if at >= 0:
                    address, size = struct.unpack_from("<II", data, at + len(SLOT_MAGIC))
                    for offset, blob, _ in segments:
                        if offset == address and len(blob) == size and size:
                            return bytes(blob)
    raise OnnxError(OnnxReason.NOT_AN_ONNX_PACKAGE, "the module is not an imported ONNX model (no graph blob)")
