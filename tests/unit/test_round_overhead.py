"""Round overhead at the coordinator (issue 11, P4/P6): what the fast paths must keep.

An update is hashed once, on arrival (the framing reader hashes while the
fragments come in and hands the bytes over as ``VerifiedBlobs``); the
checkpoint writer checks its metadata without parsing its own text, and its
files are byte for byte what they were before; attempts and chunks are
looked up by id, with the same answers as the scans they replace.
"""

from __future__ import annotations

import hashlib
import json
import struct
from typing import Any

import pytest
from sim import COORD, Sim, dataset_spec, experience_spec, initial_weights, trained_updates

from weei.core import verified
from weei.core.job.attempts import RoundAttempts
from weei.core.formats.checkpoint import prepare_checkpoint, read_checkpoint, write_checkpoint
from weei.core.wire.commands import SaveCheckpoint, Send
from weei.core.job.coordinator import Coordinator
from weei.core.errors import CheckpointError, UsageError
from weei.core.wire.framing import FrameReader, FrameWriter, MessageReceived, referenced_artifacts
from weei.core.wire.messages import ArtifactRef, Assign, InvitationDecision, ModuleStatus, Update
from weei.core.links.relay import PIECE_BYTES, split
from weei.core.verified import VerifiedBlobs
from weei.kernel.numpy_kernel import NumpyKernel


@pytest.fixture
def hashes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the core's hashes of arriving artifacts (the real SHA-256, counted at its one seam)."""
    sizes: list[int] = []
    real = verified.sha256_hex

    def counting(data: Any) -> str:
        sizes.append(len(data))
        return real(data)

    monkeypatch.setattr(verified, "sha256_hex", counting)
    return sizes


def _round_one(peers: tuple[str, ...] = ("p1", "p2", "p3")) -> tuple[Coordinator, list[tuple[str, Update, bytes]]]:
    """A started dataset job: its coordinator and each peer's trained update of round 1."""
    spec, _ = dataset_spec(len(peers), weight_count=1000)
    c = Coordinator.create(spec, initial_weights(1000), my_peer_id=COORD, kernel=NumpyKernel(), now=0.0)
    for peer in peers:
        c.invite(peer, 0.0)
        c.receive(peer, InvitationDecision(spec.job_id, True), {}, 0.0)
        c.receive(peer, ModuleStatus(spec.job_id, True, None, ()), {}, 0.0)
    c.start(0.0)
    updates = trained_updates(c, c.take_commands())
    assert len(updates) == len(peers)
    return c, updates


def _through_the_channel(update: Update, weights: bytes) -> MessageReceived:
    """The update as the coordinator's framing reader delivers it."""
    writer = FrameWriter("p")
    (ref,) = referenced_artifacts(update)
    writer.enqueue(update, [(ref, weights)])
    reader = FrameReader("coord")
    events = [e for frame in writer.frames(0.0) for e in reader.feed(frame, 0.0)]
    (got,) = [e for e in events if isinstance(e, MessageReceived)]
    return got


def _saved(c: Coordinator) -> list[SaveCheckpoint]:
    return [command for command in c.take_commands() if isinstance(command, SaveCheckpoint)]


def test_an_update_from_the_channel_is_not_hashed_again(hashes: list[int]) -> None:
    c, updates = _round_one()
    for peer, update, weights in updates:
        got = _through_the_channel(update, weights)
        assert isinstance(got.blobs, VerifiedBlobs) and dict(got.blobs) == {update.weights.sha256: weights}
        c.receive(peer, got.message, got.blobs, 1.0)
    assert hashes == []  # the reader hashed each update as it arrived; the coordinator used that
    (saved,) = _saved(c)
    assert saved.round == 1 and c.last_contributors == ["p1", "p2", "p3"]


def test_an_update_in_a_plain_mapping_is_hashed_exactly_once_and_gives_the_same_checkpoint(hashes: list[int]) -> None:
    c, updates = _round_one()
    for peer, update, weights in updates:
        c.receive(peer, update, {update.weights.sha256: weights}, 1.0)
    assert hashes == [4000, 4000, 4000]  # one hash per update, none for anything else
    (plain,) = _saved(c)
    c2, updates2 = _round_one()
    for peer, update, weights in updates2:
        c2.receive(peer, update, VerifiedBlobs.check({update.weights.sha256: weights}), 1.0)
    (checked,) = _saved(c2)
    assert checked.file == plain.file


