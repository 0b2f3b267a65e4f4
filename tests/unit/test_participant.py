"""The participant state machine on its own: the transition table and each event."""

from __future__ import annotations

import struct

import pytest
from sim import JOB_ID, WASM, initial_weights, sha

from weei.core.wire.commands import LoadModule, Log, Send, Train
from weei.core.errors import UsageError
from weei.core.wire.messages import (
    ArtifactRef, Assign, AssignmentFailed, ChunkRef, Deliver, Invitation, InvitationDecision, JobFinished, Leave,
    ModuleStatus, PauseContribution, TrainingStarted, Update, UpdateReceipt,
)
from weei.core.job.participant import Participant, TrainOutcome
from weei.core.states import PARTICIPANT_ANYWHERE, PARTICIPANT_TRANSITIONS, IllegalTransition, PeerState

C = "coord"
NOW = 1000.0
W0 = initial_weights(16)
CK = ArtifactRef("checkpoint", sha(W0), len(W0))
MODULE = ArtifactRef("module", sha(WASM), len(WASM))
# Written out by hand from the spec's participant flow, not read from the code's table:
# a wrong entry in core/states.py must fail here.
EXPECTED = {
    ("unknown", "invited"): "invited",
    ("invited", "accept"): "approved",
    ("invited", "decline"): "declined",
    ("invited", "invited"): "invited",
    ("declined", "invited"): "invited",
    ("approved", "deliver"): "approved",
    ("approved", "module_loaded"): "modelLoaded",
    ("approved", "module_failed"): "modelLoadFailed",
    ("modelLoadFailed", "deliver"): "approved",
    ("modelLoadFailed", "invited"): "invited",
    ("modelLoaded", "assign"): "assigned",
    ("modelLoaded", "deliver"): "approved",
    ("assigned", "train_started"): "training",
    ("assigned", "assign"): "assigned",
    ("assigned", "train_failed"): "modelLoaded",
    ("training", "trained"): "updateReady",
    ("training", "train_failed"): "modelLoaded",
    ("updateReady", "receipt"): "resultReceived",
    ("updateReady", "assign"): "assigned",
    ("resultReceived", "assign"): "assigned",
    ("resultReceived", "receipt"): "resultReceived",
    ("disconnected", "reconnected"): "approved",
    ("stopped", "invited"): "invited",
}
# Valid from every state once the participant has a job.
EXPECTED_ANYWHERE = {"finished": "stopped", "leave": "stopped", "disconnected": "disconnected"}
STATES = ["unknown", "invited", "declined", "approved", "modelLoadFailed", "modelLoaded", "assigned", "training",
          "updateReady", "resultReceived", "disconnected", "stopped"]
EVENTS = ["invited", "accept", "decline", "deliver", "module_loaded", "module_failed", "assign", "train_started",
          "train_failed", "trained", "receipt", "reconnected", "finished", "leave", "disconnected"]


def invitation(job: str = JOB_ID) -> Invitation:
    return Invitation(job, C, {"id": "m"}, {"fileName": "model.wasm", "bytes": len(WASM), "sha256": sha(WASM)}, 10,
                      {"epochs": 1})


def assign(n: int = 1, round_: int = 1) -> Assign:
    data = ArtifactRef("chunk", sha(b"chunk%d" % n), 6)
    return Assign(JOB_ID, round_, f"r{round_}-c{n}", f"r{round_}-c{n}-a{n}", CK, {"localEpochs": 1, "batchSize": 2}, 7,
                  ChunkRef(f"c{n}", "syn", 5, data))


def outcome(weights: bytes = W0, **metrics: float) -> TrainOutcome:
    return TrainOutcome(weights, metrics or {"loss": 0.5}, 5)


def sends(p: Participant) -> list:
    return [c.message for c in p.take_commands() if isinstance(c, Send)]


def loaded() -> Participant:
    p = Participant("p1")
    p.on_message(C, invitation(), NOW)
    p.decide(True, NOW)
    p.on_message(C, Deliver(JOB_ID, MODULE, {"id": "m"}), NOW)
    p.module_loaded(len(W0), (sha(WASM),), NOW)
    p.take_commands()
    return p


# ------------------------------------------------------------- the table


@pytest.mark.parametrize("state", STATES)
@pytest.mark.parametrize("event", EVENTS)
def test_transition_table(state: str, event: str) -> None:
    p = Participant("p1")
    p.job_id = JOB_ID
    p.state = PeerState(state)
    expected = EXPECTED.get((state, event)) or EXPECTED_ANYWHERE.get(event)
    if expected is None:
        with pytest.raises(IllegalTransition) as err:
            p._move(event)
        assert err.value.reason == "illegal-transition"
        assert (err.value.role, err.value.state, err.value.event) == ("participant", state, event)
        assert repr(state) in err.value.message and repr(event) in err.value.message
        assert "participant" in err.value.message
        assert p.state == state
    else:
        p._move(event)
        assert p.state == expected


