"""The coordinator's transition tables, written out by hand, and the one error for an illegal move.

The expected tables below are not read from ``core/states.py``: each row is
the flow the docs describe, so a wrong entry in the code's table fails here.
"""

from __future__ import annotations

import pytest
from sim import Sim, dataset_spec

from weei.core.job.attempts import Attempt
from weei.core.errors import UsageError
from weei.core.job.peers import PeerRecord
from weei.core.states import (
    ATTEMPT_TRANSITIONS, JOB_TRANSITIONS, PEER_ANYWHERE, PEER_TRANSITIONS, AttemptStatus, IllegalTransition, JobStatus,
    PeerState,
)
from weei.core.formats.settings import TrainingSettings

# The coordinator's record of a participant: (state, event) -> state.
PEER = {
    ("unknown", "invite"): "invited",
    ("unknown", "join_local"): "approved",
    ("unknown", "restore"): "disconnected",
    ("invited", "accept"): "approved",
    ("invited", "decline"): "declined",
    ("approved", "module_loaded"): "modelLoaded",
    ("approved", "module_failed"): "modelLoadFailed",
    ("modelLoadFailed", "module_loaded"): "modelLoaded",
    ("modelLoadFailed", "module_failed"): "modelLoadFailed",
    ("modelLoaded", "assign"): "assigned",
    ("modelLoaded", "module_loaded"): "modelLoaded",
    ("modelLoaded", "module_failed"): "modelLoadFailed",
    ("assigned", "training_started"): "training",
    ("assigned", "update_received"): "resultReceived",
    ("assigned", "attempt_ended"): "modelLoaded",
    ("assigned", "module_loaded"): "modelLoaded",
    ("assigned", "module_failed"): "modelLoadFailed",
    ("training", "training_started"): "training",
    ("training", "update_received"): "resultReceived",
    ("training", "attempt_ended"): "modelLoaded",
    ("training", "module_loaded"): "modelLoaded",
    ("training", "module_failed"): "modelLoadFailed",
    ("resultReceived", "assign"): "assigned",
    ("resultReceived", "module_loaded"): "modelLoaded",
    ("resultReceived", "module_failed"): "modelLoadFailed",
    ("disconnected", "rejoin"): "approved",
    ("disconnected", "reconnect"): "invited",
}
PEER_EVERYWHERE = {"disconnect": "disconnected", "leave": "stopped", "finish": "stopped", "withdraw": "stopped"}
PEER_STATES = ["unknown", "invited", "declined", "approved", "modelLoadFailed", "modelLoaded", "assigned", "training",
               "updateReady", "resultReceived", "disconnected", "stopped"]
PEER_EVENTS = ["invite", "join_local", "restore", "accept", "decline", "module_loaded", "module_failed", "assign",
               "training_started", "update_received", "attempt_ended", "rejoin", "reconnect", "disconnect", "leave",
               "finish", "withdraw"]

JOB = {
    ("ready", "start"): "running",
    ("ready", "complete"): "completed",
    ("ready", "reopen_completed"): "completed",
    ("running", "pause"): "paused",
    ("running", "fail"): "paused",
    ("running", "complete"): "completed",
    ("paused", "start"): "running",
    ("paused", "fail"): "paused",
    ("paused", "complete"): "completed",
    ("completed", "more_work"): "ready",
}
JOB_STATES = ["ready", "running", "paused", "completed"]
JOB_EVENTS = ["start", "pause", "fail", "complete", "reopen_completed", "more_work"]

ATTEMPT = {
    ("loading", "started"): "training",
    ("loading", "received"): "received",
    ("loading", "stopped"): "stopped",
    ("training", "started"): "training",
    ("training", "received"): "received",
    ("training", "stopped"): "stopped",
}
ATTEMPT_STATES = ["loading", "training", "received", "stopped"]
ATTEMPT_EVENTS = ["started", "received", "stopped"]


def listed(table: dict) -> dict[tuple[str, str], str]:
    return {(str(s), e): str(n) for s, row in table.items() for e, n in row.items()}


def test_the_tables_list_exactly_the_expected_moves() -> None:
    assert listed(PEER_TRANSITIONS) == PEER
    assert {e: str(n) for e, n in PEER_ANYWHERE.items()} == PEER_EVERYWHERE
    assert listed(JOB_TRANSITIONS) == JOB
    assert listed(ATTEMPT_TRANSITIONS) == ATTEMPT
    assert [str(s) for s in PeerState] == PEER_STATES
    assert [str(s) for s in JobStatus] == JOB_STATES
    assert [str(s) for s in AttemptStatus] == ATTEMPT_STATES


