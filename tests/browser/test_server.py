"""`weei serve`: content types, cross-origin headers, safe paths, shutdown."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from site_helpers import start_server, stop_server


def get(url: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


@pytest.mark.parametrize(("path", "content_type"), [
    ("", "text/html"),
    ("weei.js", "text/javascript"),
    ("worker.js", "text/javascript"),
    ("pyodide/pyodide.mjs", "text/javascript"),
    ("pyodide/pyodide.asm.mjs", "text/javascript"),
    ("pyodide/pyodide.asm.wasm", "application/wasm"),
    ("kernel/aggregate.wasm", "application/wasm"),
    ("models/digits-mlp/model.wasm", "application/wasm"),
    ("pyodide/pyodide-lock.json", "application/json"),
    ("weei-py.zip", "application/zip"),
])
def test_types_and_cross_origin_headers(weei_server: Any, path: str, content_type: str) -> None:
    status, headers, body = get(weei_server.url + path)
    assert status == 200 and body
    assert headers["Content-Type"].split(";")[0] == content_type
    assert headers["Access-Control-Allow-Origin"] == "*"
    assert headers["Cross-Origin-Resource-Policy"] == "cross-origin"


def test_errors_and_paths(weei_server: Any) -> None:
    status, headers, _ = get(weei_server.url + "no-such-file.js")
    assert status == 404 and headers["Access-Control-Allow-Origin"] == "*"
    for sneaky in ("../pyproject.toml", "%2e%2e/pyproject.toml", "pyodide/../../build.py"):
        assert get(weei_server.url + sneaky)[0] == 404, sneaky
    status, headers, _ = get(weei_server.url + "weei.js", method="OPTIONS")
    assert status == 204 and headers["Access-Control-Allow-Origin"] == "*"
    status, _, body = get(weei_server.url + "weei.js", method="HEAD")
    assert status == 200 and body == b""


def test_port_in_use_and_clean_shutdown(site: Path, weei_server: Any) -> None:
    port = weei_server.url.rstrip("/").rsplit(":", 1)[1]
    import subprocess
    import sys

    taken = subprocess.run(
        [sys.executable, "-m", "weei.cli", "serve", "--port", port, "--dir", str(site)],
        capture_output=True, text=True, timeout=30,
    )
    assert taken.returncode == 1 and "cannot listen" in taken.stderr
    other = start_server(site)
    assert get(other.url + "weei.js")[0] == 200
    assert stop_server(other) == 0


def test_missing_site_is_explained(tmp_path: Path) -> None:
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "weei.cli", "serve", "--dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "build.py site" in proc.stderr


def test_routes_added_later_win_over_the_site(site: Path) -> None:
    import asyncio

    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer

    from weei.server import create_app

    async def scenario() -> None:
        app = create_app(site)

        async def hello(request: web.Request) -> web.Response:
            return web.Response(text="route")

        # Added after the factory, as add_signaling(app, config) does.
        app.router.add_get("/signal", hello)
        app.router.add_get("/weei.js", hello)
        async with TestClient(TestServer(app)) as client:
            for path, expected in (("/signal", "route"), ("/weei.js", "route")):
                response = await client.get(path)
                assert response.status == 200 and await response.text() == expected
                assert response.headers["Access-Control-Allow-Origin"] == "*"
            response = await client.get("/worker.js")
            assert response.status == 200 and response.headers["Content-Type"].startswith("text/javascript")
            assert (await client.post("/worker.js")).status in (404, 405)
            response = await client.get("/models", allow_redirects=False)
            assert response.status == 301 and response.headers["Location"] == "/models/"

    # In a thread of its own: Playwright's sync API keeps a loop running in
    # this one once a browser test has run.
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, scenario()).result(timeout=60)


def test_the_same_server_carries_signaling(weei_server: Any) -> None:
    import asyncio

    from weei.agent.signaling_client import SignalingClient

    async def main() -> None:
        ws_url = weei_server.url.replace("http://", "ws://") + "signal"
        async with SignalingClient(ws_url) as client:
            welcome = await client.connect()
            assert client.peer_id and welcome.token

    # Playwright's sync API may own this thread's event loop: run ours on another thread.
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, main()).result(timeout=30)


def test_serve_hands_out_its_ice_servers_and_keeps_peer_ids_across_a_restart(site: Path, tmp_path: Path) -> None:
    import asyncio
    import concurrent.futures

    from weei.agent.signaling_client import SignalingClient

    secret = tmp_path / "secret"
    secret.write_text("a-secret-of-at-least-16-bytes\n")
    options = ("--secret-file", str(secret), "--ice", "stun:stun.example.org:3478")

    async def hello(url: str, token: str | None) -> Any:
        async with SignalingClient(url.replace("http://", "ws://") + "signal", token=token, room="lab") as client:
            welcome = await client.connect()
            await client.join("lab")
            return welcome, client.token  # the token bound to the room, from the join

    def run(coro: Any) -> Any:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:  # Playwright may own this thread's loop
            return pool.submit(asyncio.run, coro).result(timeout=30)

    first = start_server(site, *options)
    try:
        welcome, token = run(hello(first.url, None))
        assert [s["urls"] for s in welcome.ice_servers] == [["stun:stun.example.org:3478"]]
    finally:
        assert stop_server(first) == 0
    second = start_server(site, *options)
    try:
        again, _ = run(hello(second.url, token))
        assert again.peer_id == welcome.peer_id and again.resumed
    finally:
        assert stop_server(second) == 0