def test_every_state_is_a_spec_participant_state() -> None:
    spec_states = {"invited", "approved", "declined", "unknown", "disconnected", "modelLoaded", "assigned", "training",
                   "updateReady", "resultReceived", "stopped", "modelLoadFailed"}
    assert set(STATES) == spec_states == {str(s) for s in PeerState}


def test_the_table_lists_no_move_beyond_the_expected_ones() -> None:
    listed = {(str(s), e): str(n) for s, row in PARTICIPANT_TRANSITIONS.items() for e, n in row.items()}
    assert listed == EXPECTED
    assert {e: str(n) for e, n in PARTICIPANT_ANYWHERE.items()} == EXPECTED_ANYWHERE


def test_without_a_job_nothing_goes_anywhere() -> None:
    p = Participant("p1")
    for event in ("finished", "leave", "disconnected"):
        with pytest.raises(UsageError):
            p._move(event)


@pytest.mark.parametrize("call, state, event", [
    (lambda p: p.module_loaded(64, (), NOW), "unknown", "module_loaded"),
    (lambda p: p.module_failed("x", NOW), "unknown", "module_failed"),
])
def test_public_illegal_moves_name_state_and_event(call, state: str, event: str) -> None:
    p = Participant("p1")
    with pytest.raises(UsageError) as err:
        call(p)
    assert state in err.value.message and event in err.value.message


def test_module_loaded_twice_is_illegal() -> None:
    p = loaded()
    with pytest.raises(UsageError) as err:
        p.module_loaded(64, (), NOW)
    assert "'modelLoaded'" in err.value.message and "'module_loaded'" in err.value.message


def test_user_commands_out_of_place() -> None:
    p = Participant("p1")
    with pytest.raises(UsageError) as err:
        p.decide(True, NOW)
    assert err.value.reason == "no-invitation"
    with pytest.raises(UsageError):
        p.pause_contribution(True, NOW)
    with pytest.raises(UsageError):
        p.leave(NOW)
    p.on_message(C, invitation(), NOW)
    with pytest.raises(UsageError):
        p.pause_contribution(True, NOW)  # not before accepting
    p.decide(False, NOW)
    with pytest.raises(UsageError):
        p.decide(True, NOW)  # decided already


# -------------------------------------------------------------- the flow


def test_invitation_to_update() -> None:
    p = Participant("p1")
    p.on_message(C, invitation(), NOW)
    assert p.state == "invited" and p.job_id == JOB_ID and p.coordinator == C and p.take_commands() == []
    p.decide(True, NOW)
    assert sends(p) == [InvitationDecision(JOB_ID, True)] and p.state == "approved"
    p.on_message(C, Deliver(JOB_ID, MODULE, {"id": "m"}), NOW)
    assert p.take_commands() == [LoadModule(MODULE, {})]
    p.module_loaded(len(W0), (sha(WASM),), NOW)
    assert sends(p) == [ModuleStatus(JOB_ID, True, None, (sha(WASM),))] and p.state == "modelLoaded"
    a = assign()
    p.on_message(C, a, NOW)
    assert p.take_commands() == [Train(a)] and p.state == "assigned"
    p.training_started(a.attempt_id, NOW)
    assert sends(p) == [TrainingStarted(JOB_ID, a.attempt_id)] and p.state == "training"
    weights = struct.pack("<16f", *range(16))
    p.training_finished(a.attempt_id, TrainOutcome(weights, {"loss": 0.25}, 5, 3), NOW)
    [cmd] = p.take_commands()
    assert isinstance(cmd, Send) and cmd.peer == C and p.state == "updateReady"
    ref = ArtifactRef("update", sha(weights), len(weights))
    assert cmd.message == Update(JOB_ID, 1, a.assignment_id, a.attempt_id, CK.sha256, ref, {"loss": 0.25}, 5, 3)
    assert cmd.attachments == (ref,) and cmd.blobs == {sha(weights): weights}
    p.on_message(C, UpdateReceipt(JOB_ID, a.attempt_id, True), NOW)
    assert p.state == "resultReceived"
    p.on_message(C, assign(2, 2), NOW)
    assert p.state == "assigned"


