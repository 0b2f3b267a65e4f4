"""What the controller keeps in storage and in memory: each byte once, nothing after its job is gone,
and a refused write named without losing what was saved."""

from __future__ import annotations

import asyncio
import json
import time

from test_controller import (DIGITS_SETTINGS, controller, digits_validation, networked, on_network, package,
                             run_until_done)

from weei.api import TrainingController
from weei.api.log_writer import DEBUG_LOG_KEY, LOG_WRITE_MS
from weei.api.job_store import JobStore
from weei.api.ports import STORAGE_QUOTA_EXCEEDED, StorageError
from weei.core.formats.checkpoint import read_checkpoint
from weei.host.memory_storage import MemoryKeyValue, MemoryStorage
from weei.runtime.wasmtime_engine import WasmtimeEngine

CARTPOLE = {"localEpochs": 1, "batchSize": 16, "coordinatorParticipates": True,
            "experience": {"unitsPerAssignment": 1}}
STORES = ("jobs", "checkpoints", "artifacts")


async def contents(storage: MemoryStorage) -> dict[str, list[str]]:
    return {store: await storage.keys(store) for store in STORES}


def test_deleting_saved_jobs_leaves_the_stores_empty() -> None:
    async def main() -> None:
        storage = MemoryStorage()
        c = controller(storage)
        await c.init()
        jobs = []
        for model, settings, validation in [
                ("digits-mlp", {**DIGITS_SETTINGS, "epochs": 1}, digits_validation()),
                ("digits-mlp", {**DIGITS_SETTINGS, "epochs": 1}, None),  # the same files as the first job
                ("cartpole-reinforce", {**CARTPOLE, "epochs": 3}, None)]:
            jobs.append(await c.create_job(**package(model), settings=settings, validation=validation))
            await c.start()
            await run_until_done(c)
            await c.leave()
        # Each job: its record and its members entry.
        assert len(await storage.keys("jobs")) == 3 * 2 and len(await storage.keys("checkpoints")) == 16 + 16 + 4
        # The two digits jobs share their module and chunks: stored once.
        digits_files = 1 + 15 + 1  # module, chunks, validation
        cartpole_files = 1
        assert len(await storage.keys("artifacts")) == digits_files + cartpole_files
        await c.delete_saved_job(jobs[0])
        # The second digits job still names the module and chunks; only the validation file went.
        assert len(await storage.keys("artifacts")) == digits_files - 1 + cartpole_files
        for job_id in jobs[1:]:
            await c.delete_saved_job(job_id)
        assert await contents(storage) == {store: [] for store in STORES}
        assert dict(c.artifacts) == {} and c.get_state()["savedJobs"] == []

    asyncio.run(main())


def test_a_200_round_job_keeps_storage_and_memory_proportional_to_checkpoints() -> None:
    async def main() -> None:
        storage = MemoryStorage()
        c = controller(storage)
        await c.init()
        job_id = await c.create_job(**package("cartpole-reinforce"), settings={**CARTPOLE, "epochs": 200})
        held: list[int] = []
        c.subscribe(lambda _state: held.append(len(c.artifacts)))
        await c.start()
        await run_until_done(c, timeout=300)
        checkpoints = await storage.keys("checkpoints")
        assert len(checkpoints) == 201
        # The module is the one artifact; every round's weights live in its checkpoint file only.
        assert await storage.keys("artifacts") == [c.coordinator.spec.module.sha256]
        entries = [await storage.get("checkpoints", k) for k in checkpoints]
        files = sum(len(e["file"]) for e in entries)
        summaries = sum(len(json.dumps(e["summary"])) for e in entries)
        module = len(await storage.get("artifacts", c.coordinator.spec.module.sha256))
        records = storage.size("jobs") + storage.size("settings")
        assert storage.size() <= files + module + records + 2 * summaries
        # In memory: the module, the current weights and the last round's (what a retried attempt
        # may name), whatever the round: not one copy per round.
        assert max(held) <= 4, max(held)
        assert len(c.artifacts) <= 4
        assert {c.coordinator.spec.module.sha256, c.coordinator.weights_sha256} <= set(c.artifacts)
        await c.leave()
        assert dict(c.artifacts) == {}
        await c.delete_saved_job(job_id)
        assert await contents(storage) == {store: [] for store in STORES}

    asyncio.run(main())


