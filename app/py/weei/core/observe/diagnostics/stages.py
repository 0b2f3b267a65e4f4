"""The stages of a training peer's diagnostics record, and the events that move between them.

The host says what happened (an assignment started, the model runs, the
update left, files are arriving, ...); the table says which stage that
leads to, so the host holds no rule of its own about stages. A move the
table does not list raises :class:`weei.core.states.IllegalTransition`, the
same error as every other machine of ``weei.core``: it is a bug in the
host, never a peer's doing (the recorder's inputs are all local).

Some events stay put in stages where they mean nothing new, listed as such
rather than left out: a progress report of a Worker that is still winding
down arrives after the update left or the job ended (``running`` in
``uploading``, ``waiting``), the
update leaves while the next assignment already prepares (``sent`` in
``preparing``), and the transfers are looked at after every drain, whatever
the stage (``files_arriving``, ``files_idle``).
"""

from __future__ import annotations

from enum import StrEnum

from ...states import move

__all__ = ["Stage", "STAGE_TRANSITIONS", "STAGE_ANYWHERE", "next_stage"]


class Stage(StrEnum):
    """PeerExecutionDiagnostics.stage."""

    WAITING = "waiting"  #: no assignment, nothing arriving
    RECEIVING = "receiving"  #: no assignment; the coordinator's files for this job are on their way
    PREPARING = "preparing"  #: an assignment started: module instantiated, weights loaded, until the first progress
    COMPILING = "compiling"  #: the GPU compiles the job's WGSL
    TRAINING = "training"  #: the model runs
    UPLOADING = "uploading"  #: the update is on its way to the coordinator
    AWAITING_AGGREGATION = "awaitingAggregation"  #: sent; the round's outcome has not come
    ERROR = "error"  #: the assignment failed (the record names why)


W, R, PR, C, T, U, AA, E = (Stage.WAITING, Stage.RECEIVING, Stage.PREPARING, Stage.COMPILING, Stage.TRAINING,
                            Stage.UPLOADING, Stage.AWAITING_AGGREGATION, Stage.ERROR)


def _stay(stage: Stage, *events: str) -> dict[str, Stage]:
    return {event: stage for event in events}


# stage -> event -> next stage. Events: compiling (the GPU compiles), running (a progress report, the GPU
# compiled, or it fell back to the CPU Workers), trained, sent (the update left), files_arriving /
# files_idle (the coordinator's transfers to this peer, looked at after every drain).
STAGE_TRANSITIONS: dict[Stage, dict[str, Stage]] = {
    W: {"files_arriving": R, "files_idle": W, **_stay(W, "running", "sent")},
    R: {"files_arriving": R, "files_idle": W, **_stay(R, "running", "sent")},
    PR: {"compiling": C, "running": T, "trained": U, **_stay(PR, "sent", "files_arriving", "files_idle")},
    C: {"compiling": C, "running": T, "trained": U, **_stay(C, "sent", "files_arriving", "files_idle")},
    # A late progress report of a dropped attempt may have moved the next one's preparing on already.
    T: {"compiling": C, "running": T, "trained": U, **_stay(T, "sent", "files_arriving", "files_idle")},
    U: {"sent": AA, **_stay(U, "running", "files_arriving", "files_idle")},
    AA: _stay(AA, "running", "sent", "files_arriving", "files_idle"),
    E: _stay(E, "running", "sent", "files_arriving", "files_idle"),
}
# From any stage: an assignment starts (assigned), it fails (failed), the job ends for this peer (ended).
STAGE_ANYWHERE: dict[str, Stage] = {"assigned": PR, "failed": E, "ended": W}


def next_stage(stage: Stage, event: str) -> Stage:
    """The stage ``event`` leads to from ``stage``; raises IllegalTransition when the table has no such move."""
    return move("diagnostics", STAGE_TRANSITIONS, stage, event, STAGE_ANYWHERE)
