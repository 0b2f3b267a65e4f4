"""Binary framing: round trips, frame-by-frame feeding, golden bytes, every refusal, fuzzing, back-pressure, progress."""

from __future__ import annotations

import hashlib
import json
import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weei.core.wire.commands import Send
from weei.core.errors import UsageError
from weei.core.wire.framing import (
    FATAL_REASONS, HARD_MAX_FRAME_BYTES, HEADER_BYTES, REASONS, Abort, ArtifactBegin, ChannelBroken, Data,
    FrameError, FrameReader, FrameType, FrameWriter, MessageBegin, MessageReceived, ReaderLimits, SendQueue,
    TransferBook, TransferDone, TransferFailed, TransferProgress, abort_frame, artifact_begin_frame, data_frame,
    framed_bytes, message_begin_frame, parse_frame, referenced_artifacts,
)
from weei.core.wire.framing import FrameReason
from weei.core.wire.messages import (
    ArtifactRef, Assign, ChunkRef, Leave, Message, Update, encode_message,
)

KIB = 1024
H0 = "0" * 64  # a hash nobody's bytes have


def blob(n: int, seed: int = 0) -> bytes:
    """Deterministic bytes (fast for MBs: a repeated hash stream)."""
    unit = hashlib.sha256(f"{seed}".encode()).digest() * 2048  # 64 KiB
    return (unit * (n // len(unit) + 1))[:n]


def ref(kind: str, data: bytes) -> ArtifactRef:
    return ArtifactRef(kind, hashlib.sha256(data).hexdigest(), len(data))


def update_of(data: bytes) -> Update:
    return Update("job-1", 1, "r1-c0", "r1-c0-a1", "a" * 64, ref("update", data), {"loss": 0.5}, 12)


def assign_of(checkpoint: bytes, chunk: bytes, aux: bytes) -> Assign:
    return Assign("job-1", 1, "r1-c0", "r1-c0-a1", ref("checkpoint", checkpoint), {"localEpochs": 1, "batchSize": 4},
                  7, ChunkRef("c0", "syn", 12, ref("chunk", chunk)), None, {"reward": ref("auxiliary", aux)})


def frames_of(message: Message, blobs: list[bytes], *, max_frame: int = 64 * KIB, holds: frozenset[str] = frozenset(),
              now: float = 0.0) -> list[bytes]:
    w = FrameWriter("coord", max_frame_bytes=max_frame)
    refs = {r.sha256: r for r in referenced_artifacts(message)}
    w.enqueue(message, [(refs[hashlib.sha256(b).hexdigest()], b) for b in blobs], peer_holds=holds)
    return list(w.frames(now))


def feed_all(reader: FrameReader, frames: list[bytes], now: float = 0.0) -> list[Any]:
    out: list[Any] = []
    for f in frames:
        out += reader.feed(f, now)
    return out


def received(events: list[Any]) -> list[MessageReceived]:
    return [e for e in events if isinstance(e, MessageReceived)]


def failures(events: list[Any]) -> list[str]:
    return [e.reason for e in events if isinstance(e, TransferFailed)]


# ---------------------------------------------------------------- round trips

SIZES = [0, 1, 64 * KIB - 1, 64 * KIB, 64 * KIB + 1, 5 * 1000 * 1000]


def test_message_without_attachments() -> None:
    frames = frames_of(Leave("job-1"), [])
    assert len(frames) == 2  # MESSAGE_BEGIN, one DATA
    events = feed_all(FrameReader("coord"), frames)
    assert [type(e) for e in events] == [MessageReceived]
    assert events[0].message == Leave("job-1") and events[0].blobs == {}


@pytest.mark.parametrize("size", SIZES)
def test_one_attachment_round_trip(size: int) -> None:
    data = blob(size)
    message = update_of(data)
    frames = frames_of(message, [data])
    assert all(len(f) <= 64 * KIB for f in frames)
    reader = FrameReader("participant")
    events = feed_all(reader, frames)
    (got,) = received(events)
    assert got.message == message and got.blobs == {message.weights.sha256: data}
    assert any(isinstance(e, TransferDone) and e.bytes == size for e in events)
    assert reader.buffered_bytes == 0 and reader.open_transfers == 0


@pytest.mark.parametrize("sizes", [(0, 1, 64 * KIB + 1), (64 * KIB - 1, 5_000_000, 64 * KIB), (1, 0, 0)])
@pytest.mark.parametrize("max_frame", [4096, 64 * KIB, HARD_MAX_FRAME_BYTES])
def test_several_attachments_round_trip(sizes: tuple[int, int, int], max_frame: int) -> None:
    cp, chunk, aux = (blob(n, seed) for seed, n in enumerate(sizes))
    message = assign_of(cp, chunk, aux)
    frames = frames_of(message, [cp, chunk, aux], max_frame=max_frame)
    assert max(len(f) for f in frames) <= max_frame
    events = feed_all(FrameReader("participant"), frames)
    (got,) = received(events)
    assert got.message == message
    assert got.blobs == {hashlib.sha256(b).hexdigest(): b for b in (cp, chunk, aux)}
    json_bytes = len(json.dumps(encode_message(message), separators=(",", ":")).encode())
    # What an in-memory host counts as sent is what the writer puts on the channel, every header included.
    sent = {r.sha256: (r.kind, r.bytes) for r in referenced_artifacts(message)}  # equal blobs travel once, as frames_of names them
    assert framed_bytes(json_bytes, list(sent.values()), max_frame) == sum(len(f) for f in frames)


def test_several_sends_in_order_and_one_frame_at_a_time() -> None:
    a, b = blob(200_000, 1), blob(70_000, 2)
    w = FrameWriter("p")
    w.enqueue(update_of(a), [(update_of(a).weights, a)])
    w.enqueue(Leave("job-1"))
    w.enqueue(update_of(b), [(update_of(b).weights, b)])
    reader = FrameReader("c")
    got: list[Message] = []
    while (frame := w.next_frame(0.0)) is not None:
        # Each event appears exactly when its last frame arrives.
        got += [e.message for e in reader.feed(frame, 0.0) if isinstance(e, MessageReceived)]
    assert got == [update_of(a), Leave("job-1"), update_of(b)]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=40), max_size=12), st.integers(min_value=0, max_value=3))
