"""A job never waits in silence on a participant that makes no progress (issue 24, item 1), under simulated time.

Two causes: the participant lacks an artifact an assignment names as held (the frame reader refuses that
message), and a participant that goes quiet. The first is asked for and sent again; the second is stalled
after ``STALL_TIMEOUT_MS`` and its work reassigned; either way the coordinator's record of the peer says
it is stuck and why.
"""

from __future__ import annotations

from typing import Any

from sim import HANG, JOB_ID, Sim, dataset_spec, experience_spec, sha

from weei.core.job.coordinator import MAX_RESENDS, STALL_TIMEOUT_MS
from weei.core.states import JobStatus
from weei.core.wire.messages import ArtifactMissing, Assign

JOB_SEED = 12345678901234567890
START_SLOT = [{"id": "start", "role": "reference-policy", "bytes": 64, "source": {"kind": "initial"}}]


def exp_settings(**kw: Any) -> dict[str, Any]:
    return {"epochs": 3, "localEpochs": 1, "batchSize": 4, "coordinatorParticipates": False,
            "experience": {"unitsPerAssignment": 8}, **kw}


def evict_after_round_1(sim: Sim, peer: str, artifact: str) -> None:
    """``peer`` drops ``artifact`` once it trained round 1 (as a second job's residency did, issue 24)."""
    def hook(assign: Assign, start: bytes, default: Any) -> Any:
        if assign.round == 1:
            sim.stores[peer].pop(artifact)
        return default
    sim.behaviour[peer] = hook


def test_an_assignment_naming_an_evicted_artifact_is_asked_for_and_sent_again() -> None:
    spec, store = experience_spec(settings=exp_settings(), aux=START_SLOT)
    sim = Sim.start_job(spec, store, ["p1"], job_seed=JOB_SEED, start=False)
    initial = sim.coordinator.weights_sha256  # the 'start' snapshot: sent with round 1, held from then on
    evict_after_round_1(sim, "p1", initial)
    sim.coordinator.start(sim.now)
    sim.pump()
    # Round 2's assignment named the snapshot as held: refused on arrival, asked for, sent again with it.
    assert [(r[1], r[2].round, r[3]) for r in sim.refused] == [("p1", 2, initial)]
    assert sim.messages(ArtifactMissing, src="p1") == [ArtifactMissing(JOB_ID, initial)]
    resent = [d for d in sim.delivered(Assign, dst="p1") if d.message.round == 2]
    assert len(resent) == 1 and initial in {a.sha256 for a in resent[0].attachments}
    assert sim.coordinator.status is JobStatus.COMPLETED
    assert sim.rounds == [0, 1, 2, 3]
    assert "stuck" not in sim.coordinator.view(sim.now)["participants"]["p1"]  # it made progress since


def test_a_participant_that_never_starts_is_stalled_while_loading_and_its_work_goes_elsewhere() -> None:
    spec, store = dataset_spec(4, settings={"epochs": 1, "localEpochs": 1, "batchSize": 4,
                                            "coordinatorParticipates": False})
    sim = Sim.start_job(spec, store, ["p1", "p2"], start=False, round_timeout_ms=10 * 60 * 1000)
    sim.participants["p1"].on_message = lambda *args: None  # a frozen tab: what reaches it goes nowhere
    sim.coordinator.start(sim.now)
    sim.pump()
    t0 = sim.now
    lost_chunk = next(a.chunk.id for a in sim.messages(Assign, dst="p1"))
    sim.advance(STALL_TIMEOUT_MS)
    p1 = sim.coordinator.view(sim.now)["participants"]["p1"]
    assert p1["stuck"]["since"] == t0
    assert p1["stuck"]["reason"].startswith("no word for 180 s while loading")
    assert any(l.event == "assignment.stalled" and l.details["peer"] == "p1" for _, l in sim.logs)
    # The round closed at the stall with p2's update, not at its 10-minute deadline; p1 says stuck meanwhile.
    assert sim.coordinator.checkpoint_round == 1
    while sim.coordinator.status is not JobStatus.COMPLETED and sim.now - t0 < 10 * STALL_TIMEOUT_MS:
        sim.advance(STALL_TIMEOUT_MS)
    assert sim.coordinator.status is JobStatus.COMPLETED
    assert any(peer == "p2" and a.chunk.id == lost_chunk for peer, a in sim.trained)