def expect_illegal(call, role: str, state: str, event: str) -> None:
    with pytest.raises(IllegalTransition) as err:
        call()
    assert isinstance(err.value, UsageError) and err.value.reason == "illegal-transition"
    assert (err.value.role, err.value.state, err.value.event) == (role, state, event)
    assert err.value.message == f"{role} in state {state!r} cannot handle event {event!r}"


@pytest.mark.parametrize("state", PEER_STATES)
@pytest.mark.parametrize("event", PEER_EVENTS)
def test_participant_record_moves(state: str, event: str) -> None:
    record = PeerRecord(PeerState(state))
    expected = PEER.get((state, event)) or PEER_EVERYWHERE.get(event)
    if expected is None:
        expect_illegal(lambda: record.move(event), "participant record", state, event)
        assert record.state == state
    else:
        record.move(event)
        assert record.state == expected


@pytest.mark.parametrize("state", ATTEMPT_STATES)
@pytest.mark.parametrize("event", ATTEMPT_EVENTS)
def test_attempt_moves(state: str, event: str) -> None:
    attempt = Attempt("p1", 1, "r1-c000", "r1-c000-a1", "c000", None, 7, 0.0, 1.0, AttemptStatus(state))
    expected = ATTEMPT.get((state, event))
    if expected is None:
        expect_illegal(lambda: attempt.move(event), "attempt", state, event)
        assert attempt.status == state
    else:
        attempt.move(event)
        assert attempt.status == expected


@pytest.mark.parametrize("state", JOB_STATES)
@pytest.mark.parametrize("event", JOB_EVENTS)
def test_job_moves(state: str, event: str) -> None:
    spec, store = dataset_spec(2)
    c = Sim.create(spec, store).coordinator
    c.status = JobStatus(state)
    expected = JOB.get((state, event))
    if expected is None:
        expect_illegal(lambda: c._job(event), "job", state, event)
        assert c.status == state
    else:
        c._job(event)
        assert c.status == expected


def test_a_disconnected_member_rejoins_and_anyone_else_is_invited_again() -> None:
    member, guest, restored = PeerRecord(), PeerRecord(), PeerRecord(connected=False)
    for record, events in ((member, ("invite", "accept", "module_loaded")), (guest, ("invite",)),
                           (restored, ("restore",))):
        for event in events:
            record.move(event)
    for record in (member, guest):
        record.move("disconnect")
    assert member.approved and restored.approved and not guest.approved
    assert member.rejoins and restored.rejoins and not guest.rejoins
    member.move("disconnect")  # a second close forgets nothing
    assert member.rejoins


def test_a_public_call_out_of_place_raises_the_one_error() -> None:
    spec, store = dataset_spec(2)
    sim = Sim.start_job(spec, store, ["p1"])
    assert sim.coordinator.status == "completed"
    sim.coordinator.update_settings(TrainingSettings.from_json({**spec.settings.to_json(), "epochs": 2}), sim.now)
    assert sim.coordinator.status == "ready"
    sim.coordinator.start(sim.now)
    expect_illegal(sim.coordinator.reopened_completed, "job", "running", "reopen_completed")


def test_named_predicates_cover_the_states_the_docs_say() -> None:
    from weei.core.states import has_job, is_free, is_loaded, is_member, is_open, is_working, takes_part

    def which(predicate) -> list[str]:
        return [s for s in PEER_STATES if predicate(PeerState(s))]

    assert which(is_free) == ["unknown", "declined", "stopped"]
    assert which(has_job) == [s for s in PEER_STATES if s not in ("unknown", "stopped")]
    assert which(is_member) == ["approved", "modelLoadFailed", "modelLoaded", "assigned", "training", "updateReady",
                                "resultReceived"]
    assert which(takes_part) == which(is_member) + ["disconnected"]
    assert which(is_loaded) == ["modelLoaded", "assigned", "training", "updateReady", "resultReceived"]
    assert which(is_working) == ["assigned", "training"]
    assert [s for s in ATTEMPT_STATES if is_open(AttemptStatus(s))] == ["loading", "training"]
