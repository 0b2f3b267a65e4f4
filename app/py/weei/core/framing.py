"""Binary framing of messages and artifacts over one data channel (sans-I/O).

Theory of operation
-------------------
A WebRTC data channel is reliable, ordered and *message-oriented*: every
``send(buffer)`` arrives as one ``onmessage`` buffer, but a buffer above the
SCTP max-message-size (262,144 in Chromium) throws, and a send queue above
16 MiB throws too. So a ``Send`` (one JSON message plus the artifacts it
references, possibly hundreds of MB) is cut into *frames* of at most
``max_frame_bytes`` (64 KiB by default, never above ``HARD_MAX_FRAME_BYTES``).

Each artifact travels as one *transfer*: an ARTIFACT_BEGIN frame announcing
kind, SHA-256 and total size, then DATA frames at contiguous offsets. The
message follows as its own transfer: MESSAGE_BEGIN (JSON size and the list of
artifacts that travelled for it) then DATA frames of UTF-8 JSON. The byte
layout and every limit are in ``docs/wire.md``.

* ``FrameWriter`` turns queued sends into frames lazily (``next_frame(now)``),
  holding references to the artifact bytes, never a copy of all frames;
  ``SendQueue`` drains it under a bufferedAmount high/low watermark.
* ``FrameReader.feed(frame, now)`` takes one received frame and returns
  events. Frames are untrusted. A problem confined to one transfer drops that
  transfer (``TransferFailed``, the channel goes on; later frames of it are
  ignored); corruption of the framing itself (``ChannelBroken``) means the
  two ends no longer agree on the stream and the host must close the channel.
  ``feed`` never raises on peer input. Memory is bounded by reserving each
  transfer's announced size against ``max_buffered_bytes`` at its begin frame.
* ``TransferProgress`` / ``TransferDone`` / ``TransferFailed`` events on both
  sides feed a ``TransferBook``: the spec's ``transfers`` and
  ``transferErrors`` for ``getState()``.

Nothing here reads a clock: ``now`` is milliseconds, passed in.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from collections import OrderedDict, deque
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, fields, is_dataclass
from enum import IntEnum
from typing import Any, Union

from .commands import Send
from .errors import UsageError, WeeiError
from .messages import ArtifactRef, Message, decode_message, encode_message
from .transfers import RateMeter, TransferBook, TransferDone, TransferFailed, TransferProgress, progress_of

__all__ = [
    "MAGIC",
    "VERSION",
    "HEADER_BYTES",
    "DEFAULT_MAX_FRAME_BYTES",
    "HARD_MAX_FRAME_BYTES",
    "MIN_FRAME_BYTES",
    "MAX_ATTACHMENTS",
    "REASONS",
    "FATAL_REASONS",
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
    "referenced_artifacts",
    "TransferProgress",
    "TransferDone",
    "TransferFailed",
    "MessageReceived",
    "ChannelBroken",
    "Event",
    "ReaderLimits",
    "FrameReader",
    "FrameWriter",
    "SendQueue",
    "TransferBook",
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
DEFAULT_MAX_ARTIFACT_BYTES = 256_000_000  # the spec's 256 MB limit for checkpoints and modules
DEFAULT_MAX_MESSAGE_BYTES = 1024 * 1024  # like the checkpoint metadata limit
DEFAULT_MAX_TRANSFERS = 16
DEFAULT_MAX_BUFFERED_BYTES = 512 * 1024 * 1024  # two maximal artifacts at once
DEFAULT_PROGRESS_INTERVAL_MS = 250.0

_HEADER = struct.Struct("<BBBBI")  # magic, version, type, flags, transfer id
_ARTIFACT_BEGIN = struct.Struct("<Q32sB")  # total, sha256, kind length (+ kind)
_MESSAGE_BEGIN = struct.Struct("<IH")  # JSON bytes, attachment count (+ refs)
_ATTACHMENT = struct.Struct("<32sQ")  # sha256, bytes
_DATA = struct.Struct("<QI")  # offset, length (+ payload)
_ABORT = struct.Struct("<B")  # reason length (+ reason)
_DATA_AT = HEADER_BYTES + _DATA.size
_KIND = re.compile(rb"[a-z]{1,16}")
_ASCII_REASON = re.compile(rb"[\x20-\x7e]*")
_MAX_U32 = 2**32 - 1

#: Every reason code a FrameError can carry.
REASONS = frozenset({
    "bad-frame", "oversized-frame",  # framing corruption: the channel is broken
    "too-large", "too-many-transfers", "buffer-full", "out-of-order", "duplicate-fragment", "size-exceeded",
    "hash-mismatch", "missing-attachment", "bad-message", "aborted", "stalled", "channel-broken", "channel-closed",
})
#: Reasons after which the reader refuses the whole channel.
FATAL_REASONS = frozenset({"bad-frame", "oversized-frame"})


class FrameError(WeeiError):
    """A peer's frame (or a transfer it started) was refused; ``reason`` is one of ``REASONS``."""

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
    return FrameError("bad-frame", message)


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
        raise FrameError("oversized-frame", f"frame of {n} bytes, at most {max_frame_bytes}")
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
        return Data(tid, offset, view[_DATA_AT:])
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
    if not 0 < tid <= _MAX_U32:
        raise UsageError("bad-transfer-id", f"transfer id {tid} is outside 1..2**32-1")
    return _HEADER.pack(MAGIC, VERSION, ftype, 0, tid)


