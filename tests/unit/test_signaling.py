"""The signaling server: the sans-I/O hub under fake time, then the real
aiohttp endpoint on 127.0.0.1 with raw WebSocket clients."""

from __future__ import annotations

import asyncio
import json
import string
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from hypothesis import given, settings
from hypothesis import strategies as st

from weei.core.errors import UsageError
from weei.core.wire.signaling_session import room_code
from weei.server.rooms import (
    Close,
    CloseCode,
    Hub,
    Limits,
    Phase,
    Reason,
    RoomSend,
    TokenBucket,
    make_token,
    verify_token,
)
from weei.server.signaling import (
    SIGNALING_KEY,
    IceServer,
    RelayRecord,
    SignalingConfig,
    add_signaling,
    create_signaling_app,
)

SECRET = b"s" * 32


def J(key: str) -> dict[str, Any]:
    """The join frame of the room of key ``key``."""
    return {"type": "join", "room": room_code(key), "key": key}


def C(key: str) -> str:
    """The room code of ``key`` (what peer lists name)."""
    return room_code(key)


def untokened(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Frames without the joiner's resume token (asserted separately)."""
    return [{k: v for k, v in f.items() if k != "token"} for f in frames]
SDP = "v=0\r\no=- 4611731400430051336 2 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\n"
CANDIDATE = {"candidate": "candidate:842163049 1 udp 1677729535 192.0.2.7 46154 typ srflx",
             "sdpMid": "0", "sdpMLineIndex": 0, "usernameFragment": "EsBn"}


# ---------------------------------------------------------------------------
# The hub, sans I/O


def frames_to(outputs: list[Any], conn: int) -> list[dict[str, Any]]:
    return [dict(o.frame) for o in outputs if isinstance(o, RoomSend) and o.conn == conn]


def closes(outputs: list[Any]) -> list[Close]:
    return [o for o in outputs if isinstance(o, Close)]


class HubPeers:
    """A hub and a few connections driven by hand, with ``now`` ticking."""

    def __init__(self, limits: Limits | None = None, secret: bytes = SECRET) -> None:
        self.hub = Hub(limits or Limits(), secret)
        self.now = 0.0

    def connect(self) -> int:
        conn, out = self.hub.connect(self.now)
        assert out == []
        return conn

    def send(self, conn: int, frame: Any) -> list[Any]:
        text = frame if isinstance(frame, str) else json.dumps(frame)
        return self.hub.on_frame(conn, text, self.now)

    def hello(self, conn: int, token: str | None = None) -> dict[str, Any]:
        frame: dict[str, Any] = {"type": "hello"}
        if token is not None:
            frame["token"] = token
        out = self.send(conn, frame)
        (welcome,) = [f for f in frames_to(out, conn) if f["type"] == "welcome"]
        return welcome

    def joined(self, room: str) -> tuple[int, str]:
        conn = self.connect()
        peer = self.hello(conn)["peerId"]
        out = self.send(conn, J(room))
        assert frames_to(out, conn)[-1]["type"] == "peers"
        return conn, peer


def test_phases_table_decides_what_is_allowed() -> None:
    h = HubPeers()
    conn = h.connect()
    out = h.send(conn, {"type": "join", "room": "r"})
    assert frames_to(out, conn) == [{"type": "error", "reason": "hello-required", "refused": "join",
                                     "message": "join is not allowed in phase new"}]
    h.hello(conn)
    assert frames_to(h.send(conn, {"type": "hello"}), conn)[0]["reason"] == "already-welcomed"
    out = h.send(conn, {"type": "signal", "to": "x", "kind": "offer", "payload": SDP})
    assert frames_to(out, conn)[0]["reason"] == "not-in-room"
    assert frames_to(h.send(conn, {"type": "join", "room": C("r")}), conn)[0]["reason"] == "room-key-required"
    h.send(conn, J("r"))
    assert frames_to(h.send(conn, J("q")), conn)[0]["reason"] == "already-in-room"
    assert frames_to(h.send(conn, {"type": "ping"}), conn) == [{"type": "pong"}]
    assert h.hub._conns[conn].phase is Phase.JOINED


def test_relay_only_inside_the_room_and_rebuilt() -> None:
    h = HubPeers()
    a, pa = h.joined("room")
    b, pb = h.joined("room")
    c, pc = h.joined("other")
    out = h.send(a, {"type": "signal", "to": pb, "kind": "candidate", "payload": CANDIDATE})
    assert out == [RoomSend(b, {"type": "signal", "from": pa, "kind": "candidate", "payload": CANDIDATE})]
    out = h.send(a, {"type": "signal", "to": pc, "kind": "offer", "payload": SDP})
    assert frames_to(out, c) == [] and frames_to(out, a)[0]["reason"] == "unknown-peer"
    out = h.send(a, {"type": "signal", "to": pa, "kind": "offer", "payload": SDP})
    assert frames_to(out, a)[0]["reason"] == "self-addressed"
    assert h.hub.stats.relayed == {"candidate": 1}


@pytest.mark.parametrize(("kind", "payload", "reason"), [
    ("offer", {"sdp": SDP}, "bad-payload"),
    ("offer", "hello weights", "bad-payload"),
    ("answer", "v=0" + "a" * 40000, "payload-too-large"),
    ("candidate", "candidate:1 1 udp 1 1.2.3.4 5 typ host", "bad-payload"),
    ("candidate", {**CANDIDATE, "weights": [1, 2, 3]}, "bad-payload"),
    ("candidate", {"candidate": "not a candidate"}, "bad-payload"),
    ("candidate", {"candidate": "candidate:" + "x" * 3000}, "payload-too-large"),
    ("candidate", {"candidate": "", "sdpMLineIndex": True}, "bad-payload"),
    ("candidate", {"candidate": "", "sdpMid": 5}, "bad-payload"),
    ("pranswer", SDP, "bad-kind"),
    ("weights", "AAAA", "bad-kind"),
])
def test_payloads_are_validated(kind: str, payload: Any, reason: str) -> None:
    h = HubPeers()
    a, _ = h.joined("r")
    b, pb = h.joined("r")
    out = h.send(a, {"type": "signal", "to": pb, "kind": kind, "payload": payload})
    assert frames_to(out, b) == []
    assert frames_to(out, a)[0]["reason"] == reason
    assert h.hub.stats.refused[reason] == 1


def test_end_of_candidates_and_minimal_candidate_pass() -> None:
    h = HubPeers()
    a, _ = h.joined("r")
    b, pb = h.joined("r")
    for payload in ({"candidate": ""}, {"candidate": "", "sdpMid": None, "sdpMLineIndex": None}):
        out = h.send(a, {"type": "signal", "to": pb, "kind": "candidate", "payload": payload})
        assert frames_to(out, b)[0]["payload"] == payload


@pytest.mark.parametrize(("frame", "reason"), [
    ("{not json", "bad-json"),
    ("[1, 2]", "bad-json"),
    ('{"type": "ping", "x": NaN}', "bad-json"),
    ("[" * 60000, "bad-json"),  # deeper than Python's recursion limit
    ('{"type": "weights", "data": [1]}', "unknown-type"),
    ('{"kind": "offer"}', "unknown-type"),
    ('{"type": "ping", "extra": 1}', "bad-message"),
    ('{"type": "hello", "version": 2}', "unsupported-version"),
    ('{"type": "hello", "token": 5}', "bad-message"),
    ("x" * (64 * 1024 + 1), "frame-too-large"),
])
def test_malformed_frames_are_refused_by_name(frame: str, reason: str) -> None:
    h = HubPeers()
    conn = h.connect()
    out = h.send(conn, frame)
    assert frames_to(out, conn)[0]["reason"] == reason
    assert h.hub.stats.refused == {reason: 1}
    assert h.hub.on_frame(conn, b"\x00\x01", h.now) == [RoomSend(conn, {
        "type": "error", "reason": "binary-frame", "message": "the protocol uses JSON text frames only"})]


@pytest.mark.parametrize("room", ["", "a b", "ä", "x" * 65, "room/1", "../etc", 7, None])
def test_bad_room_codes(room: Any) -> None:
    h = HubPeers()
    conn = h.connect()
    h.hello(conn)
    out = h.send(conn, {"type": "join", "room": room})
    assert frames_to(out, conn)[0]["reason"] == "bad-room"
    out = h.send(conn, J("Good_room-42"))
    assert frames_to(out, conn)[0]["type"] == "peers"


def test_peer_lists_on_join_and_leave_in_join_order() -> None:
    h = HubPeers()
    a, pa = h.joined("r")
    b, pb = h.joined("r")
    c = h.connect()
    pc = h.hello(c)["peerId"]
    out = h.send(c, J("r"))
    for conn in (a, b, c):
        assert untokened(frames_to(out, conn)) == [{"type": "peers", "room": C("r"), "peers": [pa, pb, pc]}]
    assert [("token" in f) for conn in (a, b, c) for f in frames_to(out, conn)] == [False, False, True]
    out = h.hub.disconnect(b, h.now)
    assert frames_to(out, a) == frames_to(out, c) == [{"type": "peers", "room": C("r"), "peers": [pa, pc]}]
    assert h.hub.disconnect(b, h.now) == []  # idempotent
    h.hub.disconnect(a, h.now)
    h.hub.disconnect(c, h.now)
    assert h.hub.room_count == 0 and h.hub.peers_in(C("r")) == ()


def test_room_and_server_limits() -> None:
    h = HubPeers(Limits(max_peers_per_room=2, max_rooms=2, max_connections=7))
    h.joined("a")
    h.joined("a")
    conn = h.connect()
    h.hello(conn)
    assert frames_to(h.send(conn, J("a")), conn)[0]["reason"] == "room-full"
    h.joined("b")
    assert frames_to(h.send(conn, J("c")), conn)[0]["reason"] == "too-many-rooms"
    assert frames_to(h.send(conn, J("b")), conn)[0]["type"] == "peers"
    h.connect()
    h.connect()
    h.connect()
    conn, out = h.hub.connect(h.now)
    assert out == [Close(conn, CloseCode.TRY_AGAIN_LATER, "server-full")]


def test_rate_limit_and_strikes_close_an_abuser() -> None:
    h = HubPeers(Limits(rate=10, burst=5, max_strikes=3, strike_recovery_s=10))
    conn = h.connect()
    for _ in range(5):
        assert frames_to(h.send(conn, {"type": "ping"}), conn) == [{"type": "pong"}]
    out = h.send(conn, {"type": "ping"})
    assert frames_to(out, conn)[0]["reason"] == "rate-limited" and not closes(out)
    h.now += 0.1  # one token back
    assert frames_to(h.send(conn, {"type": "ping"}), conn) == [{"type": "pong"}]
    h.now += 10.0
    for _ in range(3):
        assert not closes(h.send(conn, "junk"))
    out = h.send(conn, "junk")
    assert closes(out) == [Close(conn, CloseCode.POLICY_VIOLATION, "too-many-errors")]
    assert h.hub.connection_count == 0
    assert h.hub.stats.closed["too-many-errors"] == 1


def test_strikes_recover_slowly() -> None:
    h = HubPeers(Limits(max_strikes=2, strike_recovery_s=5))
    conn = h.connect()
    for _ in range(10):  # one mistake every 5 s is forgiven forever
        assert not closes(h.send(conn, "junk"))
        h.now += 5.0


def test_token_bucket() -> None:
    bucket = TokenBucket.full(rate=2, burst=3, now=0)
    assert [bucket.take(0) for _ in range(4)] == [True, True, True, False]
    assert bucket.take(0.5) and not bucket.take(0.5)
    assert bucket.take(100) and bucket.tokens == 2  # capped at burst


def test_handshake_and_idle_timeouts() -> None:
    h = HubPeers(Limits(handshake_timeout_s=10, idle_timeout_s=60))
    lurker = h.connect()
    h.hello(lurker)  # welcomed but never joins
    a, pa = h.joined("r")
    b, pb = h.joined("r")
    h.now = 9.9
    assert h.hub.expire(h.now) == []
    h.now = 10
    out = h.hub.expire(h.now)
    assert closes(out) == [Close(lurker, CloseCode.TIMEOUT, "handshake-timeout")]
    h.now = 50
    h.send(a, {"type": "ping"})
    h.now = 60
    out = h.hub.expire(h.now)
    assert closes(out) == [Close(b, CloseCode.TIMEOUT, "idle-timeout")]
    assert frames_to(out, a) == [{"type": "peers", "room": C("r"), "peers": [pa]}]
    h.now = 110
    assert closes(h.hub.expire(h.now)) == [Close(a, CloseCode.TIMEOUT, "idle-timeout")]


def test_resume_token_keeps_the_peer_id_and_replaces_a_stale_socket() -> None:
    h = HubPeers(Limits(resume_ttl_s=100))
    a, pa = h.joined("r")
    b, pb = h.joined("r")
    token = make_token(SECRET, pa, C("r"), 10**9)
    assert verify_token(SECRET, token, 10**9 - 1) == (pa, C("r"))
    assert verify_token(SECRET, token, 10**9) is None  # expired
    assert verify_token(b"t" * 32, token, 0) is None
    assert verify_token(SECRET, pb + token[26:], 0) is None  # a token is bound to its peer ID...
    assert verify_token(SECRET, token.replace(C("r"), C("q")), 0) is None  # ...and to its room
    again = h.connect()
    h.hello(again)
    out = h.send(again, J("r"))
    token = frames_to(out, again)[-1]["token"]  # the token comes with the join, bound to the room
    h.hub.disconnect(again, h.now)
    again = h.connect()
    out = h.send(again, {"type": "hello", "token": token})
    assert closes(out) == []  # a token alone takes nothing: the join with the key does
    welcome = frames_to(out, again)[0]
    resumed_id = welcome["peerId"]
    assert welcome["resumed"] is True and verify_token(SECRET, welcome["token"], 0)[1] == C("r")
    out = h.send(again, J("q"))
    assert frames_to(out, again)[0]["reason"] == "resume-wrong-room" and closes(out) == []
    out = h.send(again, J("r"))
    assert closes(out) == []  # the earlier socket of that ID had left already
    assert h.hub.peers_in(C("r")) == (pa, pb, resumed_id)
    # the same token again, on a third socket: joining replaces the stale one
    third = h.connect()
    h.send(third, {"type": "hello", "token": token})
    out = h.send(third, J("r"))
    assert closes(out) == [Close(again, CloseCode.REPLACED, "replaced")]
    assert frames_to(out, b)[-1] == {"type": "peers", "room": C("r"), "peers": [pa, pb, resumed_id]}
    # the replaced connection's late disconnect changes nothing
    assert h.hub.disconnect(again, h.now) == []
    assert h.hub.peers_in(C("r")) == (pa, pb, resumed_id)


def test_resume_tokens_expire_and_unbound_tokens_resume_nothing() -> None:
    clock = [1000.0]
    h = HubPeers(Limits(resume_ttl_s=60))
    h.hub._unix_clock = lambda: clock[0]
    conn = h.connect()
    welcome = h.hello(conn)
    assert h.hello(h.connect(), token=welcome["token"])["resumed"] is False  # issued before any join
    out = h.send(conn, J("r"))
    token = frames_to(out, conn)[-1]["token"]
    clock[0] = 1059.0
    assert h.hello(h.connect(), token=token)["peerId"] == welcome["peerId"]
    clock[0] = 1060.0
    late = h.hello(h.connect(), token=token)
    assert late["resumed"] is False and late["peerId"] != welcome["peerId"]


def test_restart_same_secret_keeps_id_new_secret_gives_new_id() -> None:
    first = HubPeers()
    conn = first.connect()
    welcome = first.hello(conn)
    token = frames_to(first.send(conn, J("r")), conn)[-1]["token"]
    same = HubPeers(secret=SECRET)
    resumed = same.hello(same.connect(), token=token)
    assert (resumed["peerId"], resumed["resumed"]) == (welcome["peerId"], True)
    other = HubPeers(secret=b"n" * 32)
    fresh = other.hello(other.connect(), token=token)
    assert fresh["peerId"] != welcome["peerId"] and fresh["resumed"] is False
    garbage = other.hello(other.connect(), token="not-a-token")
    assert garbage["resumed"] is False


def test_peer_ids_are_random_base32() -> None:
    h = HubPeers()
    ids = {h.hello(h.connect())["peerId"] for _ in range(50)}
    assert len(ids) == 50
    assert all(len(p) == 26 and set(p) <= set(string.ascii_lowercase + "234567") for p in ids)


def test_bad_configuration_is_a_usage_error() -> None:
    with pytest.raises(UsageError):
        Hub(Limits(), b"short")
    with pytest.raises(UsageError):
        Limits(rate=0)
    with pytest.raises(UsageError):
        Limits(max_sdp_bytes=70000)
    with pytest.raises(UsageError):
        IceServer(("turn:turn.example.org:3478",))  # TURN without credentials
    with pytest.raises(UsageError):
        IceServer(("http://x",))
    with pytest.raises(UsageError):
        SignalingConfig(secret=b"short")


def test_ice_servers_fixed_and_coturn_rest_credentials() -> None:
    import base64
    import hashlib
    import hmac

    stun = IceServer.parse("stun:stun.example.org:3478")
    fixed = IceServer.parse("turn:turn.example.org:3478,turns:turn.example.org:5349|alice|pw")
    rest = IceServer.parse("turn:turn.example.org:3478|secret:coturn-shared")
    assert stun.describe("p", 0) == {"urls": ["stun:stun.example.org:3478"]}
    assert fixed.describe("p", 0) == {"urls": ["turn:turn.example.org:3478", "turns:turn.example.org:5349"],
                                      "username": "alice", "credential": "pw"}
    entry = rest.describe("peer", 1_000_000)
    assert entry["username"] == f"{1_000_000 + 86400}:peer"
    expected = hmac.new(b"coturn-shared", entry["username"].encode(), hashlib.sha1).digest()
    assert entry["credential"] == base64.b64encode(expected).decode()


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
                     max_leaves=12)
