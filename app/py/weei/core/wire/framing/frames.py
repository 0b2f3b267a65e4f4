"""The frames of wire version 1: their format, and encoding and parsing one frame.

The byte layout and every limit are written down in ``docs/wire.md``; this
module is its one parse/serialize pair. ``parse_frame`` checks every length
before it slices, and a frame must be exactly as long as its fields say.
The events both sides of a channel produce (``MessageReceived``,
``ChannelBroken`` beside the transfer events) are defined here too, so the
writer and the reader share them without importing each other.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, is_dataclass
from enum import Enum, IntEnum
from functools import lru_cache
from typing import Any, Union

from ...errors import UsageError, WeeiError, UsageReason
from ..messages import ArtifactRef, Message
from ...observe.transfers import TransferDone, TransferFailed, TransferProgress

__all__ = [
    "MAGIC",
    "VERSION",
    "HEADER_BYTES",
    "DEFAULT_MAX_FRAME_BYTES",
    "HARD_MAX_FRAME_BYTES",
    "MIN_FRAME_BYTES",
    "MAX_ATTACHMENTS",
    "MAX_KIND_BYTES",
    "MAX_ABORT_REASON_BYTES",
    "DATA_PAYLOAD_AT",
    "MAX_TRANSFER_ID",
    "REASONS",
    "FATAL_REASONS",
    "FrameReason",
    "FrameError",
    "FrameType",
    "ArtifactBegin",
    "MessageBegin",
    "Data",
    "Abort",
    "Frame",
    "parse_frame",
    "artifact_begin_frame",
    "message_begin_frame",
    "data_frame",
    "abort_frame",
    "framed_bytes",
    "referenced_artifacts",
    "MessageReceived",
    "ChannelBroken",
    "Event",
]

MAGIC = 0x57  # "W"
VERSION = 1
HEADER_BYTES = 8
DEFAULT_MAX_FRAME_BYTES = 64 * 1024
# Half of Chromium's 262,144 max-message-size: room for other SCTP stacks
# (Firefox, aiortc) that advertise less, and no frame ever near the edge.
HARD_MAX_FRAME_BYTES = 128 * 1024
# A MESSAGE_BEGIN listing MAX_ATTACHMENTS refs must fit in one frame.
MIN_FRAME_BYTES = 4096
MAX_ATTACHMENTS = 64
MAX_KIND_BYTES = 16
MAX_ABORT_REASON_BYTES = 64

_HEADER = struct.Struct("<BBBBI")  # magic, version, type, flags, transfer id
_ARTIFACT_BEGIN = struct.Struct("<Q32sB")  # total, sha256, kind length (+ kind)
_MESSAGE_BEGIN = struct.Struct("<IH")  # JSON bytes, attachment count (+ refs)
_ATTACHMENT = struct.Struct("<32sQ")  # sha256, bytes
_DATA = struct.Struct("<QI")  # offset, length (+ payload)
_ABORT = struct.Struct("<B")  # reason length (+ reason)
#: Where a DATA frame's payload starts.
DATA_PAYLOAD_AT = HEADER_BYTES + _DATA.size
_KIND = re.compile(rb"[a-z]{1,16}")
_ASCII_REASON = re.compile(rb"[\x20-\x7e]*")
#: The largest transfer id (and frame length field).
MAX_TRANSFER_ID = 2**32 - 1


class FrameReason(str, Enum):
    """Why a frame, or the transfer it belongs to, was refused (sent and shown as the string)."""

    BAD_FRAME = "bad-frame"
    """Framing corruption (bad header, lengths, transfer id): the channel is broken."""
    OVERSIZED_FRAME = "oversized-frame"
    """A frame above the reader's ``max_frame_bytes``: the channel is broken."""
    TOO_LARGE = "too-large"
    """An artifact or message announced above the reader's limit."""
    TOO_MANY_TRANSFERS = "too-many-transfers"
    """More transfers open (or artifacts awaiting their message) than allowed."""
    BUFFER_FULL = "buffer-full"
    """The announced size would exceed the bytes the reader may buffer."""
    OUT_OF_ORDER = "out-of-order"
    """A DATA frame beyond the next expected offset."""
    DUPLICATE_FRAGMENT = "duplicate-fragment"
    """A DATA frame for bytes already received."""
    SIZE_EXCEEDED = "size-exceeded"
    """More bytes than the begin frame announced."""
    HASH_MISMATCH = "hash-mismatch"
    """A complete artifact whose SHA-256 is not the announced one."""
    MISSING_ATTACHMENT = "missing-attachment"
    """A message names an artifact that neither arrived nor is held."""
    BAD_MESSAGE = "bad-message"
    """The message JSON is empty, invalid, or disagrees with its attachment list."""
    ABORTED = "aborted"
    """The sender gave the transfer up (ABORT frame, or a cancelled send)."""
    STALLED = "stalled"
    """No data for the transfer, or no message claimed the artifact, in time."""
    CHANNEL_BROKEN = "channel-broken"
    """The channel broke while the transfer was open."""
    CHANNEL_CLOSED = "channel-closed"
    """The channel closed while the transfer was open."""