def test_any_batching_of_frames_gives_the_same_events(cuts: list[int], seed: int) -> None:
    # The transport keeps frame boundaries, so "splits" are batches of whole frames.
    data = blob(300_000, seed)
    w = FrameWriter("p")
    w.enqueue(update_of(data), [(update_of(data).weights, data)])
    w.enqueue(Leave("job-1"))
    frames = list(w.frames(0.0))
    reference = feed_all(FrameReader("c"), frames)
    reader, events, at = FrameReader("c"), [], 0
    for cut in sorted(set(cuts)) + [len(frames)]:
        for f in frames[at:cut]:
            events += reader.feed(f, 0.0)
        at = max(at, cut)
    assert events == reference


def test_interleaved_transfers_from_one_peer() -> None:
    a, b = blob(5000, 1), blob(3000, 2)
    ra, rb = ref("checkpoint", a), ref("chunk", b)
    message = assign_of(a, b, b"")
    aux = ref("auxiliary", b"")
    frames = [artifact_begin_frame(1, "checkpoint", ra.sha256, len(a)), artifact_begin_frame(2, "chunk", rb.sha256, len(b)),
              data_frame(1, 0, a[:2000]), data_frame(2, 0, b[:1000]), data_frame(1, 2000, a[2000:]),
              artifact_begin_frame(3, "auxiliary", aux.sha256, 0), data_frame(2, 1000, b[1000:])]
    body = json.dumps(encode_message(message)).encode()
    frames += [message_begin_frame(4, len(body), [(rb.sha256, len(b)), (ra.sha256, len(a)), (aux.sha256, 0)]),
               data_frame(4, 0, body)]
    (got,) = received(feed_all(FrameReader("p"), frames))
    assert got.message == message and set(got.blobs) == {ra.sha256, rb.sha256, aux.sha256}


def test_enqueue_send_resolves_from_blobs_then_the_store() -> None:
    cp, chunk, aux = blob(10, 1), blob(20, 2), blob(30, 3)
    message = assign_of(cp, chunk, aux)
    store = {hashlib.sha256(b).hexdigest(): b for b in (cp, chunk)}
    send = Send("p", message, tuple(referenced_artifacts(message)), {ref("auxiliary", aux).sha256: aux})
    w = FrameWriter("p")
    w.enqueue_send(send, store.__getitem__)
    (got,) = received(feed_all(FrameReader("c"), list(w.frames(0.0))))
    assert len(got.blobs) == 3


# ---------------------------------------------------------------- golden bytes


GOLDEN_BEGIN = bytes.fromhex(
    "5701010001000000"  # magic W, version 1, ARTIFACT_BEGIN, flags 0, transfer 1
    "0300000000000000"  # total 3
    "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"  # sha256("abc")
    "06" "7570646174 65".replace(" ", "")  # kind "update"
)
GOLDEN_DATA = bytes.fromhex("5701030001000000" "0000000000000000" "03000000" "616263")


