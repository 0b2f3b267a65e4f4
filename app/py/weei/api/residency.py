"""Which artifacts stay in memory: what the active job may still ask this device for.

The coordinator side needs its job's files, the current weights and the
snapshot weights (``initial``, ``roundsAgo``) that the next rounds and the
attempts still open may name (``Coordinator.snapshot_checkpoints``). The participant side needs its module, the
artifacts of its current and pending assignments and the weights it was
sent in the last rounds: the coordinator does not send again what it sent
this device, and a snapshot slot may name them. A task that was handed
artifacts pins them until it has read them. Everything else is evicted.

The assignments remembered are one job's: round numbers of another job say
nothing about this one (a second job in the same tab starts again at round 1,
and measured against the first job's round 20 its round-1 artifacts, the WGSL
archive among them, would be evicted while the coordinator counts them held).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.errors import WeeiError
from ..core.wire.messages import Assign
from ..core.formats.modelinfo import ModelInfo
from ..core.job.participant import Participant
from .session import Session

__all__ = ["Residency", "Kept", "assign_refs"]


def assign_refs(assign: Assign) -> set[str]:
    """The artifacts an assignment names (``Assign.artifacts``)."""
    return assign.artifacts()


@dataclass(frozen=True)
class Kept:
    """The artifacts to keep: ``fixed``, the coordinator's job files (the same object while its spec is the
    same: ~one artifact per chunk, not to be walked after every drain), and the rest."""

    fixed: frozenset[str]
    rest: set[str]

    def __contains__(self, sha: object) -> bool:
        return sha in self.rest or sha in self.fixed


class Residency:
    """Pins, this device's recent assignments, and the set of artifacts to keep."""

    def __init__(self) -> None:
        self.module_refs: set[str] = set()  # the module this device's participant loaded, and its auxiliary files
        self.assigned: dict[int, set[str]] = {}  # round -> artifacts this device's assignments named
        self.pinned: dict[str, int] = {}  # artifacts a task was handed and has not read yet
        self.job_id: str | None = None  # the job whose assignments ``assigned`` holds
        # The coordinator's spec and the artifacts it names: asked after every drain (every message), and
        # a generator over every chunk each time was O(chunks) of Python a message.
        self._spec_refs: tuple[object, frozenset[str]] | None = None
        # The participant's model info (the object) and its snapshot window: parsing the model info after
        # every drain was most of a participant's own CPU a Flower message (profiled at 1,000 nodes).
        self._windows: tuple[object, int] | None = None

    def assignment_taken(self, assign: Assign) -> set[str]:
        """Note a Train command's artifacts and pin them until the task read them; returns the pinned set."""
        refs = assign_refs(assign)
        if assign.job_id != self.job_id:
            self.assigned.clear()
            self.job_id = assign.job_id
        self.assigned.setdefault(assign.round, set()).update(refs)
        self.pin(refs)
        return refs

    def pin(self, shas: set[str]) -> None:
        for sha in shas:
            self.pinned[sha] = self.pinned.get(sha, 0) + 1

    def unpin(self, shas: set[str]) -> None:
        for sha in shas:
            left = self.pinned.get(sha, 0) - 1
            if left > 0:
                self.pinned[sha] = left
            else:
                self.pinned.pop(sha, None)

    def forget_job(self) -> None:
        self.module_refs = set()
        self.assigned.clear()
        self.job_id = None

    def referenced(self, session: Session) -> Kept:
        """The artifacts to keep in memory now."""
        keep = set(self.pinned)
        fixed: frozenset[str] = frozenset()
        coordinator = session.coordinator
        if coordinator is not None:
            spec = coordinator.spec
            if self._spec_refs is None or self._spec_refs[0] is not spec:
                self._spec_refs = (spec, frozenset({spec.module.sha256, *(c.sha256 for c in spec.chunks),
                                                    *(ref.sha256 for ref in spec.auxiliary_files.values())}))
            fixed = self._spec_refs[1]
            keep.add(coordinator.weights_sha256)
            if session.validation_sha256 is not None:
                keep.add(session.validation_sha256)
            if spec.gpu is not None:  # sent to the participants that ask for it
                keep.add(spec.gpu.archive.sha256)
            # Snapshot slots (initial, roundsAgo): every checkpoint the next rounds and open attempts may name.
            keep |= set(coordinator.snapshot_checkpoints().values())
        participant = session.participant
        if participant is not None and participant.job_id is not None:
            if participant.job_id != self.job_id:  # another job's assignments: nothing this job may name
                self.assigned.clear()
            keep |= self.module_refs
            if session.relay is not None:  # a relayed checkpoint, until the Assign naming it comes
                keep |= session.relay.kept
            for assign in (participant.current, participant.pending):
                if assign is not None:
                    keep |= assign_refs(assign)
            if self.assigned:
                latest = max(self.assigned)
                window = self._window(participant)
                for round_ in [r for r in self.assigned if r <= latest - window]:
                    del self.assigned[round_]
                for refs in self.assigned.values():
                    keep |= refs
        return Kept(fixed, keep)

    def _window(self, participant: Participant) -> int:
        if self._windows is None or self._windows[0] is not participant.model_info:
            self._windows = (participant.model_info, _snapshot_window(participant))
        return self._windows[1]


def _snapshot_window(participant: Participant) -> int:
    """How many rounds of assignments to remember: a snapshot slot with roundsAgo k names the
    weights sent k + 1 rounds ago; one more for an attempt of the round that is retried."""
    try:
        slots = ModelInfo.from_json(participant.model_info).auxiliary_weights if participant.model_info else ()
    except WeeiError:
        slots = ()
    return 2 + max((slot.rounds_ago or 0 for slot in slots), default=0)