def test_a_tampered_update_in_a_plain_mapping_is_still_refused() -> None:
    c, updates = _round_one(("p1", "p2"))
    peer, update, weights = updates[0]
    c.receive(peer, update, {update.weights.sha256: bytes([weights[0] ^ 1]) + weights[1:]}, 1.0)
    assert [r.reason.split(":")[0] for r in c.rejected] == ["hash-mismatch"]


def test_verified_blobs_check_refuses_bytes_that_do_not_match_their_name() -> None:
    data = b"\x00" * 8
    good = VerifiedBlobs.check({hashlib.sha256(data).hexdigest(): data})
    assert list(good) == [hashlib.sha256(data).hexdigest()] and len(good) == 1
    with pytest.raises(UsageError) as err:
        VerifiedBlobs.check({"0" * 64: data})
    assert err.value.reason == "hash-mismatch"


# Each job's checkpoint files, SHA-256 of their hashes in order, as the writer made them before
# it stopped parsing its own metadata (computed with main at 2468314).
GOLDEN = {
    "fedavg": "9ff444bd767d441b0f1918249bacf6241dfc8876804bd4bb5f609ee52bb81b84",
    "fedadam": "8826c65df8b3d69d5a9b5a525c587e6447c5c0e0f15d97d1a7d7fdad34d021c4",
    "fedavgm": "c05ec6c430e3fdeba45cd11adfdba35dcad43a38bef4203d517bb776822d85bc",
    "experience": "b482b30f9008550bc9f31d76490dbdf4797597e2c0b2253d4101d5b2aa1c03d8",
}


def _files_digest(sim: Sim) -> str:
    return hashlib.sha256("".join(hashlib.sha256(s.file).hexdigest() for s in sim.saved).encode()).hexdigest()


@pytest.mark.parametrize("method", ["fedavg", "fedadam", "fedavgm"])
def test_checkpoint_files_are_byte_identical_to_before(method: str) -> None:
    spec, store = dataset_spec(6, settings={"epochs": 2, "aggregation": {"method": method}}, weight_count=300)
    sim = Sim.start_job(spec, store, ["p1", "p2", "p3"])
    sim.run_to_end()
    assert len(sim.saved) == 5
    for saved in sim.saved:
        assert read_checkpoint(saved.file).weights == saved.weights
    assert _files_digest(sim) == GOLDEN[method]


def test_experience_checkpoint_files_are_byte_identical_to_before() -> None:
    spec, store = experience_spec(settings={"epochs": 3, "aggregation": {"method": "fedadam"}}, weight_count=40)
    sim = Sim.start_job(spec, store, ["p1", "p2"], job_seed=12345)
    sim.run_to_end()
    assert len(sim.saved) == 4
    assert _files_digest(sim) == GOLDEN["experience"]


def test_the_writer_does_not_parse_its_own_metadata(monkeypatch: pytest.MonkeyPatch) -> None:
    spec, store = dataset_spec(4, settings={"aggregation": {"method": "fedadam"}}, weight_count=64)
    sim = Sim.start_job(spec, store, ["p1", "p2"])
    sim.run_to_end()
    last = read_checkpoint(sim.saved[-1].file)
    parsed: list[Any] = []
    real = json.loads
    monkeypatch.setattr(json, "loads", lambda *a, **k: parsed.append(a) or real(*a, **k))
    again = write_checkpoint(last.metadata, last.weights, last.state)
    assert parsed == []
    assert again == sim.saved[-1].file


def test_open_attempts_by_id_answer_as_the_scan_did() -> None:
    attempts = RoundAttempts()
    a = [attempts.new(f"p{i}", 1, f"r1-c{i}", None, None, i, now=10.0 * i, timeout_ms=100.0) for i in range(4)]
    assert attempts.next_deadline() == 100.0
    attempts.stop(a[0], "gone")
    attempts.accept(a[2], Update("j", 1, "r1-c2", a[2].attempt_id, "a" * 64, ArtifactRef("update", "b" * 64, 4),
                                 {}, 1), b"\x00" * 4)
    assert attempts.open() == [a[1], a[3]] == [x for x in attempts.current if x.open]
    assert attempts.open_one(a[0].attempt_id) is None and attempts.open_one(a[1].attempt_id) is a[1]
    assert attempts.busy_peers() == {"p1", "p3"} and attempts.open_of("p3") == [a[3]]
    assert attempts.next_deadline() == 110.0 and attempts.late(125.0) == [a[1]]
    assert attempts.any_open() and not attempts.all_ended()
    attempts.stop(a[1], "late")
    attempts.stop(a[3], "late")
    assert attempts.next_deadline() is None and attempts.all_ended() and attempts.open() == []


