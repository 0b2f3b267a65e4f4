"""The client side of docs/signaling.md, sans-I/O: frames to send, server frames parsed into events.

Theory of operation
-------------------
:class:`SignalingSession` is what the page's client (``weei.browser.signaling_ws``,
over ``js.WebSocket``) and the agent's (``weei.agent.signaling_client``, over
aiohttp) share. It makes the frames the client sends (``hello`` with the
resume token, ``join``, ``signal``, ``ping``) and turns each text frame the
server sends into events:

* :class:`Welcome` (peer ID, resume token, ICE servers, limits); the session
  keeps the token for the next ``hello``;
* :class:`Peers` for a ``peers`` list; :class:`Signal` for a relayed offer,
  answer or candidate; :class:`ServerError` for a refused frame;
* :class:`Closed` when the socket closed (:meth:`SignalingSession.closed`);
  ``4001 replaced`` means another tab or process resumed our ID: the token is
  dropped, so the next ``hello`` takes a fresh ID rather than fight over it;
* :class:`Unreadable` for a frame that is not what docs/signaling.md says
  (the client logs it and goes on).

A frame that answers a request in flight (the welcome after ``hello``, the
peer list naming us after ``join``, an error refusing either) is also an
:class:`Answer` to that request, listed before the event. With
``answers_are_events=False`` (the agent's client) the answered frame is
only an Answer; the page's client wants every welcome and peer list as an
event too. A close answers every request in flight with ``closed``.

Rooms have keys (docs/signaling.md, "Rooms and keys"): what callers pass to
:meth:`SignalingSession.join` is the room *key* (the secret of the invite
link); the frame carries the room *code* derived from it
(:func:`room_code`, a hash, which the server checks) and the key. Resume
tokens are bound to one room: the session sends its token in ``hello`` only
when it names the room it is going to join, and takes the room-bound token
the server returns with the join's peer list.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from dataclasses import dataclass
from enum import Enum
from typing import Any, NoReturn, Union

from .._check import parse_json

__all__ = [
    "Reason",
    "ClientReason",
    "reason_of",
    "Welcome",
    "Peers",
    "Signal",
    "ServerError",
    "Closed",
    "Unreadable",
    "Answer",
    "SignalingEvent",
    "SignalingSession",
    "SessionView",
    "REPLACED",
    "PING",
    "ROOM_KEY",
    "room_code",
    "token_room",
    "new_room_key",
]

REPLACED = 4001  # close code: another connection resumed our peer ID
PING = '{"type":"ping"}'
_DEFAULT_IDLE_TIMEOUT_S = 300.0
#: A larger idleTimeout from the server pings once a third of a day all the same.
_MAX_IDLE_TIMEOUT_S = 86_400.0
_SIGNAL_KINDS = ("offer", "answer", "candidate")
#: Room keys travel in URL fragments: URL-safe characters only.
ROOM_KEY = re.compile(r"[A-Za-z0-9_-]{1,128}")
_ROOM_LABEL = b"weei-room/1\n"


class Reason(str, Enum):
    """Why a frame was refused or a connection closed (sent as the string)."""

    FRAME_TOO_LARGE = "frame-too-large"
    """A text frame above ``Limits.max_frame_bytes``."""
    BINARY_FRAME = "binary-frame"
    """The protocol is JSON text frames only."""
    BAD_JSON = "bad-json"
    """Not JSON, not a JSON object, too deeply nested, or NaN/Infinity."""
    UNKNOWN_TYPE = "unknown-type"
    """``type`` missing or not one of hello, join, signal, ping."""
    BAD_MESSAGE = "bad-message"
    """A field is missing, of the wrong type, or not part of the message."""
    UNSUPPORTED_VERSION = "unsupported-version"
    """``hello.version`` is not a protocol version this server speaks."""
    HELLO_REQUIRED = "hello-required"
    """``join``/``signal`` before ``hello``."""
    ALREADY_WELCOMED = "already-welcomed"
    """A second ``hello`` on the same connection."""
    NOT_IN_ROOM = "not-in-room"
    """``signal`` before ``join``."""
    ALREADY_IN_ROOM = "already-in-room"
    """A second ``join`` on the same connection (one room per connection)."""
    BAD_ROOM = "bad-room"
    """Room code empty, too long, or with characters outside [A-Za-z0-9_-]."""
    ROOM_KEY_REQUIRED = "room-key-required"
    """``join`` without ``key``: a room is entered with its key (the invite link's secret)."""
    ROOM_REFUSED = "room-refused"
    """The key is not the room's (the same answer whether or not the room exists)."""
    RESUME_WRONG_ROOM = "resume-wrong-room"
    """``hello`` resumed a peer ID with a token bound to another room than the one joined."""
    JOIN_RATE_LIMITED = "join-rate-limited"
    """Joins (or refused joins) from this IP address, or to the whole server, came too fast; nothing was checked."""
    BYTES_RATE_LIMITED = "bytes-rate-limited"
    """This IP address (or everyone together) sent more bytes than its budget; the frame was dropped."""
    ROOM_FULL = "room-full"
    """The room has ``Limits.max_peers_per_room`` peers already."""
    TOO_MANY_ROOMS = "too-many-rooms"
    """The server has ``Limits.max_rooms`` rooms already."""
    UNKNOWN_PEER = "unknown-peer"
    """``signal.to`` is not a peer in the sender's room."""
    SELF_ADDRESSED = "self-addressed"
    """``signal.to`` is the sender itself."""
    BAD_KIND = "bad-kind"
    """``signal.kind`` is not offer, answer or candidate."""
    BAD_PAYLOAD = "bad-payload"
    """The payload is not an SDP string / an RTCIceCandidateInit."""
    PAYLOAD_TOO_LARGE = "payload-too-large"
    """SDP above ``max_sdp_bytes`` or candidate above ``max_candidate_bytes``."""
    RATE_LIMITED = "rate-limited"
    """The connection's token bucket is empty; the frame was dropped."""
    # Close reasons (sent as the WebSocket close reason).
    TOO_MANY_ERRORS = "too-many-errors"
    """Refused frames used up the connection's strikes."""
    HANDSHAKE_TIMEOUT = "handshake-timeout"
    """No ``hello`` + ``join`` within ``Limits.handshake_timeout_s``."""
    IDLE_TIMEOUT = "idle-timeout"
    """No frame at all for ``Limits.idle_timeout_s``."""
    REPLACED = "replaced"
    """A newer connection resumed this peer ID."""
    SERVER_FULL = "server-full"
    """The server has ``Limits.max_connections`` connections already."""
    SLOW_CONSUMER = "slow-consumer"
    """The peer does not read its frames; its outbound queue overflowed."""
    SERVER_SHUTDOWN = "server-shutdown"
    """The server is stopping."""


class ClientReason(str, Enum):
    """Why a signaling request failed on the client's side, where the server gave no code of :class:`Reason`."""

    CLOSED = "closed"
    """The socket closed while the request was open."""
    DISCONNECTED = "disconnected"
    """There was no open socket to send the request on."""
    UNKNOWN_REFUSAL = "unknown-refusal"
    """The server refused with a code this client does not know (the message keeps it)."""
    ORIGIN_NOT_ALLOWED = "origin-not-allowed"
    """The server answered the socket's upgrade with ``403 origin-not-allowed``: this page's origin is not
    one it allows (``weei serve --allow-origin``). A browser hides the answer from the socket; the page
    learns it by asking the same URL over HTTP."""


def reason_of(code: str) -> Reason | ClientReason:
    """The member for a code a server sent (or ``closed``); an unknown code is ``unknown-refusal``."""
    for family in (Reason, ClientReason):
        try:
            return family(code)
        except ValueError:
            pass
    return ClientReason.UNKNOWN_REFUSAL


def room_code(key: str) -> str:
    """The room code of room key ``key``: 26 lowercase base32 characters of SHA-256 (130 bits).

    The server checks ``room == room_code(key)`` on every join, so it stores
    no key, and a code alone (in a log, in a peer list) lets nobody in.
    """
    digest = hashlib.sha256(_ROOM_LABEL + key.encode("utf-8")).digest()
    return base64.b32encode(digest).decode("ascii")[:26].lower()


def new_room_key(random_bytes: Any) -> str:
    """A fresh room key: 16 random bytes (``random_bytes(16)``) in base64url, 22 characters."""
    return base64.urlsafe_b64encode(random_bytes(16)).decode("ascii").rstrip("=")


def token_room(token: str | None) -> str | None:
    """The room code a resume token is bound to (``peerId.room.expires.mac``), or None."""
    if not token:
        return None
    parts = token.split(".")
    return parts[1] if len(parts) == 4 and parts[1] != "-" else None


@dataclass(frozen=True)
class Welcome:
    """The server's answer to ``hello``."""

    peer_id: str
    token: str
    resumed: bool
    ice_servers: tuple[dict[str, Any], ...]
    limits: dict[str, Any]


@dataclass(frozen=True)
class Peers:
    """The peers now in the room (join order, self included)."""

    room: str
    peers: tuple[str, ...]


@dataclass(frozen=True)
class Signal:
    """An offer or answer (SDP text) or a candidate (an ``RTCIceCandidateInit`` dict) from peer ``sender``."""

    sender: str
    kind: str
    payload: Any


@dataclass(frozen=True)
class ServerError:
    """The server refused one of our frames (``refused``: its type, when known)."""

    reason: str
    message: str
    refused: str | None = None


@dataclass(frozen=True)
class Closed:
    """The socket closed (``code`` None if it failed without a close frame); ``reconnecting``: the client
    reconnects by itself."""

    code: int | None
    reason: str
    reconnecting: bool = False


@dataclass(frozen=True)
class Unreadable:
    """A server frame that is not JSON, or not shaped as docs/signaling.md says."""

    detail: str


@dataclass(frozen=True)
class Answer:
    """The answer to a request in flight (``hello`` or ``join``): a value (Welcome, peer tuple) or a refusal."""

    request: str
    value: Any = None
    error: ServerError | None = None


SignalingEvent = Union[Welcome, Peers, Signal, ServerError, Closed]


class SignalingSession:
    """One client's side of the signaling conversation, across reconnections; see the module docstring."""

    def __init__(self, token: str | None = None, *, answers_are_events: bool = False,
                 room: str | None = None) -> None:
        self.token = token
        self.answers_are_events = answers_are_events
        self.welcome: Welcome | None = None
        self.room: str | None = room  # the room key asked for last (or to come): a reconnection joins it again
        self.peers: tuple[str, ...] = ()
        self.pending: set[str] = set()
        self.peer_id: str | None = None  # the last welcome's: kept while the socket is down

    # ----------------------------------------------------------------- frames out

    def hello(self) -> str:
        """The ``hello`` frame (with the resume token, if any); its Answer is the Welcome."""
        self.pending.add("hello")
        frame: dict[str, Any] = {"type": "hello", "version": 1}
        # A token is bound to one room: offered only for the room we are going to join.
        if self.token and self.room is not None and token_room(self.token) == room_code(self.room):
            frame["token"] = self.token
        return _dump(frame)

    def join(self, room: str) -> str:
        """The ``join`` frame for room key ``room``; its Answer is the room's peers (self included)."""
        self.room = room
        self.pending.add("join")
        return _dump({"type": "join", "room": room_code(room), "key": room})

    @staticmethod
    def signal(to: str, kind: str, payload: Any) -> str:
        """A ``signal`` frame for peer ``to``."""
        return _dump({"type": "signal", "to": to, "kind": kind, "payload": payload})

    def ping_interval_s(self) -> float:
        """How often to ping: a third of the server's idle timeout, at least 1 s."""
        idle = _DEFAULT_IDLE_TIMEOUT_S
        if self.welcome is not None:
            value = self.welcome.limits.get("idleTimeout", idle)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
                idle = float(min(value, _MAX_IDLE_TIMEOUT_S))  # min first: 10**400 has no float
        return max(1.0, idle / 3)

    # ------------------------------------------------------------------ frames in

    def on_server_message(self, text: str) -> list[Any]:
        """Answers and events for one text frame from the server (see the module docstring)."""
        try:
            frame = parse_json(text, _not_json)
        except _Bad as exc:
            return [Unreadable(str(exc))]
        if not isinstance(frame, dict):
            return [Unreadable("not a JSON object")]
        kind = frame.get("type")
        try:
            if kind == "welcome":
                return self._welcome(frame)
            if kind == "peers":
                return self._peers(frame)
            if kind == "signal":
                return [Signal(_str(frame, "from"), _one_of(frame, "kind", _SIGNAL_KINDS), frame.get("payload"))]
            if kind == "error":
                return self._error(frame)
        except _Bad as exc:
            return [Unreadable(f"{kind}: {exc}")]
        if kind == "pong":
            return []  # the idle timer was reset by our ping
        return [Unreadable(f"unknown frame type {kind!r}")]

    def closed(self, code: int | None, reason: str, *, reconnecting: bool = False) -> list[Any]:
        """The socket closed: every request in flight is refused, then :class:`Closed`."""
        if code == REPLACED:
            self.token = None
        refusal = ServerError("closed", f"the signaling socket closed ({code} {reason})")
        out: list[Any] = [Answer(request, error=ServerError(refusal.reason, refusal.message, request))
                          for request in sorted(self.pending)]
        self.pending.clear()
        out.append(Closed(code, reason, reconnecting))
        return out

    def _welcome(self, frame: dict[str, Any]) -> list[Any]:
        servers = frame.get("iceServers") or ()
        limits = frame.get("limits") or {}
        if not isinstance(servers, (list, tuple)) or not all(isinstance(s, dict) for s in servers):
            raise _Bad("iceServers is not a list of objects")
        if not isinstance(limits, dict):
            raise _Bad("limits is not an object")
        welcome = Welcome(_str(frame, "peerId"), _str(frame, "token"), frame.get("resumed") is True,
                          tuple(dict(s) for s in servers), dict(limits))
        self.welcome, self.token, self.peer_id = welcome, welcome.token, welcome.peer_id
        return self._answer("hello", welcome, welcome, True)

    def _peers(self, frame: dict[str, Any]) -> list[Any]:
        peers = frame.get("peers")
        if not isinstance(peers, list) or not all(isinstance(p, str) for p in peers):
            raise _Bad("peers is not a list of peer IDs")
        event = Peers(_str(frame, "room"), tuple(peers))
        self.peers = event.peers
        token = frame.get("token")  # only in the joiner's own copy: the token bound to this room
        if isinstance(token, str) and token:
            self.token = token
        return self._answer("join", event.peers, event, self.peer_id in event.peers)

    def _error(self, frame: dict[str, Any]) -> list[Any]:
        refused = frame.get("refused")
        message = frame.get("message", "")
        error = ServerError(_str(frame, "reason"), message if isinstance(message, str) else "",
                            refused if isinstance(refused, str) else None)
        if error.refused is not None and error.refused in self.pending:
            self.pending.discard(error.refused)
            return [Answer(error.refused, error=error)]
        return [error]

    def _answer(self, request: str, value: Any, event: Any, answers: bool) -> list[Any]:
        if not answers or request not in self.pending:
            return [event]
        self.pending.discard(request)
        return [Answer(request, value), event] if self.answers_are_events else [Answer(request, value)]


class SessionView:
    """What a client shows of its :class:`SignalingSession` (``self.protocol``), read-only."""

    protocol: SignalingSession

    @property
    def token(self) -> str | None:
        return self.protocol.token

    @property
    def welcome(self) -> Welcome | None:
        return self.protocol.welcome

    @property
    def peer_id(self) -> str | None:
        return self.protocol.peer_id

    @property
    def room(self) -> str | None:
        return self.protocol.room

    @property
    def peers(self) -> tuple[str, ...]:
        return self.protocol.peers


class _Bad(ValueError):
    pass


def _not_json(message: str) -> NoReturn:
    # parse_json's fail: bad JSON, NaN/Infinity, or nesting past MAX_JSON_DEPTH.
    raise _Bad(f"not JSON: the frame {message}")


def _str(frame: dict[str, Any], key: str) -> str:
    value = frame.get(key)
    if not isinstance(value, str):
        raise _Bad(f"{key} is not a string")
    return value


def _one_of(frame: dict[str, Any], key: str, allowed: tuple[str, ...]) -> str:
    value = _str(frame, key)
    if value not in allowed:
        raise _Bad(f"{key} {value!r} is not one of {', '.join(allowed)}")
    return value


def _dump(frame: dict[str, Any]) -> str:
    return json.dumps(frame, separators=(",", ":"))
