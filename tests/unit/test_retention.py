"""Checkpoint retention and storage use (issue 24, item 15): the newest N files and the best are kept, every
round's summary stays (the charts' history), and a reopened job keeps both."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from test_controller import DIGITS_SETTINGS, controller, models_dir, package

from weei.api.retention import best_round, rounds_to_keep
from weei.core.errors import UsageError
from weei.host.memory_storage import MemoryStorage


def _summary(round_: int, loss: float | None = None, val: float | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"artifact": {"round": round_}}
    if loss is not None:
        out["metrics"] = {"values": {"loss": loss}}
    if val is not None:
        out["validationMetrics"] = {"values": {"loss": val}}
    return out


def test_the_rule_keeps_the_newest_the_best_and_the_pinned() -> None:
    summaries = [_summary(0), _summary(1, 2.0, 1.5), _summary(2, 1.0, 0.4), _summary(3, 0.5), _summary(4, 0.6, 0.9),
                 _summary(5, 0.7), _summary(6, 0.8)]
    # Validation values decide the best when any round has one (round 2), else training values.
    assert best_round(summaries, "loss", "minimize") == 2
    assert best_round([_summary(1, 2.0), _summary(2, 1.0)], "loss", "maximize") == 1
    assert best_round([_summary(0)], "loss", "minimize") is None
    assert rounds_to_keep(summaries, keep_last=2, metric="loss", direction="minimize", pinned=[0]) == {0, 2, 5, 6}
    assert rounds_to_keep(summaries, keep_last=0, metric="loss", direction="minimize", pinned=[]) == set(range(7))


def test_a_job_keeps_few_files_all_its_history_and_reopens() -> None:
    async def main() -> None:
        storage = MemoryStorage()
        c = controller(storage)
        c.retention.keep_last = 0
        await c.init()
        await c.set_checkpoint_retention(2)
        for bad in (-1, 1.5, True, "3"):
            with pytest.raises(UsageError):
                await c.set_checkpoint_retention(bad)  # type: ignore[arg-type]
        validation = (models_dir() / "digits-mlp" / "data" / "validation.bin").read_bytes()
        settings = {**DIGITS_SETTINGS, "epochs": 2, "validationSchedule": {"enabled": True, "unit": "round", "every": 1}}
        job_id = await c.create_job(**package("digits-mlp"), settings=settings, validation=("validation.bin", validation))
        await c.start()
        for _ in range(1200):
            s = c.get_state()
            if s["job"]["status"] == "completed" and not s["evaluating"] and not s["transitioning"]:
                break
            await asyncio.sleep(0.1)
        await c.idle()
        rounds = [cp["artifact"]["round"] for cp in c.get_state()["job"]["checkpoints"]]
        assert len(rounds) > 5 and rounds == list(range(len(rounds))), "every round's summary stays"
        kept = {int(k.rsplit("/", 1)[1]) for k in await storage.keys("checkpoints")
                if (await storage.get("checkpoints", k))["file"]}
        use = await c.storage_use()
        assert use["jobs"][job_id]["files"] == len(kept) and use["jobs"][job_id]["checkpoints"] == len(rounds)
        assert use["jobs"][job_id]["artifactBytes"] > len(validation) and use["totalBytes"] > 0
        assert rounds[-1] in kept and rounds[-2] in kept and len(kept) <= 4, kept  # newest 2, best, round 0 (initial)
        shown = {cp["artifact"]["round"] for cp in c.get_state()["job"]["checkpoints"] if cp.get("fileKept") is not False}
        assert shown == kept
        assert c.export_checkpoint()[0].endswith(".weei-checkpoint")
        # A reopened job has the whole history and the same kept files.
        again = controller(storage)
        await again.init()
        if (again.get_state().get("job") or {}).get("id") != job_id:  # init reopens the last active job itself
            await again.open_saved_job(job_id)
        assert [cp["artifact"]["round"] for cp in again.get_state()["job"]["checkpoints"]] == rounds
        assert again.get_state()["checkpointRetention"] == {"keepLast": 2, "keepBest": True}

    asyncio.run(main())
