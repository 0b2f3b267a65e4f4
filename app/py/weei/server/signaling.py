"""The signaling WebSocket of ``weei serve``: the aiohttp adapter of :mod:`.rooms`.

Theory of operation
-------------------
:func:`add_signaling` registers ``GET /signal`` (``SignalingConfig.path``)
on an aiohttp application, a sweeper task for timeouts, and a shutdown hook
that closes every socket with 1001 (going away). All decisions -- who may
join, what is relayed to whom, what is refused -- belong to
:class:`~.rooms.Hub`; this module only moves frames:

* each socket's reader loop hands frames to ``Hub.on_frame`` with
  ``loop.time()`` as ``now``;
* each socket has an :class:`_Outbox` drained by its own writer task, so a
  peer that does not read never blocks the others; an outbox over
  ``max_outbound_frames`` frames or ``max_outbound_bytes`` bytes closes that
  peer (slow-consumer): a peer that does not read costs at most that budget;
* each connection is accounted to its IP address (``request.remote``), the
  hub's *source*: per-address budgets on joins, refused joins, rooms and bytes;
* the optional ``relay_log`` hook sees every frame the server sends, as the
  exact text, so an operator (or a test) can audit that only welcomes, peer
  lists, offers, answers, candidates, pongs and errors ever leave it.

The server never sees weights, data, metrics or checkpoints: those go over
WebRTC data channels between the browsers.

``python -m weei.server.signaling`` runs the signaling server alone.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
import logging
import os
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from aiohttp import WSMsgType, web

from ..core.errors import UsageError, UsageReason
from .http_limits import HttpLimits
from .origins import normalize_origin, origin_allowed
from .rooms import Close, CloseCode, Hub, Limits, Output, Reason

__all__ = [
    "IceServer",
    "RelayRecord",
    "SignalingConfig",
    "Signaling",
    "SIGNALING_KEY",
    "add_arguments",
    "add_signaling",
    "configs_from",
    "create_signaling_app",
    "main",
]

log = logging.getLogger("weei.signaling")

#: Origins whose first refusal is said on the console, by name; later ones are only counted and logged at info.
_MAX_ORIGINS_SAID = 64

_ICE_SCHEMES = ("stun:", "stuns:", "turn:", "turns:")


@dataclass(frozen=True)
class IceServer:
    """One STUN/TURN server for ``RTCPeerConnection({iceServers})``.

    TURN servers need credentials: either fixed ``username``/``credential``,
    or ``shared_secret`` -- coturn's ``use-auth-secret`` / ``static-auth-secret``
    (the "TURN REST API"): each welcome then carries a credential minted for
    that peer, valid ``ttl_s`` seconds.
    """

    urls: tuple[str, ...]
    username: str | None = None
    credential: str | None = None
    shared_secret: str | None = None
    ttl_s: int = 24 * 3600

    def __post_init__(self) -> None:
        if isinstance(self.urls, str) or not self.urls:
            raise UsageError(UsageReason.INVALID_ICE_SERVER, "IceServer.urls must be a non-empty tuple of URLs")
        for url in self.urls:
            if not isinstance(url, str) or not url.startswith(_ICE_SCHEMES):
                raise UsageError(UsageReason.INVALID_ICE_SERVER, f"ICE server URL {url!r} must start with stun:, stuns:, turn: or turns:")
        turn = any(url.startswith(("turn:", "turns:")) for url in self.urls)
        fixed = self.username is not None or self.credential is not None
        if fixed and (self.username is None or self.credential is None):
            raise UsageError(UsageReason.INVALID_ICE_SERVER, "IceServer needs both username and credential, or neither")
        if fixed and self.shared_secret is not None:
            raise UsageError(UsageReason.INVALID_ICE_SERVER, "IceServer takes fixed credentials or shared_secret, not both")
        if turn and not fixed and self.shared_secret is None:
            raise UsageError(UsageReason.INVALID_ICE_SERVER, f"TURN server {self.urls[0]!r} needs credentials or shared_secret")
        if self.ttl_s < 60:
            raise UsageError(UsageReason.INVALID_ICE_SERVER, "IceServer.ttl_s must be at least 60 seconds")

    @classmethod
    def parse(cls, text: str) -> IceServer:
        """``URL[,URL...][|username|credential]`` or ``URL...|secret:SHARED`` (for the command line)."""
        parts = text.split("|")
        urls = tuple(u for u in parts[0].split(",") if u)
        if len(parts) == 1:
            return cls(urls)
        if len(parts) == 2 and parts[1].startswith("secret:"):
            return cls(urls, shared_secret=parts[1][len("secret:"):])
        if len(parts) == 3:
            return cls(urls, username=parts[1], credential=parts[2])
        raise UsageError(UsageReason.INVALID_ICE_SERVER, f"cannot read ICE server {text!r}")

    def describe(self, peer_id: str, unix_now: float) -> dict[str, Any]:
        """The ``RTCIceServer`` dictionary sent to ``peer_id``."""
        entry: dict[str, Any] = {"urls": list(self.urls)}
        if self.shared_secret is not None:
            username = f"{int(unix_now) + self.ttl_s}:{peer_id}"
            mac = hmac.new(self.shared_secret.encode(), username.encode(), hashlib.sha1).digest()
            entry["username"] = username
            entry["credential"] = base64.b64encode(mac).decode("ascii")
        elif self.username is not None:
            entry["username"] = self.username
            entry["credential"] = self.credential
        return entry


@dataclass(frozen=True)
class RelayRecord:
    """One frame the server sent: to whom, the parsed frame, and its exact text."""

    peer_id: str | None
    frame: Mapping[str, Any]
    text: str


@dataclass(frozen=True)
class SignalingConfig:
    """How the signaling endpoint behaves.

    ``secret`` signs resume tokens; keep it (16+ bytes) across restarts so
    peers keep their IDs, or leave it None for a random one per start.
    ``allowed_origins``: the web origins besides the server's own whose
    pages may open the socket (:mod:`.origins`; ``"*"``: any).
    """

    secret: bytes | None = None
    ice_servers: tuple[IceServer, ...] = ()
    limits: Limits = field(default_factory=Limits)
    path: str = "/signal"
    heartbeat_s: float | None = 20.0
    """WebSocket ping interval; a peer missing the pong is disconnected."""
    sweep_interval_s: float = 1.0
    """How often handshake and idle timeouts are checked."""
    max_outbound_frames: int = 1024
    max_outbound_bytes: int = 1024 * 1024
    """Bytes queued for one socket before it is closed as a slow consumer."""
    relay_log: Callable[[RelayRecord], None] | None = None
    unix_clock: Callable[[], float] = time.time
    """Wall clock for TURN credential expiry (the only wall-clock use)."""
    allowed_origins: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.allowed_origins, str):
            raise UsageError(UsageReason.INVALID_ORIGIN, "SignalingConfig.allowed_origins must be a tuple of origins")
        object.__setattr__(self, "allowed_origins", tuple(normalize_origin(o) for o in self.allowed_origins))
        if self.secret is not None and (not isinstance(self.secret, bytes) or len(self.secret) < 16):
            raise UsageError(UsageReason.INVALID_SIGNALING_SECRET, "SignalingConfig.secret must be at least 16 bytes")
        if not self.path.startswith("/"):
            raise UsageError(UsageReason.INVALID_SIGNALING_CONFIG, "SignalingConfig.path must start with '/'")
        if self.max_outbound_frames < 1 or self.max_outbound_bytes < 1 or self.sweep_interval_s <= 0:
            raise UsageError(UsageReason.INVALID_SIGNALING_CONFIG,
                             "max_outbound_frames, max_outbound_bytes and sweep_interval_s must be positive")


class _Outbox:
    """Frames waiting to go to one socket, then maybe a close."""

    def __init__(self, limit: int, byte_limit: int) -> None:
        self.limit = limit
        self.byte_limit = byte_limit
        self.queued_bytes = 0
        self.frames: deque[str] = deque()
        self.close: tuple[int, str] | None = None
        self.finished = False
        self.wakeup = asyncio.Event()

    def push(self, text: str) -> bool:
        """Queue ``text``; False if the queue is full (frames after a close are dropped)."""
        if self.close is not None or self.finished:
            return True
        size = len(text)  # characters: a lower bound of the UTF-8 bytes, and what the queue holds
        if len(self.frames) >= self.limit or self.queued_bytes + size > self.byte_limit:
            return False
        self.queued_bytes += size
        self.frames.append(text)
        self.wakeup.set()
        return True

    def request_close(self, code: int, reason: str) -> None:
        if self.close is None:
            self.close = (code, reason)
            self.wakeup.set()

    def finish(self) -> None:
        self.finished = True
        self.wakeup.set()


async def _write(ws: web.WebSocketResponse, box: _Outbox) -> None:
    """Drain ``box`` into ``ws`` until a close or ``finish``."""
    while True:
        await box.wakeup.wait()
        box.wakeup.clear()
        while box.frames and not box.finished:
            text = box.frames.popleft()
            box.queued_bytes -= len(text)
            try:
                await ws.send_str(text)
            except (ConnectionError, RuntimeError):
                box.finished = True
        if box.close is not None and not ws.closed:
            code, reason = box.close
            with contextlib.suppress(ConnectionError, RuntimeError):
                await ws.close(code=code, message=reason.encode("ascii"))
            return
        if box.finished or box.close is not None:
            return


class Signaling:
    """The live signaling endpoint of one app: the hub and its sockets."""

    def __init__(self, config: SignalingConfig) -> None:
        self.config = config
        secret = config.secret if config.secret is not None else os.urandom(32)
        self.hub = Hub(config.limits, secret, ice_servers=self._ice_servers, unix_clock=config.unix_clock)
        self._boxes: dict[int, _Outbox] = {}
        self._writers: dict[int, asyncio.Task[None]] = {}
        self._closing = False
        self._allowed_origins = frozenset(config.allowed_origins)
        self.refused_origins = 0
        self._refused_said: set[str] = set()

    def _ice_servers(self, peer_id: str) -> list[dict[str, Any]]:
        unix_now = self.config.unix_clock()
        return [server.describe(peer_id, unix_now) for server in self.config.ice_servers]

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()

    def apply(self, outputs: list[Output]) -> None:
        """Perform the hub's outputs (never blocks: frames go to outboxes)."""
        work = deque(outputs)
        while work:
            item = work.popleft()
            box = self._boxes.get(item.conn)
            if box is None:
                continue
            if isinstance(item, Close):
                box.request_close(item.code, item.reason)
                continue
            text = json.dumps(item.frame, ensure_ascii=False, separators=(",", ":"))
            if not box.push(text):
                log.info("signaling: closing a peer that does not read its frames")
                work.extend(self.hub.drop(item.conn, CloseCode.POLICY_VIOLATION, Reason.SLOW_CONSUMER, self._now()))
                continue
            if self.config.relay_log is not None:
                self.config.relay_log(RelayRecord(self.hub.peer_id(item.conn), item.frame, text))

    def _say_refused(self, origin: str | None) -> None:
        """Tell the operator once per origin (for the first origins only: strangers cannot grow the set)
        which pages were refused, and the flag that would allow them."""
        key = (origin or "")[:200]
        if key in self._refused_said or len(self._refused_said) >= _MAX_ORIGINS_SAID:
            log.info("signaling: refused a socket from origin %.100r", origin)
            return
        self._refused_said.add(key)
        try:
            remedy = f"; to allow them: weei serve --allow-origin {normalize_origin(key)}"
        except UsageError:
            remedy = ""  # "null" or malformed: no flag allows it but --allow-origin '*'
        log.warning("signaling: refused pages of origin %.100r (not an allowed origin)%s", origin, remedy)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """The WebSocket handler."""
        sockname = request.transport.get_extra_info("sockname") if request.transport is not None else None
        local = (str(sockname[0]), int(sockname[1])) if isinstance(sockname, tuple) and len(sockname) >= 2 else None
        if not origin_allowed(request.headers.get("Origin"), local, self._allowed_origins):
            self.refused_origins += 1
            self._say_refused(request.headers.get("Origin"))
            raise web.HTTPForbidden(text="origin-not-allowed")
        limits = self.config.limits
        # aiohttp's own cap is a backstop (it closes with 1009); frames up to
        # twice the limit get a named "frame-too-large" error from the hub.
        ws = web.WebSocketResponse(heartbeat=self.config.heartbeat_s, max_msg_size=2 * limits.max_frame_bytes,
                                   compress=False)
        await ws.prepare(request)
        if self._closing:
            await ws.close(code=CloseCode.GOING_AWAY, message=Reason.SERVER_SHUTDOWN.value.encode())
            return ws
        conn, outputs = self.hub.connect(self._now(), request.remote or "")
        box = _Outbox(self.config.max_outbound_frames, self.config.max_outbound_bytes)
        self._boxes[conn] = box
        writer = asyncio.create_task(_write(ws, box))
        self._writers[conn] = writer
        try:
            self.apply(outputs)
            async for msg in ws:
                if msg.type is WSMsgType.TEXT or msg.type is WSMsgType.BINARY:
                    self.apply(self.hub.on_frame(conn, msg.data, self._now()))
                else:  # ERROR (e.g. above aiohttp's size cap); aiohttp closes the socket
                    break
                if box.close is not None:
                    break
        finally:
            outputs = self.hub.disconnect(conn, self._now())
            if box.close is None:
                box.finish()  # the peer left: drop what is queued
            with contextlib.suppress(asyncio.CancelledError):
                await writer
            self._boxes.pop(conn, None)
            self._writers.pop(conn, None)
            if not self._closing:
                self.apply(outputs)
        return ws

    async def sweep_forever(self) -> None:
        """Check timeouts every ``sweep_interval_s``."""
        while True:
            await asyncio.sleep(self.config.sweep_interval_s)
            self.apply(self.hub.expire(self._now()))

    async def shutdown(self) -> None:
        """Close every socket with 1001 (going away) and wait for the writers."""
        self._closing = True
        self.apply(self.hub.close_all())
        writers = list(self._writers.values())
        if writers:
            await asyncio.wait(writers, timeout=5.0)