#: Every reason code a FrameError can carry.
REASONS = frozenset(reason.value for reason in FrameReason)
#: Reasons after which the reader refuses the whole channel.
FATAL_REASONS = frozenset({FrameReason.BAD_FRAME.value, FrameReason.OVERSIZED_FRAME.value})


class FrameError(WeeiError):
    """A peer's frame (or a transfer it started) was refused; ``reason`` is one of ``REASONS``."""

    reasons = (FrameReason,)

    @property
    def fatal(self) -> bool:
        """True when the channel itself is broken, not just one transfer."""
        return self.reason in FATAL_REASONS


class FrameType(IntEnum):
    """The frame types of wire version 1."""

    ARTIFACT_BEGIN = 1
    """Starts an artifact transfer: total size, SHA-256, kind."""
    MESSAGE_BEGIN = 2
    """Starts a message transfer: JSON size and the artifacts sent for it."""
    DATA = 3
    """Bytes of a transfer at an offset; offsets are contiguous from 0."""
    ABORT = 4
    """The sender gives up a transfer (the receiver drops it)."""


@dataclass(frozen=True)
class ArtifactBegin:
    """Parsed ARTIFACT_BEGIN."""

    transfer_id: int
    kind: str
    sha256: str
    total: int


@dataclass(frozen=True)
class MessageBegin:
    """Parsed MESSAGE_BEGIN."""

    transfer_id: int
    json_bytes: int
    attachments: tuple[tuple[str, int], ...]  # (sha256, bytes), in the order sent


@dataclass(frozen=True)
class Data:
    """Parsed DATA."""

    transfer_id: int
    offset: int
    payload: memoryview  # a view into the received frame: no copy


@dataclass(frozen=True)
class Abort:
    """Parsed ABORT."""

    transfer_id: int
    reason: str


Frame = Union[ArtifactBegin, MessageBegin, Data, Abort]


def _bad(message: str) -> FrameError:
    return FrameError(FrameReason.BAD_FRAME, message)


