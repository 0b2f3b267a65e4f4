"""A checkpoint reaches three participants through each other (real WebRTC between four Chromium processes).

The coordinator creates a byte-transformer job (2.3 MB of weights: about
36 pieces of 64 KiB, ``relay.piece_size``) and does not train itself; round 1's three assignments all carry
checkpoint 0, so the coordinator relays it down a chain of its three
participants (docs/peers.md, "Relayed checkpoint broadcast"): it sends the
pieces once, two participants get them from another participant, every
one of them assembles the checkpoint, and each trains from it and returns
an update the coordinator accepts.
"""

from __future__ import annotations

from typing import Any

from room_helpers import join_room

from weei.core.links.relay import piece_size

SETTINGS = {"epochs": 1, "localEpochs": 1, "batchSize": 8, "coordinatorParticipates": False}


def test_a_checkpoint_is_relayed_by_participants_over_webrtc(weei_server: Any, browsers: Any) -> None:
    # The full mesh: every participant sees the others too.
    room = join_room(weei_server.url, browsers, 3, mesh=True)
    coordinator, participants, ids, me = room.coordinator, room.participants, room.ids, room.coordinator_id
    job_id = room.create_job("byte-transformer", SETTINGS, validation=False)
    room.accept(job_id, loaded_ms=120_000)
    coordinator.evaluate("T.api().start()")
    coordinator.evaluate("""() => T.waitFor('round 1 closed',
      () => T.api().getState().job.checkpoints.length >= 2, 300000)""")
    coordinator.evaluate("T.api().stop()")

    events = coordinator.evaluate("T.api().getDebugLog().events")
    planned = [e["details"] for e in events if e["event"] == "relay.planned"]
    assert planned and planned[0]["round"] == 1, [e["event"] for e in events]
    # Three targets, one of them fed by the coordinator itself: it sent one copy instead of three.
    assert planned[0]["targets"] == 3 and planned[0]["fromCoordinator"] == 1
    weight_bytes = coordinator.evaluate("T.api().getState().job.checkpoints[0].artifact.bytes")
    assert planned[0]["pieces"] == -(-weight_bytes // piece_size(weight_bytes)) > 3  # pieces of 64 KiB
    assert not [e for e in events if e["event"] == "relay.failed"]
    checkpoint0 = planned[0]["artifact"]
    sources = []
    for pg in participants:
        got = [e["details"] for e in pg.evaluate("T.api().getDebugLog().events") if e["event"] == "relay.received"]
        assert any(d["artifact"] == checkpoint0 for d in got), got
        sources += [d["source"] for d in got if d["artifact"] == checkpoint0]
    # A chain: one participant had the pieces from the coordinator, the two others from a participant.
    assert sorted(s == me for s in sources) == [False, False, True], (sources, me, ids)
    accepted = {e["details"]["peer"] for e in events if e["event"] == "update.accepted"}
    assert accepted == set(ids), [e for e in events if e["event"].startswith(("update", "assignment"))]
