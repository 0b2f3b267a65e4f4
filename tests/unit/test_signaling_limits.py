"""Per-address and per-socket budgets of the signaling server (issue 9 §3), each
test the attack of the issue scaled down: non-reading victims flooded with
offers, join/leave churn, room squatting from one address, byte floods over
many sockets."""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

import pytest

from weei.core.errors import UsageError
from weei.core.wire.signaling_session import new_room_key, room_code
from weei.server.rooms import Hub, Limits, RoomSend
from weei.server.signaling import Signaling, SignalingConfig, _Outbox, add_arguments, configs_from

SECRET = b"q" * 32
SDP = "v=0\r\n" + "a=x-filler:" + "z" * 30_000 + "\r\n"


def _join(key: str) -> str:
    return json.dumps({"type": "join", "room": room_code(key), "key": key})


def _key(n: int) -> str:
    return new_room_key(lambda size: n.to_bytes(size, "big"))


class Clock:
    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.now = 0.0

    def member(self, key: str, source: str) -> int:
        conn, _ = self.hub.connect(self.now, source)
        self.hub.on_frame(conn, '{"type":"hello"}', self.now)
        out = self.hub.on_frame(conn, _join(key), self.now)
        assert any(isinstance(o, RoomSend) and o.conn == conn and o.frame["type"] == "peers" for o in out), out
        return conn


def test_a_peer_that_does_not_read_costs_at_most_its_queue_budget() -> None:
    """The attack: 20 non-reading victims flooded with offers took the server to 758 MiB. Scaled: 5 victims."""
    async def scenario() -> None:
        config = SignalingConfig(secret=SECRET)
        signaling = Signaling(config)
        hub = signaling.hub
        key = _key(1)
        conns: list[int] = []
        for i in range(6):
            conn, _ = hub.connect(0, f"10.0.0.{i}")
            signaling._boxes[conn] = _Outbox(config.max_outbound_frames, config.max_outbound_bytes)
            signaling.apply(hub.on_frame(conn, '{"type":"hello"}', 0))
            signaling.apply(hub.on_frame(conn, _join(key), 0))
            conns.append(conn)
        attacker, victims = conns[0], conns[1:]
        signaling._boxes[attacker].frames.clear()
        targets = [hub.peer_id(v) for v in victims]
        now, peak = 0.0, 0
        for step in range(400):  # 400 offers of 30 KB each to every victim: 60 MB if queued
            now += 1.0  # within the attacker's own frame and byte budgets
            for target in targets:
                if hub.peer_id(victims[targets.index(target)]) is None:
                    continue  # closed already
                frame = json.dumps({"type": "signal", "to": target, "kind": "offer", "payload": SDP})
                signaling.apply(hub.on_frame(attacker, frame, now))
                signaling._boxes[attacker].frames.clear()  # the attacker reads its own frames
            peak = max(peak, sum(box.queued_bytes for c, box in signaling._boxes.items() if c != attacker))
        for victim in victims:
            assert signaling._boxes[victim].close == (1008, "slow-consumer")
            assert signaling._boxes[victim].queued_bytes <= config.max_outbound_bytes
        assert peak <= len(victims) * config.max_outbound_bytes
        assert hub.stats.closed["slow-consumer"] == len(victims)
        assert hub.peers_in(room_code(key)) == (hub.peer_id(attacker),), hub.stats

    asyncio.run(scenario())


def test_join_leave_churn_does_not_amplify_without_bound() -> None:
    """The attack: join/leave churn amplified 41x. Scaled: 20 members, 500 join+leave cycles from one address."""
    limits = Limits(join_rate=2.0, join_burst=16)
    clock = Clock(Hub(limits, SECRET))
    key = _key(2)
    members = [clock.member(key, f"10.0.1.{i}") for i in range(20)]
    received = 0
    refused = 0
    for cycle in range(500):
        clock.now += 0.01  # 100 cycles per second
        conn, _ = clock.hub.connect(clock.now, "192.0.2.66")
        clock.hub.on_frame(conn, '{"type":"hello"}', clock.now)
        out = clock.hub.on_frame(conn, _join(key), clock.now)
        out += clock.hub.disconnect(conn, clock.now)
        received += sum(1 for o in out if isinstance(o, RoomSend) and o.conn in members)
        refused += sum(1 for o in out if isinstance(o, RoomSend) and o.frame.get("reason") == "join-rate-limited")
    seconds = clock.now
    allowed_joins = limits.join_burst + limits.join_rate * seconds
    # each admitted join and its leave cost every member one list: bounded by the address's join budget
    assert received <= 2 * len(members) * allowed_joins
    assert received < 2 * len(members) * 500 / 10
    assert refused >= 500 - allowed_joins - 1
    assert clock.hub.stats.refused["join-rate-limited"] == refused


