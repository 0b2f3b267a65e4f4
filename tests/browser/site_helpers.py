"""Helpers of the browser tests (imported by conftest.py and the tests)."""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parents[2]
DIST = ROOT / "dist"
CHROMIUM = os.environ.get("WEEI_CHROMIUM", "/usr/bin/chromium")
#: As weei.demo.browsers.CHROMIUM_ARGS (why --disable-dev-shm-usage: there).
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage",
]
#: Generous: a cold Pyodide start is ~5 s on 2 cores; a whole test takes ~10 s.
TIMEOUT_MS = 90_000


def b64(data: bytes | bytearray) -> str:
    return base64.b64encode(data).decode("ascii")


#: JS helper for page.evaluate: base64 -> ArrayBuffer.
JS_FROM_B64 = "(s) => Uint8Array.from(atob(s), (c) => c.charCodeAt(0)).buffer"

#: JS for page.evaluate: run Python source, then code, in one fresh namespace of the page's main-thread Pyodide
#: (each of data, base64, bound there as a Uint8Array first, each of values as it is); returns code's value.
JS_RUN_IN_PYODIDE = f"""async ([source, code, data, values, awaited]) => {{
  const fromB64 = {JS_FROM_B64};
  const {{ pyodide }} = await __weeiTestHooks.get('distributed-training').mainThreadPython();
  const ns = pyodide.globals.get('dict')();
  pyodide.runPython(source, {{ globals: ns }});
  for (const [name, bytes] of Object.entries(data)) ns.set(name, new Uint8Array(fromB64(bytes)));
  for (const [name, value] of Object.entries(values)) ns.set(name, value);
  return awaited ? await pyodide.runPythonAsync(code, {{ globals: ns }}) : pyodide.runPython(code, {{ globals: ns }});
}}"""


def run_in_pyodide(pg: Any, source: str, code: str, *, awaited: bool = False, **names: Any) -> Any:
    """Run ``source`` (definitions) and then ``code`` in the Pyodide of ``pg`` (a page of `weei serve
    --test-hooks`), with ``names`` bound there (bytes as Uint8Array proxies, other JSON values as they are);
    returns the value of ``code``. ``awaited``: run ``code`` with runPythonAsync (the WebGPU shim awaits)."""
    data = {name: b64(value) for name, value in names.items() if isinstance(value, (bytes, bytearray))}
    values = {name: value for name, value in names.items() if not isinstance(value, (bytes, bytearray))}
    return pg.evaluate(JS_RUN_IN_PYODIDE, [source, code, data, values, awaited])


@dataclass
class Server:
    url: str
    proc: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)


#: `weei serve` keeps its signaling secret under $XDG_STATE_HOME; the tests' servers keep theirs here, one folder
#: per test process (a restart within a test still finds it), never in the user's home.
STATE_HOME = tempfile.mkdtemp(prefix="weei-test-state-")


def start_server(site: Path, *extra: str) -> Server:
    """Start `weei serve` on a free port; return it once it printed its URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "weei.cli", "serve", "--port", "0", "--dir", str(site), "--test-hooks", *extra],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "XDG_STATE_HOME": STATE_HOME},
    )
    assert proc.stdout is not None
    first = proc.stdout.readline()
    if "http://" not in first:
        proc.kill()
        raise RuntimeError(f"weei serve did not start: {first}{proc.stdout.read()}")
    url = first[first.index("http://"):].split()[0]
    server = Server(url, proc, [first])
    threading.Thread(target=lambda: server.lines.extend(proc.stdout or ()), daemon=True).start()
    return server


def stop_server(server: Server) -> int:
    server.proc.send_signal(signal.SIGTERM)
    return server.proc.wait(timeout=15)


#: What the RTC harness page needs besides `weei serve` (tests/browser/test_rtc.py, bench/bench_rtc.py).
HARNESS_FILES = ("rtc_harness.html", "rtc_peer.py", "link_cases.py")


def serve_harness() -> tuple[ThreadingHTTPServer, str]:
    """A second origin serving the harness files, read now (not from dist/: other builds may wipe it meanwhile).
    Returns the server (``shutdown()`` and ``server_close()`` it) and its URL."""
    here = Path(__file__).parent
    files = {name: (here / name).read_bytes() for name in HARNESS_FILES}
    types = {"html": "text/html; charset=utf-8", "py": "text/plain; charset=utf-8"}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            name = urlparse(self.path).path.lstrip("/")
            if name not in files:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", types[name.rsplit(".", 1)[1]])
            self.send_header("Content-Length", str(len(files[name])))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(files[name])

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}"
