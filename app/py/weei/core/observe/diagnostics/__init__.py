"""Execution diagnostics: where, how and how fast each peer trains.

Theory of operation
-------------------
A record is the spec's ``PeerExecutionDiagnostics`` as plain JSON data (a
``dict`` with exactly the spec's field names), because it goes straight onto
the wire and into ``state.diagnostics``.

* ``DiagnosticsRecorder`` lives on every peer that trains. The adapter tells
  it about stage changes, assignments and progress, with a monotonic clock
  for durations; it answers ``due(now_mono)`` / ``next_due_at()`` (every 2 s
  while the peer has a job, at once after a stage change or a reconnection)
  and produces the record with ``snapshot(now_wall, now_mono)``. Every
  snapshot is complete, so "a complete snapshot after reconnection" only
  means "one at once".
* ``DiagnosticsBook`` lives on the coordinator (one entry per participant)
  and on every peer (its own entry). ``accept`` validates an untrusted
  snapshot with ``parse_diagnostics`` and keeps it unless it belongs to
  another job or is not newer than the one held; ``view(now)`` adds the
  local fields ``ageMs`` and ``stale``.

``receivedAt``, ``ageMs``, ``stale`` and ``connected`` are judged by the
receiver, so whatever a peer puts there is ignored. A peer learns nothing
from another peer's clock except ``measuredAt`` and ``lastProgressAt``,
shown as they are.

The package is four modules: ``records`` (the record's fields and their
check), ``stages`` (the stage machine: which event leads from which stage
to which), ``recorder`` and ``book``.
"""

from __future__ import annotations

from .book import AcceptResult, DiagnosticsBook, Difference, Uniformity, uniformity
from .recorder import DiagnosticsRecorder
from .stages import STAGE_ANYWHERE, STAGE_TRANSITIONS, Stage
from .records import (SCHEMA_VERSION, SNAPSHOT_INTERVAL_MS, SPEED_WINDOW_MS, STAGES, STALE_AFTER_MS, UNKNOWN,
                      DiagnosticsError, DiagnosticsReason, parse_diagnostics)

__all__ = [
    "Stage",
    "STAGE_TRANSITIONS",
    "STAGE_ANYWHERE",
    "SCHEMA_VERSION",
    "UNKNOWN",
    "STAGES",
    "SNAPSHOT_INTERVAL_MS",
    "SPEED_WINDOW_MS",
    "STALE_AFTER_MS",
    "DiagnosticsReason",
    "DiagnosticsError",
    "parse_diagnostics",
    "DiagnosticsRecorder",
    "DiagnosticsBook",
    "AcceptResult",
    "Difference",
    "Uniformity",
    "uniformity",
]
