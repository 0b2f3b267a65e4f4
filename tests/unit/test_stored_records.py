"""Tampered same-origin storage (issue 20, finding 7): every record read back is parsed like wire input
(api/stored.py); one that does not parse is set aside by name in the quarantine store, and the
controller starts without it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from test_controller import DIGITS_SETTINGS, controller, package

from weei.api.log_writer import DEBUG_LOG_KEY
from weei.api.stored import QUARANTINE_STORE
from weei.host.memory_storage import MemoryKeyValue, MemoryStorage

INVITATION = {"type": "invitation", "jobId": "job-1", "coordinator": "coord", "modelInfo": {"id": "m"},
              "module": {"fileName": "m.wasm", "bytes": 10, "sha256": "ab" * 32}, "dataBytes": 0, "settings": {}}


async def saved_job() -> tuple[MemoryStorage, str]:
    """Storage holding one saved, inactive job (a real record and checkpoint)."""
    storage = MemoryStorage()
    c = controller(storage)
    await c.init()
    job_id = await c.create_job(**package("digits-mlp"), settings={**DIGITS_SETTINGS, "epochs": 1})
    await c.leave()
    return storage, job_id


def tampered_job(field: str, value: Any) -> Any:
    def change(record: dict[str, Any]) -> Any:
        record[field] = value
        return record
    return change


CASES: list[tuple[str, str, Any]] = [
    ("settings", "device", {"maxLocalWorkers": "many"}),
    ("settings", "device", {"maxLocalWorkers": 4, "gpuMemoryBudgetMiB": -1}),
    ("settings", "device", {"backendPreference": ["gpu"]}),
    ("settings", "device", ["not", "an", "object"]),
    ("settings", "participation", "garbage"),
    ("settings", "participation", {"from": 5, "invitation": INVITATION}),
    ("settings", "participation", {"from": "mallory", "invitation": INVITATION}),  # not the invitation's sender
    ("settings", "participation", {"invitation": {"type": "invitation"}, "from": "coord"}),
    ("jobs", "<job>", tampered_job("updatedAt", "yesterday")),
    ("jobs", "<job>", tampered_job("modelInfo", None)),
    ("jobs", "<job>", tampered_job("participants", 7)),
    ("jobs", "<job>", tampered_job("id", "job-other")),
    # A continued job's chart history (api/metric_history.py): a point without its round, a metric not a number.
    ("jobs", "<job>", tampered_job("history", [{"metrics": {"values": {"loss": 1.0}}}])),
    ("jobs", "<job>", tampered_job("history", [{"artifact": {"round": 0}, "metrics": {"values": {"loss": "low"}}}])),
    ("jobs", "<job>", lambda record: {"id": record["id"]}),  # keys missing
    ("jobs", "<job>", lambda record: b"\x00garbage"),
]


@pytest.mark.parametrize("store,key,value", CASES)
def test_a_tampered_record_is_set_aside_by_name_and_weei_starts(store: str, key: str, value: Any) -> None:
    async def main() -> None:
        storage, job_id = await saved_job()
        if key == "<job>":
            key_ = job_id
            tampered = value(await storage.get("jobs", job_id))
        else:
            key_, tampered = key, value
        await storage.put(store, key_, tampered)
        kv = MemoryKeyValue()
        kv.set(DEBUG_LOG_KEY, "{not json")  # and the debug log in localStorage is garbage too
        c = controller(storage, kv)
        await c.init()
        state = c.get_state()  # the window's state builds
        assert f"{store}/{key_}" in state["error"]
        set_aside = [e["details"] for e in c.session.debug_log.events() if e["event"] == "storage.set-aside"]
        assert [(n["store"], n["key"], n["reason"]) for n in set_aside] == [(store, key_, "corrupt")]
        # Kept in the quarantine store with why, gone from where it was read.
        kept = await storage.get(QUARANTINE_STORE, f"{store}/{key_}")
        assert kept["reason"] == "corrupt" and kept["value"] == tampered and kept["message"]
        assert await storage.get(store, key_) is None
        if store == "jobs":  # the set-aside job's checkpoint stays, its record is not among the saved jobs
            assert [k for k in await storage.keys("checkpoints") if k.startswith(job_id)]
            assert state["savedJobs"] == []
        else:
            assert [j["id"] for j in state["savedJobs"]] == [job_id]
        if key == "device":
            assert state["maxLocalWorkers"] == c.backend.device_limit
        # And Weei works: a job can be created.
        await c.create_job(**package("digits-mlp"), settings={**DIGITS_SETTINGS, "epochs": 1})
        # A second start finds nothing left to set aside.
        again = controller(storage)
        await again.init()
        assert not [e for e in again.session.debug_log.events() if e["event"] == "storage.set-aside"]

    asyncio.run(main())


def test_valid_device_settings_are_read_back() -> None:
    async def main() -> None:
        storage = MemoryStorage()
        await storage.put("settings", "device", {"maxLocalWorkers": 3, "gpuMemoryBudgetMiB": 64,
                                                 "backendPreference": "cpu"})
        c = controller(storage)
        await c.init()
        state = c.get_state()
        assert (state["maxLocalWorkers"], state["gpuMemoryBudgetMiB"], state["backendPreference"]) == (3, 64, "cpu")
        assert "error" not in state and await storage.keys(QUARANTINE_STORE) == []

    asyncio.run(main())