_frames = st.one_of(
    st.text(max_size=200),
    _json.map(json.dumps),
    st.fixed_dictionaries({"type": st.sampled_from(["hello", "join", "signal", "ping", "x"])},
                          optional={"room": _json | st.just("r") | st.just(C("r")), "key": _json | st.just("r"),
                                    "to": _json, "token": _json,
                                    "kind": st.sampled_from(["offer", "answer", "candidate", "data"]),
                                    "payload": _json | st.just(SDP) | st.just(CANDIDATE)}).map(json.dumps),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_frames, min_size=1, max_size=20))
def test_fuzz_only_named_errors_and_signaling_kinds_leave_the_hub(frames: list[str]) -> None:
    h = HubPeers(Limits(max_strikes=1000))
    a, pa = h.joined("r")
    fuzzer = h.connect()
    h.send(fuzzer, {"type": "hello"})
    for frame in frames:
        for output in h.send(fuzzer, frame.replace("<A>", pa)):
            if isinstance(output, Close):
                continue
            sent = dict(output.frame)
            assert sent["type"] in {"welcome", "peers", "signal", "pong", "error"}
            if sent["type"] == "error":
                assert sent["reason"] in {r.value for r in Reason}
            if sent["type"] == "signal":
                assert sent["kind"] in {"offer", "answer", "candidate"}
                assert set(sent) == {"type", "from", "kind", "payload"}


