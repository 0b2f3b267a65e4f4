"""Rooms with keys (issue 9 §3): a room code alone lets nobody in, codes cannot be
enumerated, probes are rate-limited per IP address, and invite links carry the
key in their fragment. The hub under fake time, then the real endpoint."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from weei.core.errors import UsageError
from weei.core.wire.signaling_session import room_code
from weei.server.invite import fresh_key, invite_url, parse_invite
from weei.server.rooms import Hub, Limits, RoomSend
from weei.server.signaling import SignalingConfig, create_signaling_app
from weei.agent.signaling_client import SignalingClient, SignalingError

SECRET = b"k" * 32


class Hubby:
    def __init__(self, limits: Limits | None = None) -> None:
        self.hub = Hub(limits or Limits(), SECRET)
        self.now = 0.0

    def welcomed(self, source: str = "10.0.0.1") -> int:
        conn, out = self.hub.connect(self.now, source)
        assert out == []
        self.hub.on_frame(conn, '{"type":"hello"}', self.now)
        return conn

    def join(self, conn: int, frame: dict[str, Any]) -> list[dict[str, Any]]:
        out = self.hub.on_frame(conn, json.dumps({"type": "join", **frame}), self.now)
        return [dict(o.frame) for o in out if isinstance(o, RoomSend) and o.conn == conn]


def test_joining_without_the_key_is_refused_by_name() -> None:
    h = Hubby()
    key = fresh_key()
    (error,) = h.join(h.welcomed(), {"room": room_code(key)})
    assert (error["reason"], error["refused"]) == ("room-key-required", "join")
    assert h.hub.room_count == 0


def test_a_room_code_seen_in_a_peer_list_lets_no_outsider_in() -> None:
    h = Hubby()
    key = fresh_key()
    member = h.welcomed()
    (peers,) = h.join(member, {"room": room_code(key), "key": key})
    assert peers["room"] == room_code(key) and key not in json.dumps(peers)  # the code only, never the key
    outsider = h.welcomed("192.0.2.9")
    for guess in ("", "lab", room_code(key), fresh_key()):
        frames = h.join(outsider, {"room": peers["room"], "key": guess} if guess else {"room": peers["room"]})
        assert frames[0]["type"] == "error"
    assert h.hub.peers_in(room_code(key)) == (h.hub.peer_id(member),)


def test_wrong_key_and_unknown_room_get_the_same_answer() -> None:
    h = Hubby()
    key = fresh_key()
    h.join(h.welcomed(), {"room": room_code(key), "key": key})  # a room that exists
    prober = h.welcomed("192.0.2.9")
    answers = [
        h.join(prober, {"room": room_code(key), "key": fresh_key()}),  # existing room, wrong key
        h.join(prober, {"room": room_code(fresh_key()), "key": fresh_key()}),  # nobody's room
        # right key, other code (another last character: a code ending in "a" stayed the room's own, 1 in 32)
        h.join(prober, {"room": room_code(key)[:-1] + ("b" if room_code(key).endswith("a") else "a"), "key": key}),
    ]
    assert answers[0] == answers[1] == answers[2] == [{
        "type": "error", "reason": "room-refused", "message": "no room with this code and key", "refused": "join"}]


def test_probes_are_rate_limited_per_address() -> None:
    """The attack: 535 join probes per second, never refused. Now: a small burst, then nothing is checked."""
    h = Hubby(Limits(probe_burst=10, probe_rate=0.2, max_strikes=10_000))
    key = fresh_key()
    good = {"room": room_code(key), "key": key}
    prober = h.welcomed("192.0.2.9")
    reasons = [h.join(prober, {"room": room_code(fresh_key()), "key": "guess"})[0]["reason"] for _ in range(100)]
    assert reasons[:10] == ["room-refused"] * 10 and set(reasons[10:]) == {"join-rate-limited"}
    # the right key is not even checked now: no oracle while rate-limited, from any socket of that address
    assert h.join(h.welcomed("192.0.2.9"), good)[0]["reason"] == "join-rate-limited"
    assert h.join(h.welcomed("198.51.100.1"), good)[0]["type"] == "peers"  # another address is served
    h.now += 5.0  # one probe back
    assert h.join(h.welcomed("192.0.2.9"), good)[0]["type"] == "peers"


def test_invite_links_carry_the_key_in_the_fragment() -> None:
    key = fresh_key()
    assert len(key) == 22 and fresh_key() != key
    link = invite_url("http://127.0.0.1:8000/", key)
    assert link == f"http://127.0.0.1:8000/#room={key}"
    invite = parse_invite(link)
    assert (invite.key, invite.signal_url) == (key, "ws://127.0.0.1:8000/signal")
    assert parse_invite(f"https://weei.example/app/?x=1#room={key}").signal_url == "wss://weei.example/signal"
    assert (parse_invite(key).key, parse_invite(key).signal_url) == (key, None)
    for bad in ("ftp://x/#room=a", "http://x/#room=", "http://x/", "not a key", "http://x/#room=a%2Fb"):
        with pytest.raises(UsageError) as error:
            parse_invite(bad)
        assert error.value.reason == "bad-invite"


def test_clients_join_with_the_key_and_a_wrong_key_raises_by_name() -> None:
    async def scenario() -> None:
        server = TestServer(create_signaling_app(SignalingConfig(secret=SECRET)), host="127.0.0.1")
        await server.start_server()
        url = str(server.make_url("/signal"))
        key = fresh_key()
        try:
            async with SignalingClient(url) as a, SignalingClient(url) as b, SignalingClient(url) as c:
                await a.connect()
                assert await a.join(key) == (a.peer_id,)
                await b.connect()
                assert await b.join(key) == (a.peer_id, b.peer_id)
                await c.connect()
                raw = json.dumps({"type": "join", "room": room_code(key), "key": fresh_key()})
                await c.send_raw(raw)
                error = await c.next_event()
                assert (error.reason, error.refused) == ("room-refused", "join")
                with pytest.raises(SignalingError) as refused:
                    await c.join("not/a/key")
                assert refused.value.reason == "bad-room"
        finally:
            await server.close()
    asyncio.run(scenario())
