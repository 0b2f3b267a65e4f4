"""The new weights are hashed once, with the relay's pieces, through the kernel (issue 11, P4).

A closed round names its checkpoint (SHA-256 of the weights), and a relayed
broadcast lists every piece's SHA-256 before the first piece leaves. Both are
on the round's critical path, so the coordinator asks its kernel for both in
one ``sha256_many`` call, which a CPython kernel spreads over the cores
(weei.kernel.digests); the broadcast then uses those pieces as they are.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence

from sim import COORD, dataset_spec, initial_weights, trained_updates

from weei.core.aggregation.aggregate import BytesLike
from weei.core.wire.commands import Send
from weei.core.job.coordinator import Coordinator
from weei.core.wire.messages import Assign, InvitationDecision, ModuleStatus
from weei.core.links.relay import Relays, sequential_sha256, split
from weei.core.wire.messages import RelayDone, RelayPiece, RelayPlan
from weei.core.verified import VerifiedBlobs
from weei.kernel.digests import PARALLEL_MIN_BYTES, sha256_many
from weei.kernel.numpy_kernel import NumpyKernel

WEIGHTS = 1 << 20  # float32: a 4 MiB checkpoint, above the relay's 2 MiB


class RecordingKernel(NumpyKernel):
    """The numpy kernel, noting the sizes of the buffers each ``sha256_many`` call hashed."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[list[int]] = []

    def sha256_many(self, buffers: Sequence[BytesLike]) -> list[str]:
        self.calls.append([memoryview(b).nbytes for b in buffers])
        return super().sha256_many(buffers)


def _close_round_one(peers: tuple[str, ...]) -> tuple[Coordinator, RecordingKernel, list]:
    """A two-epoch job of 4 MiB weights: round 1 closed with every peer's update; the commands after."""
    spec, _ = dataset_spec(2 * len(peers), settings={"epochs": 2}, weight_count=WEIGHTS)
    kernel = RecordingKernel()
    c = Coordinator.create(spec, initial_weights(WEIGHTS), my_peer_id=COORD, kernel=kernel, now=0.0)
    for peer in peers:
        c.invite(peer, 0.0)
        c.receive(peer, InvitationDecision(spec.job_id, True), {}, 0.0)
        c.receive(peer, ModuleStatus(spec.job_id, True, None, ()), {}, 0.0)
    c.start(0.0)
    commands = c.take_commands()
    if c.broadcast is not None:  # checkpoint 0 is relayed: its targets hold it, which releases their Assigns
        cast = c.broadcast
        for peer in list(cast.waiting):
            c.receive(peer, RelayDone(spec.job_id, cast.round, cast.artifact, COORD, True), {}, 0.0)
        commands += c.take_commands()
        kernel.calls.clear()  # checkpoint 0's pieces: not this test's
    for peer, update, weights in trained_updates(c, commands):
        c.receive(peer, update, VerifiedBlobs.check({update.weights.sha256: weights}), 1.0)
    return c, kernel, c.take_commands()


def test_a_relayed_checkpoint_is_hashed_whole_and_in_pieces_in_one_call() -> None:
    c, kernel, commands = _close_round_one(("p1", "p2", "p3"))
    assert c.checkpoint_round == 1 and c.weights_sha256 == hashlib.sha256(c.weights).hexdigest()
    (call,) = kernel.calls  # nothing else hashed the new weights, before or after
    whole, *pieces = call
    assert whole == len(c.weights) and sum(pieces) == whole and len(pieces) > 1
    plans = [cmd.message for cmd in commands if isinstance(cmd, Send) and isinstance(cmd.message, RelayPlan)]
    assert {p.artifact for p in plans} == {c.weights_sha256} and len(plans) == 3
    assert [p.bytes for p in plans[0].pieces] == pieces
    view = memoryview(c.weights)
    offsets = [sum(pieces[:i]) for i in range(len(pieces))]
    assert [p.sha256 for p in plans[0].pieces] == [hashlib.sha256(view[o:o + n]).hexdigest()
                                                   for o, n in zip(offsets, pieces)]
    sent = [cmd for cmd in commands if isinstance(cmd, Send) and isinstance(cmd.message, RelayPiece)]
    assert sent and all(dict(cmd.blobs) == {cmd.message.data.sha256: bytes(view[o:o + n])}
                        for cmd, o, n in zip(sent, offsets, pieces))


def test_a_checkpoint_that_is_not_relayed_is_hashed_once_whole() -> None:
    c, kernel, commands = _close_round_one(("p1",))
    assert kernel.calls == [[len(c.weights)]]  # one peer: no relay, so no piece is hashed
    assert not any(isinstance(cmd, Send) and isinstance(cmd.message, RelayPlan) for cmd in commands)
    assert any(isinstance(cmd, Send) and isinstance(cmd.message, Assign) for cmd in commands)


def test_pieces_hashed_for_another_artifact_are_not_used() -> None:
    relays = Relays(COORD, "job")
    first, second = initial_weights(WEIGHTS), bytes(4 * WEIGHTS)
    relays.digest(first, relayed=True)
    sha = hashlib.sha256(second).hexdigest()
    pieces = relays.pieces(sha, second)
    assert [p for p, _ in pieces] == [p for p, _ in split(second, relays.piece_size(len(second)))]
    assert all(d.obj is second for _, d in pieces)


def test_sha256_many_on_threads_gives_the_sequential_hashes() -> None:
    rng = random.Random(7)
    big = rng.randbytes(PARALLEL_MIN_BYTES * 3)
    buffers: list[BytesLike] = [big, memoryview(big)[5:70_001], b"", bytearray(b"abc"),
                                *(memoryview(big)[i:i + 65_536] for i in range(0, len(big), 65_536))]
    assert sha256_many(buffers) == sequential_sha256(buffers) == [hashlib.sha256(b).hexdigest() for b in buffers]
    assert sha256_many([b"tiny", b"too"]) == sequential_sha256([b"tiny", b"too"])