def test_a_remote_participant_holds_only_what_the_next_rounds_may_name() -> None:
    from weei.demo.network import MemoryNetwork

    async def main(network: MemoryNetwork, engine: WasmtimeEngine) -> None:
        def make(peer: str) -> TrainingController:
            return networked(network, engine, peer)

        coordinator, helper = make("coord"), make("helper")
        for c in (coordinator, helper):
            await c.init()
        job_id = await coordinator.create_job(**package("cartpole-reinforce"),
                                              settings={**CARTPOLE, "epochs": 30,
                                                        "coordinatorParticipates": False})
        coordinator.invite("helper")
        await network.settle()
        await helper.decide_invitation(job_id, True)
        await network.settle()
        held: list[int] = []
        helper.subscribe(lambda _state: held.append(len(helper.artifacts)))
        await coordinator.start()
        await run_until_done(coordinator, timeout=120)
        await network.settle()
        assert len(coordinator.get_state()["job"]["checkpoints"]) == 31
        # Module, this round's and the last rounds' weights, its own update: not one per round.
        assert 0 < max(held) <= 6, max(held)

    on_network(main)


def test_a_refused_checkpoint_write_pauses_the_job_names_the_reason_and_keeps_what_was_saved() -> None:
    async def main() -> None:
        storage = MemoryStorage()
        kv = MemoryKeyValue()
        c = controller(storage, kv)
        await c.init()
        job_id = await c.create_job(**package("cartpole-reinforce"), settings={**CARTPOLE, "epochs": 50})
        first = (await storage.get("checkpoints", f"{job_id}/00000000"))["file"]
        # Room for about three more checkpoints.
        storage.quota_bytes = storage.size() + 3 * len(first) + 20_000
        await c.start()
        deadline = time.monotonic() + 60
        while c.get_state()["job"]["status"] == "running":
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        await c.idle()
        state = c.get_state()
        assert state["job"]["status"] == "paused"
        assert STORAGE_QUOTA_EXCEEDED in state["error"] and "checkpoint of round" in state["error"]
        refused = [e for e in c.get_debug_log()["events"] if e["event"] == "storage.refused"]
        assert refused and refused[0]["details"]["reason"] == STORAGE_QUOTA_EXCEEDED
        saved = await storage.keys("checkpoints")
        assert 2 <= len(saved) < 50
        # Every checkpoint that was saved is still whole, and the export is the last one saved.
        for key in saved:
            read_checkpoint((await storage.get("checkpoints", key))["file"])
        name, data = c.export_checkpoint()
        assert data == (await storage.get("checkpoints", saved[-1]))["file"]
        # Saved jobs show the round that can be reopened, not one that was lost.
        assert (await storage.get("jobs", job_id))["lastRound"] == int(saved[-1].rsplit("/", 1)[1])
        # A reload continues from the last checkpoint saved.
        storage.quota_bytes = None
        c2 = controller(storage, kv)
        await c2.init()
        assert c2.get_state()["job"]["checkpoints"][-1]["artifact"]["round"] == int(saved[-1].rsplit("/", 1)[1])
        await c2.leave()

    asyncio.run(main())


def test_a_refused_new_job_is_not_created_and_leaves_nothing_behind() -> None:
    async def main() -> None:
        storage = MemoryStorage(quota_bytes=50_000)  # less than the digits module and chunks
        c = controller(storage)
        await c.init()
        try:
            await c.create_job(**package("digits-mlp"), settings={**DIGITS_SETTINGS, "epochs": 1})
        except StorageError as exc:
            assert exc.reason == STORAGE_QUOTA_EXCEEDED
        else:
            raise AssertionError("the job was created beyond the quota")
        state = c.get_state()
        assert "job" not in state and STORAGE_QUOTA_EXCEEDED in state["error"]
        assert await contents(storage) == {store: [] for store in STORES}
        assert dict(c.artifacts) == {}

    asyncio.run(main())


def test_start_up_deletes_what_no_saved_job_names() -> None:
    async def main() -> None:
        storage = MemoryStorage()
        c = controller(storage)
        await c.init()
        job_id = await c.create_job(**package("cartpole-reinforce"), settings={**CARTPOLE, "epochs": 2})
        await c.leave()
        kept = await contents(storage)
        # What older versions left: every checkpoint's weights as an artifact, checkpoints of a deleted job.
        await storage.put("artifacts", "ab" * 32, b"old weights")
        await storage.put("checkpoints", "job-gone/00000003", {"summary": {}, "file": b"x"})
        store = JobStore(storage)
        assert await store.load() == 2
        assert await contents(storage) == kept and job_id in store.saved_jobs

    asyncio.run(main())