def test_golden_frames() -> None:
    assert artifact_begin_frame(1, "update", hashlib.sha256(b"abc").hexdigest(), 3) == GOLDEN_BEGIN
    assert data_frame(1, 0, b"abc") == GOLDEN_DATA
    assert parse_frame(GOLDEN_BEGIN) == ArtifactBegin(1, "update", hashlib.sha256(b"abc").hexdigest(), 3)
    d = parse_frame(GOLDEN_DATA)
    assert isinstance(d, Data) and (d.transfer_id, d.offset, bytes(d.payload)) == (1, 0, b"abc")
    m = message_begin_frame(2, 10, [(H0, 3)])
    assert m[:HEADER_BYTES] == bytes.fromhex("5701020002000000") and len(m) == HEADER_BYTES + 6 + 40
    assert parse_frame(m) == MessageBegin(2, 10, ((H0, 3),))
    assert parse_frame(abort_frame(9, "gone\n")) == Abort(9, "gone?")


def test_writer_frames_are_the_documented_layout() -> None:
    message = update_of(b"abc")
    frames = frames_of(message, [b"abc"])
    assert frames[0] == GOLDEN_BEGIN and frames[1] == GOLDEN_DATA
    begin = parse_frame(frames[2])
    assert isinstance(begin, MessageBegin) and begin.transfer_id == 2
    assert begin.attachments == ((message.weights.sha256, 3),)
    assert json.loads(b"".join(bytes(parse_frame(f).payload) for f in frames[3:])) == encode_message(message)  # type: ignore[union-attr]


# ---------------------------------------------------------------- refusals

FATAL_CASES = {
    "short header": b"W\x01\x03",
    "bad magic": b"X" + GOLDEN_DATA[1:],
    "unknown version": GOLDEN_DATA[:1] + b"\x02" + GOLDEN_DATA[2:],
    "unknown type": GOLDEN_DATA[:2] + b"\x09" + GOLDEN_DATA[3:],
    "flags set": GOLDEN_DATA[:3] + b"\x01" + GOLDEN_DATA[4:],
    "transfer id 0": GOLDEN_DATA[:4] + b"\0\0\0\0" + GOLDEN_DATA[8:],
    "DATA length mismatch": GOLDEN_DATA + b"x",
    "DATA truncated": GOLDEN_DATA[:18],
    "zero-length DATA": GOLDEN_DATA[:16] + b"\0\0\0\0",
    "BEGIN truncated": GOLDEN_BEGIN[:-1],
    "unknown kind": GOLDEN_BEGIN[:-7] + b"\x06" + b"weight",
    "MESSAGE_BEGIN count mismatch": message_begin_frame(1, 10, [(H0, 3)])[:-1],
    "ABORT reason length": abort_frame(1, "x")[:-1],
    "ABORT non-ascii": abort_frame(1, "x")[:-1] + b"\xff",
}


@pytest.mark.parametrize("name", list(FATAL_CASES))
def test_malformed_frames_break_the_channel(name: str) -> None:
    with pytest.raises(FrameError) as info:
        parse_frame(FATAL_CASES[name])
    assert info.value.reason == "bad-frame" and info.value.fatal
    reader = FrameReader("p")
    events = reader.feed(FATAL_CASES[name], 0.0)
    assert isinstance(events[0], ChannelBroken) and events[0].error.reason == "bad-frame"
    assert reader.broken is not None
    assert reader.feed(GOLDEN_BEGIN, 0.0) == []  # a broken channel reads nothing more


def test_oversized_frame() -> None:
    frame = data_frame(1, 0, b"x" * (HARD_MAX_FRAME_BYTES - 19))
    events = FrameReader("p").feed(frame, 0.0)
    assert isinstance(events[0], ChannelBroken) and events[0].error.reason == "oversized-frame"
    small = FrameReader("p", limits=ReaderLimits(max_frame_bytes=4096))
    assert small.feed(data_frame(1, 0, b"x" * 4096), 0.0)[0].error.reason == "oversized-frame"  # type: ignore[union-attr]


def test_stream_level_refusals_are_fatal() -> None:
    # data for a transfer never begun
    assert isinstance(FrameReader("p").feed(GOLDEN_DATA, 0.0)[0], ChannelBroken)
    # a transfer id reused
    reader = FrameReader("p")
    feed_all(reader, [GOLDEN_BEGIN, GOLDEN_DATA])
    events = reader.feed(GOLDEN_BEGIN, 0.0)
    assert isinstance(events[0], ChannelBroken)
    # data for a transfer that already completed
    reader = FrameReader("p")
    feed_all(reader, [GOLDEN_BEGIN, GOLDEN_DATA])
    assert isinstance(reader.feed(data_frame(1, 3, b"d"), 0.0)[0], ChannelBroken)


