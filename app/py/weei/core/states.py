"""The states of a job, of a peer in it and of an attempt, and the legal moves between them.

Theory of operation
-------------------
Every state a machine of ``weei.core`` can be in is a member of one of the
enums below, and every move is a row of a transition table here: data, in
one place, read by :func:`move`. A move the table does not list raises
:class:`IllegalTransition`, which names the role, the state and the event,
so a wrong call is a loud bug, never a silent half-updated record. Input
from another peer is never a reason to raise: the machines ask
:func:`allowed` first and log what they ignore.

Four tables:

* ``PARTICIPANT_TRANSITIONS``: the participant's own machine
  (``core/job/participant.py``), one per device and job.
* ``PEER_TRANSITIONS``: the coordinator's record of each participant
  (``core/job/coordinator.py``). Same states (the spec's
  ``ParticipantState.state``), other events: the coordinator learns of a
  move from a message, the participant makes it.
* ``JOB_TRANSITIONS``: the job's status (``TrainingJob.status``).
* ``ATTEMPT_TRANSITIONS``: one hand-out of work (``core/job/attempts.py``).

``*_ANYWHERE`` tables hold events valid from every state of a role.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Mapping, TypeVar

from .errors import UsageError, UsageReason

__all__ = [
    "JobStatus", "PeerState", "AttemptStatus", "IllegalTransition",
    "PARTICIPANT_TRANSITIONS", "PARTICIPANT_ANYWHERE", "PEER_TRANSITIONS", "PEER_ANYWHERE",
    "JOB_TRANSITIONS", "ATTEMPT_TRANSITIONS", "allowed", "move",
    "is_free", "has_job", "is_engaged", "takes_part", "is_member", "is_loaded", "is_working", "is_open",
]


class JobStatus(StrEnum):
    """TrainingJob.status."""

    READY = "ready"  #: created or reopened, not started
    RUNNING = "running"  #: rounds are handed out
    PAUSED = "paused"  #: no new round; asked by the person, or the job paused itself after a failed round
    COMPLETED = "completed"  #: finished or stopped; the last checkpoint is the result


class PeerState(StrEnum):
    """ParticipantState.state: one participant in one job."""

    UNKNOWN = "unknown"  #: no invitation yet
    INVITED = "invited"  #: invitation shown, no decision
    DECLINED = "declined"  #: said no
    APPROVED = "approved"  #: said yes; the module is on its way or loading
    MODEL_LOAD_FAILED = "modelLoadFailed"  #: the module did not load
    MODEL_LOADED = "modelLoaded"  #: ready for an assignment
    ASSIGNED = "assigned"  #: an assignment arrived, training has not started
    TRAINING = "training"  #: training an assignment
    UPDATE_READY = "updateReady"  #: the update left, no receipt yet (participant side only)
    RESULT_RECEIVED = "resultReceived"  #: the coordinator has the update
    DISCONNECTED = "disconnected"  #: the channel is down; a member catches up when it reopens
    STOPPED = "stopped"  #: left, or the job finished; taking part again needs a new invitation


class AttemptStatus(StrEnum):
    """RoundSlot.status: one hand-out of one piece of work to one participant."""

    LOADING = "loading"  #: sent; the participant has not started training
    TRAINING = "training"  #: the participant said it started
    RECEIVED = "received"  #: a valid update arrived (final)
    STOPPED = "stopped"  #: ended without a valid update; its work went back (final)


class IllegalTransition(UsageError):
    """A machine was asked for a move its table does not list: a bug in the caller."""

    def __init__(self, role: str, state: str, event: str) -> None:
        super().__init__(UsageReason.ILLEGAL_TRANSITION, f"{role} in state {str(state)!r} cannot handle event {event!r}")
        self.role = role
        self.state = state
        self.event = event


S = TypeVar("S", bound=StrEnum)

P = PeerState

# The participant's own machine: state -> event -> next state.
PARTICIPANT_TRANSITIONS: dict[PeerState, dict[str, PeerState]] = {
    P.UNKNOWN: {"invited": P.INVITED},
    P.INVITED: {"accept": P.APPROVED, "decline": P.DECLINED, "invited": P.INVITED},
    P.DECLINED: {"invited": P.INVITED},
    P.APPROVED: {"deliver": P.APPROVED, "module_loaded": P.MODEL_LOADED, "module_failed": P.MODEL_LOAD_FAILED},
    P.MODEL_LOAD_FAILED: {"deliver": P.APPROVED, "invited": P.INVITED},
    P.MODEL_LOADED: {"assign": P.ASSIGNED, "deliver": P.APPROVED},
    P.ASSIGNED: {"train_started": P.TRAINING, "assign": P.ASSIGNED, "train_failed": P.MODEL_LOADED},
    P.TRAINING: {"trained": P.UPDATE_READY, "train_failed": P.MODEL_LOADED},
    P.UPDATE_READY: {"receipt": P.RESULT_RECEIVED, "assign": P.ASSIGNED},
    P.RESULT_RECEIVED: {"assign": P.ASSIGNED, "receipt": P.RESULT_RECEIVED},
    P.DISCONNECTED: {"reconnected": P.APPROVED},
    P.STOPPED: {"invited": P.INVITED},
}
# Valid from any state of a participant that has a job.
PARTICIPANT_ANYWHERE: dict[str, PeerState] = {"finished": P.STOPPED, "leave": P.STOPPED,
                                               "disconnected": P.DISCONNECTED}

# A module status may repeat (a re-delivery after a reconnect), so every member state takes one.
_MODULE = {"module_loaded": P.MODEL_LOADED, "module_failed": P.MODEL_LOAD_FAILED}
# The coordinator's record of one participant: state -> event -> next state.
PEER_TRANSITIONS: dict[PeerState, dict[str, PeerState]] = {
    P.UNKNOWN: {"invite": P.INVITED, "join_local": P.APPROVED, "restore": P.DISCONNECTED},
    P.INVITED: {"accept": P.APPROVED, "decline": P.DECLINED},
    P.DECLINED: {},
    P.APPROVED: dict(_MODULE),
    P.MODEL_LOAD_FAILED: dict(_MODULE),
    P.MODEL_LOADED: {"assign": P.ASSIGNED, **_MODULE},
    P.ASSIGNED: {"training_started": P.TRAINING, "update_received": P.RESULT_RECEIVED,
                 "attempt_ended": P.MODEL_LOADED, **_MODULE},
    P.TRAINING: {"training_started": P.TRAINING, "update_received": P.RESULT_RECEIVED,
                 "attempt_ended": P.MODEL_LOADED, **_MODULE},
    P.RESULT_RECEIVED: {"assign": P.ASSIGNED, **_MODULE},
    # A member's channel reopened: it gets the module again and catches up.
    # Anyone else's: it is shown as invited again, as before it went away.
    P.DISCONNECTED: {"rejoin": P.APPROVED, "reconnect": P.INVITED},
    P.STOPPED: {},
}
# Valid from any state: the channel closes, the participant leaves, the job
# finishes, or the coordinator stops taking part itself.
PEER_ANYWHERE: dict[str, PeerState] = {"disconnect": P.DISCONNECTED, "leave": P.STOPPED, "finish": P.STOPPED,
                                       "withdraw": P.STOPPED}

J = JobStatus
JOB_TRANSITIONS: dict[JobStatus, dict[str, JobStatus]] = {
    J.READY: {"start": J.RUNNING, "complete": J.COMPLETED, "reopen_completed": J.COMPLETED},
    J.RUNNING: {"pause": J.PAUSED, "fail": J.PAUSED, "complete": J.COMPLETED},
    # Open attempts still finish while paused, so a round can close (and fail, or end the job) then.
    J.PAUSED: {"start": J.RUNNING, "fail": J.PAUSED, "complete": J.COMPLETED},
    # New settings with more epochs (or rounds) reopen a completed job.
    J.COMPLETED: {"more_work": J.READY},
}

A = AttemptStatus
ATTEMPT_TRANSITIONS: dict[AttemptStatus, dict[str, AttemptStatus]] = {
    A.LOADING: {"started": A.TRAINING, "received": A.RECEIVED, "stopped": A.STOPPED},
    A.TRAINING: {"started": A.TRAINING, "received": A.RECEIVED, "stopped": A.STOPPED},
    A.RECEIVED: {},
    A.STOPPED: {},
}

# ---------------------------------------------------------------- predicates

_MEMBER = frozenset({P.APPROVED, P.MODEL_LOAD_FAILED, P.MODEL_LOADED, P.ASSIGNED, P.TRAINING,
                     P.UPDATE_READY, P.RESULT_RECEIVED})
_LOADED = frozenset({P.MODEL_LOADED, P.ASSIGNED, P.TRAINING, P.UPDATE_READY, P.RESULT_RECEIVED})


def is_free(state: PeerState) -> bool:
    """In no job (never invited, declined, or stopped): a new invitation may be shown."""
    return state in (P.UNKNOWN, P.DECLINED, P.STOPPED)


def has_job(state: PeerState) -> bool:
    """Invited, declined or taking part: there is a job to say something about (or to leave)."""
    return state not in (P.UNKNOWN, P.STOPPED)


def is_engaged(state: PeerState) -> bool:
    """Invited or taking part: the coordinator still counts on word from this participant (a decision,
    an update, a Leave); a declined one has said its last."""
    return state == P.INVITED or takes_part(state)


def takes_part(state: PeerState) -> bool:
    """Accepted and not stopped: connected or not, the participant belongs to the job."""
    return state in _MEMBER or state == P.DISCONNECTED


def is_member(state: PeerState) -> bool:
    """Accepted, not stopped, and connected (the coordinator remembers a disconnected member apart)."""
    return state in _MEMBER


def is_loaded(state: PeerState) -> bool:
    """The module is loaded: the participant can train."""
    return state in _LOADED


def is_working(state: PeerState) -> bool:
    """An attempt is out with the participant."""
    return state in (P.ASSIGNED, P.TRAINING)


def is_open(status: AttemptStatus) -> bool:
    """The attempt has no outcome yet."""
    return status in (A.LOADING, A.TRAINING)


def allowed(table: Mapping[S, Mapping[str, S]], state: S, event: str,
            anywhere: Mapping[str, S] | None = None) -> S | None:
    """The state ``event`` leads to from ``state``, or None when the table has no such move."""
    return table.get(state, {}).get(event) or (anywhere.get(event) if anywhere else None)


def move(role: str, table: Mapping[S, Mapping[str, S]], state: S, event: str,
         anywhere: Mapping[str, S] | None = None) -> S:
    """The state ``event`` leads to from ``state``.

    Raises:
        IllegalTransition: the table has no such move.
    """
    nxt = allowed(table, state, event, anywhere)
    if nxt is None:
        raise IllegalTransition(role, state, event)
    return nxt
