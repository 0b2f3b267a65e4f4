"""The README's embed snippet, pasted into a page of another origin (a second local HTTP server on another
port), shows the window in the room; on an origin the server does not allow, the error names the origin and
the flag, and the server says the refusal once (issue 24, item 6)."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from site_helpers import ROOT, start_server, stop_server

from weei.server.invite import embed_snippet, fresh_key

HOST = "[data-weei-widget]"


def readme_snippet() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    lines = [line.strip() for line in text.splitlines() if "weei.js\" data-room=" in line or "weeiReady.then(" in line]
    return "\n".join(lines[:2])


@pytest.fixture(scope="module")
def other_origin() -> Iterator[tuple[str, dict[str, str]]]:
    """A site on another port that serves whatever page the test puts under its path."""
    pages: dict[str, str] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            body = pages.get(self.path, "").encode()
            self.send_response(200 if body else 404)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", pages
    httpd.shutdown()
    httpd.server_close()


def _page(snippet: str) -> str:
    return ("<!doctype html><html><head><meta charset=utf-8><link rel=icon href='data:,'><title>mine</title></head>"
            f"<body><p>A page of someone else's site.</p>\n{snippet}\n</body></html>")


def test_one_snippet_everywhere(weei_server: Any, browser: Any) -> None:
    url = weei_server.url
    banner = "\n".join(line.strip() for line in weei_server.lines if "weei.js\" data-room=" in line or "weeiReady" in line)
    key = re.search(r'data-room="([^"]+)"', banner).group(1)  # type: ignore[union-attr]
    assert banner == embed_snippet(url, key)
    assert readme_snippet() == embed_snippet("http://127.0.0.1:8000/", "KEY")
    pg = browser.new_page()
    try:
        pg.goto(f"{url}#room={key}")
        pg.wait_for_function("() => document.getElementById('embed').textContent.includes('data-room=\"' + location.hash.slice(6))")
        assert pg.locator("#embed").text_content() == embed_snippet(url, key)
    finally:
        pg.close()


def test_the_readme_snippet_on_another_origin(site: Path, browser: Any, other_origin: tuple[str, dict[str, str]]) -> None:
    origin, pages = other_origin
    refusing = start_server(site)
    allowing = start_server(site, "--allow-origin", origin)
    try:
        key = fresh_key()
        pages["/refused"] = _page(readme_snippet().replace("http://127.0.0.1:8000/", refusing.url).replace("KEY", key))
        pages["/allowed"] = _page(readme_snippet().replace("http://127.0.0.1:8000/", allowing.url).replace("KEY", key))

        # Allowed: the snippet alone opens the window, in the room.
        pg = browser.new_page()
        pg.goto(f"{origin}/allowed")
        pg.wait_for_selector(HOST, state="attached", timeout=90_000)
        pg.get_by_role("dialog").wait_for()
        room = pg.evaluate("weeiReady.then((w) => w.widgetsApi.get('distributed-training').getRoom())")
        assert room and room["key"] == key
        pg.wait_for_function("() => weei.widgetsApi.get('distributed-training').getState().myPeerId", timeout=90_000)
        pg.close()

        # Refused: the window says whose origin and which flag; the server says it once, for two loads.
        for _ in range(2):
            pg = browser.new_page()
            pg.goto(f"{origin}/refused")
            pg.wait_for_selector(HOST, state="attached", timeout=90_000)
            alert = pg.locator(f"{HOST} .error[role=alert]").filter(has_text="origin-not-allowed").first
            alert.wait_for(timeout=90_000)
            text = alert.inner_text()
            assert f"does not let pages of {origin} use its signaling" in text, text
            assert f"weei serve --allow-origin {origin}" in text, text
            assert "signaling socket closed ()" not in text
            pg.close()
        said = [line for line in refusing.lines if "refused pages of origin" in line]
        assert len(said) == 1 and f"weei serve --allow-origin {origin}" in said[0], refusing.lines
    finally:
        assert stop_server(refusing) == 0
        assert stop_server(allowing) == 0