def test_chunks_are_found_by_id() -> None:
    spec, _ = dataset_spec(5)
    assert [spec.chunk(c.id) for c in spec.chunks] == list(spec.chunks)
    assert spec.with_settings(spec.settings).chunk("c004") is spec.chunks[4]
    with pytest.raises(KeyError):
        spec.chunk("c999")


def _closed_round_one(method: str) -> list[Any]:
    """The commands that close round 1 of a three-peer job of 6 chunks and 2 epochs (round 2 follows)."""
    spec, _ = dataset_spec(6, settings={"epochs": 2, "aggregation": {"method": method}}, weight_count=1000)
    c = Coordinator.create(spec, initial_weights(1000), my_peer_id=COORD, kernel=NumpyKernel(), now=0.0)
    for peer in ("p1", "p2", "p3"):
        c.invite(peer, 0.0)
        c.receive(peer, InvitationDecision(spec.job_id, True), {}, 0.0)
        c.receive(peer, ModuleStatus(spec.job_id, True, None, ()), {}, 0.0)
    c.start(0.0)
    for peer, update, weights in trained_updates(c, c.take_commands()):
        c.receive(peer, update, VerifiedBlobs.check({update.weights.sha256: weights}), 1.0)
    return c.take_commands()


@pytest.mark.parametrize("method", ["fedavg", "fedadam"])
def test_the_next_rounds_work_goes_out_before_the_checkpoint_file_is_made(method: str) -> None:
    commands = _closed_round_one(method)
    (save,) = [i for i, c in enumerate(commands) if isinstance(c, SaveCheckpoint)]
    assigns = [i for i, c in enumerate(commands) if isinstance(c, Send) and isinstance(c.message, Assign)]
    assert assigns and all(c.message.round == 2 for c in (commands[i] for i in assigns))
    assert max(assigns) < save  # the host sends them before it writes the file
    saved = commands[save]
    assert "file" not in vars(saved)  # not joined (nor its state hashed) until the host reads it
    read = read_checkpoint(saved.file)
    assert read.weights == saved.weights and read.state == saved.state and read.metadata.round == 1
    assert saved.file is saved.file  # joined once
    assert write_checkpoint(read.metadata, read.weights, read.state) == saved.file


def test_prepare_checkpoint_refuses_before_anything_is_joined() -> None:
    spec, store = dataset_spec(4, settings={"aggregation": {"method": "fedadam"}}, weight_count=64)
    sim = Sim.start_job(spec, store, ["p1", "p2"])
    sim.run_to_end()
    last = read_checkpoint(sim.saved[-1].file)
    assert last.state is not None
    nan = struct.pack("<f", float("nan"))
    with pytest.raises(CheckpointError) as err:
        prepare_checkpoint(last.metadata, last.weights, last.state[:8] + nan + last.state[12:])
    assert err.value.reason == "state-non-finite"
    with pytest.raises(CheckpointError) as err:
        prepare_checkpoint(last.metadata, nan + last.weights[4:], last.state)
    assert err.value.reason == "weights-non-finite"
    big = {**last.metadata.to_json(), "chunkOrder": ["c" * 1000] * 1100}
    with pytest.raises(CheckpointError) as err:
        prepare_checkpoint(big, last.weights, last.state)
    assert err.value.reason == "metadata-too-large"
    # The state's hash is written at the join: the reader checks it.
    assert prepare_checkpoint(last.metadata, last.weights, last.state).join() == sim.saved[-1].file


def test_relay_pieces_are_views_of_the_checkpoint_not_copies() -> None:
    data = initial_weights(3 << 18)  # 3 MiB
    pieces = split(data, PIECE_BYTES)
    assert [p.bytes for p, _ in pieces] == [PIECE_BYTES] * 3
    assert all(isinstance(d, memoryview) and d.readonly and d.obj is data for _, d in pieces)
    assert [p.sha256 for p, _ in pieces] == [hashlib.sha256(data[i:i + PIECE_BYTES]).hexdigest()
                                             for i in range(0, len(data), PIECE_BYTES)]