def parse_frame(frame: bytes | bytearray | memoryview, max_frame_bytes: int = HARD_MAX_FRAME_BYTES) -> Frame:
    """Parse one frame's bytes.

    Every length is checked before it is used, and a frame must be exactly as
    long as its fields say (no trailing bytes).

    Returns:
        The parsed frame; a ``Data`` payload is a view into ``frame``.
    Raises:
        FrameError: ``oversized-frame`` above ``max_frame_bytes``, else
            ``bad-frame`` naming the defect.
    """
    view = memoryview(frame).cast("B")
    n = len(view)
    if n > max_frame_bytes:
        raise FrameError(FrameReason.OVERSIZED_FRAME, f"frame of {n} bytes, at most {max_frame_bytes}")
    if n < HEADER_BYTES:
        raise _bad(f"frame of {n} bytes is shorter than the {HEADER_BYTES}-byte header")
    magic, version, ftype, flags, tid = _HEADER.unpack_from(view)
    if magic != MAGIC:
        raise _bad(f"bad magic byte 0x{magic:02x}")
    if version != VERSION:
        raise _bad(f"unknown wire version {version}")
    if flags != 0:
        raise _bad(f"reserved flags 0x{flags:02x} are set")
    if tid == 0:
        raise _bad("transfer id 0 is reserved")
    body = n - HEADER_BYTES
    if ftype == FrameType.DATA:
        if body < _DATA.size:
            raise _bad("DATA frame too short")
        offset, length = _DATA.unpack_from(view, HEADER_BYTES)
        if length == 0 or length != body - _DATA.size:
            raise _bad(f"DATA length field {length} but {body - _DATA.size} payload bytes")
        return Data(tid, offset, view[DATA_PAYLOAD_AT:])
    if ftype == FrameType.ARTIFACT_BEGIN:
        if body < _ARTIFACT_BEGIN.size:
            raise _bad("ARTIFACT_BEGIN frame too short")
        total, digest, kind_len = _ARTIFACT_BEGIN.unpack_from(view, HEADER_BYTES)
        if body != _ARTIFACT_BEGIN.size + kind_len:
            raise _bad("ARTIFACT_BEGIN length does not match its kind length")
        kind = bytes(view[HEADER_BYTES + _ARTIFACT_BEGIN.size:])
        if not _KIND.fullmatch(kind) or kind.decode() not in ArtifactRef.KINDS:
            raise _bad(f"unknown artifact kind {kind[:MAX_KIND_BYTES]!r}")
        return ArtifactBegin(tid, kind.decode(), digest.hex(), total)
    if ftype == FrameType.MESSAGE_BEGIN:
        if body < _MESSAGE_BEGIN.size:
            raise _bad("MESSAGE_BEGIN frame too short")
        json_bytes, count = _MESSAGE_BEGIN.unpack_from(view, HEADER_BYTES)
        if body != _MESSAGE_BEGIN.size + count * _ATTACHMENT.size:
            raise _bad("MESSAGE_BEGIN length does not match its attachment count")
        start = HEADER_BYTES + _MESSAGE_BEGIN.size
        refs = tuple((d.hex(), size) for d, size in _ATTACHMENT.iter_unpack(view[start:]))
        return MessageBegin(tid, json_bytes, refs)
    if ftype == FrameType.ABORT:
        if body < _ABORT.size:
            raise _bad("ABORT frame too short")
        (reason_len,) = _ABORT.unpack_from(view, HEADER_BYTES)
        reason = bytes(view[HEADER_BYTES + _ABORT.size:])
        if len(reason) != reason_len or reason_len > MAX_ABORT_REASON_BYTES or not _ASCII_REASON.fullmatch(reason):
            raise _bad("ABORT reason is not printable ASCII of its stated length")
        return Abort(tid, reason.decode())
    raise _bad(f"unknown frame type {ftype}")


def _header(ftype: FrameType, tid: int) -> bytes:
    if not 0 < tid <= MAX_TRANSFER_ID:
        raise UsageError(UsageReason.BAD_TRANSFER_ID, f"transfer id {tid} is outside 1..2**32-1")
    return _HEADER.pack(MAGIC, VERSION, ftype, 0, tid)


def artifact_begin_frame(tid: int, kind: str, sha256: str, total: int) -> bytes:
    """The ARTIFACT_BEGIN frame. Raises ``UsageError`` for values the format cannot carry."""
    if kind not in ArtifactRef.KINDS or not 0 <= total < 2**64 or len(sha256) != 64:
        raise UsageError(UsageReason.BAD_FRAME_FIELD, f"cannot frame artifact {kind!r} {sha256!r} of {total} bytes")
    raw = kind.encode()
    return _header(FrameType.ARTIFACT_BEGIN, tid) + _ARTIFACT_BEGIN.pack(total, bytes.fromhex(sha256), len(raw)) + raw