def test_the_debug_log_is_written_when_it_changed_at_most_every_two_seconds() -> None:
    async def main() -> None:
        kv = MemoryKeyValue()
        c = controller(kv=kv)
        await c.init()
        await c.create_job(**package("cartpole-reinforce"), settings={**CARTPOLE, "epochs": 30})
        await c.start()
        started = time.monotonic()
        await run_until_done(c)
        elapsed_ms = (time.monotonic() - started) * 1000
        assert kv.sets <= 2 + elapsed_ms / LOG_WRITE_MS, (kv.sets, elapsed_ms)
        await asyncio.sleep(LOG_WRITE_MS / 1000 + 0.2)  # the trailing write
        writes = kv.sets
        assert json.loads(kv.values[DEBUG_LOG_KEY])["events"] == c.get_debug_log()["events"]
        for _ in range(5):
            await c._drain()  # nothing new in the log: nothing written
        assert kv.sets == writes
        c.clear_debug_log()  # written at once
        assert kv.sets == writes + 1 and json.loads(kv.values[DEBUG_LOG_KEY])["events"] == []

    asyncio.run(main())


class _KeyedPuts(MemoryStorage):
    """Counts the writes of each key."""

    def __init__(self) -> None:
        super().__init__()
        self.by_key: dict[tuple[str, str], int] = {}

    async def put(self, store: str, key: str, value: object) -> None:
        await super().put(store, key, value)
        self.by_key[(store, key)] = self.by_key.get((store, key), 0) + 1


def test_peers_coming_and_going_rewrite_the_members_entry_not_the_record_and_its_chunks() -> None:
    """Issue 22 (1,000 Flower clients): a join rewrote the whole record, chunk list included,
    so keeping a job of N peers cost O(N x chunks). Now it writes the small members entry; a reload
    reads both back as one record."""
    from sim import Sim, dataset_spec

    from weei.api.job_store import members_key

    spec, store = dataset_spec(200)
    sim = Sim.create(spec, store)
    storage = _KeyedPuts()
    jobs = JobStore(storage)
    job_id = spec.job_id

    async def save() -> None:
        await jobs.save_job_record(sim.coordinator, job_seed=None, validation_sha256=None, now=sim.now)

    async def main() -> dict[str, object]:
        await save()
        for n in range(12):
            sim.join(f"p{n}")
            await save()
        page = JobStore(storage)  # the reloaded page
        await page.load()
        return page.saved_jobs[job_id]

    reloaded = asyncio.run(main())
    assert storage.by_key[("jobs", job_id)] == 1
    assert storage.by_key[("jobs", members_key(job_id))] == 1 + 12
    assert reloaded["participants"] == sorted(f"p{n}" for n in range(12))
    assert reloaded == jobs.saved_jobs[job_id] and len(reloaded["chunks"]) == 200


def test_an_older_record_with_its_members_inside_loads_and_a_damaged_members_entry_is_set_aside() -> None:
    from sim import Sim, dataset_spec

    from weei.api.job_store import members_key

    spec, store = dataset_spec(4)
    sim = Sim.create(spec, store)
    for peer in ("p1", "p2"):
        sim.join(peer)
    job_id = spec.job_id

    async def main() -> tuple[dict[str, object], dict[str, object], list[str], list[str]]:
        storage = MemoryStorage()
        writer = JobStore(storage)
        await writer.save_job_record(sim.coordinator, job_seed=None, validation_sha256=None, now=sim.now)
        record, members = await storage.get("jobs", job_id), await storage.get("jobs", members_key(job_id))
        # As an older version wrote it: one record, its members inside.
        await storage.delete("jobs", members_key(job_id))
        await storage.put("jobs", job_id, {**record, **members})
        older = JobStore(storage)
        await older.load()
        # A members entry that does not parse: set aside by name; the record (and what it says) stands.
        await storage.put("jobs", members_key(job_id), {"participants": "p1,p2"})
        damaged = JobStore(storage)
        await damaged.load()
        # A members entry whose record is gone (a page closed between two writes) is deleted at start-up.
        await storage.put("jobs", members_key("job-gone"), members)
        again = JobStore(storage)
        await again.load()
        return (older.saved_jobs[job_id], damaged.saved_jobs[job_id],
                [e["key"] for e in damaged.set_aside_now], await storage.keys("jobs"))

    older, damaged, set_aside, keys = asyncio.run(main())
    assert older["participants"] == damaged["participants"] == ["p1", "p2"]
    assert set_aside == [members_key(job_id)]
    assert keys == [job_id]
