"""The signaling protocol: its phases, reason and close codes, limits, resume
tokens, and the checks on one incoming frame (no I/O, no state).

:mod:`weei.server.rooms` (the hub) applies these to connections and rooms;
``docs/signaling.md`` describes the protocol.
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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from ..core._check import parse_json
from ..core.errors import UsageError, WeeiError, UsageReason
from ..core.wire.signaling_session import ROOM_KEY, ClientReason, Reason, room_code

__all__ = [
    "PROTOCOL_VERSION",
    "ROOM_CODE",
    "PEER_ID",
    "MAX_TOKEN_CHARS",
    "MAX_PEER_ID_CHARS",
    "ALLOWED",
    "OUT_OF_PHASE",
    "MESSAGE_FIELDS",
    "Phase",
    "Reason",
    "CloseCode",
    "SignalKind",
    "SignalingError",
    "refuse",
    "Limits",
    "TokenBucket",
    "new_peer_id",
    "make_token",
    "verify_token",
    "validate_room",
    "validate_key",
    "room_code",
    "UNBOUND",
    "validate_payload",
    "parse_text_frame",
    "utf8_len",
]

PROTOCOL_VERSION = 1

#: Room codes come from page URLs: short, and only URL-safe characters.
ROOM_CODE = re.compile(r"[A-Za-z0-9_-]+")
PEER_ID = re.compile(r"[a-z2-7]{26}")
_TOKEN_LABEL = b"weei-signal/2 peer "
#: The room field of a token issued before a join (it resumes nothing).
UNBOUND = "-"
MAX_TOKEN_CHARS = 256
MAX_PEER_ID_CHARS = 64
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
#: Fields of each incoming message type.
MESSAGE_FIELDS: Mapping[str, tuple[frozenset[str], frozenset[str]]] = {
    # type: (required fields, optional fields), "type" included in neither
    "hello": (frozenset(), frozenset({"version", "token"})),
    "join": (frozenset({"room"}), frozenset({"key"})),
    "signal": (frozenset({"to", "kind", "payload"}), frozenset()),
    "ping": (frozenset(), frozenset()),
}
_CANDIDATEMESSAGE_FIELDS = frozenset({"candidate", "sdpMid", "sdpMLineIndex", "usernameFragment"})


class SignalingError(WeeiError):
    """A signaling frame was refused, or the server refused a client request.

    ``reason`` is a :class:`Reason` value (a string), or a :class:`ClientReason`
    on the client's side; ``refused`` names the message type when it was known.
    """

    reasons = (Reason, ClientReason)

    def __init__(self, reason: Reason | ClientReason, message: str, refused: str | None = None) -> None:
        super().__init__(reason, message)
        self.refused = refused


def refuse(reason: Reason, message: str) -> NoReturn:
    """Raise the ``SignalingError`` that refuses a frame for ``reason``."""
    raise SignalingError(reason, message)


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
    resume_ttl_s: float = 6 * 3600.0
    """How long a resume token keeps a peer ID (wall-clock seconds)."""
    max_rooms_per_ip: int = 32
    """Rooms that peers from one IP address may have created and still be in."""
    join_rate: float = 2.0
    """Joins per second one IP address may make, sustained (each join costs every member a peer list)..."""
    join_burst: int = 64
    """...and at once."""
    probe_rate: float = 0.2
    """Refused joins (wrong key, bad code) per second one IP address may make, sustained..."""
    probe_burst: int = 10
    """...and at once; beyond, every join from it is refused unchecked (join-rate-limited)."""
    ip_bytes_rate: float = 512 * 1024.0
    """Bytes per second one IP address may send over all its sockets, sustained..."""
    ip_bytes_burst: int = 8 * 1024 * 1024
    """...and at once."""
    total_join_rate: float = 200.0
    """Joins per second the whole server admits, sustained (many addresses churning at once)..."""
    total_join_burst: int = 2000
    """...and at once."""
    total_bytes_rate: float = 64 * 1024 * 1024.0
    """Bytes per second the whole server reads from all sockets, sustained..."""
    total_bytes_burst: int = 256 * 1024 * 1024
    """...and at once."""

    def __post_init__(self) -> None:
        positive_ints = ("max_frame_bytes", "max_sdp_bytes", "max_candidate_bytes", "max_room_code",
                         "burst", "max_peers_per_room", "max_rooms", "max_connections", "max_strikes",
                         "max_rooms_per_ip", "join_burst", "probe_burst", "ip_bytes_burst", "total_join_burst",
                         "total_bytes_burst")
        for name in positive_ints:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UsageError(UsageReason.INVALID_SIGNALING_LIMITS, f"Limits.{name} must be a positive int, not {value!r}")
        for name in ("rate", "strike_recovery_s", "handshake_timeout_s", "idle_timeout_s", "resume_ttl_s",
                     "join_rate", "probe_rate", "ip_bytes_rate", "total_join_rate", "total_bytes_rate"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value < math.inf):
                raise UsageError(UsageReason.INVALID_SIGNALING_LIMITS, f"Limits.{name} must be a positive number, not {value!r}")
        if min(self.ip_bytes_burst, self.total_bytes_burst) < self.max_frame_bytes:
            raise UsageError(UsageReason.INVALID_SIGNALING_LIMITS,
                             "Limits.ip_bytes_burst and total_bytes_burst must hold at least one frame")
        if self.max_sdp_bytes >= self.max_frame_bytes or self.max_candidate_bytes >= self.max_frame_bytes:
            raise UsageError(UsageReason.INVALID_SIGNALING_LIMITS, "Limits.max_sdp_bytes and max_candidate_bytes must be "
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


def new_peer_id(random_bytes: Callable[[int], bytes] = os.urandom) -> str:
    """16 random bytes as 26 lowercase base32 characters."""
    return base64.b32encode(random_bytes(16)).decode("ascii").rstrip("=").lower()


def _mac(secret: bytes, peer_id: str, room: str, expires: int) -> str:
    message = _TOKEN_LABEL + f"{peer_id} {room} {expires}".encode("ascii")
    digest = hmac.new(secret, message, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode("ascii").rstrip("=")


def make_token(secret: bytes, peer_id: str, room: str, expires: int) -> str:
    """The resume token of ``peer_id`` in room code ``room`` (:data:`UNBOUND`: none yet), valid until
    ``expires`` (unix seconds): ``peerId.room.expires.mac``."""
    return f"{peer_id}.{room}.{expires}.{_mac(secret, peer_id, room, expires)}"


def verify_token(secret: bytes, token: str, unix_now: float) -> tuple[str, str] | None:
    """``(peer ID, room code)`` that ``token`` was issued for under ``secret``, or None if it does not
    verify, has expired, or is bound to no room."""
    parts = token.split(".")
    if len(parts) != 4:
        return None
    peer_id, room, expires_text, mac = parts
    if (PEER_ID.fullmatch(peer_id) is None or ROOM_CODE.fullmatch(room) is None
            or not expires_text.isdigit() or len(expires_text) > 12):
        return None
    expires = int(expires_text)
    if not hmac.compare_digest(mac.encode("ascii", "replace"),
                               _mac(secret, peer_id, room, expires).encode("ascii")):
        return None
    return (peer_id, room) if expires > unix_now else None


def validate_room(room: Any, max_chars: int) -> str:
    """``room`` if it is a valid room code; raises :class:`SignalingError` otherwise."""
    if not isinstance(room, str):
        refuse(Reason.BAD_ROOM, "join.room must be a string")
    if not 1 <= len(room) <= max_chars or ROOM_CODE.fullmatch(room) is None:
        refuse(Reason.BAD_ROOM, f"join.room must be 1 to {max_chars} characters from A-Z a-z 0-9 _ -")
    return room


def validate_key(room: str, key: Any) -> None:
    """Refuse a join whose ``key`` is missing (room-key-required) or not ``room``'s (room-refused)."""
    if key is None:
        refuse(Reason.ROOM_KEY_REQUIRED, "join.key is required: rooms are entered with the key of their invite link")
    if not isinstance(key, str) or ROOM_KEY.fullmatch(key) is None:
        refuse(Reason.BAD_ROOM, "join.key must be 1 to 128 characters from A-Z a-z 0-9 _ -")
    if not hmac.compare_digest(room_code(key), room):
        # One answer for a wrong key, a malformed key and a room nobody is in: nothing to enumerate.
        refuse(Reason.ROOM_REFUSED, "no room with this code and key")


