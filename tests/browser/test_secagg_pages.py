"""Secure aggregation between browsers: three pages train digits-mlp with ``privacy.secureAggregation`` on.

Each peer is its own Chromium process on the served site (signaling, WebRTC data channels): the
invitation states the privacy terms, every update leaves masked (keys, shares, masked vector, reveal)
and the coordinator writes FedAvg of the unmasked sums into the checkpoints.
"""

from __future__ import annotations

import uuid
from typing import Any

from test_api import DIGITS
from test_peers import browsers  # noqa: F401 - the fixture

PRIVACY = {"secureAggregation": True, "clip": 50, "threshold": 0.6}


def test_three_browsers_train_with_secure_aggregation(weei_server: Any, browsers: Any) -> None:  # noqa: F811
    room = "test-" + uuid.uuid4().hex[:8]
    url = f"{weei_server.url}?room={room}"
    coordinator = browsers(url)
    participants = [browsers(url), browsers(url)]
    ids = [pg.evaluate("T.api().getState().myPeerId") for pg in participants]
    coordinator.evaluate("(ids) => T.waitFor('both peers connected', "
                         "() => ids.every((id) => T.api().getState().peers.includes(id)))", ids)
    job_id = coordinator.evaluate("""async (settings) => {
      const training = T.api();
      const { wasm, manifest, files, validation } = await T.pkg('digits-mlp');
      await training.createJob({ wasm, manifest, files, validation, settings });
      for (const peerId of training.getState().peers) training.invite(peerId);
      return training.getState().job.id;
    }""", {**DIGITS, "privacy": PRIVACY})
    for pg in participants:
        entry = pg.evaluate("""(jobId) => T.waitFor('the invitation', () => {
          const found = T.api().getState().invitations.find(([id]) => id === jobId);
          return found && found[1];
        })""", job_id)
        # What the participant agrees to, computed by its own page from the invitation's settings.
        assert entry["privacy"] == {"secureAggregation": {"clip": 50, "threshold": 0.6}}
        pg.evaluate("(jobId) => T.api().decideInvitation(jobId, true)", job_id)
    coordinator.evaluate("""(ids) => T.waitFor('participants loaded the model', () => {
      const p = T.api().getState().job.participants;
      return ids.every((id) => p[id] && p[id].approved && p[id].state !== 'approved');
    }, 120000)""", ids)  # two participants' Workers start Pyodide and compile at once: slow on a loaded 2-core host
    coordinator.evaluate("""async () => {
      const training = T.api();
      await training.start();
      await T.waitFor('the job to finish', () => T.done(training.getState()), 240000);
    }""")
    state = coordinator.evaluate("T.api().getState()")
    job = state["job"]
    events = coordinator.evaluate("T.api().getDebugLog().events")
    names = [e["event"] for e in events]
    trouble = [e for e in events if e["event"] in ("update.rejected", "assignment.stopped", "round.empty",
                                                   "secagg.failed", "secagg.refused")]
    assert job["status"] == "completed" and not job["incomplete"], (job.get("error"), trouble)
    # 15 chunks of 100 examples, one pass: every chunk trained once, nothing accepted in the clear.
    assert sum(c["metrics"]["examplesProcessed"] for c in job["checkpoints"]) == 1500, trouble
    assert "update.accepted" not in names
    keyed = {e["details"]["peer"] for e in events if e["event"] == "update.keyed"}
    assert keyed == {state["myPeerId"], *ids}, (keyed, trouble)
    finished = [e["details"] for e in events if e["event"] == "secagg.finished"]
    assert len(finished) == len(job["checkpoints"]) - 1 and all(f["contributors"] for f in finished)
    accuracy = [c["validationMetrics"]["values"]["accuracy"] for c in job["checkpoints"] if "validationMetrics" in c]
    assert accuracy[-1] > 0.6, accuracy