def test_decline() -> None:
    p = Participant("p1")
    p.on_message(C, invitation(), NOW)
    p.decide(False, NOW)
    assert sends(p) == [InvitationDecision(JOB_ID, False)] and p.state == "declined"
    p.on_message(C, invitation("job-2"), NOW)  # a declined participant may be invited again
    assert p.state == "invited" and p.job_id == "job-2"


def test_module_failure_is_reported() -> None:
    p = Participant("p1")
    p.on_message(C, invitation(), NOW)
    p.decide(True, NOW)
    p.on_message(C, Deliver(JOB_ID, MODULE, {"id": "m"}), NOW)
    p.take_commands()
    p.module_failed("x" * 5000, NOW)
    [msg] = sends(p)
    assert msg == ModuleStatus(JOB_ID, False, "x" * 2000) and p.state == "modelLoadFailed"
    p.on_message(C, Deliver(JOB_ID, MODULE, {"id": "m"}), NOW)  # the coordinator may deliver again
    assert p.state == "approved"


@pytest.mark.parametrize("result, needle", [
    (TrainOutcome(W0[:-4], {}, 5), "bytes of weights"),
    (TrainOutcome(W0[:-4] + struct.pack("<f", float("nan")), {}, 5), "diverged"),
    (TrainOutcome(W0, {"loss": float("inf")}, 5), "metric"),
])
def test_own_result_is_checked_before_it_leaves(result: TrainOutcome, needle: str) -> None:
    p = loaded()
    a = assign()
    p.on_message(C, a, NOW)
    p.take_commands()
    p.training_finished(a.attempt_id, result, NOW)
    [msg] = sends(p)
    assert isinstance(msg, AssignmentFailed) and needle in msg.error and msg.attempt_id == a.attempt_id
    assert p.state == "modelLoaded" and p.current is None


def test_training_failure() -> None:
    p = loaded()
    a = assign()
    p.on_message(C, a, NOW)
    p.training_started(a.attempt_id, NOW)
    p.take_commands()
    p.training_failed(a.attempt_id, "worker crashed", NOW)
    assert sends(p) == [AssignmentFailed(JOB_ID, a.attempt_id, "worker crashed")] and p.state == "modelLoaded"


def test_assignment_during_training_waits_and_only_the_newest_is_kept() -> None:
    p = loaded()
    a1, a2, a3 = assign(1), assign(2, 2), assign(3, 3)
    p.on_message(C, a1, NOW)
    p.training_started(a1.attempt_id, NOW)
    p.take_commands()
    p.on_message(C, a2, NOW)
    p.on_message(C, a3, NOW)
    assert p.take_commands() == [] and p.pending == a3
    p.training_finished(a1.attempt_id, outcome(), NOW)
    cmds = p.take_commands()
    assert isinstance(cmds[0], Send) and isinstance(cmds[0].message, Update)
    assert cmds[1:] == [Train(a3)] and p.state == "assigned" and p.current == a3


def test_results_of_other_attempts_are_ignored() -> None:
    p = loaded()
    a = assign()
    p.on_message(C, a, NOW)
    p.take_commands()
    p.training_started("other", NOW)
    p.training_finished("other", outcome(), NOW)
    p.training_failed("other", "x", NOW)
    assert all(isinstance(c, Log) for c in p.take_commands()) and p.state == "assigned"


def test_messages_of_other_coordinators_or_jobs_are_ignored() -> None:
    p = loaded()
    p.on_message("mallory", assign(), NOW)
    p.on_message(C, JobFinished("job-2", False), NOW)
    cmds = p.take_commands()
    assert [c.event for c in cmds] == ["message.ignored", "message.ignored"] and p.state == "modelLoaded"


def test_invitation_while_in_a_job_is_ignored() -> None:
    p = loaded()
    p.on_message("other", invitation("job-2"), NOW)
    assert p.job_id == JOB_ID and p.coordinator == C and p.state == "modelLoaded"
    assert [c.event for c in p.take_commands()] == ["invitation.ignored"]


def test_coordinator_messages_out_of_place_are_logged_not_raised() -> None:
    p = loaded()
    p.on_message(C, JobFinished(JOB_ID, True), NOW)
    assert p.state == "stopped" and p.incomplete is True
    p.on_message(C, assign(), NOW)  # a peer's message never raises
    p.on_message(C, Deliver(JOB_ID, MODULE, {"id": "m"}), NOW)
    assert p.state == "stopped"
    assert [c.event for c in p.take_commands()] == ["message.ignored", "message.ignored"]
    q = loaded()
    a = assign()
    q.on_message(C, a, NOW)
    q.training_started(a.attempt_id, NOW)
    q.take_commands()
    q.on_message(C, Deliver(JOB_ID, MODULE, {"id": "m"}), NOW)
    assert q.state == "training" and q.current == a


