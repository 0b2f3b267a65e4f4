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

import uuid
from typing import Any

from test_peers import browsers  # noqa: F401 (the fixture: one Chromium process per page)

from weei.core.links.relay import piece_size

SETTINGS = {"epochs": 1, "localEpochs": 1, "batchSize": 8, "coordinatorParticipates": False}


def test_a_checkpoint_is_relayed_by_participants_over_webrtc(weei_server: Any, browsers: Any) -> None:  # noqa: F811
    room = "test-" + uuid.uuid4().hex[:8]
    url = f"{weei_server.url}?room={room}"
    coordinator = browsers(url)
    participants = [browsers(url) for _ in range(3)]
    ids = [pg.evaluate("T.api().getState().myPeerId") for pg in participants]
    me = coordinator.evaluate("T.api().getState().myPeerId")
    for pg in participants:  # the full mesh: every participant sees the others too
        pg.evaluate("(ids) => T.waitFor('the mesh', () => ids.every((id) => id === T.api().getState().myPeerId"
                    " || T.api().getState().peers.includes(id)), 120000)", [me, *ids])
    job_id = coordinator.evaluate("""async (settings) => {
      const training = T.api();
      const { wasm, manifest, files } = await T.pkg('byte-transformer');
      await training.createJob({ wasm, manifest, files, settings });
      for (const peerId of training.getState().peers) training.invite(peerId);
      return training.getState().job.id;
    }""", SETTINGS)
    for pg in participants:
        pg.evaluate("""(jobId) => T.waitFor('the invitation',
          () => T.api().getState().invitations.find(([id]) => id === jobId), 60000)""", job_id)
        pg.evaluate("(jobId) => T.api().decideInvitation(jobId, true)", job_id)
    coordinator.evaluate("""(ids) => T.waitFor('participants loaded the model', () => {
      const p = T.api().getState().job.participants;
      return ids.every((id) => p[id] && p[id].approved && p[id].state !== 'approved');
    }, 120000)""", ids)
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
