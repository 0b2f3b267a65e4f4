"""The coordinator's record of each participant, and who of them can take work.

Theory of operation
-------------------
The coordinator learns of a participant's moves from its messages and from
the transport; :class:`PeerRecord` follows them along ``PEER_TRANSITIONS``
(``core/states.py``), the same states the participant's own machine has.
Beside the state a record keeps only what the state cannot say: whether the
channel is open (a transport fact: a stopped peer can be offline too),
whether the participant paused its contribution (its own choice, in any
state), and, while it is disconnected, whether it was a member (then it
gets the module again and catches up when the channel reopens).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from ..states import PEER_ANYWHERE, PEER_TRANSITIONS, PeerState, allowed, is_loaded, is_member, move

__all__ = ["PeerRecord", "PeerBook", "loading", "eligible", "available"]

_MAX_ROUNDS = 10**9  # far above any job's rounds; a count past it is not one this code wrote
# What the job record keeps of a peer (``approved``, ``robust_state``) is a function of these fields only.
_RECORDED = frozenset({"state", "rejoins", "outlier_rounds", "outliers", "excluded"})


@dataclass
class PeerRecord:
    """The coordinator's record of one participant."""

    state: PeerState = PeerState.UNKNOWN
    connected: bool = True
    paused: bool = False
    rejoins: bool = False  # meaningful while DISCONNECTED: it was a member when the channel closed
    held: set[str] = field(default_factory=set)  # artifact hashes the peer holds
    wants_shader_archive: bool = False  # asked for the job's WGSL archive (its ModuleStatus)
    # Robust aggregation (core/aggregation/robust.py): rounds in a row, and in all, whose
    # update was an outlier (delta norm above the clip multiple of the median).
    outlier_rounds: int = 0
    outliers: int = 0
    # aggregation.excludeOutliersAfter: excluded from the job (no assignment, its updates refused).
    excluded: bool = False
    # Why it said no to the invitation, or that the invitation expired (None: it did not decline).
    declined: str | None = None
    expired: bool = False  # its invitation expired unanswered (the Coordinator's INVITATION_TTL_MS)
    # The job finished while its channel was closed: it has not been told (it is, when it reconnects).
    missed_end: bool = False
    # Why its last assignment made no progress ({"since": ms, "reason": text}); None once it makes progress.
    stuck: dict[str, Any] | None = None
    # The book this record is in and its peer id there: a change of what the job record keeps of this peer
    # (``approved``, ``robust_state()``) is noted in the book, so that the job record, saved after every drain,
    # is updated for that peer alone. Rebuilding it over every peer at each change cost O(peers) a join,
    # O(peers^2) a job (profiled through a Flower grid at 1,000 nodes); over every peer at each drain,
    # O(peers) a message. A peer's state moves every assignment; whether it is a member does not.
    book: tuple[PeerBook, str] | None = field(default=None, init=False, repr=False, compare=False)

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in _RECORDED:
            object.__setattr__(self, name, value)
            return
        before = self._in_record()
        object.__setattr__(self, name, value)
        book = self.__dict__.get("book")  # absent while the record is being built
        if book is not None and before != self._in_record():
            book[0].changed.add(book[1])

    def _in_record(self) -> tuple[bool, dict[str, Any] | None] | None:
        """What the job record keeps of this peer; None while the record is being built."""
        try:
            return self.approved, self.robust_state()
        except AttributeError:
            return None

    @property
    def approved(self) -> bool:
        """Accepted the invitation and takes part, connected or not."""
        return is_member(self.state) or (self.state == PeerState.DISCONNECTED and self.rejoins)

    @property
    def loaded(self) -> bool:
        """The module is loaded: the participant can train."""
        return is_loaded(self.state)

    def can(self, event: str) -> bool:
        return allowed(PEER_TRANSITIONS, self.state, event, PEER_ANYWHERE) is not None

    def move(self, event: str) -> None:
        """Raises IllegalTransition when ``PEER_TRANSITIONS`` has no such move."""
        nxt = move("participant record", PEER_TRANSITIONS, self.state, event, PEER_ANYWHERE)
        if nxt == PeerState.DISCONNECTED:
            self.rejoins = event == "restore" or self.approved
        self.state = nxt

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"connected": self.connected, "approved": self.approved, "state": str(self.state)}
        if self.paused:
            out["paused"] = True
        if self.outliers:
            out["robust"] = {"outlierRounds": self.outlier_rounds, "outliers": self.outliers}
        if self.excluded:
            out["excluded"] = True
        if self.stuck is not None:
            out["stuck"] = dict(self.stuck)
        if self.missed_end:
            out["missedEnd"] = True
        if self.declined is not None and self.state == PeerState.DECLINED:
            out["declined"] = self.declined
        return out

    def robust_state(self) -> dict[str, Any] | None:
        """What robust aggregation knows of this peer, for the job record (None: nothing yet)."""
        if not (self.outliers or self.excluded):
            return None
        return {"outlierRounds": self.outlier_rounds, "outliers": self.outliers, "excluded": self.excluded}

    def restore_robust(self, saved: Any) -> bool:
        """Take back :meth:`robust_state` from a job record; False (nothing changed) when it is not one."""
        if not isinstance(saved, dict) or set(saved) != {"outlierRounds", "outliers", "excluded"}:
            return False
        rounds, total, excluded = saved["outlierRounds"], saved["outliers"], saved["excluded"]
        if type(rounds) is not int or type(total) is not int or type(excluded) is not bool \
                or not 0 <= rounds <= total <= _MAX_ROUNDS:
            return False
        self.outlier_rounds, self.outliers, self.excluded = rounds, total, excluded
        return True

    def note_round(self, outlier: bool) -> None:
        """Count a round this peer contributed to under robust aggregation."""
        if outlier:
            self.outlier_rounds += 1
            self.outliers += 1
        else:
            self.outlier_rounds = 0


class PeerBook(dict[str, PeerRecord]):
    """The coordinator's records by peer id, and the peers whose record came, went, or changed what the job
    record keeps of it since the job record last asked (``changed``, cleared by the one who asks)."""

    def __init__(self) -> None:
        super().__init__()
        self.changed: set[str] = set()

    def __setitem__(self, peer: str, record: PeerRecord) -> None:
        super().__setitem__(peer, record)
        object.__setattr__(record, "book", (self, peer))
        self.changed.add(peer)

    def __delitem__(self, peer: str) -> None:
        super().__delitem__(peer)
        self.changed.add(peer)


def loading(peers: Mapping[str, PeerRecord]) -> list[str]:
    """Members still loading the module (a failed load is not waited for)."""
    return [p for p, r in peers.items() if r.state == PeerState.APPROVED and r.connected]


def eligible(peers: Mapping[str, PeerRecord], busy: set[str]) -> list[str]:
    """Who can take an assignment now: connected, module loaded, not paused nor excluded, no attempt out. Sorted."""
    return sorted(p for p, r in peers.items()
                  if r.loaded and r.connected and not r.paused and not r.excluded and p not in busy)


def available(peers: Mapping[str, PeerRecord]) -> int:
    """How many participants could train at all (paused or busy ones count, excluded ones do not)."""
    return sum(1 for r in peers.values() if r.loaded and r.connected and not r.excluded)