SIGNALING_KEY: web.AppKey[Signaling] = web.AppKey("weei_signaling", Signaling)


def add_signaling(app: web.Application, config: SignalingConfig) -> None:
    """Register the signaling WebSocket on ``app`` (route, sweeper, shutdown).

    The live :class:`Signaling` (its ``hub.stats``, for example) is
    ``app[SIGNALING_KEY]``.
    """
    signaling = Signaling(config)
    app[SIGNALING_KEY] = signaling
    app.router.add_get(config.path, signaling.handle)

    async def sweeper(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(signaling.sweep_forever())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def on_shutdown(app: web.Application) -> None:
        await signaling.shutdown()

    app.cleanup_ctx.append(sweeper)
    app.on_shutdown.append(on_shutdown)


def create_signaling_app(config: SignalingConfig) -> web.Application:
    """An application with only the signaling endpoint."""
    app = web.Application()
    add_signaling(app, config)
    return app


def read_secret(args: argparse.Namespace) -> bytes | None:
    """The resume-token secret from ``--secret-file``, else ``$WEEI_SIGNAL_SECRET``, else the one this machine
    keeps (:func:`kept_secret`), else None (random for this start)."""
    if args.secret_file:
        with open(args.secret_file, "rb") as handle:
            return handle.read().strip()
    text = os.environ.get("WEEI_SIGNAL_SECRET")
    return text.encode() if text else kept_secret()


def kept_secret() -> bytes | None:
    """``$XDG_STATE_HOME/weei/signal-secret`` (``~/.local/state/...``), made once (32 random bytes, hex, mode
    0600): a restart keeps every peer's ID, so a tab's saved job and its participants still find each other
    (issue 24). None, with a warning, where it cannot be read or written: IDs are then new at each start."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    path = os.path.join(base, "weei", "signal-secret")
    try:
        with open(path, "rb") as handle:
            kept = handle.read().strip()
        if len(kept) >= 32:
            return kept
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("signaling secret %s unreadable (%s): peer IDs change at each start", path, exc)
        return None
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        made = os.urandom(32).hex().encode()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(made)
        return made
    except OSError as exc:
        log.warning("signaling secret %s not written (%s): peer IDs change at each start", path, exc)
        return None


def parse_limits(items: list[str]) -> Limits:
    """``Limits`` with ``NAME=VALUE`` overrides; raises UsageError ``invalid-signaling-limits`` naming the item."""
    kinds = {f.name: f.type for f in fields(Limits)}
    changes: dict[str, Any] = {}
    for item in items:
        name, sep, text = item.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or name not in kinds:
            raise UsageError(UsageReason.INVALID_SIGNALING_LIMITS,
                             f"--signal-limit {item!r}: expected NAME=VALUE with NAME one of {', '.join(kinds)}")
        try:
            changes[name] = int(text) if kinds[name] in ("int", int) else float(text)
        except ValueError:
            raise UsageError(UsageReason.INVALID_SIGNALING_LIMITS, f"--signal-limit {item!r}: {text!r} is not a "
                             f"{'whole number' if kinds[name] in ('int', int) else 'number'}") from None
    return Limits(**changes)  # its own checks name a value out of range


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of the signaling endpoint and of the HTTP listener (``weei serve`` has them too)."""
    parser.add_argument("--ice", action="append", default=[], metavar="URLS[|USER|CRED]",
                        help="STUN/TURN server the peers use (repeatable), e.g. 'stun:stun.example.org:3478' or "
                             "'turn:turn.example.org:3478|secret:SHARED' for coturn's REST credentials")
    parser.add_argument("--secret-file", default=None,
                        help="signaling resume-token secret, so peers keep their IDs across restarts "
                             "(else $WEEI_SIGNAL_SECRET, else one kept in $XDG_STATE_HOME/weei/signal-secret)")
    parser.add_argument("--allow-origin", action="append", default=[], metavar="URL",
                        help="a web origin (https://host[:port]) whose pages may use the signaling socket besides "
                             "this server's own (repeatable; '*': any)")
    defaults = HttpLimits()
    parser.add_argument("--header-timeout", type=float, default=defaults.header_timeout_s, metavar="S",
                        help=f"close a connection without a complete request after S seconds "
                             f"(and an idle one; default {defaults.header_timeout_s:g})")
    parser.add_argument("--max-connections", type=int, default=defaults.max_connections,
                        help=f"open connections in all; more get 503 (default {defaults.max_connections})")
    parser.add_argument("--max-connections-per-ip", type=int, default=defaults.max_connections_per_ip,
                        help=f"open connections from one IP address; more get 429 "
                             f"(default {defaults.max_connections_per_ip})")
    parser.add_argument("--signal-limit", action="append", default=[], metavar="NAME=VALUE",
                        help="change one signaling budget (repeatable), e.g. join_rate=5 or max_rooms_per_ip=64; "
                             "the names and defaults are in docs/signaling.md, Limits: "
                             + ", ".join(f.name for f in fields(Limits)))


def configs_from(args: argparse.Namespace) -> tuple[SignalingConfig, HttpLimits]:
    """The configurations :func:`add_arguments`'s options name. Raises UsageError or OSError."""
    signaling = SignalingConfig(secret=read_secret(args), path=getattr(args, "path", "/signal"),
                                ice_servers=tuple(IceServer.parse(t) for t in args.ice),
                                allowed_origins=tuple(args.allow_origin),
                                limits=parse_limits(args.signal_limit))
    limits = HttpLimits(header_timeout_s=args.header_timeout, max_connections=args.max_connections,
                        max_connections_per_ip=args.max_connections_per_ip)
    return signaling, limits


def main(argv: list[str] | None = None) -> int:
    """``python -m weei.server.signaling``: run the signaling endpoint alone."""
    from .app import run_app

    parser = argparse.ArgumentParser(prog="python -m weei.server.signaling",
                                     description="Weei signaling server (WebSocket, relays only WebRTC setup).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--path", default="/signal")
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        config, limits = configs_from(args)
    except (UsageError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO)

    def ready(url: str) -> None:
        print(f"Weei signaling at {url.replace('http://', 'ws://').rstrip('/')}{config.path}", flush=True)

    return run_app(create_signaling_app(config), args.host, args.port, ready, limits)


if __name__ == "__main__":
    sys.exit(main())
