"""The checkpoint relay (core/links/relay.py) under simulated time: plans, pipelines, fallbacks, bad relays.

A small in-memory network carries the Send commands between one
coordinator (``Broadcast``) and the participants' ``RelayNode``s in FIFO
order, through the JSON form of every message (so the strict parsers run),
and checks each attachment's SHA-256 on the way as the frame reader does.
"""

from __future__ import annotations

import hashlib
import json
from collections import deque
from collections.abc import Callable

import pytest

from weei.core.wire.commands import Log, Send
from weei.core.wire.messages import ArtifactRef, MessageError, decode_message
from weei.core.links.relay import Broadcast, RelayNode, Relays, split, tree
from weei.core.wire.messages import Piece, RelayDone, RelayPiece, RelayPlan

C = "coord"
JOB = "job-1"
PIECE = 1000


def blob(n: int, seed: int = 1) -> bytes:
    return bytes((i * 7 + seed) % 251 for i in range(n))


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Net:
    """The coordinator's broadcast and N nodes; ``tamper`` may rewrite a Send a node makes."""

    def __init__(self, peers: list[str], *, verify: bool = False) -> None:
        self.relays = Relays(C, JOB, fanout=1, piece_bytes=PIECE, min_relay_bytes=4 * PIECE)
        self.nodes = {p: RelayNode(p, verify=(lambda d: sha(d)) if verify else None) for p in peers}
        self.queue: deque[tuple[str, Send]] = deque()
        self.sent_by: dict[str, int] = {}  # piece bytes each peer sent
        self.logs: list[Log] = []
        self.got: dict[str, bytes] = {}
        self.tamper: Callable[[str, Send], Send | None] = lambda sender, send: send
        self.cast: Broadcast | None = None
        self.left: set[str] = set()

    def start(self, data: bytes, round_: int = 1, now: float = 0.0, targets: list[str] | None = None) -> Broadcast:
        self.cast = self.relays.broadcast(round_, sha(data), data, targets or list(self.nodes), now)
        self._take(C, self.cast.take_commands())
        return self.cast

    def _take(self, sender: str, commands: list[Send | Log]) -> None:
        for command in commands:
            if isinstance(command, Log):
                self.logs.append(command)
                continue
            command = self.tamper(sender, command) if sender != C else command
            if command is not None:
                self.queue.append((sender, command))

    def run(self, now: float = 0.0) -> None:
        while self.queue:
            self.step(now)

    def step(self, now: float = 0.0) -> tuple[str, Send]:
        """Deliver the oldest message in flight."""
        sender, send = self.queue.popleft()
        self.deliver(sender, send, now)
        return sender, send

    def deliver(self, sender: str, send: Send, now: float) -> None:
        if send.peer in self.left or sender in self.left:
            return
        message = decode_message(json.loads(json.dumps(send.message.to_json())))  # the strict parser
        blobs = {ref.sha256: send.blobs[ref.sha256] for ref in send.attachments}
        self.sent_by[sender] = self.sent_by.get(sender, 0) + sum(len(b) for b in blobs.values())
        if any(sha(b) != s for s, b in blobs.items()):
            # The frame reader refuses the transfer (hash-mismatch); the message never arrives.
            if send.peer != C:
                self.nodes[send.peer].transfer_failed(sender, "hash-mismatch")
                self._take(send.peer, self.nodes[send.peer].take_commands())
            return
        if send.peer == C:
            assert isinstance(message, RelayDone) and self.cast is not None
            self.cast.relay_done(sender, message, now)
            self._take(C, self.cast.take_commands())
            return
        node = self.nodes[send.peer]
        if isinstance(message, RelayPlan):
            node.plan(sender, message, job_id=JOB, coordinator=C)
        else:
            assert isinstance(message, RelayPiece)
            node.piece(sender, message, blobs)
        for data in node.take_assembled().values():
            self.got[send.peer] = data
        self._take(send.peer, node.take_commands())


def test_tree_layout() -> None:
    assert tree(["a", "b", "c"], 1) == {"a": (None, ("b",)), "b": ("a", ("c",)), "c": ("b", ())}
    assert tree(["a", "b", "c", "d", "e"], 2) == {
        "a": (None, ("c", "d")), "b": (None, ("e",)), "c": ("a", ()), "d": ("a", ()), "e": ("b", ())}
    pieces = split(blob(2500), 1000)
    assert [p.bytes for p, _ in pieces] == [1000, 1000, 500]
    assert b"".join(d for _, d in pieces) == blob(2500)


