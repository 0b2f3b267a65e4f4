"""The debug log: the last 1,000 events of this browser profile, and a timing baseline.

Theory of operation
-------------------
The log is plain data that the browser adapter stores in ``localStorage``
with ``to_json()`` (only when ``revision`` changed, and throttled) and reads back at start-up with ``DebugLog.from_json``.
A stored value that cannot be read (corrupt JSON, wrong shape, an older
storage version) never stops the app: the unreadable part starts empty and a
``debuglog.reset`` event says why. Events and baseline are read separately,
so a corrupt baseline does not cost the events, and the other way round.

Besides events, the log keeps a *baseline* of how long things take:

* **phases** (``'fedavg'``, ``'indexeddb.checkpoint-save'``, ...): each
  finished phase adds a duration. ``count``, ``minMs``, ``maxMs`` and
  ``avgMs`` cover every duration since the log was created or cleared
  (running sums, so they are exact and cheap); ``p50Ms`` is the exact median
  of the last ``MAX_PHASE_SAMPLES`` (1,000) durations of that phase, which
  is what the log can afford to keep in ``localStorage``.
* **idle**: within a round (``round_started`` .. ``round_finished``), the
  time during which no phase was running, from the end of one phase to the
  start of the next. Time before the round's first phase and after its last
  is not idle: it is not *between* phases.

A coordinator's round is three phases in a row (``round_phase``): its
training (``round.training``, from the hand-out to the last update), its
aggregation (named by the method: ``fedavg``, ``fedavgm`` or ``fedadam``,
announced by an ``aggregation.started`` event), which the coordinator times
with the host's monotonic clock, and the host's
``indexeddb.checkpoint-save``, after which the round ends. The gaps are the
work between them: bookkeeping, messages sent before the save.

Wall-clock milliseconds (``now_ms``) stamp events; monotonic milliseconds
(``now_mono``) measure phases and gaps. Neither is read here.

**One peer cannot flush the log.** An event about another peer (its
details name it as ``peer``, ``from`` or ``to``; this device's own id,
``own_peer``, is exempt) spends one of that peer's ``PEER_BURST`` tokens,
which come back one per ``PEER_REFILL_MS``. A peer without a token has its
event counted, not stored: into one ``debuglog.repeated`` entry per peer
(``{peer, count, events: {name: count}, lastAt}``), kept open while it is
still in the log. So 5,000 junk messages from one participant cost the
others' history about ``PEER_BURST`` events, however fast they come, and a
flood that goes on adds one event per ``PEER_REFILL_MS`` (as a busy peer of
a real job does), plus its one growing count.
"""

from __future__ import annotations

import json
import math
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Mapping, NoReturn, TypeGuard

from .._check import parse_json
from ..errors import UsageError, UsageReason

__all__ = [
    "FILE_SCHEMA_VERSION",
    "STORAGE_VERSION",
    "MAX_EVENTS",
    "MAX_PHASE_SAMPLES",
    "MAX_PHASES",
    "PEER_BURST",
    "PEER_REFILL_MS",
    "iso8601",
    "DebugLog",
]

FILE_SCHEMA_VERSION = 2  # TrainingDebugLogFile.schemaVersion
STORAGE_VERSION = 1  # our localStorage layout; not part of the spec
MAX_EVENTS = 1_000
MAX_PHASE_SAMPLES = 1_000
# Phase names come from our code, but a bug must not grow localStorage without end.
MAX_PHASES = 200
_MAX_NAME = 200
_MAX_STRING = 2_000
_MAX_DEPTH = 6
_MAX_ITEMS = 100
#: Past this, an int duration would not fit a float (an int JSON literal may be any length).
_MAX_INT_DURATION = 2**1000
# A count a float divides exactly: the averages divide a float total by it, and an int past float's
# range (10**400 is valid JSON) would raise OverflowError there.
_MAX_COUNT = 2**53

