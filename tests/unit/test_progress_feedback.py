"""What the window's progress is built from: totals that count every local epoch, an estimate for
experience jobs, slots that say their units, and the settings review through the controller."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from weei.core.errors import SettingsError
from weei.core.observe.live_progress import LiveProgress
from weei.demo.network import MemoryNetwork
from weei.runtime import progress_reports
from weei.runtime.wasmtime_engine import WasmtimeEngine

sys.path.insert(0, str(Path(__file__).parent))
from test_controller import DIGITS_SETTINGS, digits_validation, on_network, package  # noqa: E402
from test_live_progress import _make  # noqa: E402


async def _run(c: Any) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    await c.start()
    while (state := c.get_state())["job"]["status"] != "completed":
        seen.append(state)
        await asyncio.sleep(0.002)
    await c.idle()
    return seen


def test_progress_counts_every_local_epoch(monkeypatch: pytest.MonkeyPatch) -> None:
    """A chunk of 100 examples trained 3 local epochs is 300 examples of work: never "300 / 100".

    Every report is parsed here (the pool's runtimes would otherwise hand on one per 20 ms, and a
    chunk trains in a few ms: progress past the first epoch would then show only in the last report,
    just before the update)."""
    monkeypatch.setattr(progress_reports, "PARSE_INTERVAL_S", 0.0)
    # Every report the state's progress is made of (polling the state alone can miss the later
    # epochs on a loaded machine: a chunk trains in a few ms).
    recorded: list[tuple[int, int | None]] = []
    report = LiveProgress.report

    def recording(self: LiveProgress, peer: str, processed: int, total: int | None, *args: Any, **kwargs: Any) -> bool:
        if peer == "me":
            recorded.append((processed, total))
        return report(self, peer, processed, total, *args, **kwargs)

    monkeypatch.setattr(LiveProgress, "report", recording)

    async def main(network: MemoryNetwork, engine: WasmtimeEngine) -> None:
        c = _make(network, engine, "me")
        await c.init()
        files = package("digits-mlp")
        assert "estimatedMs" not in c.review_settings(DIGITS_SETTINGS, json.loads(files["manifest"]))
        await c.create_job(**files, settings={**DIGITS_SETTINGS, "epochs": 1, "localEpochs": 3})
        seen = await _run(c)
        # The next job of this model is estimated at the speed this device measured.
        review = c.review_settings({**DIGITS_SETTINGS, "epochs": 4}, json.loads(files["manifest"]))
        assert review["estimatedMs"] > 0 and review["work"] == 4 * 1500
        assert any(w["message"].startswith("about ") for w in review["warnings"])
        mine = [s["progress"]["me"] for s in seen if "me" in s["progress"]]
        assert mine and all(p["totalExamples"] == 300 for p in mine), mine[:3]
        assert all(p["processedExamples"] <= p["totalExamples"] for p in mine)
        assert recorded and all(total == 300 and processed <= 300 for processed, total in recorded), recorded[:3]
        assert max(processed for processed, _ in recorded) > 100

    on_network(main)


def test_an_experience_job_has_an_estimate_and_slots_name_their_units() -> None:
    async def main(network: MemoryNetwork, engine: WasmtimeEngine) -> None:
        c = _make(network, engine, "me")
        await c.init()
        await c.create_job(**package("cartpole-reinforce"),
                           settings={"epochs": 6, "localEpochs": 1, "batchSize": 16, "coordinatorParticipates": True,
                                     "experience": {"unitsPerAssignment": 32}})
        seen = await _run(c)
        slots = [slot for s in seen for slot in s["job"]["slots"]]
        assert slots and all(slot["units"]["count"] == 32 and slot["chunkId"] == f"units-{slot['units']['start']}"
                             for slot in slots)
        estimates = [s["estimatedRemainingMs"] for s in seen if "estimatedRemainingMs" in s]
        assert estimates and all(e >= 0 for e in estimates)
        assert "estimatedRemainingMs" not in c.get_state()  # completed: nothing left

    on_network(main)


def test_review_settings_through_the_controller() -> None:
    async def main(network: MemoryNetwork, engine: WasmtimeEngine) -> None:
        c = _make(network, engine, "me")
        await c.init()
        files = package("digits-mlp")
        review = c.review_settings({**DIGITS_SETTINGS, "batchSize": 10**9}, json.loads(files["manifest"]))
        assert review["needsConfirmation"] and [w["field"] for w in review["warnings"]] == ["batchSize"]
        assert review["work"] == 2 * 1500
        with pytest.raises(SettingsError) as err:
            c.review_settings({**DIGITS_SETTINGS, "localEpochs": 0})
        assert err.value.field == "localEpochs"
        await c.create_job(**files, settings=DIGITS_SETTINGS)
        # The active job's facts when no manifest is given.
        assert c.review_settings({**DIGITS_SETTINGS, "epochs": 10**9})["needsConfirmation"]
        assert not c.review_settings(DIGITS_SETTINGS)["needsConfirmation"]

    on_network(main)


def test_a_participant_lists_the_jobs_checkpoints_and_ends_completed() -> None:
    """The coordinator's checkpoint notes fill the participant's job.checkpoints (charts, checkpoint list)."""
    async def main(network: MemoryNetwork, engine: WasmtimeEngine) -> None:
        coordinator, helper = _make(network, engine, "coord"), _make(network, engine, "helper")
        for c in (coordinator, helper):
            await c.init()
        settings = {**DIGITS_SETTINGS, "epochs": 1, "coordinatorParticipates": False, "workers": 1}
        job_id = await coordinator.create_job(**package("digits-mlp"), settings=settings,
                                              validation=digits_validation())
        coordinator.invite("helper")
        await network.settle()
        await helper.decide_invitation(job_id, True)
        await network.settle()
        await _run(coordinator)
        await network.settle()
        await coordinator.idle()
        await network.settle()
        theirs = coordinator.get_state()["job"]["checkpoints"]
        mine = helper.get_state()["job"]
        assert mine["status"] == "completed" and mine["role"] == "participant"
        assert [c["artifact"] for c in mine["checkpoints"]] == [c["artifact"] for c in theirs]
        assert [c["metrics"] for c in mine["checkpoints"]] == [c["metrics"] for c in theirs]
        validated = [c for c in mine["checkpoints"] if "validationMetrics" in c]
        assert validated and validated[-1]["validationMetrics"] == theirs[-1]["validationMetrics"]
        assert network.refused == []

    on_network(main)


def test_a_hostile_checkpoint_note_is_refused_by_name() -> None:
    from weei.core.wire.messages import CheckpointNote, MessageError, decode_message, encode_message

    good = encode_message(CheckpointNote("j", 1, "a" * 64, 4, "f", 10, {"loss": 1.0}, 5.0))
    assert decode_message(dict(good)) == decode_message(good)
    for change, reason in [({"round": -1}, "bad-field"), ({"sha256": "x"}, "bad-field"),
                           ({"metrics": {"loss": "NaN"}}, "non-finite-metric"), ({"createdAt": "now"}, "bad-field"),
                           ({"validationError": "e" * 5000}, "bad-field"), ({"fileName": None}, "bad-field")]:
        with pytest.raises(MessageError) as err:
            decode_message({**good, **change})
        assert err.value.reason == reason, (change, err.value)
