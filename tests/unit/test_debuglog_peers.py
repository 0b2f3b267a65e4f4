"""One peer cannot flush the debug log (issue 20, finding 8): its events past a budget become one count.

The log under simulated wall time, then the coordinator's log in a real controller fed junk messages.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from weei.api import TrainingController
from weei.core.observe.debuglog import PEER_BURST, PEER_REFILL_MS, DebugLog
from weei.core.wire.commands import Send
from weei.core.wire.messages import TrainingStarted
from weei.demo.network import MemoryNetwork
from weei.demo.run import models_dir
from weei.host.memory_storage import MemoryKeyValue, MemoryStorage
from weei.host.worker_pool import ThreadWorkerPool
from weei.kernel.native import NativeKernel
from weei.runtime.wasmtime_engine import WasmtimeEngine

T0 = 1_714_564_800_000.0


def repeated(events: list[dict[str, Any]], peer: str) -> list[dict[str, Any]]:
    return [e["details"] for e in events if e["event"] == "debuglog.repeated" and e["details"]["peer"] == peer]


def test_5000_junk_events_from_one_peer_leave_the_others_history_and_a_count() -> None:
    log = DebugLog(own_peer="me")
    for i, peer in enumerate(("p1", "p2", "p3")):
        log.record(T0 + i, "invitation.accepted", {"peer": peer})
    log.record(T0 + 3, "job.started", {"round": 1})
    for i in range(5000):  # 5,000 junk messages in 5 s, the event and its details varying
        log.record(T0 + 10 + i, "message.ignored" if i % 2 else "update.rejected", {"peer": "evil", "n": i})
    log.record(T0 + 6000, "update.accepted", {"peer": "p1"})
    events = log.events()
    assert [e["details"]["peer"] for e in events if e["event"] == "invitation.accepted"] == ["p1", "p2", "p3"]
    assert events[3]["event"] == "job.started" and events[-1]["details"] == {"peer": "p1"}
    # The burst, then (at one a PEER_REFILL_MS) a few more; every other junk event is in one count.
    kept = [e for e in events if e.get("details", {}).get("peer") == "evil" and e["event"] != "debuglog.repeated"]
    [count] = repeated(events, "evil")
    assert PEER_BURST <= len(kept) <= PEER_BURST + 5000 // PEER_REFILL_MS + 1
    assert len(kept) + count["count"] == 5000
    assert sum(count["events"].values()) == count["count"] and set(count["events"]) == {"message.ignored",
                                                                                        "update.rejected"}
    assert len(events) < 5 + PEER_BURST + 5
    assert json.loads(log.to_json())["events"] == events  # stored as it reads


def test_a_quiet_peer_gets_its_budget_back_and_this_device_has_none() -> None:
    log = DebugLog(own_peer="me")
    for i in range(PEER_BURST + 10):
        log.record(T0, "peer.spoke", {"from": "p1", "i": i})
        log.record(T0, "assignment.sent", {"peer": "me", "i": i})
    assert repeated(log.events(), "p1")[0]["count"] == 10
    assert sum(e["event"] == "assignment.sent" for e in log.events()) == PEER_BURST + 10
    log.record(T0 + PEER_BURST * PEER_REFILL_MS, "peer.spoke", {"from": "p1", "i": "later"})
    assert log.events()[-1]["details"] == {"from": "p1", "i": "later"}


def test_a_flood_that_goes_on_adds_one_event_per_refill_and_keeps_one_count() -> None:
    log = DebugLog()
    log.record(T0, "job.started", {"round": 1})
    for second in range(600):  # ten minutes of ten junk events a second
        for tenth in range(10):
            log.record(T0 + second * 1000 + tenth * 100, "message.ignored", {"peer": "evil"})
    events = log.events()
    kept = sum(e["event"] == "message.ignored" for e in events)
    assert abs(kept - (PEER_BURST + 600_000 // PEER_REFILL_MS)) <= 1
    [count] = repeated(events, "evil")  # one entry, still in the log, that grew
    assert kept + count["count"] == 6000 and events[0]["event"] == "job.started"


def package(model: str) -> dict[str, Any]:
    root = models_dir() / model
    manifest = (root / "manifest.json").read_bytes()
    entries = json.loads(manifest)["inlineJson"]["dataset-manifest.json"]
    files = {e["fileName"]: (root / "data" / e["fileName"]).read_bytes() for e in entries}
    return {"wasm_name": "model.wasm", "wasm": (root / "model.wasm").read_bytes(), "manifest": manifest,
            "files": files}


def test_junk_messages_to_a_coordinator_do_not_wipe_its_debug_log() -> None:
    async def main() -> None:
        network, engine = MemoryNetwork(), WasmtimeEngine()
        c = TrainingController(my_peer_id="me", storage=MemoryStorage(), kv=MemoryKeyValue(),
                               pool=ThreadWorkerPool(engine, device_limit=1), kernel=NativeKernel(), engine=engine,
                               clock=lambda: T0, monotonic=lambda: 0.0, random_bytes=lambda n: bytes(n),
                               transport=network.transport("me"))
        network.attach(c)
        try:
            for peer in ("p1", "p2", "evil"):
                network.transport(peer)  # connected; nothing reads what they are sent
            await c.init()
            await c.create_job(**package("digits-mlp"), settings={"epochs": 1, "localEpochs": 1, "batchSize": 16,
                                                                  "coordinatorParticipates": False})
            job_id = c.get_state()["job"]["id"]
            for peer in ("p1", "p2"):
                c.invite(peer)
            await c.idle()
            for i in range(5000):  # through the wire codec, as a peer in the room sends them
                network.post("evil", Send("me", TrainingStarted(job_id, f"a{i}")), {})
            await network.inboxes["me"].join()
            await c.idle()
            events = c.get_debug_log()["events"]
            assert [e["details"]["peer"] for e in events if e["event"] == "invitation.sent"] == ["p1", "p2"]
            assert any(e["event"] == "job.created" for e in events)
            ignored = [e for e in events if e["event"] == "message.ignored"]
            assert len(ignored) == PEER_BURST and {e["details"]["peer"] for e in ignored} == {"evil"}
            [count] = repeated(events, "evil")
            assert count["count"] == 5000 - PEER_BURST and count["events"] == {"message.ignored": 5000 - PEER_BURST}
        finally:
            await network.close()

    asyncio.run(main())
