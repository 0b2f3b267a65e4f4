"""SignalingSession (weei.core.wire.signaling_session): the one parser and event set of both signaling clients."""

from __future__ import annotations

import json
import random

import pytest

from weei.core.wire.signaling_session import (PING, REPLACED, Answer, Closed, Peers, ServerError, Signal, SignalingSession,
                                          Unreadable, Welcome, room_code)

ME, OTHER = "m" * 26, "o" * 26
WELCOME = {"type": "welcome", "peerId": ME, "token": "tok-2", "resumed": True,
           "iceServers": [{"urls": ["stun:example.org"]}], "limits": {"idleTimeout": 30}}


def text(frame: object) -> str:
    return json.dumps(frame)


def test_hello_carries_the_token_and_the_welcome_answers_it() -> None:
    token = f"{ME}.{room_code('lab')}.99.mac"
    session = SignalingSession(token, room="lab")
    assert json.loads(session.hello()) == {"type": "hello", "version": 1, "token": token}
    # a token bound to another room, or with no room to join yet, is not offered
    assert "token" not in json.loads(SignalingSession(token, room="elsewhere").hello())
    assert "token" not in json.loads(SignalingSession(token).hello())
    welcome = Welcome(ME, "tok-2", True, ({"urls": ["stun:example.org"]},), {"idleTimeout": 30})
    assert session.on_server_message(text(WELCOME)) == [Answer("hello", welcome)]
    assert session.token == "tok-2" and session.peer_id == ME and session.ping_interval_s() == 10.0
    assert json.loads(SignalingSession().hello()) == {"type": "hello", "version": 1}
    assert PING == '{"type":"ping"}'


def test_the_page_wants_answered_frames_as_events_too() -> None:
    session = SignalingSession(answers_are_events=True)
    session.hello()
    answer, event = session.on_server_message(text(WELCOME))
    assert isinstance(answer, Answer) and event == answer.value
    session.join("lab")
    peers = {"type": "peers", "room": "lab", "peers": [ME, OTHER]}
    assert session.on_server_message(text(peers)) == [Answer("join", (ME, OTHER)), Peers("lab", (ME, OTHER))]
    assert session.on_server_message(text(peers)) == [Peers("lab", (ME, OTHER))], "nothing pending: an event only"


def test_join_is_answered_by_the_list_that_names_us_and_refusals_by_their_error() -> None:
    session = SignalingSession()
    session.hello()
    session.on_server_message(text(WELCOME))
    assert json.loads(session.join("lab")) == {"type": "join", "room": room_code("lab"), "key": "lab"}
    assert session.room == "lab"
    assert session.on_server_message(text({"type": "peers", "room": "lab", "peers": [OTHER]})) == [
        Peers("lab", (OTHER,))]
    assert session.on_server_message(
        text({"type": "peers", "room": "lab", "peers": [OTHER, ME], "token": "bound"})) == [Answer("join", (OTHER, ME))]
    assert session.token == "bound"  # the joiner's list carries the token bound to the room
    session.join("full")
    refusal = {"type": "error", "reason": "room-full", "message": "no room", "refused": "join"}
    assert session.on_server_message(text(refusal)) == [
        Answer("join", error=ServerError("room-full", "no room", "join"))]
    other = {"type": "error", "reason": "unknown-peer", "message": "who?", "refused": "signal"}
    assert session.on_server_message(text(other)) == [ServerError("unknown-peer", "who?", "signal")]


def test_signals_are_parsed_and_made() -> None:
    session = SignalingSession()
    candidate = {"candidate": "candidate:1 1 udp 1 192.0.2.1 5000 typ host", "sdpMid": "0"}
    frame = {"type": "signal", "from": OTHER, "kind": "candidate", "payload": candidate}
    assert session.on_server_message(text(frame)) == [Signal(OTHER, "candidate", candidate)]
    assert json.loads(session.signal(OTHER, "offer", "v=0")) == {"type": "signal", "to": OTHER, "kind": "offer",
                                                                 "payload": "v=0"}
    assert session.on_server_message(text({"type": "pong"})) == []


@pytest.mark.parametrize("frame", [
    "{nope", "[1, 2]", "null", '"text"',
    text({"type": "welcome", "token": "t"}),
    text({**WELCOME, "iceServers": "stun:x"}),
    text({**WELCOME, "limits": [1]}),
    text({"type": "peers", "room": "lab", "peers": [1, 2]}),
    text({"type": "peers", "room": "lab"}),
    text({"type": "signal", "from": OTHER, "kind": "bye", "payload": ""}),
    text({"type": "signal", "kind": "offer", "payload": ""}),
    text({"type": "error", "reason": 5}),
    text({"type": "surprise"}),
])
def test_a_frame_that_is_not_the_protocol_is_unreadable_never_a_crash(frame: str) -> None:
    items = SignalingSession().on_server_message(frame)
    assert len(items) == 1 and isinstance(items[0], Unreadable) and items[0].detail


def test_random_frames_give_only_named_outcomes() -> None:
    rng = random.Random(7)
    values: list[object] = [None, 1, "x", [], {}, ["a"], {"urls": 1}, True, 2.5, ME]
    keys = ["type", "peerId", "token", "resumed", "iceServers", "limits", "room", "peers", "from", "kind", "payload",
            "reason", "message", "refused"]
    types = ["welcome", "peers", "signal", "error", "pong", "x"]
    for _ in range(2000):
        frame = {k: rng.choice(values) for k in rng.sample(keys, rng.randint(0, len(keys)))}
        frame["type"] = rng.choice(types)
        session = SignalingSession()
        session.hello()
        session.join("lab")
        for item in session.on_server_message(text(frame)):
            assert isinstance(item, (Answer, Welcome, Peers, Signal, ServerError, Unreadable))


def test_a_close_refuses_what_is_in_flight_and_replaced_drops_the_token() -> None:
    session = SignalingSession("tok")
    session.hello()
    session.join("lab")
    items = session.closed(1006, "gone", reconnecting=True)
    assert [(a.request, a.error.reason) for a in items[:-1]] == [("hello", "closed"), ("join", "closed")]
    assert items[-1] == Closed(1006, "gone", True) and session.token == "tok" and not session.pending
    assert session.closed(REPLACED, "replaced") == [Closed(REPLACED, "replaced")]
    assert session.token is None and "token" not in json.loads(session.hello())


@pytest.mark.parametrize("idle, expected", [(None, 100.0), (-5, 100.0), ("30", 100.0), (True, 100.0), (1.5, 1.0)])
def test_ping_interval_ignores_a_bad_idle_timeout(idle: object, expected: float) -> None:
    session = SignalingSession()
    session.hello()
    session.on_server_message(text({**WELCOME, "limits": {} if idle is None else {"idleTimeout": idle}}))
    assert session.ping_interval_s() == expected
