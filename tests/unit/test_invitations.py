"""Invitations waiting for a decision (issue 20, finding 5): the coordinator an invitation names is the
peer whose channel it came over, and pending invitations are a bounded list, one per coordinator, so a
pending one never hides another (core/job/invitations.py, api/peer_events.py)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from sim import Sim, dataset_spec
from test_controller import DIGITS_SETTINGS, networked, on_network, package, run_until_done

from weei.api import TrainingController
from weei.core.wire.commands import Send
from weei.core.errors import UsageError
from weei.core.job.invitations import INVITATION_TTL_MS, MAX_PENDING, PendingInvitations
from weei.core.wire.messages import Deliver, Invitation
from weei.demo.network import MemoryNetwork
from weei.runtime.wasmtime_engine import WasmtimeEngine

MODULE = {"fileName": "model.wasm", "bytes": 10, "sha256": "ab" * 32}


def invitation(job_id: str, coordinator: str) -> Invitation:
    return Invitation(job_id, coordinator, {"id": "m", "name": "Model"}, MODULE, 0, {"epochs": 1})


def events(c: TrainingController, name: str) -> list[dict[str, Any]]:
    return [e.get("details", {}) for e in c.session.debug_log.events() if e["event"] == name]


def test_an_invitation_naming_another_coordinator_than_its_sender_is_refused_by_name() -> None:
    async def main(network: MemoryNetwork, engine: WasmtimeEngine) -> None:
        coordinator, helper = networked(network, engine, "coord"), networked(network, engine, "helper")
        for c in (coordinator, helper):
            await c.init()
        job_id = await coordinator.create_job(**package("digits-mlp"), settings={**DIGITS_SETTINGS, "epochs": 1})
        network.transport("mallory")  # a member of the room, with no controller: it only sends
        network.post("mallory", Send("helper", invitation("job-spoofed", "coord")), {})
        await network.settle()
        assert helper.get_state()["invitations"] == []
        assert events(helper, "invitation.refused") == [
            {"jobId": "job-spoofed", "from": "mallory", "reason": "coordinator-mismatch"}]
        # The real coordinator's invitation is shown, and it is the one accepted.
        coordinator.invite("helper")
        await network.settle()
        shown = dict(helper.get_state()["invitations"])
        assert list(shown) == [job_id] and shown[job_id]["invitation"]["coordinator"] == "coord"
        await helper.decide_invitation(job_id, True)
        await network.settle()
        assert coordinator.get_state()["job"]["participants"]["helper"]["approved"] is True

    on_network(main)


def test_two_coordinators_invitations_are_both_shown_and_each_can_be_decided() -> None:
    async def main(network: MemoryNetwork, engine: WasmtimeEngine) -> None:
        first, second, third = (networked(network, engine, p) for p in ("first", "second", "third"))
        helper = networked(network, engine, "helper")
        for c in (first, second, third, helper):
            await c.init()
        jobs = {}
        for c in (first, second, third):
            jobs[c.my_peer_id] = await c.create_job(**package("digits-mlp"),
                                                    settings={**DIGITS_SETTINGS, "epochs": 1})
            c.invite("helper")
            await network.settle()
        # Before: the first pending invitation made the device 'busy' and the later ones were dropped unseen.
        shown = dict(helper.get_state()["invitations"])
        assert list(shown) == [jobs["first"], jobs["second"], jobs["third"]]
        assert [shown[j]["invitation"]["coordinator"] for j in shown] == ["first", "second", "third"]
        # Each by its id: the first declined, the second accepted; accepting declines the rest.
        await helper.decide_invitation(jobs["first"], False)
        await network.settle()
        assert first.get_state()["job"]["participants"]["helper"]["state"] == "declined"
        assert [j for j, _ in helper.get_state()["invitations"]] == [jobs["second"], jobs["third"]]
        await helper.decide_invitation(jobs["second"], True)
        await network.settle()
        assert second.get_state()["job"]["participants"]["helper"]["approved"] is True
        assert helper.participant is not None and helper.participant.coordinator == "second"
        assert helper.get_state()["invitations"] == []
        assert third.get_state()["job"]["participants"]["helper"]["state"] == "declined"
        assert events(helper, "invitation.dropped") == [
            {"jobId": jobs["third"], "from": "third", "reason": "accepted-another"}]

    on_network(main)


def test_the_pending_list_is_bounded_one_per_coordinator_and_names_every_drop() -> None:
    pending = PendingInvitations()
    for i in range(MAX_PENDING):
        assert pending.offer(f"c{i}", invitation(f"job-{i}", f"c{i}"), now=i) == []
    # One more coordinator: the oldest goes, by name.
    assert pending.offer("late", invitation("job-late", "late"), now=99) == [
        {"event": "invitation.dropped", "jobId": "job-0", "from": "c0", "reason": "too-many-pending"}]
    assert len(pending) == MAX_PENDING and "job-late" in pending and "job-0" not in pending
    # A newer invitation from the same coordinator replaces its older one.
    assert pending.offer("c3", invitation("job-3b", "c3"), now=100) == [
        {"event": "invitation.dropped", "jobId": "job-3", "from": "c3", "reason": "replaced"}]
    assert [p.sender for p in pending].count("c3") == 1 and list(pending.entries())[-1] == "job-3b"
    # Another peer cannot take over a pending job's card, nor name another coordinator.
    assert pending.offer("c5", invitation("job-late", "c5"), now=101)[0]["reason"] == "job-pending-elsewhere"
    assert pending.get("job-late").sender == "late"  # type: ignore[union-attr]
    assert pending.offer("c9", invitation("job-9", "c1"), now=102)[0]["reason"] == "coordinator-mismatch"
    assert "job-9" not in pending and len(pending) == MAX_PENDING


# ---------------------------------------------- issue 24, item 3: invitations never vanish


def test_a_peer_whose_job_finished_shows_the_invitation_and_accepting_replaces_that_job() -> None:
    async def main(network: MemoryNetwork, engine: WasmtimeEngine) -> None:
        old, new = networked(network, engine, "old"), networked(network, engine, "new")
        for c in (old, new):
            await c.init()
        finished = await old.create_job(**package("digits-mlp"), settings={**DIGITS_SETTINGS, "epochs": 1})
        await old.start()
        await run_until_done(old)
        assert old.get_state()["job"]["status"] == "completed"
        job_id = await new.create_job(**package("digits-mlp"), settings={**DIGITS_SETTINGS, "epochs": 1})
        new.invite("old")
        await network.settle()
        # Before: dropped unseen ("busy with another job" in the debug log only); the inviter waited for ever.
        shown = dict(old.get_state()["invitations"])
        assert list(shown) == [job_id] and shown[job_id]["replacesFinishedJob"] == finished
        await old.decide_invitation(job_id, True)
        await network.settle()
        assert old.coordinator is None and old.participant is not None and old.participant.job_id == job_id
        saved = {j["id"]: j for j in old.get_state()["savedJobs"]}
        assert saved[finished]["status"] == "completed"  # put away, not lost
        assert new.get_state()["job"]["participants"]["old"]["approved"] is True
        await new.start()
        await run_until_done(new)
        await network.settle()
        assert old.get_state()["job"]["status"] == "completed" and old.get_state()["job"]["id"] == job_id
        assert any(c["artifact"]["round"] >= 1 for c in new.get_state()["job"]["checkpoints"])

    on_network(main)


def test_a_busy_peer_declines_at_once_says_why_and_can_be_invited_again() -> None:
    async def main(network: MemoryNetwork, engine: WasmtimeEngine) -> None:
        busy, inviter = networked(network, engine, "busy"), networked(network, engine, "inviter")
        for c in (busy, inviter):
            await c.init()
        own = await busy.create_job(**package("digits-mlp"), settings={**DIGITS_SETTINGS, "epochs": 1})
        job_id = await inviter.create_job(**package("digits-mlp"), settings={**DIGITS_SETTINGS, "epochs": 1})
        inviter.invite("busy")
        await network.settle()
        record = inviter.get_state()["job"]["participants"]["busy"]
        assert record["state"] == "declined" and record["declined"] == f"busy: it coordinates job {own}, ready"
        assert busy.get_state()["invitations"] == []
        assert events(busy, "invitation.declined")[0]["reason"].startswith("busy: it coordinates job")
        # Once it is free, the same job invites it again and it is shown.
        await busy.leave()
        inviter.invite("busy")
        await network.settle()
        assert [j for j, _ in busy.get_state()["invitations"]] == [job_id]
        assert inviter.get_state()["job"]["participants"]["busy"]["state"] == "invited"

    on_network(main)


def test_an_invitation_nobody_answers_expires_on_both_sides_and_the_inviter_hears_why() -> None:
    async def main(network: MemoryNetwork, engine: WasmtimeEngine) -> None:
        clock = [time.time() * 1000]
        coordinator = networked(network, engine, "coord")
        helper = networked(network, engine, "helper", clock=lambda: clock[0])
        for c in (coordinator, helper):
            await c.init()
        job_id = await coordinator.create_job(**package("digits-mlp"), settings={**DIGITS_SETTINGS, "epochs": 1})
        coordinator.invite("helper")
        await network.settle()
        assert [j for j, _ in helper.get_state()["invitations"]] == [job_id]
        clock[0] += INVITATION_TTL_MS
        with pytest.raises(UsageError) as err:
            await helper.decide_invitation(job_id, True)
        assert err.value.reason == "no-invitation" and "expired" in err.value.message
        await network.settle()
        assert helper.get_state()["invitations"] == []
        record = coordinator.get_state()["job"]["participants"]["helper"]
        assert record["state"] == "declined" and record["declined"].endswith("the invitation expired")
        coordinator.invite("helper")  # and it may invite again
        await network.settle()
        assert [j for j, _ in helper.get_state()["invitations"]] == [job_id]

    on_network(main)


def test_the_coordinator_expires_an_unanswered_invitation_and_a_late_acceptance_still_counts() -> None:
    spec, store = dataset_spec(2)
    sim = Sim.create(spec, store)
    sim.add_peer("p1")
    sim.coordinator.invite("p1", sim.now)
    sim.pump()
    sim.advance(INVITATION_TTL_MS - 1)
    assert sim.coordinator.view(sim.now)["participants"]["p1"]["state"] == "invited"
    sim.advance(1)
    record = sim.coordinator.view(sim.now)["participants"]["p1"]
    assert record == {"connected": True, "approved": False, "state": "declined",
                      "declined": "no answer in 10 min: the invitation expired"}
    sim.coordinator.check_invite("p1")  # may be invited again
    # The participant's clock ran a little behind: its acceptance arrives now, and counts.
    sim.participants["p1"].decide(True, sim.now)
    sim.pump()
    assert sim.coordinator.view(sim.now)["participants"]["p1"]["approved"] is True
    assert sim.messages(Deliver, dst="p1")


def test_pending_invitations_expire_after_their_time() -> None:
    pending = PendingInvitations()
    pending.offer("c1", invitation("job-1", "c1"), now=0)
    pending.offer("c2", invitation("job-2", "c2"), now=1000)
    assert pending.expire(INVITATION_TTL_MS - 1) == []
    assert [p.invitation.job_id for p in pending.expire(INVITATION_TTL_MS)] == ["job-1"]
    assert list(pending.entries()) == ["job-2"]
