"""Which web origins may open the signaling WebSocket.

Theory of operation
-------------------
A WebSocket is not subject to the same-origin policy: any page on any
site can open one to ``/signal`` from its visitors' browsers, which then
join rooms and receive offers under the server's name. Browsers always
send an ``Origin`` header with the upgrade request, so the server checks
it against an allowlist and answers ``403 origin-not-allowed`` before the
upgrade. Allowed are:

* the server's own origin: the ``Origin``'s host and port equal the
  ``Host`` the request was sent to (the scheme is not compared, so a TLS
  proxy in front of ``weei serve`` changes nothing);
* the origins the operator names (``weei serve --allow-origin URL``), the
  embedding sites; ``*`` allows every origin;
* requests without an ``Origin`` (the agent, other non-browser clients:
  they are not someone else's page acting with a visitor's browser).

``Origin: null`` (sandboxed frames, ``file:`` pages) is refused unless
``*`` is allowed.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from ..core.errors import UsageError

__all__ = ["ANY_ORIGIN", "normalize_origin", "origin_allowed"]

ANY_ORIGIN = "*"
_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


def _host_port(netloc: str, scheme: str) -> tuple[str, int] | None:
    try:
        parts = urlsplit(f"//{netloc}")
        port = parts.port
    except ValueError:
        return None
    host = parts.hostname
    if not host:
        return None
    return host.lower(), port if port is not None else _DEFAULT_PORTS.get(scheme, 0)


def normalize_origin(text: str) -> str:
    """``scheme://host[:port]`` as browsers send it (lowercase, default port
    dropped), or ``*``. Raises UsageError("invalid-origin") otherwise."""
    if text == ANY_ORIGIN:
        return text
    try:
        parts = urlsplit(text.strip())
        port = parts.port
    except ValueError:
        raise UsageError("invalid-origin", f"{text!r} is not an origin such as https://example.org") from None
    scheme = parts.scheme.lower()
    if (scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/")
            or parts.query or parts.fragment or parts.username is not None or parts.password is not None):
        raise UsageError("invalid-origin", f"{text!r} is not an origin such as https://example.org")
    host = parts.hostname.lower()
    if ":" in host:
        host = f"[{host}]"
    if port is not None and port != _DEFAULT_PORTS[scheme]:
        return f"{scheme}://{host}:{port}"
    return f"{scheme}://{host}"


def origin_allowed(origin: str | None, host: str | None, allowed: frozenset[str]) -> bool:
    """Whether a request with header ``Origin: origin`` sent to ``Host: host``
    may open the WebSocket, given the operator's normalized ``allowed``."""
    if origin is None:
        return True
    if ANY_ORIGIN in allowed:
        return True
    try:
        normalized = normalize_origin(origin)
    except UsageError:
        return False  # "null" and anything malformed
    if normalized in allowed:
        return True
    scheme = normalized.split("://", 1)[0]
    mine = _host_port(host, scheme) if host else None
    return mine is not None and mine == _host_port(normalized.split("://", 1)[1], scheme)
