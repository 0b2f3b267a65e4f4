"""Invite links: the page URL with the room key in its fragment.

``http://host:port/#room=KEY``: a browser never sends the fragment to the
server (so the key is in no HTTP log) nor in a ``Referer`` header, and the
page reads it from ``location.hash``. ``weei serve`` prints such a link
with a fresh key; ``weei agent --room`` takes the link (or the bare key).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from urllib.parse import parse_qs, urlsplit, urlunsplit

from ..core.errors import UsageError, UsageReason
from ..core.wire.signaling_session import ROOM_KEY, new_room_key

__all__ = ["Invite", "embed_snippet", "invite_url", "parse_invite", "fresh_key"]


def fresh_key(random_bytes: Callable[[int], bytes] = os.urandom) -> str:
    """A new room key (128 random bits)."""
    return new_room_key(random_bytes)


def invite_url(page_url: str, key: str) -> str:
    """The invite link of room ``key`` on the page at ``page_url``."""
    parts = urlsplit(page_url)
    return urlunsplit((parts.scheme, parts.netloc, parts.path or "/", parts.query, f"room={key}"))


def embed_snippet(site_url: str, key: str) -> str:
    """The two tags that embed Weei's window in any page, in room ``key`` (README, the landing page and
    ``weei serve`` show this very text; landing.js builds the same in the browser)."""
    base = site_url if site_url.endswith("/") else site_url + "/"
    return (f'<script src="{base}weei.js" data-room="{key}"></script>\n'
            "<script>weeiReady.then((weei) => weei.widgetsApi.get('distributed-training').enable())</script>")


class Invite:
    """What an invite link (or a bare room key) names: the key and, for a link, the signaling URL."""

    def __init__(self, key: str, signal_url: str | None) -> None:
        self.key = key
        self.signal_url = signal_url


def parse_invite(text: str, signal_path: str = "/signal") -> Invite:
    """Read an invite link ``http(s)://host/...#room=KEY`` or a bare key. Raises UsageError("bad-invite")."""
    text = text.strip()
    if ROOM_KEY.fullmatch(text):
        return Invite(text, None)
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UsageError(UsageReason.BAD_INVITE, f"{text[:200]!r} is neither a room key nor an invite link http(s)://…#room=KEY")
    keys = parse_qs(parts.fragment).get("room") or parse_qs(parts.query).get("room") or []
    if len(keys) != 1 or not ROOM_KEY.fullmatch(keys[0]):
        raise UsageError(UsageReason.BAD_INVITE, "the invite link has no room key (#room=KEY)")
    scheme = "wss" if parts.scheme == "https" else "ws"
    return Invite(keys[0], urlunsplit((scheme, parts.netloc, signal_path, "", "")))
