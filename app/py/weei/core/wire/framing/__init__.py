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

The package is three modules: ``frames`` (the format, one frame encoded or
parsed), ``writer`` (``FrameWriter``, ``SendQueue``) and ``reader``
(``FrameReader``). Nothing here reads a clock: ``now`` is milliseconds,
passed in.
"""

from __future__ import annotations

from ...observe.transfers import TransferBook, TransferDone, TransferFailed, TransferProgress
from .frames import (DEFAULT_MAX_FRAME_BYTES, FATAL_REASONS, HARD_MAX_FRAME_BYTES, HEADER_BYTES, MAGIC,
                     MAX_ATTACHMENTS, MIN_FRAME_BYTES, REASONS, VERSION, Abort, ArtifactBegin, ChannelBroken, Data,
                     Event, Frame, FrameError, FrameReason, FrameType, MessageBegin, MessageReceived, abort_frame,
                     artifact_begin_frame, data_frame, framed_bytes, message_begin_frame, parse_frame,
                     referenced_artifacts)
from .reader import FrameReader, ReaderLimits
from .writer import FrameWriter, SendQueue

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