def test_a_chain_delivers_to_every_target_with_one_copy_from_the_coordinator() -> None:
    data = blob(10 * PIECE + 17)
    net = Net(["p1", "p2", "p3", "p4"])
    cast = net.start(data)
    plans = [s for _, s in net.queue if isinstance(s.message, RelayPlan)]
    assert [(s.peer, s.message.source, s.message.forward_to) for s in plans] == [  # type: ignore[attr-defined]
        ("p1", C, ("p2",)), ("p2", "p1", ("p3",)), ("p3", "p2", ("p4",)), ("p4", "p3", ())]
    net.run()
    assert net.got == {"p1": data, "p2": data, "p3": data, "p4": data}
    assert cast.complete and cast.delivered == {"p1", "p2", "p3", "p4"} and not cast.errors
    assert net.sent_by[C] == len(data)  # one copy, not four
    assert net.sent_by["p1"] == net.sent_by["p2"] == net.sent_by["p3"] == len(data)
    assert net.sent_by["p4"] == 0  # its relayDone only
    assert cast.next_timer() is None and cast.pieces == []  # the coordinator's copy in pieces is freed


def test_the_pieces_flow_as_a_pipeline() -> None:
    # p1 passes piece 0 on as soon as it has it, while the coordinator's other pieces are still on the way.
    data = blob(8 * PIECE)
    net = Net(["p1", "p2"])
    net.start(data)
    while not any(sender == "p1" for sender, _ in net.queue):
        net.step()
    forwarded = [(s.peer, s.message.index) for sender, s in net.queue  # type: ignore[attr-defined]
                 if sender == "p1"]
    waiting = [s.message.index for sender, s in net.queue if sender == C]  # type: ignore[attr-defined]
    assert forwarded == [("p2", 0)] and waiting == [1, 2, 3, 4, 5, 6, 7]
    net.run()
    assert net.got["p2"] == data


def test_a_fanout_tree_and_a_small_artifact() -> None:
    data = blob(9 * PIECE)
    net = Net(["p1", "p2", "p3", "p4", "p5"])
    net.relays.fanout = 2
    cast = net.start(data)
    net.run()
    assert cast.complete and set(net.got) == {"p1", "p2", "p3", "p4", "p5"}
    assert net.sent_by[C] == 2 * len(data)
    small = Net(["p1", "p2", "p3"])
    cast = small.start(blob(3 * PIECE))  # under min_relay_bytes: everyone straight from the coordinator
    assert all(s.message.source == C and not s.message.forward_to  # type: ignore[attr-defined]
               for _, s in small.queue if isinstance(s.message, RelayPlan))
    small.run()
    assert cast.complete and small.sent_by[C] == 3 * 3 * PIECE


def test_a_relay_that_leaves_is_replaced_by_a_direct_send() -> None:
    data = blob(10 * PIECE)
    net = Net(["p1", "p2", "p3"])
    cast = net.start(data)
    for _ in range(12):  # part of the way: p1 got some pieces and forwarded a few
        net.step()
    assert "p2" not in net.got
    net.left.add("p1")
    cast.peer_left("p1", 500.0)
    net._take(C, cast.take_commands())
    net.run(600.0)
    assert net.got["p2"] == net.got["p3"] == data
    assert cast.complete and cast.delivered == {"p2", "p3"} and cast.gone == {"p1"}
    assert cast.errors == ["p1: left"] and net.relays.blamed == {"p1": "left"}
    # p2 went direct and kept relaying to p3, which ignored the pieces p1 no longer sends.
    assert cast.plan["p2"] == (None, ("p3",)) and cast.fell_back == {"p2"}


def test_a_relay_sending_another_piece_is_named_and_skipped() -> None:
    data = blob(6 * PIECE)
    other = blob(PIECE, seed=9)

    def swap(sender: str, send: Send) -> Send:
        if sender == "p2" and isinstance(send.message, RelayPiece) and send.message.index == 3:
            ref = ArtifactRef("checkpoint", sha(other), len(other))
            return Send(send.peer, RelayPiece(JOB, 1, send.message.artifact, 3, ref), (ref,), {ref.sha256: other})
        return send

    net = Net(["p1", "p2", "p3", "p4"])
    net.tamper = swap
    cast = net.start(data)
    net.run(100.0)
    assert net.got["p3"] == net.got["p4"] == data
    assert cast.complete and cast.fell_back == {"p3"}
    assert cast.errors == ["p2: sent p3 bad-piece: piece 3 is not the one the plan lists"]
    assert "p2" in net.relays.blamed
    # The next broadcast: p2 receives straight from the coordinator and relays for nobody.
    net.tamper = lambda sender, send: send
    nxt = net.start(blob(6 * PIECE, seed=3), round_=2)
    assert nxt.plan["p2"] == (None, ()) and all("p2" not in kids for _, kids in nxt.plan.values())
    net.run()
    assert nxt.complete and not nxt.errors


