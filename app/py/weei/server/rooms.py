"""The signaling hub without I/O: peers, rooms, and what may be relayed.

Theory of operation
-------------------
A :class:`Hub` holds every signaling connection the server has, as small
integer handles. The adapter (``signaling.py``) feeds it events with the
time passed in -- :meth:`Hub.connect`, :meth:`Hub.receive` (one WebSocket
frame), :meth:`Hub.disconnect`, :meth:`Hub.expire` -- and performs what it
returns: :class:`Send` (one JSON frame to one connection) and
:class:`Close` (close one connection with a code and a reason). The hub
never touches a socket, the clock or the event loop, so every rule below
is tested with plain calls and a fake ``now``.

A connection goes through three phases (:class:`Phase`)::

    NEW --hello--> WELCOMED --join--> JOINED

and the message types each phase accepts are a table
(:data:`ALLOWED`); a known type in the wrong phase is refused with the
reason from :data:`OUT_OF_PHASE`. The set of types is closed: ``hello``,
``join``, ``signal`` and ``ping`` in, ``welcome``, ``peers``, ``signal``,
``pong`` and ``error`` out. A ``signal`` is relayed only to a peer in the
sender's room, and only after its payload has been validated and *rebuilt*
from the fields the protocol names (an SDP string for offers and answers, an
``RTCIceCandidateInit`` for candidates), so no extra field and no other kind
of data can ride along: weights, datasets, metrics and checkpoints never
pass through the server.

Every refused frame is answered with an ``error`` frame naming the reason
(:class:`Reason`), counted in :attr:`Hub.stats`, and costs the connection a
strike from a small bucket that refills slowly; a connection that runs out
of strikes is closed (1008). Every frame also costs a token from the
connection's rate bucket (:class:`TokenBucket`).

Peer IDs are 16 random bytes in lowercase base32. The server hands each
peer a resume token, ``peerId + "." + base64url(HMAC-SHA256(secret, ...))``;
presenting it in a later ``hello`` restores the same peer ID, also after a
server restart with the same secret. A token that does not verify (for
example after the secret changed) simply yields a fresh ID.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import json
import math
import os
import re
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn, Union

from ..core.errors import UsageError, WeeiError

__all__ = [
    "PROTOCOL_VERSION",
    "ROOM_CODE",
    "ALLOWED",
    "OUT_OF_PHASE",
    "Phase",
    "Reason",
    "CloseCode",
    "SignalKind",
    "SignalingError",
    "Limits",
    "TokenBucket",
    "Send",
    "Close",
    "Output",
    "Stats",
    "Hub",
    "new_peer_id",
    "make_token",
    "verify_token",
    "validate_room",
    "validate_payload",
]

PROTOCOL_VERSION = 1

#: Room codes come from page URLs: short, and only URL-safe characters.
ROOM_CODE = re.compile(r"[A-Za-z0-9_-]+")
PEER_ID = re.compile(r"[a-z2-7]{26}")
_TOKEN_LABEL = b"weei-signal/1 peer "
_MAX_TOKEN_CHARS = 256
_MAX_PEER_ID_CHARS = 64
_MAX_MID_CHARS = 64
_MAX_UFRAG_CHARS = 256


class Phase(enum.Enum):
    """Where a connection is in its short life."""

    NEW = "new"
    """Connected; must send ``hello`` first."""
    WELCOMED = "welcomed"
    """Has a peer ID; may join one room."""
    JOINED = "joined"
    """In a room; may exchange signals with the other peers there."""


class Reason(str, enum.Enum):
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


class CloseCode(enum.IntEnum):
    """WebSocket close codes the server uses."""

    GOING_AWAY = 1001
    """Server shutdown."""
    POLICY_VIOLATION = 1008
    """Too many refused frames, or a peer that does not read."""
    TRY_AGAIN_LATER = 1013
    """Server full."""
    TIMEOUT = 4000
    """Handshake or idle timeout."""
    REPLACED = 4001
    """Another connection resumed this peer ID."""


class SignalKind(str, enum.Enum):
    """What a ``signal`` carries."""

    OFFER = "offer"
    """An SDP offer (string)."""
    ANSWER = "answer"
    """An SDP answer (string)."""
    CANDIDATE = "candidate"
    """An ICE candidate (RTCIceCandidateInit object)."""


#: Message types each phase accepts.
ALLOWED: Mapping[Phase, frozenset[str]] = {
    Phase.NEW: frozenset({"hello", "ping"}),
    Phase.WELCOMED: frozenset({"join", "ping"}),
    Phase.JOINED: frozenset({"signal", "ping"}),
}
#: Why a known message type is refused in a phase that does not accept it.
OUT_OF_PHASE: Mapping[tuple[Phase, str], Reason] = {
    (Phase.NEW, "join"): Reason.HELLO_REQUIRED,
    (Phase.NEW, "signal"): Reason.HELLO_REQUIRED,
    (Phase.WELCOMED, "hello"): Reason.ALREADY_WELCOMED,
    (Phase.WELCOMED, "signal"): Reason.NOT_IN_ROOM,
    (Phase.JOINED, "hello"): Reason.ALREADY_WELCOMED,
    (Phase.JOINED, "join"): Reason.ALREADY_IN_ROOM,
}
_FIELDS: Mapping[str, tuple[frozenset[str], frozenset[str]]] = {
    # type: (required fields, optional fields), "type" included in neither
    "hello": (frozenset(), frozenset({"version", "token"})),
    "join": (frozenset({"room"}), frozenset()),
    "signal": (frozenset({"to", "kind", "payload"}), frozenset()),
    "ping": (frozenset(), frozenset()),
}
_CANDIDATE_FIELDS = frozenset({"candidate", "sdpMid", "sdpMLineIndex", "usernameFragment"})


class SignalingError(WeeiError):
    """A signaling frame was refused, or the server refused a client request.

    ``reason`` is a :class:`Reason` value (a string); ``refused`` names the
    message type when it was known.
    """

    def __init__(self, reason: str, message: str, refused: str | None = None) -> None:
        super().__init__(reason.value if isinstance(reason, Reason) else reason, message)
        self.refused = refused


def _fail(reason: Reason, message: str) -> NoReturn:
    raise SignalingError(reason.value, message)


@dataclass(frozen=True)
class Limits:
    """Bounds on what one connection and the whole server may use."""

    max_frame_bytes: int = 64 * 1024
    max_sdp_bytes: int = 32 * 1024
    max_candidate_bytes: int = 2048
    max_room_code: int = 64
    rate: float = 50.0
    """Frames per second a connection may send, sustained."""
    burst: int = 200
    """Frames a connection may send at once."""
    max_peers_per_room: int = 64
    max_rooms: int = 1000
    max_connections: int = 4096
    max_strikes: int = 20
    """Refused frames a connection may send before it is closed..."""
    strike_recovery_s: float = 10.0
    """...where one strike is forgiven every this many seconds."""
    handshake_timeout_s: float = 30.0
    idle_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        positive_ints = ("max_frame_bytes", "max_sdp_bytes", "max_candidate_bytes", "max_room_code",
                         "burst", "max_peers_per_room", "max_rooms", "max_connections", "max_strikes")
        for name in positive_ints:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UsageError("invalid-signaling-limits", f"Limits.{name} must be a positive int, not {value!r}")
        for name in ("rate", "strike_recovery_s", "handshake_timeout_s", "idle_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value < math.inf):
                raise UsageError("invalid-signaling-limits", f"Limits.{name} must be a positive number, not {value!r}")
        if self.max_sdp_bytes >= self.max_frame_bytes or self.max_candidate_bytes >= self.max_frame_bytes:
            raise UsageError("invalid-signaling-limits", "Limits.max_sdp_bytes and max_candidate_bytes must be "
                             "below max_frame_bytes (the frame also carries the envelope)")

    def describe(self) -> dict[str, Any]:
        """The limits a client should know, as sent in ``welcome.limits``."""
        return {
            "maxFrameBytes": self.max_frame_bytes,
            "maxSdpBytes": self.max_sdp_bytes,
            "maxCandidateBytes": self.max_candidate_bytes,
            "maxRoomCode": self.max_room_code,
            "rate": self.rate,
            "burst": self.burst,
            "maxPeersPerRoom": self.max_peers_per_room,
            "idleTimeout": self.idle_timeout_s,
        }


@dataclass
class TokenBucket:
    """``burst`` tokens, refilled at ``rate`` per second; time passed in."""

    rate: float
    burst: float
    tokens: float
    updated: float

    @classmethod
    def full(cls, rate: float, burst: float, now: float) -> TokenBucket:
        return cls(rate, burst, burst, now)

    def take(self, now: float, cost: float = 1.0) -> bool:
        """Take ``cost`` tokens if there are that many; False (and take none) otherwise."""
        if now > self.updated:
            self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
            self.updated = now
        if self.tokens >= cost:
            self.tokens -= cost
            return True
        return False


@dataclass(frozen=True)
class Send:
    """Send ``frame`` (a JSON object) to connection ``conn``."""

    conn: int
    frame: Mapping[str, Any]


@dataclass(frozen=True)
class Close:
    """Close connection ``conn`` with a WebSocket close code and reason."""

    conn: int
    code: int
    reason: str


Output = Union[Send, Close]


@dataclass
class Stats:
    """Counters for monitoring and for the tests."""

    connections: int = 0
    """Connections accepted, ever."""
    frames_in: int = 0
    refused: Counter[str] = field(default_factory=Counter)
    """Refused frames by reason."""
    relayed: Counter[str] = field(default_factory=Counter)
    """Relayed signals by kind."""
    closed: Counter[str] = field(default_factory=Counter)
    """Connections the server closed, by reason."""


def new_peer_id(random_bytes: Callable[[int], bytes] = os.urandom) -> str:
    """16 random bytes as 26 lowercase base32 characters."""
    return base64.b32encode(random_bytes(16)).decode("ascii").rstrip("=").lower()


def _mac(secret: bytes, peer_id: str) -> str:
    digest = hmac.new(secret, _TOKEN_LABEL + peer_id.encode("ascii"), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode("ascii").rstrip("=")


def make_token(secret: bytes, peer_id: str) -> str:
    """The resume token of ``peer_id`` under ``secret``."""
    return f"{peer_id}.{_mac(secret, peer_id)}"


def verify_token(secret: bytes, token: str) -> str | None:
    """The peer ID ``token`` was issued for under ``secret``, or None."""
    peer_id, dot, mac = token.partition(".")
    if not dot or PEER_ID.fullmatch(peer_id) is None:
        return None
    if hmac.compare_digest(mac.encode("ascii", "replace"), _mac(secret, peer_id).encode("ascii")):
        return peer_id
    return None


def validate_room(room: Any, max_chars: int) -> str:
    """``room`` if it is a valid room code; raises :class:`SignalingError` otherwise."""
    if not isinstance(room, str):
        _fail(Reason.BAD_ROOM, "join.room must be a string")
    if not 1 <= len(room) <= max_chars or ROOM_CODE.fullmatch(room) is None:
        _fail(Reason.BAD_ROOM, f"join.room must be 1 to {max_chars} characters from A-Z a-z 0-9 _ -")
    return room


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _optional_str(value: Any, name: str, max_chars: int) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > max_chars:
        _fail(Reason.BAD_PAYLOAD, f"candidate.{name} must be null or a string of at most {max_chars} characters")
    return value


def validate_payload(kind: SignalKind, payload: Any, limits: Limits) -> str | dict[str, Any]:
    """The payload of a ``signal`` of ``kind``, rebuilt from its known fields.

    Offers and answers carry the SDP text; candidates an
    ``RTCIceCandidateInit`` (``candidate`` string, ``""`` for end of
    candidates; ``sdpMid``, ``sdpMLineIndex``, ``usernameFragment``
    optional). Raises :class:`SignalingError` (bad-payload,
    payload-too-large).
    """
    if kind is not SignalKind.CANDIDATE:
        if not isinstance(payload, str):
            _fail(Reason.BAD_PAYLOAD, f"the payload of an {kind.value} must be the SDP string")
        if len(payload) > limits.max_sdp_bytes or _utf8_len(payload) > limits.max_sdp_bytes:
            _fail(Reason.PAYLOAD_TOO_LARGE, f"SDP is limited to {limits.max_sdp_bytes} bytes")
        if not payload.startswith("v=0") or "\x00" in payload:
            _fail(Reason.BAD_PAYLOAD, "SDP must start with 'v=0' and contain no NUL")
        return payload
    if not isinstance(payload, dict):
        _fail(Reason.BAD_PAYLOAD, "the payload of a candidate must be an RTCIceCandidateInit object")
    unknown = set(payload) - _CANDIDATE_FIELDS
    if unknown:
        _fail(Reason.BAD_PAYLOAD, f"candidate has fields outside {sorted(_CANDIDATE_FIELDS)}")
    text = payload.get("candidate")
    if not isinstance(text, str):
        _fail(Reason.BAD_PAYLOAD, "candidate.candidate must be a string")
    if text and not text.startswith("candidate:"):
        _fail(Reason.BAD_PAYLOAD, "candidate.candidate must be '' or start with 'candidate:'")
    if "\x00" in text:
        _fail(Reason.BAD_PAYLOAD, "candidate.candidate must contain no NUL")
    rebuilt: dict[str, Any] = {"candidate": text}
    mid = _optional_str(payload.get("sdpMid"), "sdpMid", _MAX_MID_CHARS)
    if "sdpMid" in payload:
        rebuilt["sdpMid"] = mid
    if "sdpMLineIndex" in payload:
        index = payload["sdpMLineIndex"]
        if index is not None and (isinstance(index, bool) or not isinstance(index, int) or not 0 <= index <= 65535):
            _fail(Reason.BAD_PAYLOAD, "candidate.sdpMLineIndex must be null or an integer 0..65535")
        rebuilt["sdpMLineIndex"] = index
    ufrag = _optional_str(payload.get("usernameFragment"), "usernameFragment", _MAX_UFRAG_CHARS)
    if "usernameFragment" in payload:
        rebuilt["usernameFragment"] = ufrag
    if _utf8_len(json.dumps(rebuilt, ensure_ascii=False)) > limits.max_candidate_bytes:
        _fail(Reason.PAYLOAD_TOO_LARGE, f"a candidate is limited to {limits.max_candidate_bytes} bytes of JSON")
    return rebuilt


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


def _parse_frame(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        _fail(Reason.BAD_JSON, "the frame is not valid JSON")
    if not isinstance(value, dict):
        _fail(Reason.BAD_JSON, "the frame must be a JSON object")
    return value


@dataclass
class _Conn:
    id: int
    opened: float
    last_seen: float
    bucket: TokenBucket
    strikes: TokenBucket
    phase: Phase = Phase.NEW
    peer_id: str | None = None
    room: str | None = None


class Hub:
    """Every signaling connection of one server, and its rooms.

    ``ice_servers(peer_id)`` gives the ``iceServers`` list for a welcome
    (the adapter may mint per-peer TURN credentials there). ``secret``
    signs the resume tokens; it must be at least 16 bytes.
    """

    def __init__(
        self,
        limits: Limits,
        secret: bytes,
        ice_servers: Callable[[str], list[dict[str, Any]]] = lambda _peer: [],
        random_bytes: Callable[[int], bytes] = os.urandom,
    ) -> None:
        if not isinstance(secret, bytes) or len(secret) < 16:
            raise UsageError("invalid-signaling-secret", "the signaling secret must be at least 16 bytes")
        self.limits = limits
        self.stats = Stats()
        self._secret = secret
        self._ice_servers = ice_servers
        self._random = random_bytes
        self._conns: dict[int, _Conn] = {}
        self._by_peer: dict[str, int] = {}
        self._rooms: dict[str, list[int]] = {}
        self._next_id = 1

    # -- queries ---------------------------------------------------------

    def peers_in(self, room: str) -> tuple[str, ...]:
        """Peer IDs in ``room``, in join order (empty if there is no such room)."""
        return tuple(self._peer_of(c) for c in self._rooms.get(room, ()))

    def peer_id(self, conn: int) -> str | None:
        """The peer ID of ``conn`` once welcomed."""
        state = self._conns.get(conn)
        return state.peer_id if state else None

    @property
    def connection_count(self) -> int:
        return len(self._conns)

    @property
    def room_count(self) -> int:
        return len(self._rooms)

    # -- events ----------------------------------------------------------

    def connect(self, now: float) -> tuple[int, list[Output]]:
        """A new connection: its handle, and a Close if the server is full."""
        conn = self._next_id
        self._next_id += 1
        if len(self._conns) >= self.limits.max_connections:
            self.stats.closed[Reason.SERVER_FULL.value] += 1
            return conn, [Close(conn, CloseCode.TRY_AGAIN_LATER, Reason.SERVER_FULL.value)]
        limits = self.limits
        self._conns[conn] = _Conn(
            id=conn, opened=now, last_seen=now,
            bucket=TokenBucket.full(limits.rate, limits.burst, now),
            strikes=TokenBucket.full(1.0 / limits.strike_recovery_s, limits.max_strikes, now),
        )
        self.stats.connections += 1
        return conn, []

    def receive(self, conn: int, data: str | bytes, now: float) -> list[Output]:
        """One frame from ``conn``: text (``str``) or binary (``bytes``)."""
        state = self._conns.get(conn)
        if state is None:
            return []
        state.last_seen = now
        self.stats.frames_in += 1
        refused: str | None = None
        try:
            if not state.bucket.take(now):
                _fail(Reason.RATE_LIMITED, f"more than {self.limits.burst} frames at once "
                      f"or {self.limits.rate:g} per second")
            if not isinstance(data, str):
                _fail(Reason.BINARY_FRAME, "the protocol uses JSON text frames only")
            limit = self.limits.max_frame_bytes
            if len(data) > limit or _utf8_len(data) > limit:
                _fail(Reason.FRAME_TOO_LARGE, f"frames are limited to {limit} bytes")
            message = _parse_frame(data)
            kind = message.get("type")
            if not isinstance(kind, str) or kind not in _FIELDS:
                _fail(Reason.UNKNOWN_TYPE, "type must be one of hello, join, signal, ping")
            refused = kind
            if kind not in ALLOWED[state.phase]:
                reason = OUT_OF_PHASE[(state.phase, kind)]
                _fail(reason, f"{kind} is not allowed in phase {state.phase.value}")
            required, optional = _FIELDS[kind]
            keys = set(message) - {"type"}
            if not required <= keys or not keys <= required | optional:
                _fail(Reason.BAD_MESSAGE, f"{kind} takes exactly the fields "
                      f"{sorted(required)} (optional {sorted(optional)})")
            return getattr(self, f"_on_{kind}")(state, message, now)
        except SignalingError as error:
            return self._refuse(state, error, refused, now)

    def disconnect(self, conn: int, now: float) -> list[Output]:
        """``conn`` is gone (closed by the peer, or after a Close). Idempotent."""
        del now
        return self._drop(conn)

    def drop(self, conn: int, code: int, reason: Reason, now: float) -> list[Output]:
        """Close ``conn`` for a reason the adapter found (e.g. slow-consumer)."""
        del now
        if conn not in self._conns:
            return []
        self.stats.closed[reason.value] += 1
        return [Close(conn, code, reason.value), *self._drop(conn)]

    def expire(self, now: float) -> list[Output]:
        """Close connections past the handshake or idle timeout."""
        limits = self.limits
        out: list[Output] = []
        for state in list(self._conns.values()):
            if state.phase is not Phase.JOINED and now - state.opened >= limits.handshake_timeout_s:
                out += self.drop(state.id, CloseCode.TIMEOUT, Reason.HANDSHAKE_TIMEOUT, now)
            elif now - state.last_seen >= limits.idle_timeout_s:
                out += self.drop(state.id, CloseCode.TIMEOUT, Reason.IDLE_TIMEOUT, now)
        return out

    def close_all(self, code: int = CloseCode.GOING_AWAY,
                  reason: Reason = Reason.SERVER_SHUTDOWN) -> list[Output]:
        """Shutdown: Close for every connection, and forget them all (no peer lists)."""
        out: list[Output] = [Close(conn, code, reason.value) for conn in self._conns]
        self.stats.closed[reason.value] += len(out)
        self._conns.clear()
        self._by_peer.clear()
        self._rooms.clear()
        return out

    # -- message handlers --------------------------------------------------

    def _on_ping(self, state: _Conn, message: dict[str, Any], now: float) -> list[Output]:
        return [Send(state.id, {"type": "pong"})]

    def _on_hello(self, state: _Conn, message: dict[str, Any], now: float) -> list[Output]:
        if "version" in message and message["version"] != PROTOCOL_VERSION:
            _fail(Reason.UNSUPPORTED_VERSION, f"this server speaks version {PROTOCOL_VERSION}")
        token = message.get("token")
        peer_id: str | None = None
        if token is not None:
            if not isinstance(token, str) or len(token) > _MAX_TOKEN_CHARS:
                _fail(Reason.BAD_MESSAGE, f"hello.token must be a string of at most {_MAX_TOKEN_CHARS} characters")
            peer_id = verify_token(self._secret, token)
        out: list[Output] = []
        resumed = peer_id is not None
        if peer_id is not None:
            previous = self._by_peer.get(peer_id)
            if previous is not None:
                # The old socket is most likely dead and not yet noticed; the
                # token proves the new one is the same peer.
                out += self.drop(previous, CloseCode.REPLACED, Reason.REPLACED, now)
        else:
            peer_id = new_peer_id(self._random)
            while peer_id in self._by_peer:  # 128 random bits: never, but cheap to be sure
                peer_id = new_peer_id(self._random)
        state.peer_id = peer_id
        state.phase = Phase.WELCOMED
        self._by_peer[peer_id] = state.id
        out.append(Send(state.id, {
            "type": "welcome",
            "version": PROTOCOL_VERSION,
            "peerId": peer_id,
            "token": make_token(self._secret, peer_id),
            "resumed": resumed,
            "iceServers": self._ice_servers(peer_id),
            "limits": self.limits.describe(),
        }))
        return out

    def _on_join(self, state: _Conn, message: dict[str, Any], now: float) -> list[Output]:
        room = validate_room(message["room"], self.limits.max_room_code)
        members = self._rooms.get(room)
        if members is None:
            if len(self._rooms) >= self.limits.max_rooms:
                _fail(Reason.TOO_MANY_ROOMS, f"the server has {self.limits.max_rooms} rooms already")
            members = self._rooms[room] = []
        elif len(members) >= self.limits.max_peers_per_room:
            _fail(Reason.ROOM_FULL, f"the room has {self.limits.max_peers_per_room} peers already")
        members.append(state.id)
        state.room = room
        state.phase = Phase.JOINED
        return self._peers_update(room)

    def _on_signal(self, state: _Conn, message: dict[str, Any], now: float) -> list[Output]:
        to = message["to"]
        if not isinstance(to, str) or len(to) > _MAX_PEER_ID_CHARS:
            _fail(Reason.BAD_MESSAGE, "signal.to must be a peer ID string")
        try:
            kind = SignalKind(message["kind"])
        except (ValueError, TypeError):
            _fail(Reason.BAD_KIND, "signal.kind must be offer, answer or candidate")
        payload = validate_payload(kind, message["payload"], self.limits)
        if to == state.peer_id:
            _fail(Reason.SELF_ADDRESSED, "signal.to is the sender itself")
        target = self._by_peer.get(to)
        if target is None or self._conns[target].room != state.room:
            # Same answer for "no such peer" and "peer in another room": a
            # peer learns nothing about rooms it is not in.
            _fail(Reason.UNKNOWN_PEER, "signal.to is not a peer in this room")
        self.stats.relayed[kind.value] += 1
        return [Send(target, {"type": "signal", "from": state.peer_id, "kind": kind.value, "payload": payload})]

    # -- internals ---------------------------------------------------------

    def _peer_of(self, conn: int) -> str:
        peer_id = self._conns[conn].peer_id
        assert peer_id is not None
        return peer_id

    def _peers_update(self, room: str) -> list[Output]:
        members = self._rooms.get(room, [])
        frame = {"type": "peers", "room": room, "peers": [self._peer_of(c) for c in members]}
        return [Send(c, frame) for c in members]

    def _drop(self, conn: int) -> list[Output]:
        state = self._conns.pop(conn, None)
        if state is None:
            return []
        if state.peer_id is not None and self._by_peer.get(state.peer_id) == conn:
            del self._by_peer[state.peer_id]
        if state.room is None:
            return []
        members = self._rooms[state.room]
        members.remove(conn)
        if not members:
            del self._rooms[state.room]
            return []
        return self._peers_update(state.room)

    def _refuse(self, state: _Conn, error: SignalingError, refused: str | None, now: float) -> list[Output]:
        self.stats.refused[error.reason] += 1
        frame: dict[str, Any] = {"type": "error", "reason": error.reason, "message": error.message}
        if refused is not None:
            frame["refused"] = refused
        out: list[Output] = [Send(state.id, frame)]
        if not state.strikes.take(now):
            out += self.drop(state.id, CloseCode.POLICY_VIOLATION, Reason.TOO_MANY_ERRORS, now)
        return out
