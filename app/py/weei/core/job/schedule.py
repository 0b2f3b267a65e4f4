"""What each round hands out: dataset chunks by pass, or experience unit ranges.

Pure bookkeeping, no I/O. A chunk (or unit range) handed out is "in flight"
until its round closes: it is then either trained, or given back to the
front of the queue so the next free participant takes it first. Work that
keeps failing is dropped after ``MAX_ATTEMPTS`` so a poisonous chunk cannot
stall a job forever; the job then finishes ``incomplete``. Failures count per
participant: while other participants could take a chunk, it is dropped
only when several different ones failed it, and a participant is offered
chunks it has not failed first — so one hostile or broken peer can neither
drop a chunk nor keep it from being trained.
"""

from __future__ import annotations

import copy
import random
from collections import deque
from dataclasses import dataclass

__all__ = ["MAX_ATTEMPTS", "DatasetSchedule", "ExperienceSchedule", "UnitWork"]

MAX_ATTEMPTS = 3


class DatasetSchedule:
    """The chunk queue of the current pass over the dataset.

    ``order`` is the pass order (the manifest's, or a shuffle recorded as the
    checkpoint's chunkOrder); every pass walks the same order.
    """

    def __init__(self, chunk_ids: list[str], *, planned_epochs: int, order: list[str] | None = None,
                 epoch: int = 0, remaining: list[str] | None = None, shuffled: bool = False) -> None:
        if len(set(chunk_ids)) != len(chunk_ids):
            raise ValueError("chunk ids must be unique")
        self.chunk_ids = list(chunk_ids)
        self.order = list(order) if order is not None else list(chunk_ids)
        self.shuffled = shuffled
        self.planned_epochs = planned_epochs
        self.epoch = epoch
        known = set(self.chunk_ids)
        pending = [c for c in (remaining if remaining is not None else self.order) if c in known]
        self.queue: deque[str] = deque(pending)
        self.in_flight: set[str] = set()
        self.trained: list[str] = [c for c in self.order if c not in set(pending)]
        self.failures: dict[str, int] = {}
        self.failed_by: dict[str, set[str | None]] = {}
        self.dropped: list[str] = []

    @property
    def finished(self) -> bool:
        return self.epoch >= self.planned_epochs

    @property
    def remaining(self) -> list[str]:
        """Chunk ids of this pass not trained yet (queued or in flight), in pass order."""
        left = set(self.queue) | self.in_flight
        return [c for c in self.order if c in left]

    @property
    def progress(self) -> float:
        """Passes done with a fraction: 1.25 is a quarter into the 2nd pass."""
        if self.finished or not self.order:
            return float(self.epoch)
        return self.epoch + len(self.trained) / len(self.order)

    def take(self, peer: str | None = None) -> str | None:
        """The next chunk for ``peer`` in this round (one it has not failed, when there is one),
        or None when the pass has none left."""
        if not self.queue:
            return None
        chunk = self.queue[0]
        if peer is not None:
            chunk = next((c for c in self.queue if peer not in self.failed_by.get(c, ())), chunk)
        self.queue.remove(chunk)
        self.in_flight.add(chunk)
        return chunk

    def give_back(self, chunk: str, *, failed: bool, peer: str | None = None, peers_available: int = 1) -> None:
        """A handed-out chunk was not trained; it goes first in the queue (or is dropped).

        A failure by ``peer`` counts against the chunk; it is dropped after
        ``MAX_ATTEMPTS`` failures by at least min(MAX_ATTEMPTS, peers_available)
        different participants.
        """
        self.in_flight.discard(chunk)
        if failed:
            self.failures[chunk] = self.failures.get(chunk, 0) + 1
            self.failed_by.setdefault(chunk, set()).add(peer)
            needed = min(MAX_ATTEMPTS, max(1, peers_available))
            if self.failures[chunk] >= MAX_ATTEMPTS and len(self.failed_by[chunk]) >= needed:
                self.dropped.append(chunk)
                return
        self.queue.appendleft(chunk)

    def mark_trained(self, chunk: str) -> None:
        self.in_flight.discard(chunk)
        self.trained.append(chunk)

    def end_round(self) -> bool:
        """Advance to the next pass when this one is done. True when a pass completed."""
        if self.queue or self.in_flight:
            return False
        self.epoch += 1
        self.trained = []
        self.failures = {}
        self.failed_by = {}
        if not self.finished:
            self.queue = deque(self.order)
        return True

    def continue_passes(self) -> None:
        """Start the next pass when this one is used up but already counted in ``epoch``.

        That is the state of a checkpoint taken after the last planned pass
        (remaining empty, datasetEpoch counting it) once more epochs are
        planned: ``end_round`` would count the same pass a second time.
        """
        if not self.queue and not self.in_flight and not self.finished:
            self.queue = deque(self.order)
            self.trained = []
            self.failures = {}

    def copy(self) -> DatasetSchedule:
        """An independent copy (a closing round writes its progress down on one first, core/job/coordinator.py)."""
        other = copy.copy(self)
        other.chunk_ids, other.order, other.trained, other.dropped = (
            list(self.chunk_ids), list(self.order), list(self.trained), list(self.dropped))
        other.queue, other.in_flight, other.failures = deque(self.queue), set(self.in_flight), dict(self.failures)
        other.failed_by = {chunk: set(peers) for chunk, peers in self.failed_by.items()}
        return other

    def shuffle(self, seed: int) -> None:
        """Shuffle the pass order; chunks already trained in this pass stay trained."""
        order = list(self.chunk_ids)
        random.Random(seed).shuffle(order)
        self.order = order
        self.shuffled = True
        queued = set(self.queue)
        self.queue = deque(c for c in order if c in queued)


@dataclass(frozen=True)
class UnitWork:
    """A range of experience units."""

    start: int
    count: int


class ExperienceSchedule:
    """Unit ranges for experience jobs: fresh ranges, and ranges to retry first."""

    def __init__(self, units_per_assignment: int, next_unit: int = 0, retry: tuple[UnitWork, ...] = ()) -> None:
        self.units_per_assignment = units_per_assignment
        self.next_unit = next_unit
        self.retry: deque[UnitWork] = deque(retry)
        self.failures: dict[int, int] = {}
        self.dropped: list[UnitWork] = []

    def take(self) -> UnitWork:
        if self.retry:
            return self.retry.popleft()
        work = UnitWork(self.next_unit, self.units_per_assignment)
        self.next_unit += self.units_per_assignment
        return work

    def give_back(self, work: UnitWork, *, failed: bool) -> None:
        """A range was not played; it is retried with the same seed (or dropped)."""
        if failed:
            self.failures[work.start] = self.failures.get(work.start, 0) + 1
            if self.failures[work.start] >= MAX_ATTEMPTS:
                self.dropped.append(work)
                return
        self.retry.appendleft(work)