def artifact_begin_frame(tid: int, kind: str, sha256: str, total: int) -> bytes:
    """The ARTIFACT_BEGIN frame. Raises ``UsageError`` for values the format cannot carry."""
    if kind not in ArtifactRef.KINDS or not 0 <= total < 2**64 or len(sha256) != 64:
        raise UsageError("bad-frame-field", f"cannot frame artifact {kind!r} {sha256!r} of {total} bytes")
    raw = kind.encode()
    return _header(FrameType.ARTIFACT_BEGIN, tid) + _ARTIFACT_BEGIN.pack(total, bytes.fromhex(sha256), len(raw)) + raw


def message_begin_frame(tid: int, json_bytes: int, attachments: Sequence[tuple[str, int]]) -> bytes:
    """The MESSAGE_BEGIN frame. Raises ``UsageError`` for values the format cannot carry."""
    if not 0 <= json_bytes <= _MAX_U32 or len(attachments) > 0xFFFF:
        raise UsageError("bad-frame-field", "message or attachment list too large to frame")
    refs = b"".join(_ATTACHMENT.pack(bytes.fromhex(sha), size) for sha, size in attachments)
    return _header(FrameType.MESSAGE_BEGIN, tid) + _MESSAGE_BEGIN.pack(json_bytes, len(attachments)) + refs


def data_frame(tid: int, offset: int, payload: bytes | bytearray | memoryview) -> bytes:
    """The DATA frame carrying ``payload`` at ``offset`` (one copy of the payload)."""
    length = len(payload)
    if not 0 < length <= _MAX_U32 or not 0 <= offset < 2**64:
        raise UsageError("bad-frame-field", f"cannot frame {length} bytes at offset {offset}")
    return _header(FrameType.DATA, tid) + _DATA.pack(offset, length) + payload


def abort_frame(tid: int, reason: str) -> bytes:
    """The ABORT frame; ``reason`` is cut to 64 printable ASCII characters."""
    raw = reason.encode("ascii", "replace")[:MAX_ABORT_REASON_BYTES]
    raw = bytes(b if 0x20 <= b <= 0x7E else 0x3F for b in raw)
    return _header(FrameType.ABORT, tid) + _ABORT.pack(len(raw)) + raw


def referenced_artifacts(message: Message) -> list[ArtifactRef]:
    """Every ``ArtifactRef`` a message names (fields, nested refs, and dicts of refs).

    Raw JSON dicts (model info, settings) hold no refs and are not walked.
    """
    out: list[ArtifactRef] = []

    def walk(value: Any) -> None:
        if isinstance(value, ArtifactRef):
            out.append(value)
        elif is_dataclass(value) and not isinstance(value, type):
            for f in fields(value):
                walk(getattr(value, f.name))
        elif isinstance(value, dict):
            for v in value.values():
                if isinstance(v, ArtifactRef) or (is_dataclass(v) and not isinstance(v, type)):
                    walk(v)

    walk(message)
    return out