# ---------------------------------------------------------------------------
# The aiohttp endpoint


class RawPeer:
    """A raw WebSocket client: sends anything, reads JSON frames."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.peer_id = ""
        self.token = ""

    async def send(self, frame: Any) -> None:
        await self.ws.send_str(frame if isinstance(frame, str) else json.dumps(frame))

    async def recv(self, timeout: float = 5.0) -> dict[str, Any]:
        msg = await self.ws.receive(timeout)
        assert msg.type is aiohttp.WSMsgType.TEXT, (msg.type, msg.data, msg.extra)
        return json.loads(msg.data)

    async def recv_type(self, kind: str) -> dict[str, Any]:
        while True:
            frame = await self.recv()
            if frame["type"] == kind:
                return frame

    async def hello(self, token: str | None = None) -> dict[str, Any]:
        await self.send({"type": "hello", **({"token": token} if token else {})})
        welcome = await self.recv()
        assert welcome["type"] == "welcome", welcome
        self.peer_id, self.token = welcome["peerId"], welcome["token"]
        return welcome

    async def join(self, room: str) -> list[str]:
        await self.send(J(room))
        while True:
            frame = await self.recv()
            assert frame["type"] == "peers", frame
            if self.peer_id in frame["peers"]:
                self.token = frame["token"]  # bound to this room
                return frame["peers"]

    async def closed(self, timeout: float = 5.0) -> tuple[int | None, str]:
        """Wait for the server's close; skips frames; (code, reason)."""
        while True:
            msg = await self.ws.receive(timeout)
            if msg.type is aiohttp.WSMsgType.CLOSE:
                return msg.data, msg.extra
            if msg.type in (aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
                return self.ws.close_code, ""


class Server:
    def __init__(self, server: TestServer, session: aiohttp.ClientSession, log: list[RelayRecord]) -> None:
        self.server = server
        self.session = session
        self.log = log

    @property
    def url(self) -> str:
        return str(self.server.make_url("/signal"))

    @property
    def stats(self) -> Any:
        return self.server.app[SIGNALING_KEY].hub.stats

    async def peer(self, room: str | None = None, token: str | None = None) -> RawPeer:
        peer = RawPeer(await self.session.ws_connect(self.url))
        await peer.hello(token)
        if room is not None:
            await peer.join(room)
        return peer


@asynccontextmanager
async def serving(config: SignalingConfig | None = None) -> AsyncIterator[Server]:
    log: list[RelayRecord] = []
    config = replace(config or SignalingConfig(secret=SECRET), relay_log=log.append)
    server = TestServer(create_signaling_app(config), host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as session:
            yield Server(server, session, log)
    finally:
        await server.close()


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_two_and_three_peers_see_each_other() -> None:
    async def scenario() -> None:
        async with serving(SignalingConfig(secret=SECRET, ice_servers=(IceServer(("stun:stun.example.org",)),))) as s:
            a = RawPeer(await s.session.ws_connect(s.url))
            welcome = await a.hello()
            assert welcome["iceServers"] == [{"urls": ["stun:stun.example.org"]}]
            assert welcome["limits"]["maxFrameBytes"] == 64 * 1024 and welcome["version"] == 1
            assert await a.join("lab") == [a.peer_id]
            b = await s.peer()
            assert await b.join("lab") == [a.peer_id, b.peer_id]
            assert (await a.recv())["peers"] == [a.peer_id, b.peer_id]
            c = await s.peer("lab")
            for p in (a, b):
                assert (await p.recv()) == {"type": "peers", "room": C("lab"),
                                            "peers": [a.peer_id, b.peer_id, c.peer_id]}
            await b.ws.close()
            for p in (a, c):
                assert (await p.recv())["peers"] == [a.peer_id, c.peer_id]
    run(scenario())


def test_offer_answer_candidate_reach_only_the_addressed_peer() -> None:
    async def scenario() -> None:
        async with serving() as s:
            a, b, c = [await s.peer("lab") for _ in range(3)]
            x = await s.peer("elsewhere")
            for p in (a, a, b):  # drain the peer lists
                await p.recv_type("peers")
            await a.send({"type": "signal", "to": b.peer_id, "kind": "offer", "payload": SDP})
            assert await b.recv() == {"type": "signal", "from": a.peer_id, "kind": "offer", "payload": SDP}
            await b.send({"type": "signal", "to": a.peer_id, "kind": "answer", "payload": SDP})
            assert (await a.recv())["kind"] == "answer"
            await a.send({"type": "signal", "to": b.peer_id, "kind": "candidate", "payload": CANDIDATE})
            assert (await b.recv())["payload"] == CANDIDATE
            # across rooms: refused, and nothing arrives at x
            await x.send({"type": "signal", "to": a.peer_id, "kind": "offer", "payload": SDP})
            assert (await x.recv())["reason"] == "unknown-peer"
            await c.send({"type": "ping"})
            assert await c.recv() == {"type": "pong"}  # c got nothing in between
            await x.send({"type": "ping"})
            assert await x.recv() == {"type": "pong"}
            with pytest.raises(asyncio.TimeoutError):
                await a.ws.receive(0.2)
            assert s.stats.relayed == {"offer": 1, "answer": 1, "candidate": 1}
    run(scenario())


def test_refusals_are_named_and_the_server_keeps_serving() -> None:
    async def scenario() -> None:
        async with serving() as s:
            a = await s.peer("lab")
            b = await s.peer("lab")
            await a.recv_type("peers")
            bad = await s.peer()
            cases = [
                ("{oops", "bad-json"),
                ('{"type": "weights", "tensor": [0.1, 0.2]}', "unknown-type"),
                ("x" * (64 * 1024 + 10), "frame-too-large"),
                ({"type": "join", "room": "no spaces"}, "bad-room"),
                ({"type": "join", "room": "z" * 100}, "bad-room"),
            ]
            for frame, reason in cases:
                await bad.send(frame)
                error = await bad.recv()
                assert (error["type"], error["reason"]) == ("error", reason)
            await bad.join("lab")
            await bad.send({"type": "signal", "to": "aaaaaaaaaaaaaaaaaaaaaaaaaa", "kind": "offer", "payload": SDP})
            assert (await bad.recv())["reason"] == "unknown-peer"
            await bad.ws.send_bytes(b"\x00weights")
            assert (await bad.recv())["reason"] == "binary-frame"
            # the others are still served
            await a.send({"type": "signal", "to": b.peer_id, "kind": "offer", "payload": SDP})
            assert (await b.recv_type("signal"))["from"] == a.peer_id
            assert s.stats.refused == {"bad-json": 1, "unknown-type": 1, "frame-too-large": 1, "bad-room": 2,
                                       "unknown-peer": 1, "binary-frame": 1}
    run(scenario())


def test_frames_above_the_hard_cap_close_only_that_socket() -> None:
    async def scenario() -> None:
        async with serving() as s:
            a = await s.peer("lab")
            huge = await s.peer("lab")
            assert len((await a.recv_type("peers"))["peers"]) == 2
            await huge.send("y" * (200 * 1024))
            code, _ = await huge.closed()
            assert code == aiohttp.WSCloseCode.MESSAGE_TOO_BIG
            assert (await a.recv_type("peers"))["peers"] == [a.peer_id]
    run(scenario())


def test_rate_limit_then_repeated_abuse_closes_the_socket() -> None:
    async def scenario() -> None:
        limits = Limits(rate=1, burst=5, max_strikes=10, strike_recovery_s=60)
        async with serving(SignalingConfig(secret=SECRET, limits=limits)) as s:
            calm = await s.peer("lab")
            flood = await s.peer()  # hello used one token
            for _ in range(30):
                await flood.send({"type": "ping"})
            replies = []
            while True:
                msg = await flood.ws.receive(5)
                if msg.type is not aiohttp.WSMsgType.TEXT:
                    break
                replies.append(json.loads(msg.data))
            assert replies[:4] == [{"type": "pong"}] * 4
            assert {r.get("reason") for r in replies[4:]} == {"rate-limited"}
            assert len(replies) == 4 + 11  # ten strikes, the eleventh refusal closes
            assert msg.type is aiohttp.WSMsgType.CLOSE
            assert (msg.data, msg.extra) == (1008, "too-many-errors")
            assert s.stats.refused["rate-limited"] == 11
            await calm.send({"type": "ping"})
            assert await calm.recv() == {"type": "pong"}
    run(scenario())


def test_reconnect_with_token_keeps_the_peer_id() -> None:
    async def scenario() -> None:
        async with serving() as s:
            a = await s.peer("lab")
            b = await s.peer("lab")
            await a.recv_type("peers")
            old_id, token = a.peer_id, a.token
            await a.ws.close()
            assert (await b.recv())["peers"] == [b.peer_id]
            again = await s.peer(token=token)
            assert again.peer_id == old_id
            await again.join("lab")
            assert (await b.recv())["peers"] == [b.peer_id, old_id]
            # a stale socket is replaced by the resumed one when that joins the room
            third = await s.peer(token=token)
            assert third.peer_id == old_id
            await third.send(J("lab"))
            assert await again.closed() == (4001, "replaced")
            assert (await b.recv())["peers"] == [b.peer_id]
            assert (await b.recv())["peers"] == [b.peer_id, old_id]
    run(scenario())


def test_token_survives_a_restart_with_the_same_secret_only() -> None:
    async def scenario() -> None:
        async with serving() as s:
            first = await s.peer("lab")
        async with serving(SignalingConfig(secret=SECRET)) as s:
            again = await s.peer(token=first.token)
            assert again.peer_id == first.peer_id
            assert await again.join("lab") == [first.peer_id]
        async with serving(SignalingConfig(secret=b"another secret of 32 bytes......")) as s:
            fresh = RawPeer(await s.session.ws_connect(s.url))
            welcome = await fresh.hello(first.token)
            assert welcome["resumed"] is False and welcome["peerId"] != first.peer_id
    run(scenario())


def test_shutdown_closes_every_socket_going_away() -> None:
    async def scenario() -> None:
        async with aiohttp.ClientSession() as session:
            app = create_signaling_app(SignalingConfig(secret=SECRET))
            server = TestServer(app, host="127.0.0.1")
            await server.start_server()
            url = str(server.make_url("/signal"))
            peers = [RawPeer(await session.ws_connect(url)) for _ in range(3)]
            for p in peers[:2]:
                await p.hello()
                await p.join("lab")
            waits = [asyncio.create_task(p.closed()) for p in peers]
            await asyncio.wait_for(server.close(), 10)
            assert [await w for w in waits] == [(1001, "server-shutdown")] * 3
            assert app[SIGNALING_KEY].hub.connection_count == 0
    run(scenario())


def test_handshake_timeout_over_the_wire() -> None:
    async def scenario() -> None:
        config = SignalingConfig(secret=SECRET, limits=Limits(handshake_timeout_s=0.3), sweep_interval_s=0.05)
        async with serving(config) as s:
            lurker = RawPeer(await s.session.ws_connect(s.url))
            assert await lurker.closed() == (4000, "handshake-timeout")
    run(scenario())


def test_relay_log_shows_only_signaling() -> None:
    """Peers try to push model data through the server; the log proves none of it left."""
    marker = "WEIGHTS-0123456789"

    async def scenario() -> list[RelayRecord]:
        async with serving() as s:
            a = await s.peer("lab")
            b = await s.peer("lab")
            await a.recv_type("peers")
            attempts: list[Any] = [
                {"type": "weights", "to": b.peer_id, "data": marker},
                {"type": "signal", "to": b.peer_id, "kind": "data", "payload": marker},
                {"type": "signal", "to": b.peer_id, "kind": "offer", "payload": marker},
                {"type": "signal", "to": b.peer_id, "kind": "offer", "payload": SDP, "extra": marker},
                {"type": "signal", "to": b.peer_id, "kind": "candidate", "payload": {**CANDIDATE, "w": marker}},
                {"type": "signal", "to": b.peer_id, "kind": "candidate", "payload": {"candidate": marker}},
                {"type": "join", "room": marker + "/x"},
                {"type": "hello", "token": marker},
            ]
            for frame in attempts:
                await a.send(frame)
                assert (await a.recv())["type"] == "error"
            await a.ws.send_bytes(marker.encode())
            assert (await a.recv())["type"] == "error"
            await a.send({"type": "signal", "to": b.peer_id, "kind": "offer", "payload": SDP})
            await b.send({"type": "signal", "to": a.peer_id, "kind": "answer", "payload": SDP})
            await a.send({"type": "signal", "to": b.peer_id, "kind": "candidate", "payload": CANDIDATE})
            assert (await b.recv_type("signal"))["kind"] == "offer"
            assert (await b.recv_type("signal"))["kind"] == "candidate"
            assert (await a.recv_type("signal"))["kind"] == "answer"
            return s.log

    log = run(scenario())
    relayed = [r for r in log if r.frame["type"] in ("signal", "peers")]
    kinds = sorted(r.frame["kind"] for r in relayed if r.frame["type"] == "signal")
    assert kinds == ["answer", "candidate", "offer"]
    assert {r.frame["type"] for r in log} <= {"welcome", "peers", "signal", "error"}
    for record in log:
        assert json.loads(record.text) == record.frame
        assert marker not in record.text
    for record in relayed:
        if record.frame["type"] == "signal":
            assert set(record.frame) == {"type", "from", "kind", "payload"}


def test_a_peer_that_does_not_read_is_closed_not_waited_for() -> None:
    from weei.server.signaling import Signaling, _Outbox

    async def scenario() -> None:
        signaling = Signaling(SignalingConfig(secret=SECRET, max_outbound_frames=3))
        hub = signaling.hub
        conns = []
        for _ in range(3):
            conn, _ = hub.connect(0)
            signaling._boxes[conn] = _Outbox(3, 1 << 20)
            signaling.apply(hub.on_frame(conn, '{"type":"hello"}', 0))
            signaling.apply(hub.on_frame(conn, json.dumps(J("r")), 0))
            conns.append(conn)
            for box in list(signaling._boxes.values())[1:]:
                box.frames.clear()  # everyone but the first reads
        slow, other, third = conns
        # slow holds welcome and two peer lists (full); the third list overflows
        assert signaling._boxes[slow].close == (1008, "slow-consumer")
        assert hub.peers_in(C("r")) == (hub.peer_id(other), hub.peer_id(third))
        assert hub.stats.closed["slow-consumer"] == 1

    run(scenario())


def test_add_signaling_on_an_existing_app() -> None:
    async def scenario() -> None:
        from aiohttp import web

        async def hello(request: web.Request) -> web.Response:
            return web.Response(text="site")

        app = web.Application()
        app.router.add_get("/", hello)
        add_signaling(app, SignalingConfig(path="/ws/signal"))
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        try:
            async with aiohttp.ClientSession() as session:
                async with session.get(server.make_url("/")) as response:
                    assert await response.text() == "site"
                peer = RawPeer(await session.ws_connect(server.make_url("/ws/signal")))
                assert (await peer.hello())["resumed"] is False
        finally:
            await server.close()
    run(scenario())


def test_a_resumed_peer_takes_its_own_place_in_a_full_room() -> None:
    h = HubPeers(Limits(max_peers_per_room=2))
    a, pa = h.joined("r")
    h.joined("r")
    again = h.connect()
    stale_token = make_token(SECRET, pa, C("r"), 10**11)
    assert h.hello(again, token=stale_token)["peerId"] == pa
    out = h.send(again, J("r"))
    assert closes(out) == [Close(a, CloseCode.REPLACED, "replaced")]
    assert frames_to(out, again)[-1]["type"] == "peers" and len(h.hub.peers_in(C("r"))) == 2
