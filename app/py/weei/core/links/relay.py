"""Relayed broadcast of a checkpoint: who forwards which pieces to whom, as data.

Theory of operation
-------------------
Sending one checkpoint to N participants from the coordinator costs N
copies through the coordinator's one uplink (and, in a browser, its one
core). Participants are connected to each other (the room is a full mesh,
docs/peers.md), and artifacts are content-addressed, so a copy relayed by
a participant is as safe as the coordinator's once its hash is checked.

The coordinator (``Broadcast``) cuts the artifact into pieces (about 64 of
them, from 64 KiB to 1 MiB each: ``piece_size``) and lays the targets out
as a k-ary tree below itself (k = 1: a chain). Every target gets a
``RelayPlan`` straight from the coordinator: the list of piece hashes,
its ``source`` (parent) and the peers it ``forward_to`` (children). The
coordinator sends every piece to its own children; a node (``RelayNode``)
forwards each piece as soon as it has it, so pieces flow down the tree in
a pipeline: the last target has the
checkpoint about one piece-time (plus one latency) per level after the
first. Hence small pieces: with 1 MiB pieces a 4 MB checkpoint reached the
4th participant of a chain 1.99 x later than one participant gets it
directly, with 64 KiB pieces 1.33 x (bench/relay_sim.py: 20 MB/s uplinks,
20 ms latency); each piece costs one small message more.

Safety: the frame reader verifies every piece against the SHA-256 it
arrived under (a piece in a plain mapping the node hashes itself); a node
accepts a piece only if that hash and size are the ones its coordinator
listed for that index, and only from its plan's source, before it keeps or
forwards it. The assembled artifact is hashed once more, whole: the plan's
list only says which pieces come, not that they make the artifact the plan
names, and a coordinator that lists the pieces of another file (a module
the participant never approved, under the name of one it did) must not get
them stored under that name (issue 20). Bytes that do not hash to the
plan's artifact are dropped (``assembled-mismatch``) and reported; what
:meth:`RelayNode.take_assembled` hands over is ``VerifiedBlobs``. A node
takes plans only from the coordinator of the job it takes part in, keeps
at most ``max_plans`` artifacts and ``max_bytes`` of pieces.

Failure: a node that receives a piece the plan does not name (or a
transfer its reader refused for its hash) answers ``RelayDone(ok=False)``
naming the source. The coordinator then skips that relay: each target
below it that does not hold the artifact yet gets a new plan with the
coordinator as source and all pieces straight from it (its own subtree
keeps its place). The same happens when a relay leaves, or when a target
has not finished by its deadline (``timeout_ms``, simulated time): its
source is blamed as stalled. A target falls back at most once; after
that only the round's own deadline applies. A blamed peer is never a
relay again in later broadcasts of the same ``Relays``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ..floats import BytesLike
from ..wire.commands import Command, Log, Send
from ..wire.messages import MAX_FORWARD, MAX_PIECES, ArtifactRef, Piece, RelayDone, RelayPiece, RelayPlan
from ..verified import VerifiedBlobs, is_verified, sha256_hex

__all__ = [
    "PIECE_BYTES",
    "MIN_PIECE_BYTES",
    "PIPELINE_PIECES",
    "MIN_RELAY_BYTES",
    "piece_size",
    "sequential_sha256",
    "views",
    "split",
    "tree",
    "relay_timeout_ms",
    "Relays",
    "Broadcast",
    "RelayNode",
    "relay_assignments",
]

#: The largest piece, and the smallest (unless the policy's largest is smaller still).
PIECE_BYTES = 1 << 20
MIN_PIECE_BYTES = 1 << 16
#: Pieces an artifact is cut into when the sizes above allow: enough for a short pipeline.
PIPELINE_PIECES = 64
#: Below this an artifact goes straight to every target: the relay's extra hops (a latency each) cost
#: more than the coordinator's extra copies save.
MIN_RELAY_BYTES = 2 * PIECE_BYTES


def piece_size(total: int, largest: int = PIECE_BYTES, count: int = PIPELINE_PIECES) -> int:
    """The piece size for an artifact of ``total`` bytes: about ``count`` pieces, in whole 64 KiB, at most
    ``largest``, and large enough that no more than MAX_PIECES are needed (``count`` 1: pieces of
    ``largest``, the plan before issue 11's measurement)."""
    aim = -(-total // max(1, count))
    aim = -(-aim // MIN_PIECE_BYTES) * MIN_PIECE_BYTES
    return max(min(aim, largest), -(-total // MAX_PIECES), 1)


def sequential_sha256(buffers: Sequence[BytesLike]) -> list[str]:
    """The hex SHA-256 of each buffer, one after the other (a host with one thread)."""
    return [hashlib.sha256(b).hexdigest() for b in buffers]


def views(data: bytes, piece_bytes: int = PIECE_BYTES) -> list[memoryview]:
    """``data`` cut into pieces of ``piece_bytes`` (larger when it would need more than MAX_PIECES).

    Each piece is a read-only view into ``data``, not a copy: a checkpoint's
    bytes never change, and copying 16M weights into pieces cost more than
    hashing them.
    """
    size = max(piece_bytes, -(-len(data) // MAX_PIECES), 1)
    view = memoryview(data).toreadonly().cast("B")
    return [view[offset:offset + size] for offset in range(0, len(view), size)]


def split(data: bytes, piece_bytes: int = PIECE_BYTES,
          sha256_many: Callable[[Sequence[BytesLike]], list[str]] = sequential_sha256) -> list[tuple[Piece, memoryview]]:
    """``views(data, piece_bytes)``, each with its Piece (SHA-256 and size)."""
    chunks = views(data, piece_bytes)
    return [(Piece(sha, len(chunk)), chunk) for sha, chunk in zip(sha256_many(chunks), chunks)]


def tree(targets: Sequence[str], fanout: int) -> dict[str, tuple[str | None, tuple[str, ...]]]:
    """Each target's (parent, children) in a ``fanout``-ary tree under the root (parent None).

    Position 0 is the root (the coordinator), targets take positions 1..N in
    order; the children of position p are p*k+1 .. p*k+k (k = 1: a chain).
    """
    k = max(1, min(fanout, MAX_FORWARD))
    nodes: list[str | None] = [None, *targets]
    out: dict[str, tuple[str | None, tuple[str, ...]]] = {}
    for p, target in enumerate(targets, start=1):
        parent = nodes[(p - 1) // k]
        children = tuple(t for t in nodes[p * k + 1:p * k + k + 1] if t is not None)
        out[target] = (parent, children)
    return out


def relay_timeout_ms(nbytes: int) -> float:
    """How long a target may take: 30 s plus the bytes at 100 kB/s. Generous: a busy machine's channel
    is slow, not stalled, and a fallback sends the bytes once more."""
    return 30_000 + nbytes / 100


@dataclass
class Relays:
    """One job's relay policy: the fan-out, and the peers that failed as a relay (never asked again)."""

    coordinator: str
    job_id: str
    fanout: int = 1
    piece_bytes: int = PIECE_BYTES  # the largest piece (piece_size)
    pipeline_pieces: int = PIPELINE_PIECES  # about how many pieces (piece_size)
    min_relay_bytes: int = MIN_RELAY_BYTES
    blamed: dict[str, str] = field(default_factory=dict)  # peer -> why it is no relay any more
    sha256_many: Callable[[Sequence[BytesLike]], list[str]] = sequential_sha256  # the host's (kernel's) hasher
    # The pieces ``digest`` hashed with the artifact they cut: (artifact, piece size, pieces).
    _prehashed: tuple[str, int, list[tuple[Piece, memoryview]]] | None = field(default=None, repr=False)

    def piece_size(self, total: int) -> int:
        """The piece size this policy cuts an artifact of ``total`` bytes into."""
        return total if total < self.min_relay_bytes else piece_size(total, self.piece_bytes, self.pipeline_pieces)

    def digest(self, data: bytes, *, relayed: bool) -> str:
        """The hex SHA-256 of ``data``. When it is likely to be ``relayed``, its pieces are hashed in the
        same call (so a host hashes both on two cores at once), kept for the ``broadcast`` of it."""
        if not relayed or len(data) < self.min_relay_bytes:
            return self.sha256_many([data])[0]
        size = self.piece_size(len(data))
        chunks = views(data, size)
        whole, *shas = self.sha256_many([data, *chunks])  # the largest first: see weei.kernel.digests
        self._prehashed = (whole, size, [(Piece(sha, len(c)), c) for sha, c in zip(shas, chunks)])
        return whole

    def pieces(self, artifact: str, data: bytes) -> list[tuple[Piece, memoryview]]:
        """``data``'s pieces: those ``digest`` hashed when they are of this artifact, else hashed now."""
        size = self.piece_size(len(data))
        kept, self._prehashed = self._prehashed, None
        if kept is not None and kept[0] == artifact and kept[1] == size:
            return kept[2]
        return split(data, size, self.sha256_many)

    def broadcast(self, round_: int, artifact: str, data: bytes, targets: Sequence[str], now: float,
                  timeout_ms: float | None = None) -> Broadcast:
        """Plan the delivery of ``data`` (SHA-256 ``artifact``) to ``targets``; take its commands next."""
        return Broadcast(self, round_, artifact, data, list(targets), now,
                         timeout_ms if timeout_ms is not None else relay_timeout_ms(len(data)))


def relay_assignments(relays: Relays, commands: list[Command], artifact: ArtifactRef, data: bytes, round_: int,
                      now: float) -> tuple[list[Command], Broadcast | None]:
    """The coordinator's hook when a round opens: ``commands`` (its Sends of the round) with the checkpoint
    relayed, and the ``Broadcast`` to drive, or the commands unchanged (None) when relaying does not pay.

    The Sends to other peers that attach ``artifact`` wait in the broadcast
    until their peer reports holding it; plans and pieces go out instead.
    """
    carrying = [c for c in commands if isinstance(c, Send) and c.peer != relays.coordinator
                and any(a.sha256 == artifact.sha256 for a in c.attachments)]
    if len(carrying) < 2 or len(data) < relays.min_relay_bytes:
        return commands, None
    cast = relays.broadcast(round_, artifact.sha256, data, [c.peer for c in carrying], now)
    for send in carrying:
        cast.hold(send)
    held = set(map(id, carrying))
    return [c for c in commands if id(c) not in held] + list(cast.take_commands()), cast


class Broadcast:
    """The coordinator's side of one relayed artifact: the plans, the deadlines, the fallbacks."""

    def __init__(self, relays: Relays, round_: int, artifact: str, data: bytes, targets: list[str], now: float,
                 timeout_ms: float) -> None:
        self.relays = relays
        self.round = round_
        self.artifact = artifact
        self.timeout_ms = timeout_ms
        self.pieces = relays.pieces(artifact, data)
        self.total = len(data)
        self.delivered: set[str] = set()
        self.gone: set[str] = set()
        self.fell_back: set[str] = set()
        self.given_up: set[str] = set()  # a direct send that failed as well: the round's deadline decides
        self.errors: list[str] = []  # named, newest last: "peer: reason"
        self.waiting: dict[str, Send] = {}  # a target's Assign, sent once it holds the artifact
        self._commands: list[Send | Log] = []
        # Peers blamed before relay nothing: they hang straight under the coordinator, as leaves.
        trusted = [t for t in targets if t not in relays.blamed]
        relays_ok = len(self.pieces) > 1 and len(trusted) > 1
        self.plan: dict[str, tuple[str | None, tuple[str, ...]]] = (
            tree(trusted, relays.fanout) if relays_ok else {t: (None, ()) for t in trusted})
        self.plan.update({t: (None, ()) for t in targets if t in relays.blamed})
        self.deadline = {t: now + timeout_ms for t in targets}
        direct = sum(1 for t in targets if self.plan[t][0] is None)
        self._commands.append(Log("relay.planned", {"round": round_, "artifact": artifact, "targets": len(targets),
                                                    "fromCoordinator": direct, "pieces": len(self.pieces)}))
        for target in targets:
            self._send_plan(target)
        for target in targets:
            if self.plan[target][0] is None:
                self._send_pieces(target)

    # ----------------------------------------------------------------- host surface

    def take_commands(self) -> list[Send | Log]:
        if self.complete:
            self.pieces = []  # only a fallback needs them, and none can come any more
        out, self._commands = self._commands, []
        return out

    @property
    def complete(self) -> bool:
        """Every target holds the artifact, or left."""
        return self.deadline.keys() <= self.delivered | self.gone | self.given_up

    def next_timer(self) -> float | None:
        open_ = [d for t, d in self.deadline.items() if t not in self.delivered | self.gone | self.given_up]
        return min(open_) if open_ else None

    def handle_timer(self, now: float) -> None:
        for target, deadline in list(self.deadline.items()):
            if now >= deadline and target not in self.delivered | self.gone | self.given_up:
                source = self.plan[target][0]
                if source is None:
                    self._error(target, "stalled: no relayDone from a direct send by its deadline")
                    self._give_up(target)
                else:
                    self._blame(source, f"stalled: {target} had not received every piece by its deadline", now)

    def relay_done(self, peer: str, message: RelayDone, now: float) -> None:
        """A target's report; one that is not about this broadcast, or not from a target, is logged and ignored."""
        if message.job_id != self.relays.job_id or message.round != self.round or message.artifact != self.artifact:
            self._log("relay.ignored", peer, "stale")
            return
        if peer not in self.plan or peer in self.delivered:
            self._log("relay.ignored", peer, "not-a-target" if peer not in self.plan else "duplicate")
            return
        if message.ok:
            self.delivered.add(peer)
            self._release(peer, relayed=True)
            return
        source = self.plan[peer][0]
        if source is None or message.source != source:
            # A direct send is the coordinator's own bytes; a report about another peer is not this plan's.
            self._error(peer, f"reports {message.error} from {message.source}, which is not its relay")
            return
        self._blame(source, f"sent {peer} {message.error}", now)

    def peer_left(self, peer: str, now: float) -> None:
        """A target's channel closed: it gets nothing more, and what it should have relayed goes direct."""
        if peer not in self.plan or peer in self.gone:
            return
        self.gone.add(peer)
        self.waiting.pop(peer, None)
        if self.plan[peer][1]:
            self._blame(peer, "left", now)

    # -------------------------------------------------------------------- internals

    def _blame(self, relay: str, why: str, now: float) -> None:
        """``relay`` fails as a relay: each target below it without the artifact goes direct (once)."""
        self.relays.blamed.setdefault(relay, why)
        self._error(relay, why)
        for child in self.plan[relay][1]:
            if child in self.delivered or child in self.gone:
                continue
            if child in self.fell_back:
                self._error(child, "its direct send failed too")
                self._give_up(child)
                continue
            self.fell_back.add(child)
            self.plan[child] = (None, self.plan[child][1])
            self.deadline[child] = now + self.timeout_ms
            self._send_plan(child)
            self._send_pieces(child)
        self.plan[relay] = (self.plan[relay][0], ())

    def hold(self, send: Send) -> None:
        """Keep ``send`` (an Assign naming the artifact) until its peer holds the artifact."""
        self.waiting[send.peer] = send

    def _release(self, peer: str, *, relayed: bool) -> None:
        send = self.waiting.pop(peer, None)
        if send is None:
            return
        if relayed:  # the peer holds it now: the Assign names it without carrying it
            send = Send(send.peer, send.message, tuple(a for a in send.attachments if a.sha256 != self.artifact),
                        send.blobs)
        self._commands.append(send)

    def _give_up(self, target: str) -> None:
        """Relaying failed twice for ``target``: its Assign goes as before the relay, the artifact attached."""
        self.given_up.add(target)
        self._release(target, relayed=False)

    def _send_plan(self, target: str) -> None:
        source, children = self.plan[target]
        plan = RelayPlan(self.relays.job_id, self.round, self.artifact, self.total,
                         source if source is not None else self.relays.coordinator, children,
                         tuple(p for p, _ in self.pieces))
        self._commands.append(Send(target, plan))

    def _send_pieces(self, target: str) -> None:
        for index, (piece, data) in enumerate(self.pieces):
            ref = ArtifactRef("checkpoint", piece.sha256, piece.bytes)
            message = RelayPiece(self.relays.job_id, self.round, self.artifact, index, ref)
            self._commands.append(Send(target, message, (ref,), {piece.sha256: data}))

    def _error(self, peer: str, why: str) -> None:
        self.errors.append(f"{peer}: {why}")
        self._commands.append(Log("relay.failed", {"peer": peer, "artifact": self.artifact, "error": why}))

    def _log(self, event: str, peer: str, reason: str) -> None:
        self._commands.append(Log(event, {"peer": peer, "artifact": self.artifact, "reason": reason}))


@dataclass
class _Held:
    plan: RelayPlan
    coordinator: str  # who sent the plan: the one to report to
    pieces: dict[int, bytes] = field(default_factory=dict)
    forwarded: dict[str, set[int]] = field(default_factory=dict)  # child -> indices sent to it
    failed: bool = False
    done: bool = False


class RelayNode:
    """A participant's side: take plans from its coordinator, check and forward pieces, assemble.

    ``verify`` hashes (hex SHA-256) a piece that arrives in a plain mapping
    and every assembled artifact (None: ``sha256_hex``). Pieces in
    ``VerifiedBlobs`` (the frame reader's) are not hashed again.
    """

    def __init__(self, my_peer_id: str, *, max_plans: int = 2, max_bytes: int = 512_000_000,
                 verify: Callable[[bytes], str] | None = None) -> None:
        self.my_peer_id = my_peer_id
        self.max_plans = max_plans
        self.max_bytes = max_bytes
        self.verify = verify or sha256_hex
        self.held: dict[str, _Held] = {}  # artifact -> its plan and pieces, oldest first
        self.assembled: dict[str, bytes] = {}  # artifact -> bytes that hash to it, until the host takes them
        self._commands: list[Send | Log] = []

    def take_commands(self) -> list[Send | Log]:
        out, self._commands = self._commands, []
        return out

    @property
    def kept(self) -> set[str]:
        """The artifacts this node assembled and still plans for: the host keeps them for the Assign naming them."""
        return {sha for sha, held in self.held.items() if held.done}

    def take_assembled(self) -> VerifiedBlobs:
        """Artifacts completed since the last call, each hashed whole when it was assembled."""
        out, self.assembled = VerifiedBlobs(self.assembled), {}
        return out

    def plan(self, sender: str, plan: RelayPlan, *, job_id: str | None, coordinator: str | None) -> None:
        """A plan from ``sender``; taken only from the coordinator of the job this participant takes part in."""
        if job_id is None or plan.job_id != job_id or sender != coordinator:
            self._log("relay.ignored", sender, "not-my-job")
            return
        if self.my_peer_id in plan.forward_to or plan.source == self.my_peer_id:
            self._log("relay.ignored", sender, "bad-plan")
            return
        newest = max((h.plan.round for h in self.held.values()), default=0)
        if plan.round < newest and plan.artifact not in self.held:
            self._log("relay.ignored", sender, "stale")
            return
        held = self.held.get(plan.artifact)
        if held is not None:
            if held.plan.pieces != plan.pieces:
                self._log("relay.ignored", sender, "bad-plan")
                return
            held.plan, held.failed = plan, False  # a fallback: new source, same pieces
            for index in sorted(held.pieces):
                self._forward(held, index)
            return
        if plan.bytes > self.max_bytes:
            self._log("relay.ignored", sender, "too-large")
            return
        self.held[plan.artifact] = _Held(plan, sender)
        while len(self.held) > self.max_plans or sum(h.plan.bytes for h in self.held.values()) > self.max_bytes:
            oldest = next(iter(self.held))
            del self.held[oldest]
            self._log("relay.dropped", sender, oldest)

    def piece(self, sender: str, message: RelayPiece, blobs: Mapping[str, bytes]) -> None:
        """A piece with its attachment (verified by the frame reader against ``message.data.sha256``)."""
        held = self.held.get(message.artifact)
        if held is None or held.done or message.job_id != held.plan.job_id or message.round != held.plan.round:
            self._log("relay.ignored", sender, "no-plan" if held is None else "stale")
            return
        if sender != held.plan.source:
            self._log("relay.ignored", sender, "not-the-source")  # e.g. the old relay after a fallback
            return
        if held.failed:
            return  # waiting for the coordinator's fallback plan
        pieces = held.plan.pieces
        data = blobs.get(message.data.sha256)
        expected = pieces[message.index] if message.index < len(pieces) else None
        if expected is None or (message.data.sha256, message.data.bytes) != (expected.sha256, expected.bytes):
            self._fail(held, sender, f"bad-piece: piece {message.index} is not the one the plan lists")
            return
        if data is None or len(data) != expected.bytes or (
                not is_verified(blobs) and self.verify(data) != expected.sha256):
            self._fail(held, sender, f"hash-mismatch: piece {message.index}")
            return
        if message.index in held.pieces:
            self._log("relay.ignored", sender, "duplicate")
            return
        held.pieces[message.index] = data
        self._forward(held, message.index)
        if len(held.pieces) == len(pieces):
            whole = b"".join(held.pieces[i] for i in range(len(pieces)))
            held.pieces = {}
            digest = self.verify(whole)
            if digest != held.plan.artifact:
                # Every piece was the plan's, so the plan itself names bytes it does not list: the
                # coordinator's doing, reported as its own (no relay is blamed), and nothing is kept.
                self._fail(held, held.coordinator, f"assembled-mismatch: the pieces join to {digest[:16]}..., "
                                                   f"not the plan's artifact {held.plan.artifact[:16]}...")
                return
            held.done = True
            self.assembled[held.plan.artifact] = whole
            self._commands.append(Log("relay.received", {"round": held.plan.round, "artifact": held.plan.artifact,
                                                         "source": held.plan.source}))
            self._report(held, held.plan.source, None)

    def transfer_failed(self, sender: str, reason: str) -> None:
        """The frame reader refused a transfer from ``sender`` (e.g. ``hash-mismatch``): if ``sender`` is
        the source of a plan still open, the coordinator hears of it now rather than at the deadline."""
        for held in self.held.values():
            if not held.done and not held.failed and held.plan.source == sender:
                self._fail(held, sender, reason)

    # -------------------------------------------------------------------- internals

    def _forward(self, held: _Held, index: int) -> None:
        piece = held.plan.pieces[index]
        ref = ArtifactRef("checkpoint", piece.sha256, piece.bytes)
        for child in held.plan.forward_to:
            sent = held.forwarded.setdefault(child, set())
            if index not in sent:
                sent.add(index)
                message = RelayPiece(held.plan.job_id, held.plan.round, held.plan.artifact, index, ref)
                self._commands.append(Send(child, message, (ref,), {piece.sha256: held.pieces[index]}))

    def _fail(self, held: _Held, source: str, error: str) -> None:
        held.failed = True
        self._log("relay.failed", source, error)
        self._report(held, source, error)

    def _report(self, held: _Held, source: str, error: str | None) -> None:
        plan = held.plan
        self._commands.append(Send(held.coordinator, RelayDone(plan.job_id, plan.round, plan.artifact, source,
                                                               error is None, error)))

    def _log(self, event: str, peer: str, reason: str) -> None:
        self._commands.append(Log(event, {"peer": peer, "reason": reason}))