def test_channel_broken_fails_open_transfers() -> None:
    reader = FrameReader("p")
    reader.feed(GOLDEN_BEGIN, 0.0)
    events = reader.feed(b"junk-junk", 0.0)
    assert isinstance(events[0], ChannelBroken)
    assert failures(events) == ["channel-broken"]
    assert reader.buffered_bytes == 0


def _begin_then(reader: FrameReader, *frames: bytes) -> list[Any]:
    return feed_all(reader, [artifact_begin_frame(1, "update", hashlib.sha256(b"abcdef").hexdigest(), 6), *frames])


@pytest.mark.parametrize(("frames", "reason"), [
    ([data_frame(1, 1, b"bc")], "out-of-order"),
    ([data_frame(1, 0, b"abc"), data_frame(1, 0, b"abc")], "duplicate-fragment"),
    ([data_frame(1, 0, b"abc"), data_frame(1, 2, b"cdef")], "duplicate-fragment"),
    ([data_frame(1, 0, b"abcdefg")], "size-exceeded"),
    ([data_frame(1, 0, b"abcdeX")], "hash-mismatch"),
    ([data_frame(1, 0, b"ab"), abort_frame(1, "source gone")], "aborted"),
])
def test_transfer_refusals_drop_only_that_transfer(frames: list[bytes], reason: str) -> None:
    reader = FrameReader("p")
    events = _begin_then(reader, *frames)
    (failed,) = [e for e in events if isinstance(e, TransferFailed)]
    assert failed.reason == reason and not failed.error.fatal
    assert failed.artifact_id == hashlib.sha256(b"abcdef").hexdigest()
    assert reader.buffered_bytes == 0 and reader.open_transfers == 0
    # Later frames of the dropped transfer are ignored, and the channel goes on.
    assert reader.feed(data_frame(1, 3, b"def"), 0.0) == []
    later = frames_of(Leave("job-1"), [])
    later = [f[:4] + struct.pack("<I", 7) + f[8:] for f in later]  # ids above the dropped one
    assert [e.message for e in received(feed_all(reader, later))] == [Leave("job-1")]


def test_too_large_refused_at_the_begin_frame_without_buffering() -> None:
    reader = FrameReader("p")
    events = reader.feed(artifact_begin_frame(1, "checkpoint", H0, 10 * 10**9), 0.0)  # 10 GB
    assert failures(events) == ["too-large"]
    assert reader.buffered_bytes == 0 and reader.open_transfers == 0
    # The sender does not know and streams on: ignored, nothing kept.
    for i in range(50):
        assert reader.feed(data_frame(1, i * 60_000, bytes(60_000)), 0.0) == []
    assert reader.buffered_bytes == 0 and reader.ignored_frames == 50
    limits = ReaderLimits(max_artifact_bytes=1000, max_message_bytes=100)
    reader = FrameReader("p", limits=limits)
    assert failures(reader.feed(artifact_begin_frame(1, "chunk", H0, 1001), 0.0)) == ["too-large"]
    assert failures(reader.feed(message_begin_frame(2, 101, []), 0.0)) == ["too-large"]
    # A WGSL shader archive has its own limit, 4 MiB (docs/gpu.md), under the artifact limit.
    reader = FrameReader("p")
    assert failures(reader.feed(artifact_begin_frame(1, "wgsl", H0, 4 * 2**20 + 1), 0.0)) == ["too-large"]
    assert failures(reader.feed(artifact_begin_frame(2, "wgsl", H0, 4 * 2**20), 0.0)) == []


def test_too_many_transfers() -> None:
    reader = FrameReader("p", limits=ReaderLimits(max_transfers=3))
    events = feed_all(reader, [artifact_begin_frame(i, "chunk", H0, 10) for i in range(1, 5)])
    assert failures(events) == ["too-many-transfers"]
    assert reader.open_transfers == 3


def test_buffer_full_counts_announced_sizes() -> None:
    reader = FrameReader("p", limits=ReaderLimits(max_buffered_bytes=1000))
    events = feed_all(reader, [artifact_begin_frame(1, "chunk", H0, 600), artifact_begin_frame(2, "chunk", H0, 600)])
    assert failures(events) == ["buffer-full"]
    assert reader.buffered_bytes == 600


def test_completed_artifacts_count_until_their_message_claims_them() -> None:
    data = blob(700)
    reader = FrameReader("p", limits=ReaderLimits(max_buffered_bytes=2000))
    frames = frames_of(update_of(data), [data])
    feed_all(reader, frames[:2])  # the artifact, not yet its message
    assert reader.buffered_bytes == 700 and reader.open_transfers == 1
    feed_all(reader, frames[2:])
    assert reader.buffered_bytes == 0 and reader.open_transfers == 0
    # A message refused at its begin frame frees what it listed.
    reader = FrameReader("p", limits=ReaderLimits(max_buffered_bytes=800))
    events = feed_all(reader, frames)
    assert failures(events) == ["buffer-full"] and reader.buffered_bytes == 0


