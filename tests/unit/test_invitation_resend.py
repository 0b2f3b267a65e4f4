"""A channel that closes loses what it still held (docs/peers.md): an invitation, or the answer to it, can be
lost that way. Nothing else would ever say it again, and both windows would wait until the invitation expires
(10 min). So when an invited peer's channel reopens, its coordinator asks again; a peer that already accepted
answers again, and a peer that never saw the invitation now sees it. Under simulated time (sim.py); the page's
routing of such an invitation to the participant is in test_invitation_resend_controller.py.
"""

from __future__ import annotations

from sim import Sim, dataset_spec
from weei.core.wire.messages import Deliver, Invitation, InvitationDecision


def _sim() -> Sim:
    spec, store = dataset_spec(2)
    sim = Sim.create(spec, store)
    sim.add_peer("p1")
    return sim


def test_an_invitation_lost_with_its_channel_is_sent_again_when_the_channel_reopens() -> None:
    sim = _sim()
    sim.connected.discard("p1")  # the channel is closing: what is sent now never arrives
    sim.coordinator.invite("p1", sim.now)
    sim.pump()
    assert [m.TYPE for _, _, m in sim.lost] == ["invitation"]
    sim.coordinator.peer_disconnected("p1", sim.now)
    sim.reconnect("p1")
    assert sim.participants["p1"].state == "invited"
    assert len(sim.messages(Invitation, dst="p1")) == 1
    sim.participants["p1"].decide(True, sim.now)
    sim.pump()
    assert sim.coordinator.peers["p1"].state == "modelLoaded"


def test_an_acceptance_lost_with_its_channel_is_said_again_when_asked_again() -> None:
    sim = _sim()
    sim.coordinator.invite("p1", sim.now)
    sim.pump()
    sim.disconnect("p1")
    sim.participants["p1"].decide(True, sim.now)  # said while the channel is down: lost
    sim.pump()
    assert isinstance(sim.lost[-1][2], InvitationDecision)
    assert sim.coordinator.peers["p1"].state == "disconnected"
    sim.reconnect("p1")
    assert [d.accepted for d in sim.messages(InvitationDecision, src="p1")] == [True]
    assert len(sim.messages(Deliver, dst="p1")) == 1
    assert sim.coordinator.peers["p1"].state == "modelLoaded"
    assert sim.participants["p1"].state == "modelLoaded"
    assert ("p1", "decision.resent") in [(peer, log.event) for peer, log in sim.logs]


def test_nothing_is_asked_again_of_a_peer_that_answered_or_of_a_member() -> None:
    sim = _sim()
    sim.add_peer("p2")
    sim.join("p1")  # a member: it rejoins with the module, no invitation
    sim.coordinator.invite("p2", sim.now)
    sim.pump()
    sim.participants["p2"].decide(False, sim.now)
    sim.pump()
    for peer in ("p1", "p2"):
        sim.disconnect(peer)
        sim.reconnect(peer)
    assert len(sim.messages(Invitation, dst="p1")) == 1 and len(sim.messages(Invitation, dst="p2")) == 1
    assert sim.coordinator.peers["p1"].state == "modelLoaded"
    assert [d.accepted for d in sim.messages(InvitationDecision, src="p2")] == [False]
