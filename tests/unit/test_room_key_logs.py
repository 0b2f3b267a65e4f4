"""`weei serve` logs no query strings: a room key that came as ``?room=KEY`` is in no log record, at any
level, whatever the request's fate (issue 9 §3; docs/signaling.md "Rooms and keys")."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from test_server_http import raw, running, status_and_headers
from weei.server.app import create_app
from weei.server.signaling import SignalingConfig, add_signaling

KEY = "Qk3yN0tF0rL0gs_xYz-123"


def test_a_room_key_in_the_query_is_in_no_log_record(tmp_path: Path, caplog: Any) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text("<!doctype html><title>weei</title>")
    (site / "weei.js").write_text("// weei")
    (site / "models").mkdir()

    async def scenario() -> None:
        app = create_app(site)
        add_signaling(app, SignalingConfig(secret=b"s" * 32))

        async def broken(request: web.Request) -> web.Response:
            raise RuntimeError("boom")

        app.router.add_get("/broken", broken)
        async with running(app) as (host, port):
            want = {"/": {200}, "/weei.js": {200}, "/missing.html": {404}, "/broken": {500}, "/" + "a" * 300: {414},
                    "//evil.example/%2e%2e/models": {301, 404}, "/.env": {404}}
            for path, statuses in want.items():
                request = f"GET {path}?x=1&room={KEY} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n"
                answer = await raw(host, port, request.encode())
                assert status_and_headers(answer)[0] in statuses, (path, answer[:200])
            # requests the parser refuses (aiohttp would quote their raw line): a 400, logged without it
            for bad in (f"GET /?room={KEY}\x01 HTTP/1.1\r\nHost: a\r\n\r\n", f"BAD\x00 /?room={KEY} HTTP/1.1\r\n\r\n",
                        f"GET /?room={KEY} HTTP/1.1\r\nHost: a\r\nX: {'a' * 10000}\r\n\r\n"):
                assert status_and_headers(await raw(host, port, bad.encode()))[0] == 400
            # a signaling socket from a foreign page, with the key in its query: refused, logged without it
            async with aiohttp.ClientSession() as session:
                async with session.get(f"http://{host}:{port}/signal?room={KEY}",
                                       headers={"Origin": "https://evil.example", "Upgrade": "websocket",
                                                "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
                                                "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}) as response:
                    assert response.status == 403

    with caplog.at_level(logging.DEBUG):
        asyncio.run(scenario())
    texts = [caplog.handler.format(record) for record in caplog.records]
    # The capture works: the 500's error id and the refused origin are there (by path and origin only).
    assert any("internal error" in t and "/broken" in t for t in texts), texts
    assert any("evil.example" in t for t in texts), texts
    assert any("BadHttpMethod 400 (request not shown)" in t for t in texts), texts
    assert not [t for t in texts if KEY in t]
