"""SignalingClient against the real signaling endpoint on 127.0.0.1."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from weei.core.errors import UsageError
from weei.server.rooms import Limits, SignalingError
from weei.server.signaling import IceServer, SignalingConfig, create_signaling_app
from weei.agent.signaling_client import Closed, Peers, ServerError, Signal, SignalingClient

SECRET = b"c" * 32
SDP = "v=0\r\no=- 1 2 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\n"
CANDIDATE = {"candidate": "candidate:1 1 udp 2122260223 192.0.2.1 54321 typ host", "sdpMid": "0",
             "sdpMLineIndex": 0}


@asynccontextmanager
async def server(config: SignalingConfig | None = None) -> AsyncIterator[str]:
    test_server = TestServer(create_signaling_app(config or SignalingConfig(secret=SECRET)), host="127.0.0.1")
    await test_server.start_server()
    try:
        yield str(test_server.make_url("/signal"))
    finally:
        await test_server.close()


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def next_peers(client: SignalingClient) -> tuple[str, ...]:
    while True:
        event = await client.next_event()
        if isinstance(event, Peers):
            return event.peers


def test_connect_join_exchange_signals() -> None:
    async def scenario() -> None:
        config = SignalingConfig(secret=SECRET, ice_servers=(IceServer(("stun:stun.example.org:3478",)),))
        async with server(config) as url, SignalingClient(url) as a, SignalingClient(url) as b:
            welcome = await a.connect()
            assert welcome.ice_servers == ({"urls": ["stun:stun.example.org:3478"]},)
            assert welcome.resumed is False and a.peer_id == welcome.peer_id
            assert await a.join("lab") == (a.peer_id,)
            await b.connect()
            assert await b.join("lab") == (a.peer_id, b.peer_id)
            assert await next_peers(a) == (a.peer_id, b.peer_id)
            assert a.peers == (a.peer_id, b.peer_id)
            await a.signal(b.peer_id, "offer", SDP)
            assert await b.next_signal() == Signal(a.peer_id, "offer", SDP)
            await b.signal(a.peer_id, "answer", SDP)
            await b.signal(a.peer_id, "candidate", CANDIDATE)
            assert await a.next_signal() == Signal(b.peer_id, "answer", SDP)
            assert await a.next_signal() == Signal(b.peer_id, "candidate", CANDIDATE)
    run(scenario())


def test_refused_join_and_refused_signal_raise_named_errors() -> None:
    async def scenario() -> None:
        config = SignalingConfig(secret=SECRET, limits=Limits(max_peers_per_room=1))
        async with server(config) as url, SignalingClient(url) as a, SignalingClient(url) as b:
            await a.connect()
            with pytest.raises(SignalingError) as bad_room:
                await a.join("no/slashes")
            assert (bad_room.value.reason, bad_room.value.refused) == ("bad-room", "join")
            await a.join("solo")
            await b.connect()
            with pytest.raises(SignalingError) as full:
                await b.join("solo")
            assert full.value.reason == "room-full"
            await b.join("other")
            await b.signal(a.peer_id, "offer", SDP)
            with pytest.raises(SignalingError) as unknown:
                await b.next_signal()
            assert unknown.value.reason == "unknown-peer"
    run(scenario())


def test_reconnect_keeps_peer_id_and_room_also_across_a_restart() -> None:
    async def scenario() -> None:
        async with server() as url, SignalingClient(url) as a, SignalingClient(url) as b:
            await a.connect()
            await a.join("lab")
            await b.connect()
            await b.join("lab")
            first_id = a.peer_id
            welcome = await a.reconnect()
            assert welcome.resumed is True and a.peer_id == first_id and a.room == "lab"
            assert first_id in a.peers
            await b.signal(first_id, "offer", SDP)
            assert (await a.next_signal()).sender == b.peer_id
            token = a.token
        # a new server process with the same secret: same ID
        async with server() as url, SignalingClient(url, token=token, room="lab") as again:
            assert (await again.connect()).resumed is True
            assert again.peer_id == first_id
        # with another secret: a fresh ID
        # a token is offered only for the room it is bound to
        async with server() as url, SignalingClient(url, token=token, room="elsewhere") as other_room:
            assert (await other_room.connect()).resumed is False
        async with server(SignalingConfig(secret=b"d" * 32)) as url, \
                SignalingClient(url, token=token, room="lab") as fresh:
            assert (await fresh.connect()).resumed is False
            assert fresh.peer_id != first_id
    run(scenario())


def test_server_shutdown_is_reported_as_closed() -> None:
    async def scenario() -> None:
        test_server = TestServer(create_signaling_app(SignalingConfig(secret=SECRET)), host="127.0.0.1")
        await test_server.start_server()
        async with SignalingClient(str(test_server.make_url("/signal"))) as a:
            await a.connect()
            await a.join("lab")
            await test_server.close()
            event = await a.next_event()
            assert event == Closed(1001, "server-shutdown")
            with pytest.raises(UsageError):
                await a.signal("x", "offer", SDP)
    run(scenario())


def test_pings_keep_an_idle_peer_connected() -> None:
    async def scenario() -> None:
        config = SignalingConfig(secret=SECRET, limits=Limits(idle_timeout_s=0.4), sweep_interval_s=0.05)
        async with server(config) as url, SignalingClient(url, ping_interval_s=0.1) as a, \
                SignalingClient(url, ping_interval_s=100) as quiet:
            await a.connect()
            await a.join("lab")
            await quiet.connect()
            await quiet.join("lab")
            event = await quiet.next_event(2)
            while not isinstance(event, Closed):
                event = await quiet.next_event(2)
            assert event == Closed(4000, "idle-timeout")
            assert await next_peers(a) == (a.peer_id, quiet.peer_id)
            assert await next_peers(a) == (a.peer_id,)
            assert a.connected
    run(scenario())


def test_misuse_is_a_usage_error() -> None:
    async def scenario() -> None:
        async with server() as url, SignalingClient(url) as a:
            with pytest.raises(UsageError):
                await a.join("lab")
            await a.connect()
            with pytest.raises(UsageError):
                await a.connect()
            await a.send_raw("{nope")
            event = await a.next_event()
            assert isinstance(event, ServerError) and event.reason == "bad-json"
    run(scenario())
