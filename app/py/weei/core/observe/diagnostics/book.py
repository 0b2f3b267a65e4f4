"""``DiagnosticsBook``: the latest snapshot of every peer, as one browser received them,
and the ``uniformity`` check over them.

It lives on the coordinator (one entry per participant) and on every peer
(its own entry). ``accept`` validates an untrusted snapshot with
``parse_diagnostics`` and keeps it unless it belongs to another job or is not
newer than the one held; ``view(now)`` adds the local fields ``ageMs`` and
``stale``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from .records import PEER_INPUT, STALE_AFTER_MS, UNKNOWN, parse_diagnostics

__all__ = ["AcceptResult", "DiagnosticsBook", "Difference", "Uniformity", "uniformity"]


class AcceptResult(Enum):
    """What ``DiagnosticsBook.accept`` did with a snapshot."""

    ACCEPTED = "accepted"
    """Kept: it is now the peer's entry."""
    OLD_SEQUENCE = "old-sequence"
    """Ignored: its sequence is not above the one held for this peer."""
    OTHER_JOB = "other-job"
    """Ignored: it belongs to another job than the one this book follows."""


class DiagnosticsBook:
    """The latest snapshot of every peer of one job, as this browser received them."""

    def __init__(self, job_id: str | None = None) -> None:
        """Start an empty book following ``job_id`` (None: no job, everything is ignored)."""
        self._job_id = job_id
        self._entries: dict[str, dict[str, Any]] = {}

    @property
    def job_id(self) -> str | None:
        """The job whose diagnostics are kept."""
        return self._job_id

    def set_job(self, job_id: str | None) -> None:
        """Follow another job; entries of the previous job are dropped."""
        if job_id != self._job_id:
            self._entries.clear()
        self._job_id = job_id

    def accept(self, peer_id: str, job_id: object, snapshot: object, now: float, *, chunk_id: str | None = None) -> AcceptResult:
        """Take a snapshot received from ``peer_id`` for ``job_id`` at wall time ``now``.

        ``chunk_id``: the coordinator fills in ``assignment.chunkId`` from its
        own records. Returns whether it was kept or why it was ignored.
        Raises ``DiagnosticsError`` (``bad-diagnostics``) for a malformed snapshot, or
        one whose assignment names another job than the envelope.
        """
        if not isinstance(job_id, str):
            PEER_INPUT.at("jobId")("must be a string")
        if self._job_id is None or job_id != self._job_id:
            return AcceptResult.OTHER_JOB
        record = parse_diagnostics(snapshot)
        if record["assignment"] is not None and record["assignment"]["jobId"] != job_id:
            named = record["assignment"]["jobId"]
            PEER_INPUT.at("assignment").at("jobId")(f"names job {named[:80]!r}, sent for job {job_id[:80]!r}")
        held = self._entries.get(peer_id)
        if held is not None and record["sequence"] <= held["sequence"]:
            return AcceptResult.OLD_SEQUENCE
        record["receivedAt"] = now
        record["connected"] = True
        if chunk_id is not None and record["assignment"] is not None:
            record["assignment"]["chunkId"] = chunk_id
        self._entries[peer_id] = record
        return AcceptResult.ACCEPTED

    def mark_disconnected(self, peer_id: str) -> None:
        """Keep the peer's last snapshot but show it disconnected (and so stale)."""
        entry = self._entries.get(peer_id)
        if entry is not None:
            entry["connected"] = False

    def forget(self, peer_id: str) -> None:
        """Drop the peer's entry, for example when it leaves the job."""
        self._entries.pop(peer_id, None)

    def view(self, now: float) -> dict[str, dict[str, Any]]:
        """Return ``state.diagnostics`` at wall time ``now``: copies with ``ageMs`` and ``stale``.

        ``ageMs`` is never negative, even if the local clock stepped back.
        """
        result: dict[str, dict[str, Any]] = {}
        for peer_id in sorted(self._entries):
            record = copy.deepcopy(self._entries[peer_id])
            age = max(0, now - record["receivedAt"])
            record["ageMs"] = age
            record["stale"] = age > STALE_AFTER_MS or not record["connected"]
            result[peer_id] = record
        return result


# --- are all participants alike? ----------------------------------------------------

_COMPARED = (
    ("model", "id"),
    ("model", "version"),
    ("model", "wasmSha256"),
    ("assignment", "batchSize"),
    ("assignment", "localEpochs"),
    ("assignment", "learningRate"),
)


@dataclass(frozen=True)
class Difference:
    """One compared field on which peers disagree, with each known value by peer."""

    field: str
    values: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        """Return ``{field, values}``."""
        return {"field": self.field, "values": dict(self.values)}


@dataclass(frozen=True)
class Uniformity:
    """Whether every peer uses the same model and settings.

    ``uniform`` is true when no two known values differ; ``unknown`` lists
    the fields a peer could not report (``peerId -> fields``), which are
    missing data, not a difference.
    """

    uniform: bool
    differences: tuple[Difference, ...] = ()
    unknown: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """Return ``{uniform, differences, unknown}`` as plain data."""
        return {
            "uniform": self.uniform,
            "differences": [d.to_json() for d in self.differences],
            "unknown": {peer: list(fields) for peer, fields in self.unknown.items()},
        }


def uniformity(view: Mapping[str, Mapping[str, Any]]) -> Uniformity:
    """Compare model id, version, wasmSha256 and batchSize, localEpochs, learningRate.

    Takes a ``view()`` (records by peer ID). A model of ``'unknown'``, an
    assignment of null (between assignments) or a learning rate of
    ``'unknown'`` leave that field out for that peer and list it under
    ``unknown``. Returns the ``Uniformity``.
    """
    differences: list[Difference] = []
    unknown: dict[str, list[str]] = {}
    for section, key in _COMPARED:
        name = f"{section}.{key}"
        known: dict[str, Any] = {}
        for peer_id in sorted(view):
            part = view[peer_id].get(section)
            value = part.get(key, UNKNOWN) if isinstance(part, dict) else UNKNOWN
            if value == UNKNOWN:
                unknown.setdefault(peer_id, []).append(name)
            else:
                known[peer_id] = value
        values = list(known.values())
        # Compare by ==, so that 1 and 1.0 (a JSON round trip) are the same value.
        if any(v != values[0] for v in values[1:]):
            differences.append(Difference(name, known))
    return Uniformity(not differences, tuple(differences), {p: tuple(f) for p, f in unknown.items()})