def _message_frames(message: Message, listed: list[tuple[str, int]], tid: int = 10) -> list[bytes]:
    body = json.dumps(encode_message(message)).encode()
    return [message_begin_frame(tid, len(body), listed), data_frame(tid, 0, body)]


def test_missing_attachment_never_sent() -> None:
    data = blob(100)
    message = update_of(data)
    events = feed_all(FrameReader("c"), _message_frames(message, [(message.weights.sha256, 100)]))
    (failed,) = [e for e in events if isinstance(e, TransferFailed)]
    assert failed.reason == "missing-attachment" and failed.artifact_id == message.weights.sha256


def test_missing_attachment_referenced_but_neither_sent_nor_held() -> None:
    message = update_of(blob(100))
    assert failures(feed_all(FrameReader("c"), _message_frames(message, []))) == ["missing-attachment"]


def test_missing_attachment_arrived_with_another_size() -> None:
    data = blob(100)
    message = update_of(data)
    wrong = Update("job-1", 1, "r1-c0", "r1-c0-a1", "a" * 64, ArtifactRef("update", message.weights.sha256, 99),
                   {"loss": 0.5}, 12)
    frames = [artifact_begin_frame(1, "update", message.weights.sha256, 100), data_frame(1, 0, data)]
    reader = FrameReader("c")
    events = feed_all(reader, frames + _message_frames(wrong, [(message.weights.sha256, 100)]))
    assert failures(events) == ["missing-attachment"]
    assert reader.buffered_bytes == 0  # the refused message released its attachment
    # The frame lists a size the artifact did not arrive with.
    reader = FrameReader("c")
    events = feed_all(reader, frames + _message_frames(message, [(message.weights.sha256, 99)]))
    assert failures(events) == ["missing-attachment"]


@pytest.mark.parametrize("body", [b"\xff\xfe", b"{not json", b"[" * 5000 + b"]" * 5000, b'{"type":"nope"}',
                                  b'{"type":"leave"}', b"12345678901234567890" * 300])
def test_bad_message(body: bytes) -> None:
    events = feed_all(FrameReader("c"), [message_begin_frame(1, len(body), []), data_frame(1, 0, body)])
    assert failures(events) == ["bad-message"]


def test_bad_message_listing() -> None:
    assert failures(FrameReader("c").feed(message_begin_frame(1, 0, []), 0.0)) == ["bad-message"]  # empty
    assert failures(FrameReader("c").feed(message_begin_frame(1, 5, [(H0, 1), (H0, 1)]), 0.0)) == ["bad-message"]
    # an attachment the message does not name
    frames = [artifact_begin_frame(1, "chunk", hashlib.sha256(b"x").hexdigest(), 1), data_frame(1, 0, b"x")]
    events = feed_all(FrameReader("c"), frames + _message_frames(Leave("j"), [(hashlib.sha256(b"x").hexdigest(), 1)]))
    assert failures(events) == ["bad-message"]


def test_stalled_transfers_and_unclaimed_artifacts_expire() -> None:
    reader = FrameReader("p")
    data = blob(200_000)
    frames = frames_of(update_of(data), [data])
    feed_all(reader, frames[:3], now=1000.0)  # begin + 2 fragments
    assert reader.expire(5000.0, timeout_ms=10_000) == []
    events = reader.expire(12_000.0, timeout_ms=10_000)
    assert failures(events) == ["stalled"] and reader.buffered_bytes == 0
    # A complete artifact whose message never comes is freed too.
    reader = FrameReader("p")
    n = next(i for i, f in enumerate(frames) if f[2] == FrameType.MESSAGE_BEGIN)
    feed_all(reader, frames[:n], now=0.0)
    assert reader.buffered_bytes == len(data)
    assert failures(reader.expire(20_000.0, 10_000)) == ["stalled"] and reader.buffered_bytes == 0


def test_close_fails_open_transfers() -> None:
    reader = FrameReader("p")
    reader.feed(GOLDEN_BEGIN, 0.0)
    assert failures(reader.close()) == ["channel-closed"]
    assert reader.buffered_bytes == 0


TESTED_REASONS = {"bad-frame", "oversized-frame", "too-large", "too-many-transfers", "buffer-full", "out-of-order",
                  "duplicate-fragment", "size-exceeded", "hash-mismatch", "missing-attachment", "bad-message",
                  "aborted", "stalled", "channel-broken", "channel-closed"}


def test_every_reason_has_a_test() -> None:
    assert TESTED_REASONS == REASONS
    assert FATAL_REASONS <= REASONS


