"""People in different browsers train one model: signaling room, invitation, WebRTC, diagnostics.

Each peer is its own Chromium process (as on different machines), on the
served site with ``?room=CODE``: the page's Python meets the others through
``weei serve``'s signaling and talks to them over WebRTC data channels.
"""

from __future__ import annotations

from typing import Any

from room_helpers import join_room
from test_api import DIGITS


def test_three_browsers_train_digits_together_and_compare_diagnostics(weei_server: Any, browsers: Any) -> None:
    room = join_room(weei_server.url, browsers, 2)
    coordinator, participants, ids = room.coordinator, room.participants, room.ids
    job_id = room.create_job("digits-mlp", {**DIGITS, "epochs": 2})

    def before_deciding(pg: Any, entry: dict[str, Any]) -> None:
        invitation = entry["invitation"]
        assert invitation["modelInfo"]["id"] == "digits-mlp" and len(invitation["module"]["sha256"]) == 64
        # Only the invitation goes out before a decision: nothing else is downloaded.
        assert pg.evaluate("T.api().getState().transfers.length") == 0

    room.accept(job_id, before_deciding)
    rows = coordinator.evaluate("""async () => {
      const training = T.api();
      // Whose live progress the coordinator hears of while they train (state.progress, by peer ID).
      window.progressSeen = new Set();
      training.subscribe((s) => Object.keys(s.progress).forEach((peer) => window.progressSeen.add(peer)));
      await training.start();
      await T.waitFor('the job to finish', () => T.done(training.getState()), 180000);
      // The spec's "Example: compare participants".
      const show = value => (value === 'unknown' || value === null ? '—' : value);
      const state = training.getState();
      return Object.entries(state.diagnostics).map(([peerId, d]) => ({
        peer: peerId,
        browser: show(d.environment.browser) + ' ' + show(d.environment.browserVersion),
        mode: show(d.execution.actual),
        model: d.model === 'unknown' ? '—' : d.model.id,
        fresh: d.stale ? 'stale ' + Math.round(d.ageMs / 1000) + ' s' : 'live',
        sequence: d.sequence,
      }));
    }""")
    state = coordinator.evaluate("T.api().getState()")
    job = state["job"]
    events = coordinator.evaluate("T.api().getDebugLog().events")
    trouble = [e for e in events if e["event"] in ("update.rejected", "assignment.stopped", "round.empty")]
    assert job["status"] == "completed" and job["progress"]["datasetEpoch"] == 2 and not job["incomplete"]
    rounds = [c["artifact"]["round"] for c in job["checkpoints"]]
    assert rounds == list(range(len(rounds))), rounds
    # Two passes over 15 chunks of 100 examples: every chunk trained exactly once per pass.
    assert sum(c["metrics"]["examplesProcessed"] for c in job["checkpoints"]) == 3000, trouble
    # 15 chunks and three training peers: 5 rounds per pass when no attempt fails (a slow machine may retry).
    assert len(rounds) == 11 or trouble, rounds
    accepted = {e["details"]["peer"] for e in events if e["event"] == "update.accepted"}
    assert accepted == {state["myPeerId"], *ids}, (accepted, trouble)
    assert all(job["participants"][peer]["state"] == "stopped" for peer in ids)  # the job finished
    assert {r["peer"] for r in rows} == {state["myPeerId"], *ids}
    # The coordinator saw the remote participants' live progress and metrics (the progress message).
    assert set(ids) <= set(coordinator.evaluate("[...window.progressSeen]")), ids
    assert set(ids) <= set(state["liveMetrics"]) and state["progress"] == {}
    assert all(r["browser"].startswith("Chrome") and r["model"] == "digits-mlp" for r in rows)
    accuracy = [c["validationMetrics"]["values"]["accuracy"] for c in job["checkpoints"] if "validationMetrics" in c]
    assert accuracy[-1] > 0.8
    for pg in participants:
        assert pg.evaluate("T.api().getState().job.role") == "participant"