def test_rejected_receipt_is_recorded() -> None:
    p = loaded()
    a = assign()
    p.on_message(C, a, NOW)
    p.training_finished(a.attempt_id, outcome(), NOW)
    p.take_commands()
    p.on_message(C, UpdateReceipt(JOB_ID, a.attempt_id, False, "late-update: closed"), NOW)
    assert p.state == "resultReceived" and p.last_error == "late-update: closed"


def test_pause_leave_and_finish() -> None:
    p = loaded()
    p.pause_contribution(True, NOW)
    assert sends(p) == [PauseContribution(JOB_ID, True)] and p.paused
    p.leave(NOW)
    assert sends(p) == [Leave(JOB_ID)] and p.state == "stopped"
    with pytest.raises(UsageError):
        p.leave(NOW)


def test_disconnect_drops_the_current_attempt_and_reconnect_reloads() -> None:
    p = loaded()
    a = assign()
    p.on_message(C, a, NOW)
    p.take_commands()
    p.disconnected(NOW)
    assert p.state == "disconnected" and p.current is None
    p.training_finished(a.attempt_id, outcome(), NOW)  # the Worker finished meanwhile: nothing is sent
    assert not [c for c in p.take_commands() if isinstance(c, Send)]
    p.reconnected(NOW)
    assert p.state == "approved"
    p.on_message(C, Deliver(JOB_ID, MODULE, {"id": "m"}), NOW)
    assert isinstance(p.take_commands()[0], LoadModule)


def test_local_participant_needs_no_invitation() -> None:
    p = Participant.local(C, JOB_ID)
    assert p.state == "approved" and p.coordinator == C
    p.on_message(C, Deliver(JOB_ID, MODULE, {"id": "m"}), NOW)
    p.module_loaded(64, (), NOW)
    assert p.state == "modelLoaded"
    assert p.view() == {"jobId": JOB_ID, "state": "modelLoaded", "paused": False, "currentAttempt": None,
                        "error": None}


def test_a_delivery_other_than_what_was_accepted_is_refused_not_loaded() -> None:
    other = ArtifactRef("module", sha(b"another module"), 14)
    p = Participant("p1")
    p.on_message(C, invitation(), NOW)
    p.decide(True, NOW)
    p.take_commands()
    p.on_message(C, Deliver(JOB_ID, other, {"id": "m"}), NOW)
    commands = p.take_commands()
    assert not any(isinstance(c, LoadModule) for c in commands)
    status = [c.message for c in commands if isinstance(c, Send)]
    assert isinstance(status[0], ModuleStatus) and not status[0].loaded and "SHA-256" in status[0].error
    # An auxiliary file the model does not declare is refused the same way.
    p.on_message(C, Deliver(JOB_ID, MODULE, {"id": "m"}, {"extra": ArtifactRef("auxiliary", sha(b"x"), 1)}), NOW)
    commands = p.take_commands()
    assert not any(isinstance(c, LoadModule) for c in commands)
    assert "not declared" in [c.message for c in commands if isinstance(c, Send)][0].error
    # The module that was accepted loads.
    p.on_message(C, Deliver(JOB_ID, MODULE, {"id": "m"}), NOW)
    assert any(isinstance(c, LoadModule) for c in p.take_commands())


def test_a_remote_participant_learns_the_weight_size_from_its_first_checkpoint() -> None:
    """The coordinator's job gives no size to a remote participant: the first checkpoint assigned does, so a
    model that returns weights of another size is refused here, without the host writing the size in."""
    p = Participant("p1")
    p.on_message(C, invitation(), NOW)
    p.decide(True, NOW)
    p.on_message(C, Deliver(JOB_ID, MODULE, {"id": "m"}), NOW)
    p.module_loaded(None, (sha(WASM),), NOW)
    a = assign()
    p.on_message(C, a, NOW)
    p.take_commands()
    p.training_finished(a.attempt_id, outcome(W0 + W0[:4]), NOW)
    [msg] = sends(p)
    assert isinstance(msg, AssignmentFailed) and f"expected {len(W0)}" in msg.error
    assert p.weight_bytes == len(W0)


def test_the_host_reads_weight_size_and_pause_but_changes_them_only_through_methods() -> None:
    p = Participant.local(C, JOB_ID, paused=True)
    assert p.view()["paused"] is True and p.paused
    with pytest.raises(AttributeError):
        p.paused = False  # type: ignore[misc]
    with pytest.raises(AttributeError):
        p.weight_bytes = 4  # type: ignore[misc]
    p.pause_contribution(False, NOW)
    assert not p.paused and sends(p) == [PauseContribution(JOB_ID, False)]
