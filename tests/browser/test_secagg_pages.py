"""Secure aggregation between browsers: three pages train digits-mlp with ``privacy.secureAggregation`` on.

Each peer is its own Chromium process on the served site (signaling, WebRTC data channels): the
invitation states the privacy terms, every update leaves masked (keys, shares, masked vector, reveal)
and the coordinator writes FedAvg of the unmasked sums into the checkpoints.
"""

from __future__ import annotations

from typing import Any

from room_helpers import join_room
from test_api import DIGITS

PRIVACY = {"secureAggregation": True, "clip": 50, "threshold": 0.6}


def test_three_browsers_train_with_secure_aggregation(weei_server: Any, browsers: Any) -> None:
    room = join_room(weei_server.url, browsers, 2)
    coordinator, ids = room.coordinator, room.ids
    job_id = room.create_job("digits-mlp", {**DIGITS, "privacy": PRIVACY})

    def agreed_terms(_pg: Any, entry: dict[str, Any]) -> None:
        # What the participant agrees to, computed by its own page from the invitation's settings.
        assert entry["privacy"] == {"secureAggregation": {"clip": 50, "threshold": 0.6}}

    # Two participants' Workers start Pyodide and compile at once: slow on a loaded 2-core host.
    room.accept(job_id, agreed_terms, loaded_ms=120_000)
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