def message_begin_frame(tid: int, json_bytes: int, attachments: Sequence[tuple[str, int]]) -> bytes:
    """The MESSAGE_BEGIN frame. Raises ``UsageError`` for values the format cannot carry."""
    if not 0 <= json_bytes <= MAX_TRANSFER_ID or len(attachments) > 0xFFFF:
        raise UsageError(UsageReason.BAD_FRAME_FIELD, "message or attachment list too large to frame")
    refs = b"".join(_ATTACHMENT.pack(bytes.fromhex(sha), size) for sha, size in attachments)
    return _header(FrameType.MESSAGE_BEGIN, tid) + _MESSAGE_BEGIN.pack(json_bytes, len(attachments)) + refs


def data_frame(tid: int, offset: int, payload: bytes | bytearray | memoryview) -> bytes:
    """The DATA frame carrying ``payload`` at ``offset`` (one copy of the payload)."""
    length = len(payload)
    if not 0 < length <= MAX_TRANSFER_ID or not 0 <= offset < 2**64:
        raise UsageError(UsageReason.BAD_FRAME_FIELD, f"cannot frame {length} bytes at offset {offset}")
    return _header(FrameType.DATA, tid) + _DATA.pack(offset, length) + payload


def framed_bytes(json_bytes: int, attachments: Sequence[tuple[str, int]],
                 max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> int:
    """The bytes a channel carries for a message of ``json_bytes`` with ``(kind, bytes)`` attachments, frame
    headers included, as ``FrameWriter`` frames them (what in-memory hosts count as sent)."""
    room = max_frame_bytes - DATA_PAYLOAD_AT

    def data(n: int) -> int:
        return n + DATA_PAYLOAD_AT * -(-n // room)

    begins = sum(HEADER_BYTES + _ARTIFACT_BEGIN.size + len(kind.encode()) + data(size) for kind, size in attachments)
    return begins + HEADER_BYTES + _MESSAGE_BEGIN.size + _ATTACHMENT.size * len(attachments) + data(json_bytes)


def abort_frame(tid: int, reason: str) -> bytes:
    """The ABORT frame; ``reason`` is cut to 64 printable ASCII characters."""
    raw = reason.encode("ascii", "replace")[:MAX_ABORT_REASON_BYTES]
    raw = bytes(b if 0x20 <= b <= 0x7E else 0x3F for b in raw)
    return _header(FrameType.ABORT, tid) + _ABORT.pack(len(raw)) + raw


@lru_cache(maxsize=256)  # the wire's dataclasses: asked for each one walked, i.e. for every message received
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


def referenced_artifacts(message: Message) -> list[ArtifactRef]:
    """Every ``ArtifactRef`` a message names (fields, nested refs, and dicts of refs).

    Raw JSON dicts (model info, settings) hold no refs and are not walked.
    """
    out: list[ArtifactRef] = []

    def walk(value: Any) -> None:
        if isinstance(value, ArtifactRef):
            out.append(value)
        elif is_dataclass(value) and not isinstance(value, type):
            for name in _field_names(type(value)):
                walk(getattr(value, name))
        elif isinstance(value, dict):
            for v in value.values():
                if isinstance(v, ArtifactRef) or (is_dataclass(v) and not isinstance(v, type)):
                    walk(v)

    walk(message)
    return out



@dataclass(frozen=True)
class MessageReceived:
    """A complete, valid message and the verified artifacts that travelled with it."""

    peer_id: str
    message: Message
    blobs: Mapping[str, bytes]  # a VerifiedBlobs: the reader hashed each artifact on arrival
    transfer_id: int


@dataclass(frozen=True)
class ChannelBroken:
    """Framing corruption: the host must close this channel."""

    peer_id: str
    error: FrameError


Event = Union[TransferProgress, TransferDone, TransferFailed, MessageReceived, ChannelBroken]
