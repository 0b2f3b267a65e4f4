"""Weei's pages under their Content-Security-Policy: another site cannot frame
the landing page (so it cannot click-jack Accept), an allowed origin can, and
everything the page runs -- Pyodide in the host worker and a training
Worker, the window -- works without one violation."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

from site_helpers import start_server, stop_server

HOOKS = "__weeiTestHooks.get('distributed-training')"
#: Records every securitypolicyviolation the document sees (before any of its scripts run).
RECORD_VIOLATIONS = """
window.__violations = [];
document.addEventListener('securitypolicyviolation',
  (e) => window.__violations.push(`${e.violatedDirective} ${e.blockedURI}`));
"""


@pytest.fixture(scope="module")
def framing_origin() -> Iterator[str]:
    """Another site (another port): GET /frame?src=URL is a page that frames URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            src = parse_qs(urlparse(self.path).query).get("src", [""])[0].replace('"', "%22")
            body = (f"<!doctype html><meta charset=utf-8><title>someone else's site</title>"
                    f'<iframe id=weei src="{src}" width=800 height=600 onload="window.framed = true"></iframe>').encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def framed(browser: Any, framing_origin: str, weei_url: str) -> dict[str, Any]:
    """Open the foreign page framing Weei's invite link; what the frame holds."""
    context = browser.new_context()
    try:
        pg = context.new_page()
        console: list[str] = []
        pg.on("console", lambda m: console.append(m.text))
        invite = f"{weei_url}#room=framing-test-room-key"
        pg.goto(f"{framing_origin}/frame?src={invite}")
        # The frame's load event comes once its document is in, or once the browser refused it.
        pg.wait_for_function("() => window.framed === true")
        frame = pg.frame_locator("#weei")
        child = next(f for f in pg.frames if f != pg.main_frame)
        opened = frame.locator("#open").count()
        weei = child.evaluate("() => typeof window.weeiReady") if opened else "undefined"
        return {"open_buttons": opened, "weei": weei, "console": console, "url": child.url}
    finally:
        context.close()


def test_a_foreign_site_cannot_frame_the_landing_page(browser: Any, site: Path, weei_server: Any,
                                                       framing_origin: str) -> None:
    out = framed(browser, framing_origin, weei_server.url)
    # The browser refused the document: no Weei runs in the frame, there is no button to press.
    assert out["open_buttons"] == 0 and out["weei"] == "undefined", out
    assert any("frame-ancestors" in line for line in out["console"]), out["console"]

    # The operator's allowed origin may frame it (the same check, so it does see a framed page).
    allowed = start_server(site, "--allow-origin", framing_origin)
    try:
        out = framed(browser, framing_origin, allowed.url)
        assert out["open_buttons"] == 1 and out["weei"] == "object", out
        assert not any("Content Security Policy" in line for line in out["console"]), out["console"]
    finally:
        assert stop_server(allowed) == 0


def test_the_landing_page_runs_everything_under_its_policy(weei_server: Any, page: Any) -> None:
    """Pyodide in the host worker and in a training Worker (WebAssembly), the
    signaling socket, IndexedDB and the window's styles: no violation."""
    pg, log = page
    pg.add_init_script(RECORD_VIOLATIONS)
    response = pg.goto(weei_server.url + "#room=csp-test-room-key")
    policy = response.headers["content-security-policy"]
    assert "script-src 'self' 'wasm-unsafe-eval'" in policy and "'unsafe-inline'" not in policy
    out = pg.evaluate(f"""async () => {{
      const weei = await weeiReady;
      const api = weei.widgetsApi.get('distributed-training');
      const hooks = {HOOKS};
      await hooks.startApi();
      const trained = await hooks.trainOnce('digits-mlp');
      await new Promise((resolve) => {{
        const check = () => (api.getState().myPeerId ? resolve() : setTimeout(check, 100));
        check();
      }});
      await api.enable();
      const root = document.querySelector('[data-weei-widget]').shadowRoot;
      const win = root.querySelector('.win');
      return {{ units: trained.uniqueExamples, peer: api.getState().myPeerId,
               position: getComputedStyle(win).position, lead: getComputedStyle(document.querySelector('.lead')).color,
               violations: window.__violations }};
    }}""")
    assert out["units"] > 0 and out["peer"], out  # trained in a Worker; joined the room over /signal
    assert out["position"] == "fixed", out  # the window's constructed style sheets apply
    assert out["lead"] != "rgb(0, 0, 0)", out  # landing.css applies
    assert out["violations"] == [], out["violations"]
    assert not [line for line in log.console if "Content Security Policy" in line], log.console
    assert not log.errors, log.errors