def test_a_participant_cannot_make_the_coordinator_resend_without_end() -> None:
    spec, store = experience_spec(settings=exp_settings(), aux=START_SLOT)
    sim = Sim.start_job(spec, store, ["p1", "p2"], job_seed=JOB_SEED, start=False)
    sim.auto_train = False
    initial = sim.coordinator.weights_sha256
    real_on_message = sim.participants["p1"].on_message
    sim.participants["p1"].on_message = lambda *args: None  # its assignment stays 'loading'
    sim.coordinator.start(sim.now)
    sim.pump()
    for _ in range(MAX_RESENDS + 3):  # p1 keeps saying it lacks round 1's checkpoint
        sim.coordinator.receive("p1", ArtifactMissing(JOB_ID, initial), {}, sim.now)
        sim.pump()
    resent = [l for peer, l in sim.logs if peer == "coord" and l.event == "assignment.resent"]
    assert len(resent) == MAX_RESENDS
    assert not sim.coordinator.attempts.open_of("p1")  # its attempt ended; its work went back
    p1 = sim.coordinator.view(sim.now)["participants"]["p1"]
    assert p1["stuck"]["reason"] == f"still lacks artifact {initial[:12]}… after {MAX_RESENDS} resends"
    sim.participants["p1"].on_message = real_on_message
    while sim.pending:
        sim.finish()
    assert sim.coordinator.status is JobStatus.COMPLETED


def test_a_quiet_attempt_is_stalled_and_its_work_reassigned_long_before_the_round_deadline() -> None:
    spec, store = dataset_spec(4, settings={"epochs": 1, "localEpochs": 1, "batchSize": 4,
                                            "coordinatorParticipates": False})
    sim = Sim.start_job(spec, store, ["p1", "p2"], start=False, round_timeout_ms=10 * 60 * 1000)
    sim.behaviour["p1"] = lambda assign, start, default: HANG  # it said it started, then nothing
    sim.coordinator.start(sim.now)
    sim.pump()
    hung_chunk = sim.hung[0][1].chunk.id
    t0 = sim.now
    sim.advance(STALL_TIMEOUT_MS - 1)
    assert sim.coordinator.attempts.open_of("p1"), "stalled before its time"
    sim.advance(1)
    p1 = sim.coordinator.view(sim.now)["participants"]["p1"]
    assert p1["stuck"] == {"since": t0, "reason": "no word for 180 s while training"}
    # p1 is still eligible next round; with it hanging, p2 trains the rest, the hung chunk included.
    for _ in range(4):
        sim.advance(STALL_TIMEOUT_MS)
    assert sim.coordinator.status is JobStatus.COMPLETED
    assert any(peer == "p2" and a.chunk.id == hung_chunk for peer, a in sim.trained)
    assert sim.now - t0 < 5 * STALL_TIMEOUT_MS + 1


def test_progress_keeps_an_attempt_alive() -> None:
    spec, store = dataset_spec(1)
    sim = Sim.start_job(spec, store, ["p1"], start=False, round_timeout_ms=10 * 60 * 1000)
    sim.auto_train = False
    sim.coordinator.start(sim.now)
    sim.pump()
    (peer, assign), = sim.pending
    for step in range(1, 5):  # a long chunk: word every two minutes, eight minutes in all
        sim.advance(STALL_TIMEOUT_MS * 2 // 3)
        sim.participants["p1"].report_progress(step, 10, {}, sim.now)
        sim.pump()
    assert sim.coordinator.attempts.open_of("p1")
    sim.finish()
    assert sim.coordinator.status is JobStatus.COMPLETED


def test_artifact_requests_are_bounded() -> None:
    spec, store = dataset_spec(2)
    sim = Sim.start_job(spec, store, ["p1"], start=False)
    p1 = sim.participants["p1"]
    for _ in range(3):
        p1.artifact_missing("coord", sha(b"x"), sim.now)
    p1.artifact_missing("someone-else", sha(b"y"), sim.now)
    sim.pump()
    assert sim.messages(ArtifactMissing, src="p1") == [ArtifactMissing(JOB_ID, sha(b"x"))]
    # Nothing of this job names it: the coordinator sends nothing, and logs it.
    assert any(l.event == "artifact.missing" for peer, l in sim.logs if peer == "coord")
