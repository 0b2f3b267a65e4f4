"""LinkManager (weei.core.links.peerlink) under simulated time: peers wired in memory, no WebRTC.

``Net`` plays the platform and the signaling server for several managers:
it carries out their commands (a description is ``sdp-<kind>-<link>``, a
channel opens once the offerer has applied the answer, frames go straight
to the other side's link, closing a link closes its other end), and keeps
what the adapters would show: notes, candidates applied, deliveries.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from weei.core.wire.commands import Send
from weei.core.wire.framing import data_frame, message_begin_frame
from weei.core.wire.messages import ArtifactRef, Deliver
from weei.core.links.peerlink import CHANNEL_LABEL, LinkManager, offers_to
from weei.core.links.peerlink_commands import (AddCandidate, CloseLink, CreateLink, MakeAnswer, MakeOffer, Note, Pump,
                                         SendSignal, SetRemote, Wake)

A, B, C = "a" * 26, "b" * 26, "c" * 26
BAD = {"candidate": "candidate:bad", "sdpMid": "0", "sdpMLineIndex": 0}
GOOD = {"candidate": "candidate:1 1 udp 1 192.0.2.1 5000 typ host", "sdpMid": "0", "sdpMLineIndex": 0}


class Net:
    def __init__(self, *peers: str, hold_signals: bool = False) -> None:
        self.now = 0.0
        self.m = {p: LinkManager() for p in peers}
        self.hold = hold_signals
        self.signals: list[tuple[str, str, str, Any]] = []  # to, from, kind, payload
        self.links: dict[tuple[str, int], dict[str, Any]] = {}
        self.notes: list[tuple[str, str, str]] = []
        self.applied: list[tuple[str, int, dict[str, Any]]] = []
        self.got: list[tuple[str, str, str, Any]] = []  # receiver, kind, from, message
        self.frames_sent = 0
        for p in peers:
            self.run(p, self.m[p].welcomed(p, ({"urls": ["stun:example.org"]},), self.now))

    # -- the platform
    def run(self, me: str, commands: list[Any]) -> None:
        for c in commands:
            m = self.m[me]
            if isinstance(c, CreateLink):
                self.links[(me, c.link)] = {"peer": c.peer, "offerer": c.offerer, "closed": False, "ice": c.ice_servers}
            elif isinstance(c, MakeOffer | MakeAnswer):
                kind = "offer" if isinstance(c, MakeOffer) else "answer"
                self.run(me, m.local_description(c.link, f"sdp-{kind}-{c.link}"))
            elif isinstance(c, SetRemote):
                self.run(me, m.remote_set(c.link))
                if c.kind == "answer":  # the offerer applied the answer: the channel opens on both ends
                    other = self.other_end(me, c.link)
                    self.run(me, m.channel_open(c.link, self.now))
                    if other is not None:
                        assert self.m[other[0]].accepts_channel(other[1], CHANNEL_LABEL)
                        self.run(other[0], self.m[other[0]].channel_open(other[1], self.now))
            elif isinstance(c, AddCandidate):
                if c.init.get("candidate") == BAD["candidate"]:
                    self.run(me, m.candidate_refused(c.link, "OperationError: bad candidate"))
                else:
                    self.applied.append((me, c.link, c.init))
            elif isinstance(c, SendSignal):
                self.signals.append((c.peer, me, c.kind, c.payload))
                if not self.hold:
                    self.flush()
            elif isinstance(c, Pump):
                other = self.other_end(me, c.link)
                for frame in m.frames(c.link, 0, self.now):
                    self.frames_sent += 1
                    if other is not None:
                        self.run(other[0], self.m[other[0]].frame(other[1], frame, self.now))
            elif isinstance(c, CloseLink):
                self.links[(me, c.link)]["closed"] = True
                other = self.other_end(me, c.link)
                if other is not None:
                    self.run(other[0], self.m[other[0]].link_closed(other[1], "channel closed", self.now))
            elif isinstance(c, Wake):
                self.drain(me, c.peer)
            elif isinstance(c, Note):
                self.notes.append((me, c.level, c.text))

    def drain(self, me: str, peer: str) -> None:
        while (item := self.m[me].take(peer)) is not None:
            self.got.append((me, item.kind, item.peer, item.message))

    def other_end(self, me: str, link: int) -> tuple[str, int] | None:
        peer = self.links[(me, link)]["peer"]
        live = [k for k, v in self.links.items() if k[0] == peer and v["peer"] == me and not v["closed"]]
        return live[-1] if live else None

    # -- the signaling server
    def flush(self, count: int | None = None) -> None:
        """Relay the signals in flight (``count``: only that many, in order)."""
        while self.signals and count != 0:
            count = None if count is None else count - 1
            to, sender, kind, payload = self.signals.pop(0)
            self.run(to, self.m[to].signal(sender, kind, payload, self.now))

    def room(self, *peers: str) -> None:
        for p in peers:
            self.run(p, self.m[p].room(peers, self.now))

    def advance(self, ms: float) -> None:
        """Move the clock, firing every timer that falls due on the way."""
        end = self.now + ms
        while True:
            due = [t for t in (m.next_timer() for m in self.m.values()) if t is not None and t <= end]
            if not due:
                break
            self.now = max(self.now, min(due))
            for p, m in self.m.items():
                timer = m.next_timer()
                if timer is not None and timer <= self.now:
                    self.run(p, m.handle_timer(self.now))
        self.now = end

    def kinds(self, me: str) -> list[tuple[str, str]]:
        return [(kind, peer) for who, kind, peer, _ in self.got if who == me]


def deliver(peer: str, job: str, data: bytes = b"") -> tuple[Send, dict[str, bytes]]:
    sha = hashlib.sha256(data).hexdigest()
    ref = ArtifactRef("module", sha, len(data))
    return Send(peer, Deliver(job, ref, {"id": job}), (ref,)), {sha: data}


def test_the_lower_id_offers_and_both_ends_see_connected() -> None:
    net = Net(A, B)
    net.room(A, B)
    assert offers_to(A, B) and not offers_to(B, A) and not offers_to(None, A)
    assert [v["offerer"] for (p, _), v in net.links.items()] == [True, False]
    assert list(net.links)[0][0] == A, "A (lower ID) made the first peer connection"
    assert net.links[(A, 1)]["ice"] == ({"urls": ["stun:example.org"]},)
    assert net.m[A].peers() == [B] and net.m[B].peers() == [A]
    assert net.kinds(A) == [("connected", B)] and net.kinds(B) == [("connected", A)]
    assert net.m[A].next_timer() == 5_000.0  # only the stall sweep is left: the watchdog ended


def test_three_peers_make_one_connection_per_pair() -> None:
    net = Net(A, B, C)
    net.room(A, B, C)
    offerers = sorted((me, v["peer"]) for (me, _), v in net.links.items() if v["offerer"])
    assert offerers == [(A, B), (A, C), (B, C)]
    assert net.m[C].peers() == [A, B]


def test_candidates_wait_for_the_remote_description_and_a_bad_one_is_logged_and_skipped() -> None:
    net = Net(A, B, hold_signals=True)
    net.room(A, B)
    net.flush(1)  # the offer reaches B; B's answer is held
    assert [kind for _, _, kind, _ in net.signals] == ["answer"]
    # candidates from B that arrive before the answer (one of them bad) are kept
    net.run(A, net.m[A].signal(B, "candidate", BAD, net.now))
    net.run(A, net.m[A].signal(B, "candidate", {**GOOD, "extra": "dropped"}, net.now))
    assert not [x for x in net.applied if x[0] == A], "kept until the remote description is set"
    net.hold = False
    net.flush()
    assert [(who, init) for who, _, init in net.applied] == [(A, GOOD)], "the bad one skipped, the good one applied"
    assert (A, "info", f"candidate from {B} refused: OperationError: bad candidate") in net.notes
    assert net.m[A].peers() == [B], "one bad candidate does not tear the link down"
    assert net.m[A].transfers_state() == {"transfers": [], "transferErrors": {}}
    net.run(A, net.m[A].signal(B, "candidate", GOOD, net.now))  # after: applied at once
    assert len(net.applied) == 2


def test_local_candidates_are_signalled_only_after_our_sdp() -> None:
    m = LinkManager()
    m.welcomed(A, (), 0)
    create, offer = m.room((A, B), 0)
    assert isinstance(create, CreateLink) and offer == MakeOffer(create.link)
    assert m.local_candidate(create.link, GOOD) == []
    assert m.local_candidate(create.link, None) == []
    assert m.local_description(create.link, "sdp") == [
        SendSignal(B, "offer", "sdp"), SendSignal(B, "candidate", GOOD), SendSignal(B, "candidate", {"candidate": ""})]
    assert m.local_candidate(create.link, GOOD) == [SendSignal(B, "candidate", GOOD)]


def test_unexpected_signals_are_ignored_with_a_note() -> None:
    m = LinkManager()
    m.welcomed(A, (), 0)
    assert m.signal(C, "answer", "sdp", 0) == [Note("info", f"answer from {C}, which has no connection: ignored")]
    link = m.room((A, B), 0)[0].link
    assert m.signal(B, "offer", 42, 0) == [Note("info", f"unexpected offer from {B}: ignored")]
    assert m.signal(B, "answer", {"not": "sdp"}, 0) == [Note("info", f"unexpected answer from {B}: ignored")]
    assert m.signal(B, "candidate", "text", 0) == [Note("info", f"unexpected candidate from {B}: ignored")]
    assert m.signal(B, "answer", "sdp", 0) == [SetRemote(link, "answer", "sdp")]


def test_messages_arrive_in_order_per_peer_and_are_logged() -> None:
    net = Net(A, B, C)
    net.room(A, B, C)
    for i in range(5):
        net.run(A, net.m[A].send(*deliver(B, f"to-b-{i}", bytes([i]) * (70_000 * i))))
        net.run(C, net.m[C].send(*deliver(B, f"from-c-{i}")))
    from_a = [m.job_id for who, kind, peer, m in net.got if who == B and kind == "message" and peer == A]
    from_c = [m.job_id for who, kind, peer, m in net.got if who == B and kind == "message" and peer == C]
    assert from_a == [f"to-b-{i}" for i in range(5)] and from_c == [f"from-c-{i}" for i in range(5)]
    assert [(r.direction, r.type, r.bytes) for r in net.m[A].log] == [("send", "deliver", 70_000 * i) for i in range(5)]
    received = [r for r in net.m[B].log if r.peer == A]
    assert [r.bytes for r in received] == [70_000 * i for i in range(5)] and received[2].kinds == ("module",)
    assert net.m[A].bytes_sent > 70_000 * 10 and net.m[B].bytes_received > net.m[A].bytes_sent  # C's too


def test_deliveries_queue_while_the_receiver_is_busy_and_one_wake_per_drainer() -> None:
    m = LinkManager()
    m.welcomed(B, (), 0)
    create, set_remote = m.signal(A, "offer", "sdp", 0)
    assert set_remote == SetRemote(create.link, "offer", "sdp") and not create.offerer
    assert m.remote_set(create.link) == [MakeAnswer(create.link)]
    assert [type(c) for c in m.channel_open(create.link, 0)] == [Note, Wake]
    writer_peer = LinkManager()
    writer_peer.welcomed(A, (), 0)
    link_a = writer_peer.room((A, B), 0)[0].link
    writer_peer.channel_open(link_a, 0)
    frames: list[bytes] = []
    for i in range(3):
        writer_peer.send(*deliver(B, f"job-{i}"))
        frames += writer_peer.frames(link_a, 0, 0)
    wakes = [c for f in frames for c in m.frame(create.link, f, 0) if isinstance(c, Wake)]
    assert wakes == [], "the connected delivery's drainer has not run yet: no second drainer"
    items = []
    while (item := m.take(A)) is not None:
        items.append((item.kind, getattr(item.message, "job_id", None)))
    assert items == [("connected", None), ("message", "job-0"), ("message", "job-1"), ("message", "job-2")]
    assert [c for c in m.link_closed(create.link, "channel closed", 0) if isinstance(c, Wake)] == [Wake(A)]
    assert m.take(A).kind == "disconnected" and m.take(A) is None


def test_broken_channel_and_refused_message_are_named_in_transfer_errors() -> None:
    net = Net(A, B)
    net.room(A, B)
    b_link = next(k[1] for k, v in net.links.items() if k[0] == B and not v["closed"])
    # a message whose JSON is no message: that transfer is dropped, the channel goes on
    for frame in (message_begin_frame(99, 8, []), data_frame(99, 0, b"not json")):
        net.run(A, net.m[A].frame(next(k[1] for k in net.links if k[0] == A), frame, net.now))
    assert net.m[A].transfers_state()["transferErrors"][f"message:{B}"].startswith("bad-message: invalid message")
    assert net.m[A].peers() == [B]
    # garbage breaks the channel: A tears down, B hears the close; both get one disconnected
    net.run(A, net.m[A].frame(next(k[1] for k, v in net.links.items() if k[0] == A and not v["closed"]),
                              b"\x00garbage", net.now))
    errors = net.m[A].transfers_state()["transferErrors"]
    assert errors[f"channel:{B}"].startswith("bad-frame: ") and f"message:{B}" in errors
    assert net.kinds(A) == [("connected", B), ("disconnected", B)]
    assert net.kinds(B) == [("connected", A), ("disconnected", A)]
    assert net.m[A].peers() == [] and net.links[(B, b_link)]["closed"] is True
    # A (the offerer) retries after 1 s; the channel error is cleared when the new channel opens
    net.advance(999)
    assert net.m[A].peers() == []
    net.advance(1)
    assert net.m[A].peers() == [B] and f"channel:{B}" not in net.m[A].transfers_state()["transferErrors"]
    assert net.kinds(B)[-1] == ("connected", A)


def test_text_on_the_channel_breaks_it() -> None:
    net = Net(A, B)
    net.room(A, B)
    link = next(k[1] for k in net.links if k[0] == B)
    net.run(B, net.m[B].frame(link, "hello", net.now))
    assert net.m[B].transfers_state()["transferErrors"][f"channel:{A}"] == \
        "bad-frame: a text message on the channel"


def test_watchdog_and_backoff_then_success_resets_the_backoff() -> None:
    net = Net(A, B, hold_signals=True)
    net.room(A, B)
    net.signals.clear()  # the offer is lost
    assert net.m[A].next_timer() == 30_000.0
    net.advance(30_000)
    assert (A, "info", f"connection to {B} closed: not open after 30 s") in net.notes
    created = lambda: sum(1 for (me, _), v in net.links.items() if me == A)  # noqa: E731
    for attempt, wait in enumerate((1_000, 2_000, 4_000, 8_000, 16_000, 30_000, 30_000)):
        assert created() == attempt + 1
        net.advance(wait - 1)
        assert created() == attempt + 1, f"retry {attempt} came early"
        net.advance(1)
        assert created() == attempt + 2
        net.signals.clear()
        net.advance(30_000)  # its watchdog
    net.hold = False
    net.advance(1_000 * 30)
    assert net.m[A].peers() == [B]
    assert net.kinds(A) == [("connected", B)], "never opened before: no disconnected delivered"
    link = next(k[1] for k, v in net.links.items() if k[0] == A and not v["closed"])
    net.run(A, net.m[A].link_closed(link, "connection failed", net.now))
    net.advance(1_000)
    assert net.m[A].peers() == [B], "the backoff started again at 1 s"


def test_leaving_the_room_tears_down_without_retry_and_an_answerer_never_retries() -> None:
    net = Net(A, B)
    net.room(A, B)
    net.run(A, net.m[A].room((A,), net.now))
    assert net.m[A].peers() == [] and net.kinds(A)[-1] == ("disconnected", B)
    assert net.m[A].next_timer() is None, "no retry for a peer that left; no reader to expire"
    net2 = Net(A, B)
    net2.room(A, B)
    link = next(k[1] for k in net2.links if k[0] == B)
    net2.links[(A, 1)]["closed"] = True  # B's close does not reach A
    net2.run(B, net2.m[B].link_closed(link, "connection failed", net2.now))
    assert net2.m[B].next_timer() is None, "B sorts higher: it waits for A's offer"


def test_a_close_that_outruns_the_room_list_retries_once_then_the_list_ends_it_quietly() -> None:
    """B closes; A hears the channel go before signaling's list drops B (the order under load in the browser)."""
    net = Net(A, B, hold_signals=True)
    net.room(A, B)
    net.flush()
    a_link = next(k[1] for k, v in net.links.items() if k[0] == A and v["peer"] == B)
    net.links[(B, 1)]["closed"] = True  # B is gone: its end answers nothing
    net.run(A, net.m[A].link_closed(a_link, "channel closed", net.now))
    assert net.kinds(A) == [("connected", B), ("disconnected", B)] and net.m[A].members() == (A, B)
    net.advance(1000)  # the retry falls due while signaling still lists B
    assert list(net.m[A].links()) == [B] and not net.m[A].links()[B][1]
    net.run(A, net.m[A].room((A,), net.now))
    assert net.m[A].links() == {} and net.m[A].members() == (A,)
    assert net.kinds(A) == [("connected", B), ("disconnected", B)], "a link that never opened is no disconnection"
    assert net.m[A].next_timer() is None
    net.advance(60_000)
    assert net.m[A].links() == {}


