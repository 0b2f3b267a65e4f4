"""Fixtures of the browser tests: the built site, `weei serve`, Chromium.

The session builds dist/ once (``python build.py site``), starts ``weei
serve --port 0`` in a subprocess (its first line names the URL) and one
headless system Chromium through Playwright; each test gets a fresh page
(``page``), or pages in Chromium processes of their own (``browsers``).
The server must exit 0 on SIGTERM (clean shutdown).

Set WEEI_CHROMIUM to use another Chromium binary. Playwright never
downloads a browser here: it drives the system one via executable_path.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from room_helpers import capture_console
from site_helpers import CHROMIUM, CHROMIUM_ARGS, DIST, ROOT, TIMEOUT_MS, Server, start_server, stop_server
from test_api import ready


#: What Playwright says when Chromium's renderer process dies under the test (a clean-clone CI once saw
#: one, in a fresh Chromium process, before the page had logged anything). A test is run once more after
#: such a crash, and only then (pytest-rerunfailures reports it as a rerun); a product bug that crashes
#: the renderer every time still fails.
RENDERER_CRASHED = ["Target crashed", "Page crashed"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.browser)
            item.add_marker(pytest.mark.flaky(reruns=1, only_rerun=RENDERER_CRASHED))


@pytest.fixture(scope="session")
def site() -> Path:
    proc = subprocess.run([sys.executable, "build.py", "site"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return DIST


@pytest.fixture(scope="session")
def weei_server(site: Path) -> Iterator[Server]:
    server = start_server(site)
    yield server
    assert stop_server(server) == 0, "weei serve did not shut down cleanly:\n" + "".join(server.lines)


@pytest.fixture(scope="session")
def host_origin() -> Iterator[str]:
    """A second origin (another port) whose pages embed Weei with one tag:
    GET /embed?weei=<weei url> returns such a page."""
    from urllib.parse import parse_qs, urlparse

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            query = parse_qs(urlparse(self.path).query)
            weei = query.get("weei", [""])[0]
            if not urlparse(self.path).path == "/embed" or not weei:
                self.send_response(404)
                self.end_headers()
                return
            body = (
                "<!doctype html><html><head><meta charset=utf-8><link rel=icon href='data:,'>"
                "<title>host</title></head><body><p>A page of someone else's site.</p>"
                f"<script src=\"{weei}weei.js\"></script></body></html>"
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="session")
def playwright() -> Iterator[Any]:
    # One Playwright per session: its sync API refuses to start a second one
    # while the first one's loop runs, so every browser is launched from here.
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM} (apt-get install chromium, or set WEEI_CHROMIUM)")
    with sync_playwright() as pw:
        yield pw


@pytest.fixture(scope="session")
def browser(playwright: Any) -> Iterator[Any]:
    b = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
    yield b
    b.close()


@pytest.fixture(scope="session")
def webgpu_browser(playwright: Any) -> Iterator[Any]:
    """Chromium with a WebGPU adapter (SwiftShader, software)."""
    b = playwright.chromium.launch(executable_path=CHROMIUM, args=[*CHROMIUM_ARGS, "--enable-unsafe-webgpu"])
    yield b
    b.close()


@pytest.fixture
def browsers(browser: Any) -> Iterator[Any]:
    """A factory of pages on the served site, each in a Chromium process of its own (as on different machines);
    ``browsers(url, *chromium_args, timeout_ms=...)`` opens one and waits for its API (test_api.ready).
    All closed afterwards."""
    opened: list[Any] = []

    def open_page(url: str, *extra: str, timeout_ms: int = TIMEOUT_MS) -> Any:
        process = browser.browser_type.launch(executable_path=CHROMIUM, args=[*CHROMIUM_ARGS, *extra])
        opened.append(process)
        pg = process.new_page()
        pg.set_default_timeout(timeout_ms)
        capture_console(pg)
        ready(pg, url)
        return pg

    yield open_page
    for process in opened:
        process.close()


@dataclass
class PageLog:
    errors: list[str] = field(default_factory=list)
    console: list[str] = field(default_factory=list)


@pytest.fixture
def page(browser: Any) -> Iterator[tuple[Any, PageLog]]:
    context = browser.new_context()
    pg = context.new_page()
    pg.set_default_timeout(TIMEOUT_MS)
    log = PageLog()
    pg.on("pageerror", lambda e: log.errors.append(f"pageerror: {e}"))
    pg.on("console", lambda m: log.console.append(f"{m.type}: {m.text}"))
    pg.on("requestfailed", lambda r: log.errors.append(f"request failed: {r.url} {r.failure}"))
    pg.on("response", lambda r: log.errors.extend([f"HTTP {r.status} {r.url}"] if r.status >= 400 else []))
    yield pg, log
    context.close()
