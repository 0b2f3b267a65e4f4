"""The aiohttp application of ``weei serve`` and its runner.

Theory of operation
-------------------
:func:`create_app` is an ordinary aiohttp app factory. The static site is
not a route: a middleware serves a file only when no route matched the
request (aiohttp's own "not found"), so routes added to the app in any
order, before or after this factory (``add_signaling(app, config)`` puts
the signaling WebSocket on ``GET /signal``), always win. Every response,
errors included, gets the cross-origin headers in an
``on_response_prepare`` hook:

* ``Access-Control-Allow-Origin: *`` - a page on another origin loads
  ``weei.js``, imports ``pyodide.mjs`` and ``worker.js`` as modules and
  fetches the wasm and the package (module scripts are always CORS);
* ``Cross-Origin-Resource-Policy: cross-origin`` - so an embedder that is
  cross-origin isolated (COEP ``require-corp``) may still load them;
* ``Cache-Control: no-cache`` - files keep their names across builds, so
  the browser revalidates (Last-Modified / If-Modified-Since) every time.

An HTML document (the landing page; the only documents Weei serves) also
gets :func:`content_security_policy`: scripts, styles, workers and
connections from this origin only, WebAssembly compilation allowed, no
inline script or style, and ``frame-ancestors`` limited to this origin and
the origins the operator allows (``--allow-origin``), so no other site can
frame the page and click-jack its buttons (Accept an invitation). Scripts,
wasm and the other files keep no such header: pages of other origins load
them with one tag and their own policy applies there.

``GET /test-hooks.js`` is a route: ``window.WEEI_TEST_HOOKS = true`` when the
app was made with ``test_hooks`` (``weei serve --test-hooks``, what the
browser tests and benchmarks start), otherwise a script that does nothing.
The landing page loads it before ``weei.js``, so only a test server's page
exposes the test hooks (``hostPython`` runs any Python in the page's host
worker).

Content types come from :data:`MIME_TYPES` rather than the platform's
``mimetypes`` table: browsers refuse module scripts that are not served
as JavaScript and ``WebAssembly.compileStreaming`` wants
``application/wasm``.

:func:`serve` binds, reports the URL through a callback and runs until
:func:`run`'s SIGINT/SIGTERM handler (or the caller) sets ``stop``; the
runner's cleanup closes open connections, so shutdown is clean.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from urllib.parse import quote

from aiohttp import web

from .http_limits import ConnectionGate, GatedSite, HttpLimits
from .log_redaction import redact_parser_errors
from .origins import ANY_ORIGIN
from .signaling import SignalingConfig, add_signaling

__all__ = ["MIME_TYPES", "SITE_DIR_KEY", "content_security_policy", "create_app", "default_site_dir", "serve", "run",
           "run_app"]

MIME_TYPES: dict[str, str] = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".json": "application/json",
    ".map": "application/json",
    ".wasm": "application/wasm",
    ".zip": "application/zip",
    ".bin": "application/octet-stream",
    ".txt": "text/plain; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
}
_FALLBACK_TYPE = "application/octet-stream"

log = logging.getLogger("weei.server")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

SITE_DIR_KEY: web.AppKey[Path] = web.AppKey("weei_site_dir", Path)
_DOCUMENT_HEADERS_KEY: web.AppKey[dict[str, str]] = web.AppKey("weei_document_headers", dict)

_CROSS_ORIGIN_HEADERS = {
    "Access-Control-Allow-Origin": "*",
    "Cross-Origin-Resource-Policy": "cross-origin",
    "X-Content-Type-Options": "nosniff",
}


def default_site_dir() -> Path:
    """``./dist`` when it exists, else ``dist/`` at the repository root."""
    here = Path.cwd() / "dist"
    if here.is_dir():
        return here
    return Path(__file__).resolve().parents[4] / "dist"


def content_security_policy(frame_origins: tuple[str, ...] = ()) -> str:
    """The Content-Security-Policy of Weei's HTML documents; ``frame_origins``
    (normalized origins, ``*`` ignored: framing needs a name) may frame them
    besides this origin."""
    ancestors = " ".join(["'self'", *(o for o in frame_origins if o != ANY_ORIGIN)])
    return "; ".join((
        "default-src 'none'",
        # Pyodide and the models are WebAssembly: compiling it needs 'wasm-unsafe-eval' (not 'unsafe-eval').
        "script-src 'self' 'wasm-unsafe-eval'",
        # The Workers start from a blob: module that imports the real script (so that an embedding
        # page of another origin can start them too); a blob Worker runs under this policy.
        "worker-src 'self' blob:",
        # fetch of the Pyodide files, packages and models, and the signaling WebSocket (same origin).
        "connect-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "base-uri 'none'",
        "form-action 'none'",
        f"frame-ancestors {ancestors}",
    ))


def _document_headers(frame_origins: tuple[str, ...]) -> dict[str, str]:
    # A room key may still arrive in an older link's query (?room=KEY) until the page's first script
    # moves it into the fragment; no Referer may carry it to the stylesheet and scripts fetched before.
    headers = {"Content-Security-Policy": content_security_policy(frame_origins), "Referrer-Policy": "no-referrer"}
    if not any(o != ANY_ORIGIN for o in frame_origins):
        # For browsers without frame-ancestors; it cannot name another origin, so it is left out then.
        headers["X-Frame-Options"] = "SAMEORIGIN"
    return headers


async def _add_headers(request: web.Request, response: web.StreamResponse) -> None:
    for name, value in _CROSS_ORIGIN_HEADERS.items():
        response.headers.setdefault(name, value)
    response.headers.setdefault("Cache-Control", "no-cache")
    if response.headers.get("Content-Type", "").startswith("text/html"):
        for name, value in request.app[_DOCUMENT_HEADERS_KEY].items():
            response.headers.setdefault(name, value)


def _no_route(request: web.Request) -> bool:
    # For a request no route matched, aiohttp's match_info carries the
    # HTTPNotFound it will raise (a MatchInfoError).
    return isinstance(getattr(request.match_info, "http_exception", None), web.HTTPNotFound)


#: The longest path segment served (a file name on every file system we
#: serve from is at most 255 bytes); longer is 414, never an OS error.
MAX_SEGMENT = 255


def _segments(path: str) -> list[str]:
    """The segments of the decoded URL path ``path``, empty ones (``//``)
    dropped. Raises HTTPNotFound for a dot segment or a dotfile (any
    segment starting with ``.``, so ``..`` too), a backslash or NUL, and
    HTTPRequestURITooLong for a segment over :data:`MAX_SEGMENT`."""
    segments = [s for s in path.split("/") if s]
    for segment in segments:
        if len(segment) > MAX_SEGMENT:
            raise web.HTTPRequestURITooLong(text="path-segment-too-long")
        if segment.startswith(".") or "\\" in segment or "\0" in segment:
            raise web.HTTPNotFound()
    return segments


def _site_file(root: Path, request_path: str) -> Path:
    """The file under ``root`` for the decoded URL path ``request_path``.
    Raises HTTPNotFound (missing, hidden, or outside ``root``), 414 (a
    segment too long) or a redirect (a directory without '/') whose
    Location is a same-origin absolute path: one '/', then the segments."""
    segments = _segments(request_path)
    try:
        target = root.joinpath(*segments).resolve()
        if not target.is_relative_to(root):
            raise web.HTTPNotFound()
        if target.is_dir():
            if segments and not request_path.endswith("/"):
                location = "/" + "/".join(quote(s, safe="!$&'()*+,;=:@-._~") for s in segments) + "/"
                raise web.HTTPMovedPermanently(location=location)
            target = target / "index.html"
        if not target.is_file():
            raise web.HTTPNotFound()
    except (OSError, ValueError):
        raise web.HTTPNotFound() from None
    return target


@web.middleware
async def _no_tracebacks(request: web.Request, handler: Handler) -> web.StreamResponse:
    """An unexpected exception becomes a 500 that names only an error id
    (the traceback goes to the server's log under that id), whatever
    aiohttp's debug mode would show."""
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except Exception:  # noqa: BLE001 (the boundary of every handler)
        error_id = secrets.token_hex(6)
        log.exception("internal error %s on %s %s", error_id, request.method, request.path[:200])
        return web.Response(status=500, text=f"internal-error {error_id}\n")


@web.middleware
async def _static_fallback(request: web.Request, handler: Handler) -> web.StreamResponse:
    if not _no_route(request):
        return await handler(request)
    if request.method == "OPTIONS":
        # CORS preflight; simple GETs (all the site needs) never send one.
        return web.Response(status=204, headers={
            "Access-Control-Allow-Methods": "GET, HEAD, OPTIONS",
            "Access-Control-Allow-Headers": "*",
            "Access-Control-Max-Age": "86400",
        })
    if request.method not in ("GET", "HEAD"):
        return await handler(request)
    target = _site_file(request.app[SITE_DIR_KEY], request.path)
    content_type = MIME_TYPES.get(target.suffix.lower(), _FALLBACK_TYPE)
    return web.FileResponse(target, headers={"Content-Type": content_type})


_TEST_HOOKS_ON = "window.WEEI_TEST_HOOKS = true; // weei serve --test-hooks\n"
_TEST_HOOKS_OFF = "// The test hooks are off (weei serve --test-hooks turns them on).\n"


def create_app(site_dir: Path, *, frame_origins: tuple[str, ...] = (), test_hooks: bool = False) -> web.Application:
    """The Weei server app serving the static files of ``site_dir`` (made
    absolute) wherever no route matches; its HTML documents may be framed by
    this origin and ``frame_origins`` (normalized, as
    ``SignalingConfig.allowed_origins``); ``test_hooks`` turns the landing
    page's test hooks on. Raises FileNotFoundError if ``site_dir`` is not a
    directory."""
    root = Path(site_dir).resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a directory (build it with: python build.py site)")
    app = web.Application(middlewares=[_no_tracebacks, _static_fallback])
    app[SITE_DIR_KEY] = root
    app[_DOCUMENT_HEADERS_KEY] = _document_headers(tuple(frame_origins))
    switch = _TEST_HOOKS_ON if test_hooks else _TEST_HOOKS_OFF

    async def test_hooks_switch(request: web.Request) -> web.Response:
        del request
        return web.Response(text=switch, content_type="text/javascript", charset="utf-8")

    app.router.add_get("/test-hooks.js", test_hooks_switch)
    app.on_response_prepare.append(_add_headers)
    return app


def _url_host(host: str) -> str:
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


async def serve(
    app: web.Application,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    on_ready: Callable[[str], None] | None = None,
    stop: asyncio.Event | None = None,
    limits: HttpLimits | None = None,
) -> None:
    """Serve ``app`` on ``host:port`` (port 0: any free port) until ``stop``
    is set, with ``limits`` (timeouts, connection limits: :mod:`.http_limits`);
    call ``on_ready(url)`` once listening. Raises OSError when the address
    cannot be bound."""
    limits = limits or HttpLimits()
    redact_parser_errors()  # no access log, and an unparsable request is logged without its text
    runner = web.AppRunner(app, access_log=None, handle_signals=False, keepalive_timeout=limits.header_timeout_s)
    await runner.setup()
    try:
        site = GatedSite(runner, host, port, ConnectionGate(limits))
        await site.start()
        bound_port = runner.addresses[0][1]
        if on_ready is not None:
            on_ready(f"http://{_url_host(host)}:{bound_port}/")
        await (stop or asyncio.Event()).wait()
    finally:
        await runner.cleanup()


def run_app(app: web.Application, host: str = "127.0.0.1", port: int = 8000,
            on_ready: Callable[[str], None] | None = None, limits: HttpLimits | None = None) -> int:
    """Serve ``app`` (:func:`serve`) until SIGINT or SIGTERM; return an exit status."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await serve(app, host, port, on_ready=on_ready, stop=stop, limits=limits)

    asyncio.run(main())
    return 0


def run(site_dir: Path, host: str = "127.0.0.1", port: int = 8000,
        on_ready: Callable[[str], None] | None = None, signaling: SignalingConfig | None = None,
        limits: HttpLimits | None = None, test_hooks: bool = False) -> int:
    """Serve ``site_dir`` and the signaling endpoint until SIGINT or SIGTERM; return an exit status.
    The origins the signaling allows may also frame the site's pages."""
    signaling = signaling or SignalingConfig()
    app = create_app(site_dir, frame_origins=signaling.allowed_origins, test_hooks=test_hooks)
    add_signaling(app, signaling)
    return run_app(app, host, port, on_ready, limits)