# ---------------------------------------------------------------- dedupe


def test_writer_omits_what_the_peer_holds_and_reader_checks_it_is_held() -> None:
    cp, chunk, aux = blob(100_000, 1), blob(1000, 2), blob(10, 3)
    message = assign_of(cp, chunk, aux)
    held = {ref("checkpoint", cp).sha256, ref("auxiliary", aux).sha256}
    frames = frames_of(message, [cp, chunk, aux], holds=frozenset(held))
    sent = sum(len(f) for f in frames)
    assert sent < 5000  # the checkpoint did not travel
    sizes = {ref("checkpoint", cp).sha256: len(cp), ref("auxiliary", aux).sha256: len(aux)}
    (got,) = received(feed_all(FrameReader("p", has=lambda sha, size: sizes.get(sha) == size), frames))
    assert set(got.blobs) == {ref("chunk", chunk).sha256}
    # A reader that does not hold them refuses the message.
    assert failures(feed_all(FrameReader("p"), frames)) == ["missing-attachment"]


def test_a_held_artifact_counts_only_at_the_size_the_message_gives() -> None:
    # Issue 20: what a reader holds under a hash stands in for an omitted attachment only at that size.
    cp, chunk, aux = blob(100_000, 1), blob(1000, 2), blob(10, 3)
    frames = frames_of(assign_of(cp, chunk, aux), [cp, chunk, aux],
                       holds=frozenset({ref("checkpoint", cp).sha256, ref("auxiliary", aux).sha256}))
    sizes = {ref("checkpoint", cp).sha256: len(cp) + 1, ref("auxiliary", aux).sha256: len(aux)}
    reader = FrameReader("p", has=lambda sha, size: sizes.get(sha) == size)
    events = feed_all(reader, frames)
    assert failures(events) == ["missing-attachment"] and not received(events)
    assert "100000 bytes was neither sent nor held" in str(events[-1].error)


def test_same_bytes_twice_before_their_messages() -> None:
    data = blob(5000)
    frames = frames_of(update_of(data), [data])

    def renumber(f: bytes, tid: int) -> bytes:
        return f[:4] + struct.pack("<I", tid) + f[8:]

    reader = FrameReader("c")
    # both artifacts first (ids 1, 2), then both messages (ids 3, 4)
    stream = [renumber(f, 1) for f in frames[:2]] + [renumber(f, 2) for f in frames[:2]]
    stream += [renumber(f, 3) for f in frames[2:]] + [renumber(f, 4) for f in frames[2:]]
    events = feed_all(reader, stream)
    assert len(received(events)) == 2 and reader.buffered_bytes == 0


# ---------------------------------------------------------------- writer misuse


def test_writer_usage_errors() -> None:
    with pytest.raises(UsageError):
        FrameWriter("p", max_frame_bytes=300 * KIB)
    with pytest.raises(UsageError):
        FrameWriter("p", max_frame_bytes=1000)
    w = FrameWriter("p")
    data = blob(10)
    with pytest.raises(UsageError):
        w.enqueue(update_of(data), [(update_of(data).weights, data + b"!")])  # wrong size
    with pytest.raises(UsageError):
        w.enqueue(Leave("j"), [(ref("chunk", data), data)])  # not referenced
    with pytest.raises(UsageError):
        ReaderLimits(max_transfers=0)
    with pytest.raises(UsageError):
        SendQueue(w, high_water=100, low_water=100)


def test_writer_cancel_aborts_the_transfer_in_flight() -> None:
    data = blob(300_000)
    w = FrameWriter("p")
    w.enqueue(update_of(data), [(update_of(data).weights, data)])
    w.enqueue(Leave("j"))
    reader = FrameReader("c")
    for _ in range(3):
        reader.feed(w.next_frame(0.0), 0.0)  # type: ignore[arg-type]
    aborts = w.cancel("peer left")
    assert not w.pending and len(aborts) == 1
    assert [e.reason for e in w.take_events() if isinstance(e, TransferFailed)] == ["aborted"]
    assert failures(reader.feed(aborts[0], 0.0)) == ["aborted"] and reader.buffered_bytes == 0


# ---------------------------------------------------------------- back-pressure