def test_one_address_cannot_take_every_room() -> None:
    limits = Limits(max_rooms=100, max_rooms_per_ip=8)
    clock = Clock(Hub(limits, SECRET))
    squatter = []
    answers = []
    for i in range(20):
        conn, _ = clock.hub.connect(clock.now, "192.0.2.7")
        clock.hub.on_frame(conn, '{"type":"hello"}', clock.now)
        out = clock.hub.on_frame(conn, _join(_key(100 + i)), clock.now)
        answers.append([dict(o.frame) for o in out if isinstance(o, RoomSend)][0])
        squatter.append(conn)
    assert [a["type"] for a in answers[:8]] == ["peers"] * 8
    assert {a.get("reason") for a in answers[8:]} == {"too-many-rooms"}
    assert clock.hub.room_count == 8
    clock.member(_key(999), "198.51.100.3")  # others still get rooms
    clock.hub.disconnect(squatter[0], clock.now)  # a room that empties is given back
    conn, _ = clock.hub.connect(clock.now, "192.0.2.7")
    clock.hub.on_frame(conn, '{"type":"hello"}', clock.now)
    out = clock.hub.on_frame(conn, _join(_key(500)), clock.now)
    assert [o.frame["type"] for o in out if isinstance(o, RoomSend)] == ["peers"]


def test_bytes_are_budgeted_per_address_over_all_its_sockets() -> None:
    limits = Limits(ip_bytes_rate=100_000, ip_bytes_burst=1_000_000, max_strikes=10_000)
    clock = Clock(Hub(limits, SECRET))
    junk = json.dumps({"type": "ping", "x": "y" * 60_000})  # refused as bad-message, but its bytes count
    conns = []
    for _ in range(10):
        conn, _ = clock.hub.connect(clock.now, "192.0.2.8")
        conns.append(conn)
    reasons: list[Any] = []
    for _ in range(10):
        for conn in conns:
            out = clock.hub.on_frame(conn, junk, clock.now)
            reasons.append(out[0].frame["reason"])
    accepted = reasons.count("bad-message")
    assert accepted * len(junk) <= limits.ip_bytes_burst
    assert reasons.count("bytes-rate-limited") == len(reasons) - accepted >= 80
    other, _ = clock.hub.connect(clock.now, "198.51.100.4")  # another address is not starved
    assert clock.hub.on_frame(other, '{"type":"ping"}', clock.now)[0].frame == {"type": "pong"}
    clock.now += 1.0  # 100 kB back: one more big frame
    assert clock.hub.on_frame(conns[0], junk, clock.now)[0].frame["reason"] == "bad-message"


def test_an_address_with_nothing_left_is_forgotten() -> None:
    clock = Clock(Hub(Limits(), SECRET))
    conn = clock.member(_key(3), "192.0.2.9")
    clock.hub.disconnect(conn, clock.now)
    assert "192.0.2.9" in clock.hub._sources  # its join budget is not full yet
    clock.now += 1000
    clock.hub.expire(clock.now)
    assert clock.hub._sources == {}


def test_many_addresses_together_meet_the_server_wide_budgets() -> None:
    limits = Limits(total_join_rate=1.0, total_join_burst=5, total_bytes_rate=1000, total_bytes_burst=200_000)
    clock = Clock(Hub(limits, SECRET))
    answers = []
    for i in range(8):  # eight addresses, each well inside its own budget
        conn, _ = clock.hub.connect(clock.now, f"10.9.0.{i}")
        clock.hub.on_frame(conn, '{"type":"hello"}', clock.now)
        out = clock.hub.on_frame(conn, _join(_key(7)), clock.now)
        answers.append([o.frame for o in out if isinstance(o, RoomSend) and o.conn == conn][0])
    assert [a["type"] for a in answers[:5]] == ["peers"] * 5
    assert {a.get("reason") for a in answers[5:]} == {"join-rate-limited"}
    big = json.dumps({"type": "ping", "x": "y" * 60_000})
    reasons = []
    for i in range(8):
        conn, _ = clock.hub.connect(clock.now, f"10.9.1.{i}")
        reasons.append(clock.hub.on_frame(conn, big, clock.now)[0].frame["reason"])
    assert reasons.count("bad-message") == 200_000 // len(big) and "bytes-rate-limited" in reasons


def test_an_operator_sets_the_budgets_on_the_command_line_and_a_bad_one_is_named() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    config, _ = configs_from(parser.parse_args(["--signal-limit", "max_rooms_per_ip=2",
                                                "--signal-limit", "join-rate=5.5"]))
    assert config.limits == Limits(max_rooms_per_ip=2, join_rate=5.5)
    clock = Clock(Hub(config.limits, SECRET))  # the budget given is the one the hub keeps
    answers = []
    for i in range(3):
        conn, _ = clock.hub.connect(clock.now, "192.0.2.8")
        clock.hub.on_frame(conn, '{"type":"hello"}', clock.now)
        answers += [o.frame.get("reason", o.frame["type"]) for o in clock.hub.on_frame(conn, _join(_key(700 + i)),
                                                                                      clock.now) if isinstance(o, RoomSend)]
    assert answers == ["peers", "peers", "too-many-rooms"]
    for bad, words in ((["max_room=3"], "NAME one of"), (["max_rooms_per_ip"], "NAME=VALUE"),
                       (["max_rooms_per_ip=2.5"], "not a whole number"), (["join_rate=fast"], "not a number"),
                       (["max_rooms_per_ip=0"], "positive int"), (["join_rate=inf"], "positive number")):
        with pytest.raises(UsageError) as err:
            configs_from(parser.parse_args([f"--signal-limit={bad[0]}"]))
        assert err.value.reason == "invalid-signaling-limits" and words in str(err.value), (bad, str(err.value))