def test_a_relay_sending_garbage_bytes_is_named() -> None:
    data = blob(6 * PIECE)

    def garble(sender: str, send: Send) -> Send:
        if sender == "p1" and isinstance(send.message, RelayPiece) and send.message.index == 2:
            ref = send.attachments[0]
            return Send(send.peer, send.message, send.attachments, {ref.sha256: b"x" * ref.bytes})
        return send

    net = Net(["p1", "p2", "p3"])
    net.tamper = garble
    cast = net.start(data)
    net.run(100.0)
    assert cast.errors == ["p1: sent p2 hash-mismatch"]
    assert net.got["p2"] == net.got["p3"] == data and cast.complete


def test_a_node_that_verifies_refuses_bytes_under_a_false_hash() -> None:
    # A host whose transport does not verify attachments passes ``verify``: the node hashes each piece.
    data = blob(5 * PIECE)
    pieces = split(data, PIECE)
    node = RelayNode("p2", verify=sha)
    plan = RelayPlan(JOB, 1, sha(data), len(data), "p1", ("p3",), tuple(p for p, _ in pieces))
    node.plan(C, plan, job_id=JOB, coordinator=C)
    ref = ArtifactRef("checkpoint", pieces[0][0].sha256, PIECE)
    node.piece("p1", RelayPiece(JOB, 1, sha(data), 0, ref), {ref.sha256: b"y" * PIECE})
    sends = [c for c in node.take_commands() if isinstance(c, Send)]
    assert [(s.peer, s.message) for s in sends] == [
        (C, RelayDone(JOB, 1, sha(data), "p1", False, "hash-mismatch: piece 0"))]  # and nothing forwarded to p3


def test_a_stalled_relay_times_out_into_a_direct_send() -> None:
    data = blob(6 * PIECE)
    net = Net(["p1", "p2", "p3"])
    net.tamper = lambda sender, send: None if sender == "p1" and isinstance(send.message, RelayPiece) else send
    cast = net.start(data, now=0.0)
    net.run()
    assert set(net.got) == {"p1"} and cast.next_timer() == cast.timeout_ms
    cast.handle_timer(cast.timeout_ms - 1)
    assert not cast.take_commands()
    cast.handle_timer(cast.timeout_ms)
    net._take(C, cast.take_commands())
    net.run(cast.timeout_ms)
    assert net.got["p2"] == net.got["p3"] == data and cast.complete
    assert cast.errors[0].startswith("p1: stalled: p2 had not received every piece")
    assert cast.next_timer() is None


def test_a_direct_send_that_stalls_is_given_up_once() -> None:
    data = blob(6 * PIECE)
    net = Net(["p1", "p2"])
    net.tamper = lambda sender, send: None if isinstance(send.message, RelayDone) else send
    cast = net.start(data)
    net.run()
    cast.handle_timer(cast.timeout_ms)  # p1 never reported; p1 is the source of p2
    net._take(C, cast.take_commands())
    net.run()
    cast.handle_timer(2 * cast.timeout_ms)
    assert cast.given_up == {"p1", "p2"} and cast.complete and cast.next_timer() is None
    assert "p2: its direct send failed too" in cast.errors or "p2: stalled: no relayDone from a direct send by its " \
                                                               "deadline" in cast.errors


def test_duplicates_stale_and_strangers_are_ignored() -> None:
    data = blob(4 * PIECE)
    pieces = split(data, PIECE)
    node = RelayNode("p2", max_plans=2, max_bytes=10 * PIECE)
    plan = RelayPlan(JOB, 5, sha(data), len(data), "p1", (), tuple(p for p, _ in pieces))
    node.plan("intruder", plan, job_id=JOB, coordinator=C)  # not our coordinator
    node.plan(C, RelayPlan("job-2", 5, sha(data), len(data), "p1", (), plan.pieces), job_id=JOB, coordinator=C)
    assert not node.held
    node.plan(C, plan, job_id=JOB, coordinator=C)

    def give(sender: str, index: int, round_: int = 5) -> None:
        p, d = pieces[index]
        ref = ArtifactRef("checkpoint", p.sha256, p.bytes)
        node.piece(sender, RelayPiece(JOB, round_, sha(data), index, ref), {p.sha256: d})

    give("p1", 0)
    give("p1", 0)  # duplicate
    give("p3", 1)  # not the source
    give("p1", 1, round_=4)  # stale round
    reasons = [c.details.get("reason") for c in node.take_commands() if isinstance(c, Log)]
    assert reasons == ["not-my-job", "not-my-job", "duplicate", "not-the-source", "stale"]
    for i in (1, 2, 3):
        give("p1", i)
    assert node.take_assembled() == {sha(data): data}
    give("p1", 3)  # after completion: stale
    old = RelayPlan(JOB, 4, "c" * 64, 10, C, (), (Piece("d" * 64, 10),))
    node.plan(C, old, job_id=JOB, coordinator=C)  # an older round than the newest plan
    assert [c.details.get("reason") for c in node.take_commands() if isinstance(c, Log)][-2:] == ["stale", "stale"]
    # Bounded: at most two plans, and at most max_bytes of them.
    node.plan(C, RelayPlan(JOB, 6, "e" * 64, 10, C, (), (Piece("d" * 64, 10),)), job_id=JOB, coordinator=C)
    node.plan(C, RelayPlan(JOB, 7, "f" * 64, 10, C, (), (Piece("d" * 64, 10),)), job_id=JOB, coordinator=C)
    assert list(node.held) == ["e" * 64, "f" * 64]
    node.plan(C, RelayPlan(JOB, 8, "0" * 64, 11 * PIECE, C, (), (Piece("d" * 64, 11 * PIECE),)), job_id=JOB,
              coordinator=C)
    assert "0" * 64 not in node.held