def test_send_queue_stops_at_high_water_and_resumes_at_low() -> None:
    data = blob(2_000_000)
    w = FrameWriter("p")
    w.enqueue(update_of(data), [(update_of(data).weights, data)])
    q = SendQueue(w, high_water=256 * KIB, low_water=64 * KIB)
    first = list(q.pump(0, 0.0))
    assert sum(len(f) for f in first) >= 256 * KIB and sum(len(f) for f in first[:-1]) < 256 * KIB
    assert q.paused
    assert list(q.pump(200 * KIB, 1.0)) == []  # still above the low mark: hysteresis
    again = list(q.on_low(64 * KIB, 2.0))  # the bufferedamountlow event
    assert 192 * KIB <= sum(len(f) for f in again) < 192 * KIB + 64 * KIB + 64
    # Draining to the end: every frame arrives once, in order.
    frames = first + again
    while w.pending:
        frames += list(q.on_low(0, 3.0))
    assert not q.paused
    (got,) = received(feed_all(FrameReader("c"), frames))
    assert got.blobs[update_of(data).weights.sha256] == data


def test_send_queue_never_materializes_more_than_the_window() -> None:
    data = blob(5_000_000)
    w = FrameWriter("p")
    w.enqueue(update_of(data), [(update_of(data).weights, data)])
    q = SendQueue(w)
    burst = list(q.pump(3 * 1024 * KIB, 0.0))
    assert sum(len(f) for f in burst) <= 1024 * KIB + 64 * KIB


# ---------------------------------------------------------------- progress


def test_receive_progress_under_simulated_time() -> None:
    # 1 MiB at 64 KiB per 100 ms: 655,360 bytes/s.
    data = blob(1024 * KIB)
    frames = frames_of(update_of(data), [data])
    reader = FrameReader("coord", job_id="job-1", progress_interval_ms=0)
    progress: list[TransferProgress] = []
    now = 0.0
    for f in frames:
        if f[2] == FrameType.DATA:
            now += 100.0
        for e in reader.feed(f, now):
            if isinstance(e, TransferProgress):
                progress.append(e)
    half = next(p for p in progress if p.bytes >= 512 * KIB)
    assert half.direction == "receive" and half.total_bytes == 1024 * KIB and half.job_id == "job-1"
    payload = 64 * KIB - 20
    assert half.bytes_per_second == pytest.approx(payload * 10, rel=0.01)
    assert half.remaining_seconds == pytest.approx((half.total_bytes - half.bytes) / half.bytes_per_second)
    assert progress[-1].bytes == progress[-1].total_bytes and progress[-1].remaining_seconds == 0
    assert half.to_json()["peerId"] == "coord" and set(half.to_json()) == {
        "jobId", "peerId", "artifactId", "direction", "bytes", "totalBytes", "bytesPerSecond", "remainingSeconds"}


def test_send_progress_is_throttled_and_falls_when_stalled() -> None:
    data = blob(2_000_000)
    w = FrameWriter("p", job_id="j", progress_interval_ms=250)
    w.enqueue(update_of(data), [(update_of(data).weights, data)])
    now, emitted = 0.0, []
    while (f := w.next_frame(now)) is not None:
        now += 100.0
        emitted += [e for e in w.take_events() if isinstance(e, TransferProgress)]
        if f[2] == FrameType.DATA and len(emitted) == 3:
            mid = w.progress(now)
            assert mid is not None and mid.direction == "send"
            assert mid.bytes_per_second == pytest.approx(mid.bytes * 1000 / now, rel=0.05)
            stalled = w.progress(now + 60_000)
            assert stalled is not None and stalled.bytes_per_second < mid.bytes_per_second / 5
    assert 8 < len(emitted) < 16  # 31 frames over 3.1 s: about one every 300 ms
    assert emitted[-1].bytes == len(data)


def test_transfer_book() -> None:
    book = TransferBook()
    data = blob(300_000)
    w = FrameWriter("p", progress_interval_ms=0)
    w.enqueue(update_of(data), [(update_of(data).weights, data)])
    reader = FrameReader("coord", job_id="j", progress_interval_ms=0)
    frames = list(w.frames(0.0))
    book.apply_all(feed_all(reader, frames[:3]))
    (entry,) = book.state()["transfers"]
    assert entry["direction"] == "receive" and 0 < entry["bytes"] < entry["totalBytes"]
    book.apply_all(feed_all(reader, frames[3:]))
    book.apply_all(w.take_events())
    assert book.state() == {"transfers": [], "transferErrors": {}}
    reader2 = FrameReader("coord")
    book.apply_all(_begin_then(reader2, data_frame(1, 0, b"abcdeX")))
    (key, text), = book.state()["transferErrors"].items()
    assert key == hashlib.sha256(b"abcdef").hexdigest() and text.startswith("hash-mismatch")
    for i in range(400):
        book.apply(TransferFailed("p", f"{i:064x}", "receive", FrameError(FrameReason.STALLED, "x"), i))
    assert len(book.errors) == 256


# ---------------------------------------------------------------- fuzz

EVENT_TYPES = (TransferProgress, TransferDone, TransferFailed, MessageReceived, ChannelBroken)


