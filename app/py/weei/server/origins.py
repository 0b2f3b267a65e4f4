"""Which web origins may open the signaling WebSocket.

Theory of operation
-------------------
A WebSocket is not subject to the same-origin policy: any page on any
site can open one to ``/signal`` from its visitors' browsers, which then
join rooms and receive offers under the server's name. Browsers always
send an ``Origin`` header with the upgrade request, so the server checks
it against an allowlist and answers ``403 origin-not-allowed`` before the
upgrade. Allowed are:

* the server's own origin as the connection reached it: ``http://`` and
  the address and port the socket was accepted on (an IP literal; for a
  loopback address also ``localhost``);
* the origins the operator names (``weei serve --allow-origin URL``), the
  embedding sites and any name the server is reached by (a TLS proxy's
  ``https://weei.example.org``, a LAN host name); ``*`` allows every origin;
* requests without an ``Origin`` (the agent, other non-browser clients:
  they are not someone else's page acting with a visitor's browser).

``Origin: null`` (sandboxed frames, ``file:`` pages) is refused unless
``*`` is allowed.

The ``Host`` header is never trusted: under DNS rebinding a page of
``http://evil.example:8000`` whose name the attacker re-points at this
server sends ``Origin`` and ``Host`` that agree with each other, and neither
names this server. Only an address the browser connected to by number, or
a name the operator listed, identifies the server.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from ..core.errors import UsageError, UsageReason

__all__ = ["ANY_ORIGIN", "normalize_origin", "origin_allowed", "own_origins"]

ANY_ORIGIN = "*"
_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


def normalize_origin(text: str) -> str:
    """``scheme://host[:port]`` as browsers send it (lowercase, default port
    dropped), or ``*``. Raises UsageError("invalid-origin") otherwise."""
    if text == ANY_ORIGIN:
        return text
    try:
        parts = urlsplit(text.strip())
        port = parts.port
    except ValueError:
        raise UsageError(UsageReason.INVALID_ORIGIN, f"{text!r} is not an origin such as https://example.org") from None
    scheme = parts.scheme.lower()
    if (scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/")
            or parts.query or parts.fragment or parts.username is not None or parts.password is not None):
        raise UsageError(UsageReason.INVALID_ORIGIN, f"{text!r} is not an origin such as https://example.org")
    host = parts.hostname.lower()
    if ":" in host:
        host = f"[{host}]"
    if port is not None and port != _DEFAULT_PORTS[scheme]:
        return f"{scheme}://{host}:{port}"
    return f"{scheme}://{host}"


def own_origins(local: tuple[str, int] | None) -> frozenset[str]:
    """The origins of this server for a connection accepted on ``local``
    (the socket's ``(address, port)``; None: unknown, then none)."""
    if local is None:
        return frozenset()
    try:
        address = ipaddress.ip_address(local[0].split("%", 1)[0])
    except ValueError:
        return frozenset()
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # a dual-stack socket reports IPv4 peers this way
    host = f"[{address}]" if address.version == 6 else str(address)
    hosts = {host, "localhost"} if address.is_loopback else {host}
    return frozenset(normalize_origin(f"http://{h}:{local[1]}") for h in hosts)


def origin_allowed(origin: str | None, local: tuple[str, int] | None, allowed: frozenset[str]) -> bool:
    """Whether a request with header ``Origin: origin``, on a connection
    accepted on ``local`` (:func:`own_origins`), may open the WebSocket,
    given the operator's normalized ``allowed``."""
    if origin is None:
        return True
    if ANY_ORIGIN in allowed:
        return True
    try:
        normalized = normalize_origin(origin)
    except UsageError:
        return False  # "null" and anything malformed
    return normalized in allowed or normalized in own_origins(local)