def utf8_len(text: str) -> int:
    """Bytes of ``text`` in UTF-8 (what the limits count)."""
    return len(text.encode("utf-8", "surrogatepass"))


def _optional_str(value: Any, name: str, max_chars: int) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > max_chars:
        refuse(Reason.BAD_PAYLOAD, f"candidate.{name} must be null or a string of at most {max_chars} characters")
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
            refuse(Reason.BAD_PAYLOAD, f"the payload of an {kind.value} must be the SDP string")
        if len(payload) > limits.max_sdp_bytes or utf8_len(payload) > limits.max_sdp_bytes:
            refuse(Reason.PAYLOAD_TOO_LARGE, f"SDP is limited to {limits.max_sdp_bytes} bytes")
        if not payload.startswith("v=0") or "\x00" in payload:
            refuse(Reason.BAD_PAYLOAD, "SDP must start with 'v=0' and contain no NUL")
        return payload
    if not isinstance(payload, dict):
        refuse(Reason.BAD_PAYLOAD, "the payload of a candidate must be an RTCIceCandidateInit object")
    unknown = set(payload) - _CANDIDATEMESSAGE_FIELDS
    if unknown:
        refuse(Reason.BAD_PAYLOAD, f"candidate has fields outside {sorted(_CANDIDATEMESSAGE_FIELDS)}")
    text = payload.get("candidate")
    if not isinstance(text, str):
        refuse(Reason.BAD_PAYLOAD, "candidate.candidate must be a string")
    if text and not text.startswith("candidate:"):
        refuse(Reason.BAD_PAYLOAD, "candidate.candidate must be '' or start with 'candidate:'")
    if "\x00" in text:
        refuse(Reason.BAD_PAYLOAD, "candidate.candidate must contain no NUL")
    rebuilt: dict[str, Any] = {"candidate": text}
    mid = _optional_str(payload.get("sdpMid"), "sdpMid", _MAX_MID_CHARS)
    if "sdpMid" in payload:
        rebuilt["sdpMid"] = mid
    if "sdpMLineIndex" in payload:
        index = payload["sdpMLineIndex"]
        if index is not None and (isinstance(index, bool) or not isinstance(index, int) or not 0 <= index <= 65535):
            refuse(Reason.BAD_PAYLOAD, "candidate.sdpMLineIndex must be null or an integer 0..65535")
        rebuilt["sdpMLineIndex"] = index
    ufrag = _optional_str(payload.get("usernameFragment"), "usernameFragment", _MAX_UFRAG_CHARS)
    if "usernameFragment" in payload:
        rebuilt["usernameFragment"] = ufrag
    if utf8_len(json.dumps(rebuilt, ensure_ascii=False)) > limits.max_candidate_bytes:
        refuse(Reason.PAYLOAD_TOO_LARGE, f"a candidate is limited to {limits.max_candidate_bytes} bytes of JSON")
    return rebuilt


def _bad_json(message: str) -> NoReturn:
    # Bad JSON, NaN/Infinity, or nesting past MAX_JSON_DEPTH (a frame is at most 64 KiB).
    refuse(Reason.BAD_JSON, f"the frame {message}")


def parse_text_frame(text: str) -> dict[str, Any]:
    """One text frame as a JSON object; refuses anything else (``bad-json``)."""
    value = parse_json(text, _bad_json)
    if not isinstance(value, dict):
        refuse(Reason.BAD_JSON, "the frame must be a JSON object")
    return value
