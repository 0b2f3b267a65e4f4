"""The receiving side of a channel: ``FrameReader`` reassembles a peer's frames
into messages and verified artifacts.

Frames are untrusted. A problem confined to one transfer drops that transfer
(``TransferFailed``; the channel goes on and later frames of it are ignored);
corruption of the framing itself (``ChannelBroken``) means the two ends no
longer agree on the stream and the host must close the channel. ``feed``
never raises on peer input. Memory is bounded by reserving each transfer's
announced size against ``max_buffered_bytes`` at its begin frame.

Sizes follow ``weei.core.limits``: an auxiliary weights file may be 2 GiB,
every other artifact 256 MB, and the default buffer holds one of each. An
artifact is kept as the received frames (views of immutable frames cost
nothing) and joined once when it completes: the join is its one copy, and
the frames go right after it, so a 2 GiB file briefly needs twice its size.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from ..._check import parse_json
from ...errors import UsageError, WeeiError, UsageReason
from ...limits import MAX_AUXILIARY_BYTES, MAX_FILE_BYTES, max_bytes
from ..messages import Message, decode_message
from ...observe.transfers import RateMeter, TransferDone, TransferFailed, progress_of
from ...verified import VerifiedBlobs
from .frames import (HARD_MAX_FRAME_BYTES, MAX_ATTACHMENTS, MIN_FRAME_BYTES, Abort, ArtifactBegin, ChannelBroken,
                     Data, Event, Frame, FrameError, FrameReason, MessageBegin, MessageReceived, parse_frame,
                     referenced_artifacts)
from .writer import DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_PROGRESS_INTERVAL_MS

__all__ = ["DEFAULT_MAX_ARTIFACT_BYTES", "DEFAULT_MAX_AUXILIARY_BYTES", "DEFAULT_MAX_TRANSFERS", "DEFAULT_MAX_BUFFERED_BYTES", "ReaderLimits",
           "FrameReader"]

DEFAULT_MAX_ARTIFACT_BYTES = MAX_FILE_BYTES  # the spec's 256 MB limit for checkpoints and modules
DEFAULT_MAX_AUXILIARY_BYTES = MAX_AUXILIARY_BYTES  # an auxiliary weights file: up to 2 GiB
DEFAULT_MAX_TRANSFERS = 16
DEFAULT_MAX_BUFFERED_BYTES = MAX_AUXILIARY_BYTES + 2 * MAX_FILE_BYTES  # the largest file and two others at once


@dataclass(frozen=True)
class ReaderLimits:
    """What a reader accepts from a peer; every field bounds memory or work."""

    max_frame_bytes: int = HARD_MAX_FRAME_BYTES
    max_artifact_bytes: int = DEFAULT_MAX_ARTIFACT_BYTES  # every kind but auxiliary
    max_auxiliary_bytes: int = DEFAULT_MAX_AUXILIARY_BYTES
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    max_transfers: int = DEFAULT_MAX_TRANSFERS  # in flight + complete artifacts awaiting their message
    max_buffered_bytes: int = DEFAULT_MAX_BUFFERED_BYTES  # reserved at each begin frame

    def __post_init__(self) -> None:
        if not MIN_FRAME_BYTES <= self.max_frame_bytes <= HARD_MAX_FRAME_BYTES:
            raise UsageError(UsageReason.BAD_LIMIT, f"max_frame_bytes must be {MIN_FRAME_BYTES}..{HARD_MAX_FRAME_BYTES}")
        if min(self.max_artifact_bytes, self.max_auxiliary_bytes, self.max_message_bytes, self.max_transfers,
               self.max_buffered_bytes) < 1:
            raise UsageError(UsageReason.BAD_LIMIT, "reader limits must be positive")


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

    ``has(sha256, size)`` tells whether this side already holds an artifact
    of that size: a message may name artifacts that were not sent with it
    only if they are held (the sender omitted them on purpose), at the size
    the message gives. Without ``has``, nothing is held.
    """

    def __init__(self, peer_id: str, *, job_id: str | None = None, limits: ReaderLimits = ReaderLimits(),
                 has: Callable[[str, int], bool] | None = None,
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
                raise FrameError(FrameReason.BAD_FRAME, f"transfer id {tid} is not above the last one ({self._last_tid})")
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
            raise FrameError(FrameReason.BAD_FRAME, f"frame for transfer {tid}, which is not in progress")
        t.last_activity = now
        if isinstance(frame, Abort):
            self._drop(t, FrameReason.ABORTED, f"the sender aborted the transfer: {frame.reason}", out)
            return
        self._data(t, frame, now, out, immutable)

    def _begin(self, frame: ArtifactBegin | MessageBegin, now: float, out: list[Event]) -> None:
        lim = self.limits
        if isinstance(frame, ArtifactBegin):
            sha: str | None = frame.sha256
            refs: tuple[tuple[str, int], ...] = ()
            total, kind = frame.total, frame.kind
            limit = lim.max_auxiliary_bytes if kind == "auxiliary" else lim.max_artifact_bytes
            limit = min(limit, max_bytes(kind)) if kind in ("wgsl", "qdelta") else limit
        else:
            sha, total, kind, refs, limit = None, frame.json_bytes, "message", frame.attachments, lim.max_message_bytes
        t = _Incoming(frame.transfer_id, sha, kind, total, [], refs, RateMeter(now), now, now)
        # Every refusal here happens before a byte is buffered.
        if total > limit:
            return self._drop(t, FrameReason.TOO_LARGE, f"{kind} of {total} bytes announced, at most {limit}", out, begun=False)
        if self.open_transfers >= lim.max_transfers:
            return self._drop(t, FrameReason.TOO_MANY_TRANSFERS, f"more than {lim.max_transfers} transfers open", out, begun=False)
        if self._reserved + total > lim.max_buffered_bytes:
            return self._drop(t, FrameReason.BUFFER_FULL, f"{total} more bytes would exceed {lim.max_buffered_bytes} buffered",
                              out, begun=False)
        if sha is None:
            if total == 0:
                return self._drop(t, FrameReason.BAD_MESSAGE, "empty message", out, begun=False)
            if len(refs) > MAX_ATTACHMENTS or len({s for s, _ in refs}) != len(refs):
                return self._drop(t, FrameReason.BAD_MESSAGE, "attachment list too long or repeated", out, begun=False)
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
            return self._drop(t, FrameReason.DUPLICATE_FRAGMENT, f"bytes at {frame.offset} already received (have {t.received})", out)
        if frame.offset > t.received:
            return self._drop(t, FrameReason.OUT_OF_ORDER, f"fragment at {frame.offset}, expected {t.received}", out)
        if t.received + n > t.total:
            return self._drop(t, FrameReason.SIZE_EXCEEDED, f"{t.received + n} bytes, {t.total} announced", out)
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
            return self._drop(t, FrameReason.HASH_MISMATCH, f"content hashes to {digest[:16]}..., not {t.sha256[:16]}...", out)
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
        error: tuple[FrameReason, str, str | None] | None = None
        for sha, size in t.attachments:
            if sha not in blobs:
                error = (FrameReason.MISSING_ATTACHMENT, f"attachment {sha[:16]}... of {size} bytes has not arrived", sha)
                break
        message: Message | None = None
        if error is None:
            try:
                message = decode_message(parse_json(b"".join(t.parts), _bad_json))
            except WeeiError as exc:
                # Bad UTF-8 or JSON, nesting past the depth limit, or a message
                # that does not check: all the peer's fault, and all named.
                error = (FrameReason.BAD_MESSAGE, f"invalid message: {str(exc)[:200]}", None)
        if message is not None:
            named: set[str] = set()
            for ref in referenced_artifacts(message):
                named.add(ref.sha256)
                if ref.sha256 in listed:
                    if listed[ref.sha256] != ref.bytes:
                        error = (FrameReason.MISSING_ATTACHMENT, f"{ref.kind} {ref.sha256[:16]}... arrived with "
                                 f"{listed[ref.sha256]} bytes, the message says {ref.bytes}", ref.sha256)
                        break
                elif self.has is None or not self.has(ref.sha256, ref.bytes):
                    error = (FrameReason.MISSING_ATTACHMENT, f"{ref.kind} {ref.sha256[:16]}... of {ref.bytes} bytes "
                             "was neither sent nor held", ref.sha256)
                    break
            if error is None and not set(listed) <= named:
                error = (FrameReason.BAD_MESSAGE, "an attachment was sent that the message does not name", None)
        if error is not None:
            reason, detail, blame = error
            out.append(TransferFailed(self.peer_id, blame, "receive", FrameError(reason, detail), t.tid))
            return
        assert message is not None
        # Each artifact was hashed as its fragments arrived (_data, _complete): say so, so nobody hashes it again.
        out.append(MessageReceived(self.peer_id, message, VerifiedBlobs(blobs), t.tid))

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

    def _failed(self, t: _Incoming, reason: FrameReason, detail: str) -> TransferFailed:
        return TransferFailed(self.peer_id, t.sha256, "receive", FrameError(reason, detail), t.tid)

    def _drop(self, t: _Incoming, reason: FrameReason, detail: str, out: list[Event], *, begun: bool = True) -> None:
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
        events += self.close(FrameReason.CHANNEL_BROKEN)
        return events

    def expire(self, now: float, timeout_ms: float) -> list[Event]:
        """Drop transfers with no frame for ``timeout_ms`` and artifacts no message claimed in that time.

        Returns a ``TransferFailed('stalled')`` for each.
        """
        out: list[Event] = []
        for t in [t for t in self._active.values() if now - t.last_activity > timeout_ms]:
            self._drop(t, FrameReason.STALLED, f"no data for {now - t.last_activity:.0f} ms", out)
        for sha in [s for s, h in self._pool.items() if now - h.at > timeout_ms]:
            held = self._pool.pop(sha)
            self._reserved -= len(held.data)
            out.append(TransferFailed(self.peer_id, sha, "receive",
                                      FrameError(FrameReason.STALLED, "no message claimed the artifact in time"), 0))
        return out

    def close(self, reason: FrameReason = FrameReason.CHANNEL_CLOSED) -> list[Event]:
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


def _bad_json(message: str) -> NoReturn:
    raise FrameError(FrameReason.BAD_MESSAGE, f"message JSON {message}")
