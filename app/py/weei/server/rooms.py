"""The signaling hub without I/O: peers, rooms, and what may be relayed.

Theory of operation
-------------------
A :class:`Hub` holds every signaling connection the server has, as small
integer handles. The adapter (``signaling.py``) feeds it events with the
time passed in -- :meth:`Hub.connect`, :meth:`Hub.on_frame` (one WebSocket
frame), :meth:`Hub.disconnect`, :meth:`Hub.expire` -- and performs what it
returns: :class:`RoomSend` (one JSON frame to one connection) and
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

A room is entered with its key: ``join`` carries the room code and the
key, and the code must be :func:`room_code` of the key (a hash), so the hub
stores no key and answers a wrong key, a malformed one and a room nobody is
in alike (``room-refused``). Every connection belongs to a *source* (its IP
address, given to :meth:`Hub.connect`); a source has budgets of its own --
joins per second (each join and each leave costs every member of the room a
peer list, so this bounds churn), refused joins per second (probes), rooms
it created, and bytes per second over all its sockets -- and the server has
joins and bytes per second budgets over all addresses together.

Peer IDs are 16 random bytes in lowercase base32. After a join the joiner's
peer list carries a resume token ``peerId.room.expires.mac`` (HMAC-SHA256
under the server secret), bound to that room and valid
``Limits.resume_ttl_s``; presenting it in a later ``hello`` gives the same
peer ID back, also after a server restart with the same secret, but the ID
is taken over (the old socket closed as ``replaced``) only when that
connection then joins the same room with its key. A token that does not
verify, has expired or is bound to no room simply yields a fresh ID.

The protocol's vocabulary (phases, reasons, limits, tokens, the checks on a
frame) is in :mod:`weei.server.signaling_rules`; it is re-exported here.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Union

from ..core.errors import UsageError, UsageReason
from .signaling_rules import (ALLOWED, MAX_PEER_ID_CHARS, MAX_TOKEN_CHARS, MESSAGE_FIELDS, OUT_OF_PHASE, PROTOCOL_VERSION,
                              ROOM_CODE, UNBOUND, CloseCode, Limits, Phase, Reason, SignalingError, SignalKind,
                              TokenBucket, make_token, new_peer_id, parse_text_frame, refuse, utf8_len, validate_key,
                              validate_payload, validate_room, verify_token)

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
    "RoomSend",
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


@dataclass(frozen=True)
class RoomSend:
    """Send ``frame`` (a JSON object) to connection ``conn``."""

    conn: int
    frame: Mapping[str, Any]


@dataclass(frozen=True)
class Close:
    """Close connection ``conn`` with a WebSocket close code and reason."""

    conn: int
    code: int
    reason: str


Output = Union[RoomSend, Close]


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




@dataclass
class _Source:
    """One IP address: its connections and budgets (forgotten when its last connection goes)."""

    joins: TokenBucket
    probes: TokenBucket
    bytes: TokenBucket
    conns: int = 0
    rooms: int = 0


@dataclass
class _Conn:
    id: int
    opened: float
    last_seen: float
    bucket: TokenBucket
    strikes: TokenBucket
    source: str
    phase: Phase = Phase.NEW
    peer_id: str | None = None
    room: str | None = None
    resume_room: str | None = None
    """The room the hello's token was bound to: the peer ID is taken over only by joining it."""


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
        unix_clock: Callable[[], float] = time.time,
    ) -> None:
        if not isinstance(secret, bytes) or len(secret) < 16:
            raise UsageError(UsageReason.INVALID_SIGNALING_SECRET, "the signaling secret must be at least 16 bytes")
        self.limits = limits
        self.stats = Stats()
        self._secret = secret
        self._ice_servers = ice_servers
        self._random = random_bytes
        self._unix_clock = unix_clock  # token expiry survives restarts: wall clock, not ``now``
        self._conns: dict[int, _Conn] = {}
        self._by_peer: dict[str, int] = {}
        self._rooms: dict[str, list[int]] = {}
        self._room_source: dict[str, str] = {}
        self._sources: dict[str, _Source] = {}
        # Server-wide budgets: many addresses together cannot cost more either.
        self._total_joins = TokenBucket.full(limits.total_join_rate, limits.total_join_burst, 0.0)
        self._total_bytes = TokenBucket.full(limits.total_bytes_rate, limits.total_bytes_burst, 0.0)
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

    def connect(self, now: float, source: str = "") -> tuple[int, list[Output]]:
        """A new connection from ``source`` (its IP address): its handle, and a Close if the server is full."""
        conn = self._next_id
        self._next_id += 1
        if len(self._conns) >= self.limits.max_connections:
            self.stats.closed[Reason.SERVER_FULL.value] += 1
            return conn, [Close(conn, CloseCode.TRY_AGAIN_LATER, Reason.SERVER_FULL.value)]
        limits = self.limits
        origin = self._sources.get(source)
        if origin is None:
            origin = self._sources[source] = _Source(
                joins=TokenBucket.full(limits.join_rate, limits.join_burst, now),
                probes=TokenBucket.full(limits.probe_rate, limits.probe_burst, now),
                bytes=TokenBucket.full(limits.ip_bytes_rate, limits.ip_bytes_burst, now))
        origin.conns += 1
        self._conns[conn] = _Conn(
            id=conn, opened=now, last_seen=now,
            bucket=TokenBucket.full(limits.rate, limits.burst, now),
            strikes=TokenBucket.full(1.0 / limits.strike_recovery_s, limits.max_strikes, now),
            source=source,
        )
        self.stats.connections += 1
        return conn, []

    def on_frame(self, conn: int, data: str | bytes, now: float) -> list[Output]:
        """One frame from ``conn``: text (``str``) or binary (``bytes``)."""
        state = self._conns.get(conn)
        if state is None:
            return []
        state.last_seen = now
        self.stats.frames_in += 1
        refused: str | None = None
        try:
            if not state.bucket.take(now):
                refuse(Reason.RATE_LIMITED, f"more than {self.limits.burst} frames at once "
                      f"or {self.limits.rate:g} per second")
            if not self._sources[state.source].bytes.take(now, len(data)):
                refuse(Reason.BYTES_RATE_LIMITED, f"more than {self.limits.ip_bytes_rate:g} bytes per second "
                       "from this address")
            if not self._total_bytes.take(now, len(data)):
                refuse(Reason.BYTES_RATE_LIMITED, "the server reads no more bytes per second; wait")
            if not isinstance(data, str):
                refuse(Reason.BINARY_FRAME, "the protocol uses JSON text frames only")
            limit = self.limits.max_frame_bytes
            if len(data) > limit or utf8_len(data) > limit:
                refuse(Reason.FRAME_TOO_LARGE, f"frames are limited to {limit} bytes")
            message = parse_text_frame(data)
            kind = message.get("type")
            if not isinstance(kind, str) or kind not in MESSAGE_FIELDS:
                refuse(Reason.UNKNOWN_TYPE, "type must be one of hello, join, signal, ping")
            refused = kind
            if kind not in ALLOWED[state.phase]:
                reason = OUT_OF_PHASE[(state.phase, kind)]
                refuse(reason, f"{kind} is not allowed in phase {state.phase.value}")
            required, optional = MESSAGE_FIELDS[kind]
            keys = set(message) - {"type"}
            if not required <= keys or not keys <= required | optional:
                refuse(Reason.BAD_MESSAGE, f"{kind} takes exactly the fields "
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
        for address, source in list(self._sources.items()):
            # An address with no socket and no room is forgotten once its budgets are full again.
            if source.conns == 0 and source.rooms == 0 and all(
                    bucket.take(now, 0) and bucket.tokens >= bucket.burst
                    for bucket in (source.joins, source.probes, source.bytes)):
                del self._sources[address]
        return out

    def close_all(self, code: int = CloseCode.GOING_AWAY,
                  reason: Reason = Reason.SERVER_SHUTDOWN) -> list[Output]:
        """Shutdown: Close for every connection, and forget them all (no peer lists)."""
        out: list[Output] = [Close(conn, code, reason.value) for conn in self._conns]
        self.stats.closed[reason.value] += len(out)
        self._conns.clear()
        self._by_peer.clear()
        self._rooms.clear()
        self._room_source.clear()
        self._sources.clear()
        return out

    # -- message handlers --------------------------------------------------

    def _on_ping(self, state: _Conn, message: dict[str, Any], now: float) -> list[Output]:
        return [RoomSend(state.id, {"type": "pong"})]

    def _on_hello(self, state: _Conn, message: dict[str, Any], now: float) -> list[Output]:
        if "version" in message and message["version"] != PROTOCOL_VERSION:
            refuse(Reason.UNSUPPORTED_VERSION, f"this server speaks version {PROTOCOL_VERSION}")
        token = message.get("token")
        unix_now = self._unix_clock()
        resumed: tuple[str, str] | None = None
        if token is not None:
            if not isinstance(token, str) or len(token) > MAX_TOKEN_CHARS:
                refuse(Reason.BAD_MESSAGE, f"hello.token must be a string of at most {MAX_TOKEN_CHARS} characters")
            resumed = verify_token(self._secret, token, unix_now)
        if resumed is not None and resumed[1] != UNBOUND:
            # The ID is only taken over at the join of the token's room (with its key), see _on_join.
            peer_id, state.resume_room = resumed
        else:
            peer_id = new_peer_id(self._random)
            while peer_id in self._by_peer:  # 128 random bits: never, but cheap to be sure
                peer_id = new_peer_id(self._random)
            self._by_peer[peer_id] = state.id
        state.peer_id = peer_id
        state.phase = Phase.WELCOMED
        return [RoomSend(state.id, {
            "type": "welcome",
            "version": PROTOCOL_VERSION,
            "peerId": peer_id,
            "token": self._token(peer_id, state.resume_room or UNBOUND),
            "resumed": state.resume_room is not None,
            "iceServers": self._ice_servers(peer_id),
            "limits": self.limits.describe(),
        })]

    def _on_join(self, state: _Conn, message: dict[str, Any], now: float) -> list[Output]:
        limits = self.limits
        source = self._sources[state.source]
        # Budgets first, so a refused probe and a good join look the same once they are spent.
        source.probes.take(now, 0)  # refill
        if source.probes.tokens < 1:
            refuse(Reason.JOIN_RATE_LIMITED, "too many refused joins from this address; wait")
        if not source.joins.take(now):
            refuse(Reason.JOIN_RATE_LIMITED, f"more than {limits.join_rate:g} joins per second from this address")
        if not self._total_joins.take(now):
            refuse(Reason.JOIN_RATE_LIMITED, "the server admits no more joins per second; wait")
        try:
            room = validate_room(message["room"], limits.max_room_code)
            validate_key(room, message.get("key"))
        except SignalingError as error:
            if error.reason != Reason.ROOM_KEY_REQUIRED.value:
                source.probes.take(now)
            raise
        if state.resume_room is not None and state.resume_room != room:
            refuse(Reason.RESUME_WRONG_ROOM, "the hello's token is bound to another room")
        peer_id = self._peer_of(state.id)
        previous = self._by_peer.get(peer_id)
        members = self._rooms.get(room)
        if members is None:
            if len(self._rooms) >= limits.max_rooms:
                refuse(Reason.TOO_MANY_ROOMS, f"the server has {limits.max_rooms} rooms already")
            if source.rooms >= limits.max_rooms_per_ip:
                refuse(Reason.TOO_MANY_ROOMS, f"peers from this address made {limits.max_rooms_per_ip} rooms already")
        elif len(members) - (previous in members) >= limits.max_peers_per_room:  # a replaced socket frees its place
            refuse(Reason.ROOM_FULL, f"the room has {limits.max_peers_per_room} peers already")
        out: list[Output] = []
        if previous is not None and previous != state.id:
            # The old socket is most likely dead and not yet noticed; the token and
            # the key prove the new one is the same peer.
            out += self.drop(previous, CloseCode.REPLACED, Reason.REPLACED, now)
        self._by_peer[peer_id] = state.id
        members = self._rooms.get(room)
        if members is None:
            members = self._rooms[room] = []
            self._room_source[room] = state.source
            source.rooms += 1
        members.append(state.id)
        state.room = room
        state.phase = Phase.JOINED
        return out + self._peers_update(room, joiner=state.id)

    def _on_signal(self, state: _Conn, message: dict[str, Any], now: float) -> list[Output]:
        to = message["to"]
        if not isinstance(to, str) or len(to) > MAX_PEER_ID_CHARS:
            refuse(Reason.BAD_MESSAGE, "signal.to must be a peer ID string")
        try:
            kind = SignalKind(message["kind"])
        except (ValueError, TypeError):
            refuse(Reason.BAD_KIND, "signal.kind must be offer, answer or candidate")
        payload = validate_payload(kind, message["payload"], self.limits)
        if to == state.peer_id:
            refuse(Reason.SELF_ADDRESSED, "signal.to is the sender itself")
        target = self._by_peer.get(to)
        if target is None or self._conns[target].room != state.room:
            # Same answer for "no such peer" and "peer in another room": a
            # peer learns nothing about rooms it is not in.
            refuse(Reason.UNKNOWN_PEER, "signal.to is not a peer in this room")
        self.stats.relayed[kind.value] += 1
        return [RoomSend(target, {"type": "signal", "from": state.peer_id, "kind": kind.value, "payload": payload})]

    # -- internals ---------------------------------------------------------

    def _peer_of(self, conn: int) -> str:
        peer_id = self._conns[conn].peer_id
        assert peer_id is not None
        return peer_id

    def _token(self, peer_id: str, room: str) -> str:
        return make_token(self._secret, peer_id, room, int(self._unix_clock() + self.limits.resume_ttl_s))

    def _peers_update(self, room: str, joiner: int | None = None) -> list[Output]:
        members = self._rooms.get(room, [])
        frame = {"type": "peers", "room": room, "peers": [self._peer_of(c) for c in members]}
        return [RoomSend(c, dict(frame, token=self._token(self._peer_of(c), room)) if c == joiner else frame)
                for c in members]

    def _drop(self, conn: int) -> list[Output]:
        state = self._conns.pop(conn, None)
        if state is None:
            return []
        if state.peer_id is not None and self._by_peer.get(state.peer_id) == conn:
            del self._by_peer[state.peer_id]
        self._sources[state.source].conns -= 1
        if state.room is None:
            return []
        members = self._rooms[state.room]
        members.remove(conn)
        if not members:
            del self._rooms[state.room]
            owner = self._room_source.pop(state.room)
            if owner in self._sources:
                self._sources[owner].rooms -= 1
            return []
        return self._peers_update(state.room)

    def _refuse(self, state: _Conn, error: SignalingError, refused: str | None, now: float) -> list[Output]:
        self.stats.refused[error.reason] += 1
        frame: dict[str, Any] = {"type": "error", "reason": error.reason, "message": error.message}
        if refused is not None:
            frame["refused"] = refused
        out: list[Output] = [RoomSend(state.id, frame)]
        if not state.strikes.take(now):
            out += self.drop(state.id, CloseCode.POLICY_VIOLATION, Reason.TOO_MANY_ERRORS, now)
        return out