def _check_events(events: list[Any]) -> None:
    for e in events:
        assert isinstance(e, EVENT_TYPES)
        if isinstance(e, (TransferFailed, ChannelBroken)):
            assert isinstance(e.error, FrameError) and e.error.reason in REASONS
        if isinstance(e, MessageReceived):
            for sha, data in e.blobs.items():
                assert hashlib.sha256(data).hexdigest() == sha


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=200))
def test_parse_random_bytes_raises_only_frame_error(data: bytes) -> None:
    try:
        parse_frame(data)
    except FrameError as e:
        assert e.reason in REASONS


_VALID = frames_of(assign_of(blob(9000, 1), blob(3, 2), b""), [blob(9000, 1), blob(3, 2), b""], max_frame=4096)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, len(_VALID) - 1),
                          st.sampled_from(["keep", "flip", "cut", "drop", "dup", "swap", "junk"]),
                          st.integers(0, 4200), st.integers(0, 255)), max_size=20))
def test_mutated_streams_give_only_named_refusals(mutations: list[tuple[int, str, int, int]]) -> None:
    frames = list(_VALID)
    for index, op, pos, value in mutations:
        index %= len(frames) or 1
        if not frames:
            break
        f = frames[index]
        if op == "flip" and f:
            b = bytearray(f)
            b[pos % len(b)] ^= value or 1
            frames[index] = bytes(b)
        elif op == "cut":
            frames[index] = f[: pos % (len(f) + 1)]
        elif op == "drop":
            del frames[index]
        elif op == "dup":
            frames.insert(index, f)
        elif op == "swap" and index + 1 < len(frames):
            frames[index], frames[index + 1] = frames[index + 1], frames[index]
        elif op == "junk":
            frames.insert(index, bytes([value]) * (pos % 64))
    reader = FrameReader("p", limits=ReaderLimits(max_transfers=4, max_buffered_bytes=20_000))
    for i, f in enumerate(frames):
        events = reader.feed(f, float(i))
        _check_events(events)
        assert reader.buffered_bytes <= 20_000 and reader.open_transfers <= 4
    _check_events(reader.expire(1e9, 1.0))
    assert reader.buffered_bytes == 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(
    st.builds(artifact_begin_frame, st.integers(1, 6), st.sampled_from(sorted(ArtifactRef.KINDS)),
              st.sampled_from([H0, hashlib.sha256(b"").hexdigest(), hashlib.sha256(b"ab").hexdigest()]),
              st.integers(0, 2**64 - 1) | st.integers(0, 5)),
    st.builds(message_begin_frame, st.integers(1, 6), st.integers(0, 40),
              st.lists(st.tuples(st.sampled_from([H0, hashlib.sha256(b"ab").hexdigest()]), st.integers(0, 3)),
                       max_size=3)),
    st.builds(data_frame, st.integers(1, 6), st.integers(0, 6), st.binary(min_size=1, max_size=8)),
    st.builds(abort_frame, st.integers(1, 6), st.text(max_size=10)),
), max_size=25))
def test_well_formed_but_hostile_frame_sequences(frames: list[bytes]) -> None:
    reader = FrameReader("p", limits=ReaderLimits(max_transfers=3, max_buffered_bytes=10**6))
    for f in frames:
        _check_events(reader.feed(f, 0.0))
        assert reader.buffered_bytes <= 10**6


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=20)
       | st.fixed_dictionaries({"type": st.sampled_from(["update", "assign", "deliver", "leave"]),
                                "jobId": st.text(max_size=5)}))
def test_random_json_messages_give_only_named_refusals(value: Any) -> None:
    body = json.dumps(value).encode()
    events = feed_all(FrameReader("p"), [message_begin_frame(1, len(body), []), data_frame(1, 0, body)])
    _check_events(events)


def test_mutable_frames_are_copied_so_a_reused_buffer_cannot_corrupt_data() -> None:
    data = blob(200_000)
    frames = frames_of(update_of(data), [data])
    reader, events = FrameReader("c"), []
    scratch = bytearray(HARD_MAX_FRAME_BYTES)
    for f in frames:
        scratch[: len(f)] = f
        events += reader.feed(memoryview(scratch)[: len(f)], 0.0)
        scratch[:] = bytes(len(scratch))  # the host reuses its buffer
    (got,) = received(events)
    assert got.blobs[update_of(data).weights.sha256] == data


def test_rate_meter_keeps_a_bounded_window() -> None:
    from weei.core.observe.transfers import RateMeter
    meter = RateMeter(0.0)
    for i in range(1, 100_000):
        meter.add(float(i), i * 100)  # 100 bytes per ms for 100 s
    assert len(meter.samples) <= 40
    assert meter.per_second(100_000.0) == pytest.approx(100_000.0, rel=0.05)
