"""`weei serve`'s HTTP listener under attack: slowloris, off-site redirects,
long segments, dotfiles, connection floods (a real server on a free port)."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from weei.core.errors import UsageError
from weei.server.app import create_app, serve
from weei.server.http_limits import HttpLimits


@pytest.fixture
def site(tmp_path: Path) -> Path:
    root = tmp_path / "site"
    (root / "models" / "m").mkdir(parents=True)
    (root / "index.html").write_text("<!doctype html><title>weei</title>")
    (root / "weei.js").write_text("// weei")
    (root / "models" / "m" / "model.json").write_text("{}")
    (root / ".env").write_text("SECRET=1")
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text("[core]")
    (root / "models" / ".hidden.json").write_text("{}")
    (tmp_path / "outside.txt").write_text("outside")
    return root


@asynccontextmanager
async def running(app: web.Application, limits: HttpLimits | None = None) -> AsyncIterator[tuple[str, int]]:
    stop = asyncio.Event()
    ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(serve(app, "127.0.0.1", 0, on_ready=ready.set_result, stop=stop, limits=limits))
    url = await asyncio.wait_for(ready, 10)
    port = int(url.rstrip("/").rsplit(":", 1)[1])
    try:
        yield "127.0.0.1", port
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)


async def raw(host: str, port: int, request: bytes, timeout: float = 5.0) -> bytes:
    """Send ``request`` as is; everything the server answers until it closes."""
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(request)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()


def status_and_headers(answer: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(lines[0].split()[1]), headers, body


def get(target: str) -> bytes:
    return f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode()


def run(scenario: Callable[[], Any]) -> None:
    asyncio.run(scenario())


def test_slowloris_sockets_are_closed_within_the_header_timeout(site: Path) -> None:
    async def scenario() -> None:
        async with running(create_app(site), HttpLimits(header_timeout_s=1.0)) as (host, port):
            socks = []
            for _ in range(4):
                s = socket.create_connection((host, port))
                s.setblocking(False)
                socks.append(s)
            started = time.monotonic()
            closed_at: dict[int, float] = {}
            request = b"GET /weei.js HTTP/1.1\r\nHost: x\r\n"
            i = 0
            while len(closed_at) < len(socks) and time.monotonic() - started < 10:
                for n, s in enumerate(socks):
                    if n in closed_at:
                        continue
                    try:
                        if s.recv(1024) == b"":
                            closed_at[n] = time.monotonic() - started
                            continue
                    except BlockingIOError:
                        pass
                    except ConnectionError:
                        closed_at[n] = time.monotonic() - started
                        continue
                    try:  # one more byte of a request line that never ends
                        s.send(request[i % len(request):i % len(request) + 1])
                    except OSError:
                        closed_at[n] = time.monotonic() - started
                i += 1
                await asyncio.sleep(0.1)
            for s in socks:
                s.close()
            assert len(closed_at) == len(socks), "a slowloris socket stayed open"
            assert max(closed_at.values()) < 4.0, closed_at
            # An ordinary request still works, and an idle keep-alive socket is closed too.
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(b"GET /weei.js HTTP/1.1\r\nHost: x\r\n\r\n")
            first = await asyncio.wait_for(reader.readuntil(b"// weei"), 5)
            assert first.startswith(b"HTTP/1.1 200")
            assert await asyncio.wait_for(reader.read(), 4) == b""
            writer.close()

    run(scenario)


def test_a_websocket_outlives_the_header_timeout(site: Path) -> None:
    async def scenario() -> None:
        app = create_app(site)

        async def echo(request: web.Request) -> web.WebSocketResponse:
            ws = web.WebSocketResponse()
            await ws.prepare(request)
            async for msg in ws:
                await ws.send_str(msg.data)
            return ws

        app.router.add_get("/echo", echo)
        async with running(app, HttpLimits(header_timeout_s=0.5)) as (host, port), \
                aiohttp.ClientSession() as session, session.ws_connect(f"http://{host}:{port}/echo") as ws:
            await asyncio.sleep(1.5)
            await ws.send_str("still here")
            assert (await ws.receive(timeout=5)).data == "still here"

    run(scenario)


@pytest.mark.parametrize("target", [
    "//evil.example/%2e%2e/models",
    "//evil.example/../models",
    "/\\evil.example/%2e%2e/models",
    "/%5cevil.example/%2e%2e/models",
    "/%2f%2fevil.example/%2e%2e/models",
    "/%2F%2Fevil.example/..%2fmodels",
    "//models",
    "///models",
    "/%2fmodels",
    "/models",
    "//evil.example/models",
])
def test_no_redirect_leaves_the_site(site: Path, target: str) -> None:
    async def scenario() -> None:
        async with running(create_app(site)) as (host, port):
            status, headers, _ = status_and_headers(await raw(host, port, get(target)))
            if status in (301, 302, 303, 307, 308):
                location = headers["location"]
                assert location == "/models/", (target, location)
            else:
                assert status == 404, (target, status)

    run(scenario)


def test_directory_redirect_is_one_slash_and_same_origin(site: Path) -> None:
    async def scenario() -> None:
        async with running(create_app(site)) as (host, port):
            for target, location in (("/models", "/models/"), ("/models/m", "/models/m/"), ("//models//m", "/models/m/")):
                status, headers, _ = status_and_headers(await raw(host, port, get(target)))
                assert (status, headers["location"]) == (301, location), target
            status, _, body = status_and_headers(await raw(host, port, get("/models/m/model.json")))
            assert status == 200 and body == b"{}"

    run(scenario)


@pytest.mark.parametrize("target", [
    "/" + "a" * 256, "/models/" + "b" * 300, "/" + "c" * 4000 + "/x", "/%41" + "a" * 300,
])
def test_a_long_segment_is_414_not_500(site: Path, target: str) -> None:
    async def scenario() -> None:
        async with running(create_app(site)) as (host, port):
            status, _, body = status_and_headers(await raw(host, port, get(target)))
            assert status == 414 and b"Traceback" not in body and len(body) < 200

    run(scenario)


def test_a_255_character_name_is_still_served(site: Path) -> None:
    name = "n" * 251 + ".txt"
    (site / name).write_text("long")

    async def scenario() -> None:
        async with running(create_app(site)) as (host, port):
            status, _, body = status_and_headers(await raw(host, port, get("/" + name)))
            assert (status, body) == (200, b"long")

    run(scenario)


@pytest.mark.parametrize("target", [
    "/.env", "/%2eenv", "/%2Eenv", "/.git/config", "/%2egit/config", "/models/.hidden.json",
    "/models/%2ehidden.json", "/.git/", "/.git", "/models/m/../../.env", "/./weei.js", "/%2e/weei.js",
    "/../outside.txt", "/%2e%2e/outside.txt", "/models/%2e%2e/%2e%2e/outside.txt", "/weei.js%00",
])
def test_dotfiles_and_dot_segments_are_never_served(site: Path, target: str) -> None:
    async def scenario() -> None:
        async with running(create_app(site)) as (host, port):
            status, _, body = status_and_headers(await raw(host, port, get(target)))
            assert status in (400, 404), (target, status)
            assert b"SECRET" not in body and b"[core]" not in body and b"outside" not in body

    run(scenario)


def test_an_unexpected_error_is_a_500_with_only_an_error_id(site: Path, caplog: Any) -> None:
    async def scenario() -> None:
        app = create_app(site)

        async def broken(request: web.Request) -> web.Response:
            raise RuntimeError("secret internals /home/x")

        app.router.add_get("/broken", broken)
        async with running(app) as (host, port):
            status, _, body = status_and_headers(await raw(host, port, get("/broken")))
            assert status == 500 and body.startswith(b"internal-error ")
            assert b"Traceback" not in body and b"secret" not in body and len(body) < 64
            error_id = body.split()[1].decode()
            assert any(error_id in record.getMessage() for record in caplog.records)

    run(scenario)


def test_connections_over_the_per_ip_limit_get_429(site: Path) -> None:
    async def scenario() -> None:
        limits = HttpLimits(max_connections_per_ip=3, max_connections=100)
        async with running(create_app(site), limits) as (host, port):
            held = [await asyncio.open_connection(host, port) for _ in range(3)]
            await asyncio.sleep(0.1)
            status, headers, body = status_and_headers(await raw(host, port, get("/weei.js")))
            assert (status, body) == (429, b"too-many-connections\n") and headers["connection"] == "close"
            for _, writer in held[:1]:
                writer.close()
            await asyncio.sleep(0.2)
            status, _, body = status_and_headers(await raw(host, port, get("/weei.js")))
            assert (status, body) == (200, b"// weei")
            for _, writer in held[1:]:
                writer.close()

    run(scenario)


def test_connections_over_the_global_limit_get_503(site: Path) -> None:
    async def scenario() -> None:
        limits = HttpLimits(max_connections_per_ip=100, max_connections=2)
        async with running(create_app(site), limits) as (host, port):
            held = [await asyncio.open_connection(host, port) for _ in range(2)]
            await asyncio.sleep(0.1)
            status, _, body = status_and_headers(await raw(host, port, get("/weei.js")))
            assert (status, body) == (503, b"server-busy\n")
            for _, writer in held:
                writer.close()
            await asyncio.sleep(0.2)
            assert status_and_headers(await raw(host, port, get("/weei.js")))[0] == 200

    run(scenario)


def test_http_limits_are_validated() -> None:
    for bad in ({"header_timeout_s": 0}, {"max_connections": 0}, {"max_connections_per_ip": 0}):
        with pytest.raises(UsageError):
            HttpLimits(**bad)


# ---------------------------------------------------------------------------
# /signal checks Origin


async def upgrade_status(host: str, port: int, origin: str | None, host_header: str | None = None) -> int:
    headers = {"Host": host_header or f"{host}:{port}"}
    if origin is not None:
        headers["Origin"] = origin
    async with aiohttp.ClientSession(skip_auto_headers=("User-Agent",)) as session:
        try:
            async with session.ws_connect(f"http://{host}:{port}/signal", headers=headers) as ws:
                await ws.send_json({"type": "hello"})
                assert (await ws.receive_json(timeout=5))["type"] == "welcome"
                return 101
        except aiohttp.WSServerHandshakeError as exc:
            return exc.status


def test_signal_checks_origin_against_the_allowlist(site: Path) -> None:
    from weei.server.signaling import SIGNALING_KEY, SignalingConfig, add_signaling

    async def scenario() -> None:
        app = create_app(site)
        add_signaling(app, SignalingConfig(allowed_origins=("https://Embed.Example:443/", "http://127.0.0.1:9")))
        async with running(app) as (host, port):
            own = f"http://{host}:{port}"
            assert await upgrade_status(host, port, None) == 101  # the agent: no Origin
            assert await upgrade_status(host, port, own) == 101  # the site's own pages
            # DNS rebinding: evil.example re-pointed at this server sends an Origin that matches its Host.
            rebound = f"evil.example:{port}"
            assert await upgrade_status(host, port, f"http://{rebound}", rebound) == 403
            assert await upgrade_status(host, port, "https://embed.example") == 101
            assert await upgrade_status(host, port, "http://127.0.0.1:9") == 101
            assert await upgrade_status(host, port, f"http://localhost:{port}") == 101  # loopback by name
            for stranger in ("https://evil.example", "http://embed.example", "https://embed.example:8443",
                             f"http://{host}:{port + 1}", "null", "garbage", f"http://evil.example:{port}"):
                assert await upgrade_status(host, port, stranger) == 403, stranger
            # A proxy's name is the server's only when the operator lists it (see the next test).
            assert await upgrade_status(host, port, "https://weei.example", "weei.example") == 403
            assert app[SIGNALING_KEY].refused_origins == 9
            assert app[SIGNALING_KEY].hub.connection_count == 0

    run(scenario)


def test_any_origin_is_opt_in_and_origins_are_validated(site: Path) -> None:
    from weei.server.signaling import SignalingConfig, add_signaling

    async def scenario() -> None:
        app = create_app(site)
        add_signaling(app, SignalingConfig(allowed_origins=("*",)))
        async with running(app) as (host, port):
            assert await upgrade_status(host, port, "https://evil.example") == 101

    run(scenario)

    async def proxied() -> None:
        app = create_app(site)
        add_signaling(app, SignalingConfig(allowed_origins=("https://weei.example",)))
        async with running(app) as (host, port):
            assert await upgrade_status(host, port, "https://weei.example", "weei.example") == 101

    run(proxied)
    for bad in ("embed.example", "ftp://x.example", "https://x.example/path", "https://u@x.example", "https://x:99999"):
        with pytest.raises(UsageError) as info:
            SignalingConfig(allowed_origins=(bad,))
        assert info.value.reason == "invalid-origin"
    assert SignalingConfig(allowed_origins=("HTTP://[::1]:80/",)).allowed_origins == ("http://[::1]",)


# ---------------------------------------------------------------------------
# Framing and the test hooks


def test_documents_carry_a_policy_that_limits_framing_and_scripts(site: Path) -> None:
    async def fetch(app: web.Application, path: str) -> tuple[dict[str, str], str]:
        async with running(app) as (host, port), aiohttp.ClientSession() as session:
            async with session.get(f"http://{host}:{port}{path}") as response:
                return dict(response.headers), await response.text()

    async def scenario() -> None:
        headers, _ = await fetch(create_app(site), "/")
        policy = headers["Content-Security-Policy"]
        assert "frame-ancestors 'self'" in policy and headers["X-Frame-Options"] == "SAMEORIGIN"
        assert headers["Referrer-Policy"] == "no-referrer"
        assert "script-src 'self' 'wasm-unsafe-eval'" in policy and "unsafe-inline" not in policy
        headers, _ = await fetch(create_app(site, frame_origins=("https://embed.example", "*")), "/index.html")
        assert headers["Content-Security-Policy"].endswith("frame-ancestors 'self' https://embed.example")
        assert "X-Frame-Options" not in headers  # it cannot name embed.example
        # Scripts are loaded by other origins' pages under their own policy: no document policy on them.
        headers, _ = await fetch(create_app(site), "/weei.js")
        assert "Content-Security-Policy" not in headers and headers["Access-Control-Allow-Origin"] == "*"
        # The landing page's test-hook switch is off unless the server was started for tests.
        _, text = await fetch(create_app(site), "/test-hooks.js")
        assert "WEEI_TEST_HOOKS = true" not in text
        _, text = await fetch(create_app(site, test_hooks=True), "/test-hooks.js")
        assert text.startswith("window.WEEI_TEST_HOOKS = true;")

    run(scenario)
