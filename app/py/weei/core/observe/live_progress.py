"""Live progress of the training peers: the spec's ``state.progress`` and ``liveMetrics``.

A participant's host reports progress many times a second (Workers call
``weei.onProgress``); the participant sends at most one ``Progress`` message
per ``PROGRESS_INTERVAL_MS`` of an attempt, and always the one that
completes it (``ProgressThrottle``). The coordinator keeps one
``PeerProgress`` per training peer and at most ``LIVE_METRICS_KEPT``
metric samples per peer (``LiveProgress``), so a peer that floods cannot
grow its memory. From these it derives each peer's ``recordsPerSecond``
(examples processed over the attempt's training time, as the peer measured
it, so a burst of late messages does not fake a rate) and the job's
``estimatedRemainingMs`` (docs/api.md gives the formula).

Sans-I/O: time comes in as ``now`` (ms).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Container, Iterable, Mapping

__all__ = ["PROGRESS_INTERVAL_MS", "LIVE_METRICS_KEPT", "ProgressThrottle", "LiveProgress", "estimate_remaining_ms"]

#: A participant sends at most one progress message per attempt this often (and one on completion).
PROGRESS_INTERVAL_MS = 500
#: Metric samples kept per peer in ``liveMetrics`` (older ones are dropped).
LIVE_METRICS_KEPT = 200


@dataclass
class ProgressThrottle:
    """The sender's rate limit: one report per attempt every ``interval_ms``, plus its completion."""

    interval_ms: float = PROGRESS_INTERVAL_MS
    _attempt: str | None = None
    _last_at: float = float("-inf")
    _completed: bool = False

    def due(self, attempt_id: str, processed: int, total: int | None, now: float) -> bool:
        """Whether a report of ``attempt_id`` may leave now; a True answer counts as sent."""
        if attempt_id != self._attempt:
            self._attempt, self._last_at, self._completed = attempt_id, float("-inf"), False
        completes = total is not None and processed >= total
        if self._completed:
            return False
        if completes or now - self._last_at >= self.interval_ms:
            self._last_at = now
            self._completed = completes
            return True
        return False


@dataclass
class _Entry:
    attempt_id: str | None
    processed: int
    total: int | None
    metrics: dict[str, float]
    updated_at: float
    records_per_second: float | None = None


@dataclass
class LiveProgress:
    """PeerProgress and liveMetrics by peer ID, bounded per peer."""

    kept: int = LIVE_METRICS_KEPT
    _entries: dict[str, _Entry] = field(default_factory=dict)
    _series: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    _rates: dict[str, float] = field(default_factory=dict)  # each peer's last known rate

    def report(self, peer: str, processed: int, total: int | None, metrics: Mapping[str, float], now: float, *,
               attempt_id: str | None = None, elapsed_ms: float | None = None) -> bool:
        """Record a report (``elapsed_ms``: the attempt's training time so far); returns False, and
        records nothing, when it is older than the one kept for the same attempt (a duplicate or
        a reordered message)."""
        entry = self._entries.get(peer)
        if entry is not None and entry.attempt_id == attempt_id:
            if processed < entry.processed:
                return False
            entry.processed, entry.total, entry.updated_at = processed, total, now
            if metrics:
                entry.metrics = dict(metrics)
        else:
            entry = self._entries[peer] = _Entry(attempt_id, processed, total, dict(metrics), now)
        if elapsed_ms is not None and elapsed_ms > 0 and processed > 0:
            entry.records_per_second = self._rates[peer] = processed * 1000.0 / elapsed_ms
        if metrics:
            series = self._series.setdefault(peer, [])
            series.append({"at": now, "values": dict(metrics)})
            del series[:-self.kept]
        return True

    def drop(self, peer: str) -> None:
        """``peer`` stopped training: its progress goes (its metric samples stay for the chart)."""
        self._entries.pop(peer, None)

    def retain(self, open_ids: Container[str]) -> None:
        """Keep the progress of remote attempts still open (and of reports without an attempt). Called after
        every drain: ``open_ids`` is looked up, not copied (at 1,000 peers a set of every open attempt a
        drain was O(peers) a message)."""
        for peer in [p for p, e in self._entries.items() if e.attempt_id is not None and e.attempt_id not in open_ids]:
            del self._entries[peer]

    def clear(self) -> None:
        self._entries.clear()
        self._series.clear()
        self._rates.clear()

    def reports(self, peer: str, attempt_id: str) -> bool:
        """Whether the progress kept for ``peer`` is of ``attempt_id``."""
        entry = self._entries.get(peer)
        return entry is not None and entry.attempt_id == attempt_id

    def records_per_second(self, peers: Iterable[str]) -> float | None:
        """The last known rates of ``peers`` added up (None when none is known): a peer between
        two assignments keeps the rate of its last one."""
        rates = [self._rates[p] for p in set(peers) if p in self._rates]
        return sum(rates) if rates else None

    def unprocessed(self) -> int:
        """Examples (or units) of the running attempts not processed yet."""
        return sum(max(0, e.total - e.processed) for e in self._entries.values() if e.total is not None)

    def progress_json(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for peer, e in self._entries.items():
            item: dict[str, Any] = {"processedExamples": e.processed, "metrics": dict(e.metrics),
                                    "updatedAt": e.updated_at}
            if e.total is not None:
                item["totalExamples"] = e.total
            if e.records_per_second is not None:
                item["recordsPerSecond"] = e.records_per_second
            out[peer] = item
        return out

    def live_metrics_json(self) -> dict[str, list[dict[str, Any]]]:
        return {peer: [{"at": s["at"], "values": dict(s["values"])} for s in series]
                for peer, series in self._series.items()}


def estimate_remaining_ms(unassigned: int, live: LiveProgress, peers: Iterable[str]) -> int | None:
    """``1000 * (unassigned + live.unprocessed()) / live.records_per_second(peers)``, or None while
    no rate of those peers is known."""
    rate = live.records_per_second(peers)
    if rate is None or rate <= 0:
        return None
    return round(1000.0 * (unassigned + live.unprocessed()) / rate)