#: Events about one other peer kept in a burst, and the wall-clock ms after which it may add one more.
PEER_BURST = 100
PEER_REFILL_MS = 2_000
# Details that name the peer an event is about, in the order they are looked for.
_PEER_KEYS = ("peer", "from", "to")
# Peers whose budget is remembered: past this, full budgets (they carry nothing) are forgotten first.
_MAX_PEER_BUDGETS = 4 * MAX_EVENTS

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def iso8601(now_ms: float) -> str:
    """Format wall-clock ms since the epoch as JavaScript's ``toISOString()`` does.

    Returns for example ``'2024-05-01T12:00:00.000Z'`` (UTC, milliseconds).
    Raises ``UsageError`` (``bad-time``) for a value that is not a finite
    time between the years 1 and 9999.
    """
    if isinstance(now_ms, bool) or not isinstance(now_ms, (int, float)) or not math.isfinite(now_ms):
        raise UsageError(UsageReason.BAD_TIME, f"time must be finite ms since the epoch, got {now_ms!r}")
    ms = int(round(now_ms))
    try:
        # Integer arithmetic on a timedelta: no float rounding, no platform time_t limits.
        moment = _EPOCH + timedelta(milliseconds=ms)
    except OverflowError as error:
        raise UsageError(UsageReason.BAD_TIME, f"time {now_ms!r} is outside the years 1 to 9999") from error
    return f"{moment:%Y-%m-%dT%H:%M:%S}.{ms % 1000:03d}Z"


def _plain(value: Any, depth: int = 0) -> Any:
    """Turn event details into JSON data, so that logging never fails on a value."""
    if value is None or isinstance(value, (bool, int, str)):
        return value[:_MAX_STRING] if isinstance(value, str) else value
    if isinstance(value, float):
        # JSON has no NaN or Infinity; say what it was instead of losing it.
        return value if math.isfinite(value) else repr(value)
    if depth >= _MAX_DEPTH:
        return "…"
    if isinstance(value, Mapping):
        return {str(k)[:_MAX_NAME]: _plain(v, depth + 1) for k, v in list(value.items())[:_MAX_ITEMS]}
    if isinstance(value, (list, tuple)):
        return [_plain(v, depth + 1) for v in list(value)[:_MAX_ITEMS]]
    try:
        return repr(value)[:_MAX_STRING]
    except Exception:  # a broken __repr__ must not break the caller's job
        return f"<{type(value).__name__}>"


@dataclass
class _PhaseStats:
    count: int = 0
    total_ms: float = 0.0
    min_ms: float = math.inf
    max_ms: float = 0.0
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=MAX_PHASE_SAMPLES))

    def add(self, duration_ms: float) -> None:
        self.count += 1
        self.total_ms += duration_ms
        self.min_ms = min(self.min_ms, duration_ms)
        self.max_ms = max(self.max_ms, duration_ms)
        self.recent.append(duration_ms)

    def summary(self) -> dict[str, float | int]:
        ordered = sorted(self.recent)
        middle = len(ordered) // 2
        p50 = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
        return {"count": self.count, "minMs": self.min_ms, "avgMs": self.total_ms / self.count, "p50Ms": p50, "maxMs": self.max_ms}

    def to_json(self) -> dict[str, Any]:
        return {"count": self.count, "totalMs": self.total_ms, "minMs": self.min_ms, "maxMs": self.max_ms, "recent": list(self.recent)}

    @classmethod
    def from_json(cls, value: Any) -> _PhaseStats:
        # Raises ValueError on any inconsistency; the caller turns that into a reset.
        if not isinstance(value, dict):
            raise ValueError("phase is not an object")
        count, total, low, high, recent = (value.get(k) for k in ("count", "totalMs", "minMs", "maxMs", "recent"))
        if type(count) is not int or not 1 <= count <= _MAX_COUNT:
            raise ValueError(f"phase count is not a whole number from 1 to {_MAX_COUNT}")
        if not isinstance(recent, list) or not 1 <= len(recent) <= min(count, MAX_PHASE_SAMPLES):
            raise ValueError("phase durations are missing")
        if not (_is_duration(total) and _is_duration(low) and _is_duration(high)
                and all(_is_duration(r) for r in recent)):
            raise ValueError("phase durations are not finite non-negative numbers")
        if not (low <= min(recent) and max(recent) <= high and low <= high):
            raise ValueError("phase minimum and maximum do not fit its durations")
        stats = cls(count, float(total), float(low), float(high))
        stats.recent.extend(float(r) for r in recent)
        return stats


@dataclass
class _PeerBudget:
    """One peer's tokens (see "One peer cannot flush the log") and its open ``debuglog.repeated`` entry."""

    tokens: float
    at_ms: float
    repeated: dict[str, Any] | None = None
    repeated_seq: int = 0  # DebugLog._appended just after the entry went in


def _unreadable(message: str) -> NoReturn:
    # parse_json's fail: bad JSON, NaN/Infinity (to_json could not write them
    # back) or nesting past MAX_JSON_DEPTH; the caller turns it into a reset.
    raise ValueError(f"stored value {message}")


