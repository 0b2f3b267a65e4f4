"""The sending side of a channel: ``FrameWriter`` cuts queued sends into frames,
``SendQueue`` drains it under the channel's bufferedAmount watermarks.

The writer holds references to the artifact bytes and builds one frame per
call, so memory stays at the artifacts themselves whatever their size.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass

from ..commands import Send
from ...errors import UsageError, UsageReason
from ..messages import ArtifactRef, Message, encode_message
from ...observe.transfers import RateMeter, TransferDone, TransferFailed, TransferProgress, progress_of
from .frames import (DATA_PAYLOAD_AT, DEFAULT_MAX_FRAME_BYTES, HARD_MAX_FRAME_BYTES, MAX_ATTACHMENTS,
                     MAX_TRANSFER_ID, MIN_FRAME_BYTES, Event, FrameError, FrameReason, abort_frame,
                     artifact_begin_frame, data_frame, message_begin_frame, referenced_artifacts)

__all__ = ["DEFAULT_MAX_MESSAGE_BYTES", "DEFAULT_PROGRESS_INTERVAL_MS", "FrameWriter", "SendQueue"]

DEFAULT_MAX_MESSAGE_BYTES = 1024 * 1024  # like the checkpoint metadata limit
DEFAULT_PROGRESS_INTERVAL_MS = 250.0


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
            raise UsageError(UsageReason.BAD_FRAME_SIZE,
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
        self._job: str | None = job_id

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
                raise UsageError(UsageReason.ATTACHMENT_SIZE, f"attachment {ref.sha256[:12]}: {len(view)} bytes, ref says {ref.bytes}")
            if ref.sha256 not in named:
                raise UsageError(UsageReason.UNREFERENCED_ATTACHMENT, f"attachment {ref.sha256[:12]} is not named by the message")
            if ref.sha256 in peer_holds or ref.sha256 in seen:
                continue
            seen.add(ref.sha256)
            parts.append((ref, view))
        if len(parts) > MAX_ATTACHMENTS:
            raise UsageError(UsageReason.TOO_MANY_ATTACHMENTS, f"{len(parts)} attachments, at most {MAX_ATTACHMENTS}")
        text = json.dumps(encode_message(message), separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
        if len(text) > DEFAULT_MAX_MESSAGE_BYTES:
            raise UsageError(UsageReason.MESSAGE_TOO_LARGE, f"message JSON of {len(text)} bytes, at most {DEFAULT_MAX_MESSAGE_BYTES}")
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
        if tid > MAX_TRANSFER_ID:
            raise UsageError(UsageReason.TRANSFER_IDS_EXHAUSTED, "this channel has used every transfer id")
        self._next_id += 1
        return tid

    def _frames_of(self, out: _Outgoing) -> Iterator[bytes]:
        # One channel carries every job's messages: a transfer belongs to the job its message names.
        self._job = getattr(out.message, "job_id", None) or self.job_id
        room = self.max_frame_bytes - DATA_PAYLOAD_AT
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
        p = progress_of(self.peer_id, self._job, ref.sha256, "send", self._sent, ref.bytes, self._rate, self._now)
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
        return progress_of(self.peer_id, self._job, ref.sha256, "send", self._sent, ref.bytes, self._rate, now)

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
                                               FrameError(FrameReason.ABORTED, f"send aborted: {reason}"), tid))
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
            raise UsageError(UsageReason.BAD_WATERMARKS, f"need 0 <= low ({low_water}) < high ({high_water}) <= 8 MiB")
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
