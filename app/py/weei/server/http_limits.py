"""Connection limits and timeouts of ``weei serve``'s HTTP listener.

Theory of operation
-------------------
aiohttp refuses nothing by itself: any client may open as many sockets as
the process has file descriptors and hold each one open by trickling a
request line a byte at a time. Two guards sit in front of it:

* **Headers and idle deadline.** aiohttp arms its keep-alive timer when a
  connection opens and again after each response, and closes the
  connection if, when it fires, no complete request has arrived (bytes
  trickling in do not postpone it). :attr:`HttpLimits.header_timeout_s`
  is that timer, so a slowloris socket and an idle keep-alive socket are
  both closed within it. A request being handled (a WebSocket included)
  is never cut by it.
* **Connection admission.** :class:`GatedSite` listens like aiohttp's
  ``TCPSite`` but hands every accepted socket to :class:`ConnectionGate`
  first. Over :attr:`HttpLimits.max_connections_per_ip` from one address
  the socket gets ``429 too-many-connections`` and is closed; over
  :attr:`HttpLimits.max_connections` in all, ``503 server-busy``. A
  refused socket is answered at once, half-closed, and closed for good
  after :data:`_REFUSED_LINGER_S` (reading and dropping what the client
  sends meanwhile, so its request does not turn the close into a reset
  that would hide the answer).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from ..core.errors import UsageError, UsageReason

__all__ = ["ConnectionGate", "GatedSite", "HttpLimits"]

_REFUSED_LINGER_S = 1.0


@dataclass(frozen=True)
class HttpLimits:
    """Limits of the HTTP listener (every TCP connection, WebSockets included)."""

    header_timeout_s: float = 15.0
    """A connection must deliver a complete request within this long of
    opening, and of its previous response (then it is idle: closed too)."""
    max_connections: int = 2048
    """Open connections in all; more get ``503 server-busy``."""
    max_connections_per_ip: int = 256
    """Open connections from one IP address; more get ``429 too-many-connections``."""

    def __post_init__(self) -> None:
        if not self.header_timeout_s > 0:
            raise UsageError(UsageReason.INVALID_HTTP_LIMITS, "header_timeout_s must be positive")
        if self.max_connections < 1 or self.max_connections_per_ip < 1:
            raise UsageError(UsageReason.INVALID_HTTP_LIMITS, "connection limits must be at least 1")


def _refusal(status: int, title: str, reason: str) -> bytes:
    body = f"{reason}\n".encode("ascii")
    head = (f"HTTP/1.1 {status} {title}\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nRetry-After: 5\r\nConnection: close\r\n\r\n")
    return head.encode("ascii") + body


_TOO_MANY_FROM_IP = _refusal(429, "Too Many Requests", "too-many-connections")
_SERVER_BUSY = _refusal(503, "Service Unavailable", "server-busy")


class ConnectionGate:
    """Counts open connections, in all and per IP address, and admits or refuses new ones."""

    def __init__(self, limits: HttpLimits) -> None:
        self.limits = limits
        self.open = 0
        self.per_ip: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()

    def admit(self, ip: str) -> bytes | None:
        """Count a new connection from ``ip``; or the refusal to send it (then nothing is counted)."""
        if self.per_ip[ip] >= self.limits.max_connections_per_ip:
            self.refused["too-many-connections"] += 1
            return _TOO_MANY_FROM_IP
        if self.open >= self.limits.max_connections:
            self.refused["server-busy"] += 1
            return _SERVER_BUSY
        self.open += 1
        self.per_ip[ip] += 1
        return None

    def release(self, ip: str) -> None:
        self.open -= 1
        self.per_ip[ip] -= 1
        if self.per_ip[ip] <= 0:
            del self.per_ip[ip]


def _peer_ip(transport: asyncio.BaseTransport) -> str:
    peer = transport.get_extra_info("peername")
    if isinstance(peer, tuple) and peer:
        return str(peer[0])
    return ""  # a Unix socket: every peer is the same local "address"


class _GateProtocol(asyncio.Protocol):
    """Admits a socket through the gate, then delegates everything to aiohttp's protocol."""

    def __init__(self, gate: ConnectionGate, make_inner: Callable[[], asyncio.Protocol]) -> None:
        self._gate = gate
        self._make_inner = make_inner
        self._inner: asyncio.Protocol | None = None
        self._ip = ""
        self._linger: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._ip = _peer_ip(transport)
        refusal = self._gate.admit(self._ip)
        if refusal is None:
            self._inner = self._make_inner()
            self._inner.connection_made(transport)
            return
        assert isinstance(transport, asyncio.Transport)
        transport.write(refusal)
        if transport.can_write_eof():
            transport.write_eof()
        self._linger = asyncio.get_running_loop().call_later(_REFUSED_LINGER_S, transport.close)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._inner is None:
            if self._linger is not None:
                self._linger.cancel()
            return
        self._gate.release(self._ip)
        self._inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._inner is not None:
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        if self._inner is not None:
            return self._inner.eof_received()
        return None

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()


class GatedSite(web.TCPSite):
    """aiohttp's ``TCPSite`` with every accepted socket passed through a :class:`ConnectionGate`."""

    def __init__(self, runner: web.BaseRunner, host: str | None, port: int, gate: ConnectionGate,
                 **kwargs: Any) -> None:
        super().__init__(runner, host, port, **kwargs)
        self.gate = gate

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with its runner
        server = self._runner.server
        assert server is not None
        gate = self.gate
        self._server = await asyncio.get_running_loop().create_server(
            lambda: _GateProtocol(gate, server), self._host, self._port,
            ssl=self._ssl_context, backlog=self._backlog,
            reuse_address=self._reuse_address, reuse_port=self._reuse_port,
        )
        sockets = self._server.sockets
        self._bound_port = sockets[0].getsockname()[1] if sockets else self._port