def _is_duration(value: Any) -> TypeGuard[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    # An int past float's range (10**400 is valid JSON) is no duration, and
    # math.isfinite would raise OverflowError on it.
    return (isinstance(value, float) or abs(value) <= _MAX_INT_DURATION) and math.isfinite(value) and value >= 0


class DebugLog:
    """The last ``MAX_EVENTS`` events and the phase/idle baseline of this browser profile."""

    def __init__(self, *, own_peer: str | None = None) -> None:
        """Start an empty log; events about ``own_peer`` (this device) are never rate-limited."""
        self.own_peer = own_peer
        self._events: deque[dict[str, Any]] = deque(maxlen=MAX_EVENTS)
        self._appended = 0  # events ever appended (since the last clear): where an open repeated entry is
        self._budgets: dict[str, _PeerBudget] = {}
        self._phases: dict[str, _PhaseStats] = {}
        self._idle_samples = 0
        self._idle_total_ms = 0.0
        # Not persisted: phases in flight and the round's last phase end die with the page.
        self._running: dict[str, float] = {}
        self._in_round = False
        self._round: int | None = None  # the round round_phase() is timing
        self._last_phase_end: float | None = None
        self._revision = 0

    @property
    def revision(self) -> int:
        """A number that changes whenever what ``to_json()`` returns changes: the adapter writes only then."""
        return self._revision

    # -- events -----------------------------------------------------------------------

    def record(self, now_ms: float, event: str, details: Mapping[str, Any] | None = None) -> None:
        """Append an event at wall time ``now_ms``; the oldest goes beyond 1,000. An event about another
        peer past its budget is counted into that peer's ``debuglog.repeated`` entry instead.

        ``details`` is copied into JSON data (values that JSON cannot hold
        become strings), so a later change to the caller's dict does not
        change the log. Raises ``UsageError`` for an empty or non-string event
        name or a bad time.
        """
        if not isinstance(event, str) or not event:
            raise UsageError(UsageReason.BAD_EVENT, f"event must be a non-empty string, got {event!r}")
        entry: dict[str, Any] = {"at": iso8601(now_ms), "event": event[:_MAX_NAME]}
        peer = self._peer_of(details)
        if peer is not None and not self._spend(peer, now_ms, entry):
            return
        if details is not None:
            plain = _plain(details)
            entry["details"] = plain if isinstance(plain, dict) else {"value": plain}
        self._append(entry)

    def _append(self, entry: dict[str, Any]) -> None:
        self._events.append(entry)
        self._appended += 1
        self._revision += 1

    def _peer_of(self, details: Mapping[str, Any] | None) -> str | None:
        """The other peer an event is about, or None (no peer, or this device)."""
        if not isinstance(details, Mapping):
            return None
        for key in _PEER_KEYS:
            value = details.get(key)
            if value is not None:
                return str(value)[:_MAX_NAME] if value != self.own_peer else None
        return None

    def _spend(self, peer: str, now_ms: float, entry: dict[str, Any]) -> bool:
        """Whether ``peer`` may add ``entry`` now; if not, the entry is counted into its repeated entry."""
        budget = self._budgets.get(peer)
        if budget is None:
            if len(self._budgets) >= _MAX_PEER_BUDGETS:
                self._forget_budgets(now_ms)
            budget = self._budgets[peer] = _PeerBudget(float(PEER_BURST), now_ms)
        # A wall clock may step back: time only ever adds tokens.
        budget.tokens = min(float(PEER_BURST), budget.tokens + max(0.0, now_ms - budget.at_ms) / PEER_REFILL_MS)
        budget.at_ms = max(budget.at_ms, now_ms)
        if budget.tokens >= 1:
            budget.tokens -= 1
            return True
        repeated = budget.repeated
        if repeated is None or self._appended - budget.repeated_seq >= len(self._events):  # gone from the log
            repeated = {"at": entry["at"], "event": "debuglog.repeated",
                        "details": {"peer": peer, "count": 0, "events": {}, "lastAt": entry["at"]}}
            self._append(repeated)
            budget.repeated, budget.repeated_seq = repeated, self._appended
        details = repeated["details"]
        details["count"] += 1
        details["lastAt"] = entry["at"]
        counts = details["events"]
        if entry["event"] in counts or len(counts) < _MAX_ITEMS:
            counts[entry["event"]] = counts.get(entry["event"], 0) + 1
        self._revision += 1
        return False

    def _forget_budgets(self, now_ms: float) -> None:
        """Make room: a full budget carries nothing; if every peer is still busy, the first seen half goes."""
        for peer in [p for p, b in self._budgets.items()
                     if b.tokens + max(0.0, now_ms - b.at_ms) / PEER_REFILL_MS >= PEER_BURST]:
            del self._budgets[peer]
        if len(self._budgets) >= _MAX_PEER_BUDGETS:
            for peer in list(self._budgets)[:len(self._budgets) // 2]:
                del self._budgets[peer]

    def events(self) -> list[dict[str, Any]]:
        """Return a copy of the events, oldest first (``getDebugLog()``)."""
        events: list[dict[str, Any]] = json.loads(json.dumps(list(self._events)))
        return events

    # -- phases and rounds ------------------------------------------------------------

    def round_started(self, now_mono: float) -> None:
        """Begin a round: gaps between its phases count as idle from now on."""
        self._in_round = True
        self._last_phase_end = None

    def round_finished(self, now_mono: float, round_: int | None = None) -> None:
        """End the round (``round_``: only if it is the one being timed): the time until the next
        round's first phase is not idle."""
        if round_ is not None and round_ != self._round:
            return
        self._in_round = False
        self._last_phase_end = None

    def round_phase(self, round_: int, name: str, started_mono: float, finished_mono: float, now_ms: float) -> float:
        """A phase of round ``round_`` timed elsewhere on the same monotonic clock; returns its duration.

        The first phase of another round starts that round. When no other
        phase is running, the gap since the round's last phase ended is idle.
        Raises ``UsageError`` for a bad name or a phase that ends before it starts.
        """
        self._check_name(name)
        duration = finished_mono - started_mono
        if not _is_duration(duration):
            raise UsageError(UsageReason.BAD_DURATION, f"phase {name!r} of round {round_} ends before it starts")
        if round_ != self._round:
            self._round = round_
            self.round_started(started_mono)
        if not self._running and self._in_round and self._last_phase_end is not None:
            self._idle_samples += 1
            self._idle_total_ms += max(0.0, started_mono - self._last_phase_end)
        self.add_phase(name, duration, now_ms)
        if not self._running:
            self._last_phase_end = max(finished_mono, self._last_phase_end or finished_mono)
        return duration

    def phase_started(self, name: str, now_mono: float) -> None:
        """Begin phase ``name``. If no other phase was running inside a round, the gap since the last one ended is idle.

        Raises ``UsageError`` if ``name`` is already running (phases of the
        same name cannot overlap; give them distinct names).
        """
        self._check_name(name)
        if name in self._running:
            raise UsageError(UsageReason.PHASE_RUNNING, f"phase {name!r} is already running")
        if not self._running and self._in_round and self._last_phase_end is not None:
            self._idle_samples += 1
            self._idle_total_ms += max(0.0, now_mono - self._last_phase_end)
            self._revision += 1
        self._running[name] = now_mono

    def phase_finished(self, name: str, now_mono: float, now_ms: float) -> float:
        """End phase ``name``: add its duration to the baseline and log ``phase.finished``.

        Returns the duration in ms. Raises ``UsageError`` if the phase was not
        started.
        """
        self._check_name(name)
        if name not in self._running:
            raise UsageError(UsageReason.PHASE_NOT_RUNNING, f"phase {name!r} was not started")
        duration = max(0.0, now_mono - self._running.pop(name))
        if not self._running:
            self._last_phase_end = now_mono
        self.add_phase(name, duration, now_ms)
        return duration

    def add_phase(self, name: str, duration_ms: float, now_ms: float) -> None:
        """Add a duration measured elsewhere (for example by the JS side) and log it.

        Does not count towards idle time: the log does not know when it ran.
        Raises ``UsageError`` for a negative or non-finite duration.
        """
        self._check_name(name)
        if not _is_duration(duration_ms):
            raise UsageError(UsageReason.BAD_DURATION, f"duration of {name!r} must be finite and not negative, got {duration_ms!r}")
        stats = self._phases.get(name)
        if stats is None and len(self._phases) < MAX_PHASES:
            stats = self._phases[name] = _PhaseStats()
        if stats is not None:
            stats.add(float(duration_ms))
        self.record(now_ms, "phase.finished", {"phase": name, "durationMs": float(duration_ms)})

    def baseline(self) -> dict[str, Any]:
        """Return the file's ``baseline``: per-phase figures and idle gaps."""
        idle_avg = self._idle_total_ms / self._idle_samples if self._idle_samples else 0.0
        return {
            "phases": {name: stats.summary() for name, stats in sorted(self._phases.items())},
            "idle": {"samples": self._idle_samples, "totalMs": self._idle_total_ms, "avgMs": idle_avg},
        }

    # -- export, persistence ----------------------------------------------------------

    def to_file(self, now_ms: float) -> dict[str, Any]:
        """Return the ``TrainingDebugLogFile`` exported at wall time ``now_ms``."""
        return {"schemaVersion": FILE_SCHEMA_VERSION, "exportedAt": iso8601(now_ms), "baseline": self.baseline(), "events": self.events()}

    def clear(self) -> None:
        """Delete every event and the baseline (``clearDebugLog()``); phases in flight go on."""
        self._events.clear()
        self._budgets.clear()
        self._phases.clear()
        self._idle_samples = 0
        self._idle_total_ms = 0.0
        self._revision += 1

    def to_json(self) -> str:
        """Return the text to keep in ``localStorage``."""
        return json.dumps(
            {
                "storageVersion": STORAGE_VERSION,
                "events": list(self._events),
                "phases": {name: stats.to_json() for name, stats in self._phases.items()},
                "idle": {"samples": self._idle_samples, "totalMs": self._idle_total_ms},
            },
            separators=(",", ":"),
            allow_nan=False,
        )

    @classmethod
    def from_json(cls, text: object, now_ms: float, *, own_peer: str | None = None) -> DebugLog:
        """Read the stored text back; ``None`` (nothing stored) gives an empty log.

        Never raises for the stored value: a part that cannot be read starts
        empty and a ``debuglog.reset`` event (at ``now_ms``) names the part and
        the reason. Raises ``UsageError`` only for a bad ``now_ms``.
        """
        log = cls(own_peer=own_peer)
        iso8601(now_ms)  # check the caller's time before trusting it for a reset event
        if text is None:
            return log
        try:
            if not isinstance(text, str):
                raise ValueError(f"stored value is a {type(text).__name__}, not text")
            data = parse_json(text, _unreadable)
            if not isinstance(data, dict):
                raise ValueError("stored value is not a JSON object")
            version = data.get("storageVersion")
            if type(version) is not int or version != STORAGE_VERSION:
                raise ValueError(f"unsupported storage version {str(data.get('storageVersion'))[:20]}")
        except ValueError as error:
            log.record(now_ms, "debuglog.reset", {"part": "all", "reason": str(error)[:_MAX_STRING]})
            return log
        try:
            log._load_events(data.get("events"))
        except ValueError as error:
            log._events.clear()
            log.record(now_ms, "debuglog.reset", {"part": "events", "reason": str(error)})
        try:
            log._load_baseline(data.get("phases"), data.get("idle"))
        except ValueError as error:
            log._phases.clear()
            log._idle_samples, log._idle_total_ms = 0, 0.0
            log.record(now_ms, "debuglog.reset", {"part": "baseline", "reason": str(error)})
        return log

    # -- internals --------------------------------------------------------------------

    def _check_name(self, name: object) -> None:
        if not isinstance(name, str) or not 0 < len(name) <= _MAX_NAME:
            raise UsageError(UsageReason.BAD_PHASE, f"phase name must be a string of 1 to {_MAX_NAME} characters, got {name!r}")

    def _load_events(self, events: Any) -> None:
        if not isinstance(events, list):
            raise ValueError("events are not a list")
        for index, entry in enumerate(events[-MAX_EVENTS:]):
            if not isinstance(entry, dict) or not isinstance(entry.get("at"), str) or not isinstance(entry.get("event"), str):
                raise ValueError(f"event {index} lacks at or event")
            if set(entry) - {"at", "event", "details"} or ("details" in entry and not isinstance(entry["details"], dict)):
                raise ValueError(f"event {index} has unexpected fields")
            # 1e400 reads as infinity, which to_json could not write back.
            json.dumps(entry, allow_nan=False)
            self._append(entry)

    def _load_baseline(self, phases: Any, idle: Any) -> None:
        if not isinstance(phases, dict) or len(phases) > MAX_PHASES:
            raise ValueError("phases are not an object of at most 200 phases")
        loaded = {}
        for name, stats in phases.items():
            if not isinstance(name, str) or not 0 < len(name) <= _MAX_NAME:
                raise ValueError("a phase name is not valid")
            loaded[name] = _PhaseStats.from_json(stats)
        if not isinstance(idle, dict):
            raise ValueError("idle is not an object")
        samples, total = idle.get("samples"), idle.get("totalMs")
        if (type(samples) is not int or not 0 <= samples <= _MAX_COUNT or not _is_duration(total)
                or (samples == 0 and total != 0)):
            raise ValueError("idle figures are not valid")
        self._phases = loaded
        self._idle_samples, self._idle_total_ms = samples, float(total)