# ---------------------------------------------------------------- events


@dataclass(frozen=True)
class MessageReceived:
    """A complete, valid message and the verified artifacts that travelled with it."""

    peer_id: str
    message: Message
    blobs: dict[str, bytes]
    transfer_id: int


@dataclass(frozen=True)
class ChannelBroken:
    """Framing corruption: the host must close this channel."""

    peer_id: str
    error: FrameError


Event = Union[TransferProgress, TransferDone, TransferFailed, MessageReceived, ChannelBroken]


# ---------------------------------------------------------------- writer


@dataclass
class _Outgoing:
    message: Message
    json: bytes
    parts: list[tuple[ArtifactRef, memoryview]]


class FrameWriter:
    """Frames queued sends for one peer, lazily and in order (one transfer at a time).

    The writer holds references to the artifact bytes and builds one frame
    per ``next_frame`` call, so memory stays at the artifacts themselves
    whatever their size. Progress events (``TransferProgress`` at most every
    ``progress_interval_ms``, ``TransferDone``) are collected for
    ``take_events``.
    """

    def __init__(self, peer_id: str, *, job_id: str | None = None, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                 progress_interval_ms: float = DEFAULT_PROGRESS_INTERVAL_MS) -> None:
        """Raises ``UsageError`` if ``max_frame_bytes`` is outside MIN_FRAME_BYTES..HARD_MAX_FRAME_BYTES."""
        if not MIN_FRAME_BYTES <= max_frame_bytes <= HARD_MAX_FRAME_BYTES:
            raise UsageError("bad-frame-size",
                             f"max_frame_bytes must be {MIN_FRAME_BYTES}..{HARD_MAX_FRAME_BYTES}, not {max_frame_bytes}")
        self.peer_id = peer_id
        self.job_id = job_id
        self.max_frame_bytes = max_frame_bytes
        self.progress_interval_ms = progress_interval_ms
        self._queue: deque[_Outgoing] = deque()
        self._frames: Iterator[bytes] | None = None
        self._next_id = 1
        self._events: list[Event] = []
        # The artifact now on the wire, and its progress figures.
        self._current: tuple[int, ArtifactRef] | None = None
        # The transfer (artifact or message) whose begin frame is out but not its last byte.
        self._open_tid: int | None = None
        self._sent = 0
        self._rate: RateMeter | None = None
        self._last_emit = 0.0
        self._now = 0.0

    # -- queueing

    def enqueue(self, message: Message, attachments: Iterable[tuple[ArtifactRef, bytes | bytearray | memoryview]] = (),
                *, peer_holds: Collection[str] = frozenset()) -> None:
        """Queue ``message`` with the bytes of the artifacts it references.

        Attachments whose SHA-256 is in ``peer_holds`` (the peer said it
        holds them) are not sent; a repeated hash is sent once. The bytes are
        not copied and must not change until they are framed.

        Raises:
            UsageError: an attachment's size differs from its ref, it is not
                referenced by the message, or the message JSON is too large.
        """
        named = {ref.sha256 for ref in referenced_artifacts(message)}
        parts: list[tuple[ArtifactRef, memoryview]] = []
        seen: set[str] = set()
        for ref, data in attachments:
            view = memoryview(data).cast("B")
            if len(view) != ref.bytes:
                raise UsageError("attachment-size", f"attachment {ref.sha256[:12]}: {len(view)} bytes, ref says {ref.bytes}")
            if ref.sha256 not in named:
                raise UsageError("unreferenced-attachment", f"attachment {ref.sha256[:12]} is not named by the message")
            if ref.sha256 in peer_holds or ref.sha256 in seen:
                continue
            seen.add(ref.sha256)
            parts.append((ref, view))
        if len(parts) > MAX_ATTACHMENTS:
            raise UsageError("too-many-attachments", f"{len(parts)} attachments, at most {MAX_ATTACHMENTS}")
        text = json.dumps(encode_message(message), separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
        if len(text) > DEFAULT_MAX_MESSAGE_BYTES:
            raise UsageError("message-too-large", f"message JSON of {len(text)} bytes, at most {DEFAULT_MAX_MESSAGE_BYTES}")
        self._queue.append(_Outgoing(message, text, parts))

    def enqueue_send(self, send: Send, resolve: Callable[[str], bytes | bytearray | memoryview], *,
                     peer_holds: Collection[str] = frozenset()) -> None:
        """Queue a state machine's ``Send``: bytes from ``send.blobs``, else ``resolve(sha256)``.

        Raises:
            UsageError: as ``enqueue``; whatever ``resolve`` raises for a missing artifact.
        """
        parts = [(ref, send.blobs[ref.sha256] if ref.sha256 in send.blobs else resolve(ref.sha256))
                 for ref in send.attachments if ref.sha256 not in peer_holds]
        self.enqueue(send.message, parts, peer_holds=peer_holds)

    @property
    def pending(self) -> bool:
        """True while frames remain to be produced."""
        return self._frames is not None or bool(self._queue)

    # -- framing

    def next_frame(self, now: float) -> bytes | None:
        """The next frame to hand to the channel, or None when nothing is queued."""
        self._now = now
        while True:
            if self._frames is None:
                if not self._queue:
                    return None
                self._frames = self._frames_of(self._queue.popleft())
            frame = next(self._frames, None)
            if frame is not None:
                return frame
            self._frames = None

    def frames(self, now: float) -> Iterator[bytes]:
        """Every remaining frame, lazily (no back-pressure: tests and in-memory hosts)."""
        while (frame := self.next_frame(now)) is not None:
            yield frame

    def _new_id(self) -> int:
        tid = self._next_id
        # Ids only grow: the reader refuses a begin frame that reuses one. 2**32
        # transfers on one channel would take years at WebRTC rates.
        if tid > _MAX_U32:
            raise UsageError("transfer-ids-exhausted", "this channel has used every transfer id")
        self._next_id += 1
        return tid

    def _frames_of(self, out: _Outgoing) -> Iterator[bytes]:
        room = self.max_frame_bytes - _DATA_AT
        sent_refs: list[tuple[str, int]] = []
        # Book-keeping happens before each yield: a frame counts as sent once
        # it is handed out, and the host may never resume this generator.
        for ref, view in out.parts:
            tid = self._new_id()
            frame = artifact_begin_frame(tid, ref.kind, ref.sha256, ref.bytes)
            self._start(tid, ref)
            yield frame
            for offset in range(0, ref.bytes, room):
                chunk = view[offset:offset + room]
                frame = data_frame(tid, offset, chunk)
                self._advance(len(chunk))
                yield frame
            sent_refs.append((ref.sha256, ref.bytes))
        tid = self._new_id()
        frame = message_begin_frame(tid, len(out.json), sent_refs)
        self._open_tid = tid
        yield frame
        for offset in range(0, len(out.json), room):
            end = min(offset + room, len(out.json))
            frame = data_frame(tid, offset, out.json[offset:end])
            if end == len(out.json):
                self._open_tid = None
            yield frame

    def _start(self, tid: int, ref: ArtifactRef) -> None:
        self._current = (tid, ref)
        self._open_tid = tid
        self._sent = 0
        self._rate = RateMeter(self._now)
        self._last_emit = self._now
        self._emitprogress_of()
        if ref.bytes == 0:
            self._finish()

    def _advance(self, n: int) -> None:
        assert self._rate is not None
        self._sent += n
        self._rate.add(self._now, self._sent)
        if self._sent == self._current_ref().bytes:
            self._finish()
        elif self._now - self._last_emit >= self.progress_interval_ms:
            self._last_emit = self._now
            self._emitprogress_of()

    def _current_ref(self) -> ArtifactRef:
        assert self._current is not None
        return self._current[1]

    def _finish(self) -> None:
        assert self._current is not None
        tid, ref = self._current
        self._open_tid = None
        self._emitprogress_of()
        self._events.append(TransferDone(self.peer_id, ref.sha256, "send", ref.bytes, tid))
        self._current = None

    def _emitprogress_of(self) -> None:
        assert self._current is not None and self._rate is not None
        _, ref = self._current
        p = progress_of(self.peer_id, self.job_id, ref.sha256, "send", self._sent, ref.bytes, self._rate, self._now)
        # Coalesce: a host that drains rarely sees the latest figure, and the list stays short.
        if self._events and isinstance(self._events[-1], TransferProgress) and self._events[-1].artifact_id == ref.sha256:
            self._events[-1] = p
        else:
            self._events.append(p)

    def progress(self, now: float) -> TransferProgress | None:
        """The artifact now being sent, as of ``now``; None between artifacts."""
        if self._current is None or self._rate is None:
            return None
        _, ref = self._current
        return progress_of(self.peer_id, self.job_id, ref.sha256, "send", self._sent, ref.bytes, self._rate, now)

    def take_events(self) -> list[Event]:
        """Progress, done and failure events since the last call."""
        events, self._events = self._events, []
        return events

    def cancel(self, reason: str = "cancelled") -> list[bytes]:
        """Drop every queued send; returns the ABORT frame for a half-sent transfer, if any.

        Records ``TransferFailed('aborted')`` for the artifact in flight.
        Use on a live channel; on a closed one just discard the writer.
        """
        frames: list[bytes] = []
        if self._open_tid is not None:
            frames.append(abort_frame(self._open_tid, reason))
        if self._current is not None:
            tid, ref = self._current
            self._events.append(TransferFailed(self.peer_id, ref.sha256, "send",
                                               FrameError("aborted", f"send aborted: {reason}"), tid))
        self._current = None
        self._open_tid = None
        self._frames = None
        self._queue.clear()
        return frames


class SendQueue:
    """Back-pressure for a writer: frames while the channel's bufferedAmount is below the high mark.

    Sans-I/O: the host passes the channel's ``bufferedAmount`` and sends what
    ``pump`` returns; it sets ``bufferedAmountLowThreshold = low_water`` and
    calls ``pump`` again on ``bufferedamountlow`` and after each enqueue.
    Once stopped at the high mark, it resumes only at or below the low mark
    (hysteresis: one wake-up moves ``high - low`` bytes, not one frame).
    """

    def __init__(self, writer: FrameWriter, *, high_water: int = 4 * 1024 * 1024, low_water: int = 1024 * 1024) -> None:
        """Raises ``UsageError`` unless 0 <= low_water < high_water <= 8 MiB (half the 16 MiB queue limit)."""
        if not 0 <= low_water < high_water <= 8 * 1024 * 1024:
            raise UsageError("bad-watermarks", f"need 0 <= low ({low_water}) < high ({high_water}) <= 8 MiB")
        self.writer = writer
        self.high_water = high_water
        self.low_water = low_water
        self.paused = False

    def pump(self, buffered_amount: int, now: float) -> Iterator[bytes]:
        """Yield frames to send now; stops at the high mark or when the writer is empty.

        Counts each yielded frame into the buffered amount itself, so the
        host need not re-read ``bufferedAmount`` between sends.
        """
        if self.paused and buffered_amount > self.low_water:
            return
        self.paused = False
        buffered = buffered_amount
        while buffered < self.high_water:
            frame = self.writer.next_frame(now)
            if frame is None:
                return
            buffered += len(frame)
            yield frame
        self.paused = self.writer.pending

    on_low = pump  # the bufferedamountlow handler does the same thing


# ---------------------------------------------------------------- reader


@dataclass(frozen=True)
class ReaderLimits:
    """What a reader accepts from a peer; every field bounds memory or work."""

    max_frame_bytes: int = HARD_MAX_FRAME_BYTES
    max_artifact_bytes: int = DEFAULT_MAX_ARTIFACT_BYTES
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    max_transfers: int = DEFAULT_MAX_TRANSFERS  # in flight + complete artifacts awaiting their message
    max_buffered_bytes: int = DEFAULT_MAX_BUFFERED_BYTES  # reserved at each begin frame

    def __post_init__(self) -> None:
        if not MIN_FRAME_BYTES <= self.max_frame_bytes <= HARD_MAX_FRAME_BYTES:
            raise UsageError("bad-limit", f"max_frame_bytes must be {MIN_FRAME_BYTES}..{HARD_MAX_FRAME_BYTES}")
        if min(self.max_artifact_bytes, self.max_message_bytes, self.max_transfers, self.max_buffered_bytes) < 1:
            raise UsageError("bad-limit", "reader limits must be positive")


@dataclass
class _Incoming:
    tid: int
    sha256: str | None  # None: a message transfer
    kind: str
    total: int
    parts: list[bytes | memoryview]
    attachments: tuple[tuple[str, int], ...]
    rate: RateMeter
    last_activity: float
    last_emit: float
    received: int = 0
    hasher: Any = None


@dataclass
class _Held:
    """A verified artifact waiting for the message that names it."""

    data: bytes
    count: int  # the same bytes may arrive twice before their messages
    at: float


_FINISHED_MEMORY = 256


class FrameReader:
    """Reassembles frames from one peer into messages and verified artifacts.

    ``has(sha256)`` tells whether this side already holds an artifact: a
    message may name artifacts that were not sent with it only if they are
    held (the sender omitted them on purpose). Without ``has``, nothing is held.
    """

    def __init__(self, peer_id: str, *, job_id: str | None = None, limits: ReaderLimits = ReaderLimits(),
                 has: Callable[[str], bool] | None = None,
                 progress_interval_ms: float = DEFAULT_PROGRESS_INTERVAL_MS) -> None:
        self.peer_id = peer_id
        self.job_id = job_id
        self.limits = limits
        self.has = has
        self.progress_interval_ms = progress_interval_ms
        self.broken: FrameError | None = None
        self._active: dict[int, _Incoming] = {}
        self._pool: dict[str, _Held] = {}
        self._reserved = 0
        self._last_tid = 0
        # Ids that ended recently: 'dropped' ones are ignored (the sender does
        # not know and keeps sending), anything else for an ended id is corrupt.
        self._finished: OrderedDict[int, bool] = OrderedDict()
        self.ignored_frames = 0

    @property
    def buffered_bytes(self) -> int:
        """Bytes reserved for transfers in flight and artifacts awaiting their message."""
        return self._reserved

    @property
    def open_transfers(self) -> int:
        """Transfers in flight plus complete artifacts awaiting their message."""
        return len(self._active) + len(self._pool)

    def feed(self, frame: bytes | bytearray | memoryview, now: float) -> list[Event]:
        """Take one frame as received from the channel; returns what it completed or broke.

        Never raises on peer input: refusals come back as ``TransferFailed``
        (that transfer dropped) or ``ChannelBroken`` (close the channel;
        later frames are ignored).
        """
        if self.broken is not None:
            return []
        out: list[Event] = []
        try:
            self._feed(parse_frame(frame, self.limits.max_frame_bytes), now, out, isinstance(frame, bytes))
        except FrameError as error:
            return out + self._break(error)
        return out

    def _feed(self, frame: Frame, now: float, out: list[Event], immutable: bool) -> None:
        tid = frame.transfer_id
        if isinstance(frame, (ArtifactBegin, MessageBegin)):
            if tid <= self._last_tid:
                raise _bad(f"transfer id {tid} is not above the last one ({self._last_tid})")
            self._last_tid = tid
            self._begin(frame, now, out)
            return
        t = self._active.get(tid)
        if t is None:
            if self._finished.get(tid) is False:  # dropped by us: the rest of it is noise
                self.ignored_frames += 1
                return
            if isinstance(frame, Abort) and tid <= self._last_tid:
                return  # the sender gave up something that already ended: harmless
            raise _bad(f"frame for transfer {tid}, which is not in progress")
        t.last_activity = now
        if isinstance(frame, Abort):
            self._drop(t, "aborted", f"the sender aborted the transfer: {frame.reason}", out)
            return
        self._data(t, frame, now, out, immutable)

    def _begin(self, frame: ArtifactBegin | MessageBegin, now: float, out: list[Event]) -> None:
        lim = self.limits
        if isinstance(frame, ArtifactBegin):
            sha: str | None = frame.sha256
            total, kind, refs, limit = frame.total, frame.kind, (), lim.max_artifact_bytes
        else:
            sha, total, kind, refs, limit = None, frame.json_bytes, "message", frame.attachments, lim.max_message_bytes
        t = _Incoming(frame.transfer_id, sha, kind, total, [], refs, RateMeter(now), now, now)
        # Every refusal here happens before a byte is buffered.
        if total > limit:
            return self._drop(t, "too-large", f"{kind} of {total} bytes announced, at most {limit}", out, begun=False)
        if self.open_transfers >= lim.max_transfers:
            return self._drop(t, "too-many-transfers", f"more than {lim.max_transfers} transfers open", out, begun=False)
        if self._reserved + total > lim.max_buffered_bytes:
            return self._drop(t, "buffer-full", f"{total} more bytes would exceed {lim.max_buffered_bytes} buffered",
                              out, begun=False)
        if sha is None:
            if total == 0:
                return self._drop(t, "bad-message", "empty message", out, begun=False)
            if len(refs) > MAX_ATTACHMENTS or len({s for s, _ in refs}) != len(refs):
                return self._drop(t, "bad-message", "attachment list too long or repeated", out, begun=False)
        else:
            t.hasher = hashlib.sha256()
        self._reserved += total
        self._active[t.tid] = t
        if sha is not None:
            out.append(progress_of(self.peer_id, self.job_id, sha, "receive", 0, total, t.rate, now))
        if total == 0:
            self._complete(t, now, out)

    def _data(self, t: _Incoming, frame: Data, now: float, out: list[Event], immutable: bool) -> None:
        n = len(frame.payload)
        if frame.offset < t.received:
            return self._drop(t, "duplicate-fragment", f"bytes at {frame.offset} already received (have {t.received})", out)
        if frame.offset > t.received:
            return self._drop(t, "out-of-order", f"fragment at {frame.offset}, expected {t.received}", out)
        if t.received + n > t.total:
            return self._drop(t, "size-exceeded", f"{t.received + n} bytes, {t.total} announced", out)
        end = t.received + n
        # A view into an immutable frame costs nothing and the one copy happens
        # in the join at completion; a mutable buffer the host may reuse is copied.
        t.parts.append(frame.payload if immutable else bytes(frame.payload))
        if t.hasher is not None:
            t.hasher.update(frame.payload)
        t.received = end
        if t.sha256 is not None:
            t.rate.add(now, end)
            if end < t.total and now - t.last_emit >= self.progress_interval_ms:
                t.last_emit = now
                out.append(progress_of(self.peer_id, self.job_id, t.sha256, "receive", end, t.total, t.rate, now))
        if end == t.total:
            self._complete(t, now, out)

    def _complete(self, t: _Incoming, now: float, out: list[Event]) -> None:
        if t.sha256 is None:
            del self._active[t.tid]
            self._remember(t.tid, True)
            self._reserved -= t.total
            return self._message(t, now, out)
        digest = (t.hasher or hashlib.sha256()).hexdigest()
        if digest != t.sha256:
            return self._drop(t, "hash-mismatch", f"content hashes to {digest[:16]}..., not {t.sha256[:16]}...", out)
        del self._active[t.tid]
        self._remember(t.tid, True)
        out.append(progress_of(self.peer_id, self.job_id, t.sha256, "receive", t.total, t.total, t.rate, now))
        out.append(TransferDone(self.peer_id, t.sha256, "receive", t.total, t.tid))
        held = self._pool.get(t.sha256)
        if held is not None:  # the same bytes again: keep one copy, count both
            held.count += 1
            held.at = now
            self._reserved -= t.total
        else:
            self._pool[t.sha256] = _Held(b"".join(t.parts), 1, now)
        t.parts = []

    def _message(self, t: _Incoming, now: float, out: list[Event]) -> None:
        listed = dict(t.attachments)
        blobs: dict[str, bytes] = {}
        # Claim what the message lists first, so a refused message frees it too.
        for sha, size in t.attachments:
            held = self._pool.get(sha)
            if held is not None and len(held.data) == size:
                blobs[sha] = held.data
                self._release(sha)
        error: tuple[str, str, str | None] | None = None
        for sha, size in t.attachments:
            if sha not in blobs:
                error = ("missing-attachment", f"attachment {sha[:16]}... of {size} bytes has not arrived", sha)
                break
        message: Message | None = None
        if error is None:
            try:
                message = decode_message(json.loads(b"".join(t.parts).decode("utf-8")))
            except (WeeiError, ValueError, RecursionError) as exc:
                # ValueError covers bad UTF-8, bad JSON and over-long integers;
                # RecursionError deeply nested arrays: all the peer's fault.
                error = ("bad-message", f"invalid message: {str(exc)[:200]}", None)
        if message is not None:
            named: set[str] = set()
            for ref in referenced_artifacts(message):
                named.add(ref.sha256)
                if ref.sha256 in listed:
                    if listed[ref.sha256] != ref.bytes:
                        error = ("missing-attachment", f"{ref.kind} {ref.sha256[:16]}... arrived with "
                                 f"{listed[ref.sha256]} bytes, the message says {ref.bytes}", ref.sha256)
                        break
                elif self.has is None or not self.has(ref.sha256):
                    error = ("missing-attachment", f"{ref.kind} {ref.sha256[:16]}... was neither sent nor held",
                             ref.sha256)
                    break
            if error is None and not set(listed) <= named:
                error = ("bad-message", "an attachment was sent that the message does not name", None)
        if error is not None:
            reason, detail, blame = error
            out.append(TransferFailed(self.peer_id, blame, "receive", FrameError(reason, detail), t.tid))
            return
        assert message is not None
        out.append(MessageReceived(self.peer_id, message, blobs, t.tid))

    def _release(self, sha: str) -> None:
        held = self._pool[sha]
        held.count -= 1
        if held.count == 0:
            del self._pool[sha]
            self._reserved -= len(held.data)

    def _remember(self, tid: int, completed: bool) -> None:
        self._finished[tid] = completed
        if len(self._finished) > _FINISHED_MEMORY:
            self._finished.popitem(last=False)

    def _failed(self, t: _Incoming, reason: str, detail: str) -> TransferFailed:
        return TransferFailed(self.peer_id, t.sha256, "receive", FrameError(reason, detail), t.tid)

    def _drop(self, t: _Incoming, reason: str, detail: str, out: list[Event], *, begun: bool = True) -> None:
        if begun:
            del self._active[t.tid]
            self._reserved -= t.total
        # A refused message frees the artifacts it listed: nothing else will claim them.
        for sha in dict(t.attachments):
            if sha in self._pool:
                self._release(sha)
        t.parts = []
        self._remember(t.tid, False)
        out.append(self._failed(t, reason, detail))

    def _break(self, error: FrameError) -> list[Event]:
        self.broken = error
        events: list[Event] = [ChannelBroken(self.peer_id, error)]
        events += self.close("channel-broken")
        return events

    def expire(self, now: float, timeout_ms: float) -> list[Event]:
        """Drop transfers with no frame for ``timeout_ms`` and artifacts no message claimed in that time.

        Returns a ``TransferFailed('stalled')`` for each.
        """
        out: list[Event] = []
        for t in [t for t in self._active.values() if now - t.last_activity > timeout_ms]:
            self._drop(t, "stalled", f"no data for {now - t.last_activity:.0f} ms", out)
        for sha in [s for s, h in self._pool.items() if now - h.at > timeout_ms]:
            held = self._pool.pop(sha)
            self._reserved -= len(held.data)
            out.append(TransferFailed(self.peer_id, sha, "receive",
                                      FrameError("stalled", "no message claimed the artifact in time"), 0))
        return out

    def close(self, reason: str = "channel-closed") -> list[Event]:
        """The channel is gone: fail every open transfer and free all buffers."""
        out: list[Event] = []
        for t in list(self._active.values()):
            if t.sha256 is not None:
                self._drop(t, reason, "the channel closed mid-transfer", out)
            else:
                self._drop(t, reason, "the channel closed mid-message", [])
        self._pool.clear()
        self._reserved = 0
        return out