def test_a_new_offer_replaces_the_link_and_a_new_peer_id_ends_every_pairing() -> None:
    m = LinkManager()
    m.welcomed(B, (), 0)
    first = m.signal(A, "offer", "one", 0)[0].link
    m.remote_set(first)
    m.channel_open(first, 0)
    out = m.signal(A, "offer", "two", 0)
    assert CloseLink(first) in out and isinstance(out[-1], SetRemote) and out[-1].link != first
    assert m.remote_set(first) == [] and m.local_description(first, "x") == [], "the old link is gone"
    m.channel_open(out[-1].link, 0)
    assert [c for c in m.welcomed("z" * 26, (), 0) if isinstance(c, CloseLink)] == [CloseLink(out[-1].link)]
    assert m.peers() == [] and m.peer_id == "z" * 26


def test_send_without_a_channel_is_dropped_and_counted() -> None:
    m = LinkManager()
    m.welcomed(A, (), 0)
    assert m.send(*deliver(B, "lost")) == [Note("info", f"dropped deliver to {B}: no open channel")]
    assert m.dropped == 1


def test_stalled_transfers_expire_and_a_closed_link_fails_its_transfers() -> None:
    net = Net(A, B)
    net.room(A, B)
    link = next(k[1] for k in net.links if k[0] == B)
    sha = "ab" * 32
    from weei.core.wire.framing import artifact_begin_frame
    net.run(B, net.m[B].frame(link, artifact_begin_frame(7, "module", sha, 1000), net.now))
    net.run(B, net.m[B].frame(link, data_frame(7, 0, b"x" * 10), net.now))
    state = net.m[B].transfers_state()
    assert [(t["peerId"], t["artifactId"], t["totalBytes"]) for t in state["transfers"]] == [(A, sha, 1000)]
    net.advance(115_000)
    assert len(net.m[B].transfers_state()["transfers"]) == 1, "not stalled yet"
    net.advance(10_000)  # the sweep every 5 s finds it silent for 2 minutes
    assert net.m[B].transfers_state()["transfers"] == []
    assert net.m[B].transfers_state()["transferErrors"][sha].startswith("stalled: ")
    net.run(B, net.m[B].frame(link, artifact_begin_frame(8, "module", "cd" * 32, 1000), net.now))
    net.run(B, net.m[B].close(net.now))
    assert net.m[B].transfers_state()["transferErrors"]["cd" * 32].startswith("channel-closed: ")
    assert net.m[B].next_timer() is None and net.m[B].take(A) is None, "closing delivers nothing more"


def test_transfers_state_shape_and_bounded_errors() -> None:
    m = LinkManager()
    state = m.transfers_state()
    assert state == {"transfers": [], "transferErrors": {}}
    from weei.core.wire.framing import FrameError, FrameReason
    for i in range(300):
        m._error(f"channel:{i}", FrameError(FrameReason.BAD_FRAME, str(i)))
    errors = m.transfers_state()["transferErrors"]
    assert len(errors) == 256 and "channel:299" in errors and "channel:0" not in errors


@pytest.mark.parametrize("label", ["other", CHANNEL_LABEL])
def test_the_answerer_takes_only_the_first_weei_channel(label: str) -> None:
    m = LinkManager()
    m.welcomed(B, (), 0)
    link = m.signal(A, "offer", "sdp", 0)[0].link
    assert m.accepts_channel(link, label) is (label == CHANNEL_LABEL)
    m.channel_open(link, 0)
    assert not m.accepts_channel(link, CHANNEL_LABEL)