def test_the_coordinator_ignores_reports_that_are_not_about_its_plan() -> None:
    data = blob(6 * PIECE)
    net = Net(["p1", "p2"])
    cast = net.start(data)
    cast.take_commands()
    cast.relay_done("p9", RelayDone(JOB, 1, sha(data), C, True), 0.0)  # not a target
    cast.relay_done("p1", RelayDone(JOB, 2, sha(data), C, True), 0.0)  # another round
    cast.relay_done("p1", RelayDone(JOB, 1, sha(data), "p2", False, "bad-piece"), 0.0)  # blames a non-source
    cast.relay_done("p1", RelayDone(JOB, 1, sha(data), C, True), 0.0)
    cast.relay_done("p1", RelayDone(JOB, 1, sha(data), C, True), 0.0)  # duplicate
    logs = [c.details.get("reason") for c in cast.take_commands() if isinstance(c, Log)]
    assert logs == ["not-a-target", "stale", None, "duplicate"]
    assert cast.delivered == {"p1"} and not net.relays.blamed


@pytest.mark.parametrize("change, field", [
    ({"bytes": 31}, "pieces"),
    ({"forwardTo": ["p2", "p2"]}, "forwardTo"),
    ({"forwardTo": ["coord"]}, "forwardTo"),
    ({"forwardTo": [f"p{i}" for i in range(9)]}, "forwardTo"),
    ({"pieces": []}, "pieces"),
    ({"pieces": [{"sha256": "a" * 64, "bytes": 1}] * 1025}, "pieces"),
    ({"pieces": [{"sha256": "A" * 64, "bytes": 30}]}, "pieces.0.sha256"),
    ({"bytes": 256_000_001}, "bytes"),
    ({"round": 0}, "round"),
    ({"source": "x" * 65}, "source"),
])
def test_plans_are_parsed_strictly(change: dict[str, object], field: str) -> None:
    good = RelayPlan(JOB, 3, "a" * 64, 30, "coord", ("p2",), (Piece("b" * 64, 20), Piece("c" * 64, 10))).to_json()
    with pytest.raises(MessageError) as err:
        decode_message({**good, **change})
    assert err.value.reason == "bad-field" and f"message.{field}" in str(err.value)


@pytest.mark.parametrize("obj, field", [
    ({"type": "relayPiece", "jobId": JOB, "round": 1, "artifact": "a" * 64, "index": 0,
      "data": {"kind": "module", "sha256": "b" * 64, "bytes": 5}}, "data"),
    ({"type": "relayPiece", "jobId": JOB, "round": 1, "artifact": "a" * 64, "index": 1024,
      "data": {"kind": "checkpoint", "sha256": "b" * 64, "bytes": 5}}, "index"),
    ({"type": "relayDone", "jobId": JOB, "round": 1, "artifact": "a" * 64, "source": "p", "ok": False}, "error"),
    ({"type": "relayDone", "jobId": JOB, "round": 1, "artifact": "a" * 64, "source": "p", "ok": True,
      "error": "x"}, "error"),
    ({"type": "relayDone", "jobId": JOB, "round": 1, "artifact": "a" * 64, "source": "p", "ok": "yes"}, "ok"),
])
def test_pieces_and_reports_are_parsed_strictly(obj: dict[str, object], field: str) -> None:
    with pytest.raises(MessageError) as err:
        decode_message(obj)
    assert err.value.reason == "bad-field" and f"message.{field}" in str(err.value)
