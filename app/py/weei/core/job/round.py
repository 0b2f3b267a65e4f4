"""One round of a job, from the work it hands out to the outcome it closes to.

Theory of operation
-------------------
Round ``r`` opens with the job's spec as it is at that moment
(:attr:`Round.spec`: its settings are the round's, whatever
``updateSettings`` says while it runs) and trains from checkpoint ``r - 1``.
It owns its attempts (``core/job/attempts.py``: the work out and the valid
updates in) and the broadcast that relays its checkpoint, if it is relayed
(:meth:`Round.plan_relay`, over the round's Sends before any is emitted).

A round closes in two steps. :meth:`Round.begin_closing` takes its valid
updates (canonical order) and marks it *closing*: from then until its
checkpoint goes to the host to be saved the job is ``transitioning``, which
the host may publish before the averaging starts. Then :meth:`Round.aggregate`
averages them under the round's own settings (the one call of
``round_rules.close_round``), and :meth:`Round.end` sets the outcome: a new
checkpoint (:class:`RoundClosed`), no valid update (:class:`RoundEmpty`) or
a named failure (:class:`RoundFailed`). The coordinator writes a closed
round down; nothing here changes the coordinator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from ..aggregation.aggregate import AggregationState, DpRound
from ..privacy.dp_accountant import DpLedger
from ..links.relay import Broadcast, Relays, relay_assignments
from ..wire.commands import Command, SaveCheckpoint
from ..wire.messages import ArtifactRef
from .attempts import Received, RoundAttempts
from .round_rules import Kernel, RoundRecord, close_round, secure_terms
from .secure_aggregator import SecureAggregator
from .schedule import DatasetSchedule
from .spec import JobSpec

__all__ = ["Round", "RoundClosed", "RoundEmpty", "RoundFailed", "RoundOutcome"]


@dataclass(frozen=True)
class RoundClosed:
    """The round produced checkpoint ``record.round``: its record, the schedule after it, its checked file."""

    record: RoundRecord
    dataset: DatasetSchedule | None  # a copy with the round's chunks trained
    epoch_done: bool
    save: SaveCheckpoint
    incomplete: bool  # the checkpoint says the job ended incomplete
    dp_ledger: DpLedger | None = None  # the privacy spent with this round (None: the job has no DP)


@dataclass(frozen=True)
class RoundEmpty:
    """No valid update came in: the previous checkpoint stays."""

    round: int


@dataclass(frozen=True)
class RoundFailed:
    """Closing failed before anything was written down: the previous checkpoint stays."""

    round: int
    reason: str  # a WeeiError's reason, or the exception's type name
    text: str


RoundOutcome = RoundClosed | RoundEmpty | RoundFailed


class Round:
    """One round: its spec (settings), attempts, relayed checkpoint, and once closed, its outcome."""

    def __init__(self, number: int, spec: JobSpec, attempts: RoundAttempts, opened_at: float, opening: int = 1) -> None:
        self.number = number
        self.opening = opening  # 1, then 2 for the round's first retry, ...
        #: Secure aggregation (docs/privacy.md): the terms its assignments carry, and the coordinator's side of
        #: it (core/job/secure_aggregator.py: the keys of the participants that trained, then the protocol).
        self.terms = secure_terms(spec, opening)
        self.secure = SecureAggregator(spec.job_id, number, self.terms, spec.weight_bytes // 4) \
            if self.terms is not None else None
        self.spec = spec  # as the round opened: its settings aggregate it and are recorded in its checkpoint
        self.attempts = attempts
        self.opened_at = opened_at  # the host's stopwatch when the round's work went out
        self.broadcast: Broadcast | None = None
        self.closing = False
        self.outcome: RoundOutcome | None = None

    def plan_relay(self, relays: Relays, commands: list[Command], checkpoint: ArtifactRef, weights: bytes,
                   now: float) -> list[Command]:
        """The round's opening commands with its checkpoint relayed when that pays (participants relay it
        to each other rather than each getting it from the coordinator): planned before any is emitted."""
        planned, self.broadcast = relay_assignments(relays, commands, checkpoint, weights, self.number, now)
        return planned

    def begin_closing(self) -> list[Received]:
        """The round's valid updates in canonical order; with at least one, the round is closing."""
        received = self.attempts.take_round()
        self.closing = bool(received)
        return received

    def aggregate(self, kernel: Kernel, weights: bytes, state: AggregationState | None,
                  received: Sequence[Received], digest: Callable[[bytes], str],
                  dp: DpRound | None = None) -> RoundRecord:
        """Checkpoint ``number``'s record, under the settings the round opened with.

        Raises:
            SettingsError, AggregationError: as ``round_rules.close_round``.
        """
        return close_round(kernel, self.number, weights, state, self.spec.settings, self.spec.info, received,
                           digest=digest, dp=dp)

    @property
    def securing(self) -> bool:
        """The training phase closed and secure aggregation runs: no new round opens meanwhile."""
        return self.secure is not None and self.secure.running and self.outcome is None

    def end(self, outcome: RoundOutcome) -> None:
        self.closing = False
        self.outcome = outcome
