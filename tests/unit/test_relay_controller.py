"""The checkpoint relay through the real controllers (in-memory network, wasmtime Workers).

A coordinator and three participants train digits-mlp; the coordinator's
relay threshold and piece size are lowered so its 19 kB checkpoint is
relayed in pieces. Every round's checkpoint must then reach the three
participants with one copy from the coordinator, the rest relayed by the
participants, and the job must complete as it does without the relay.
"""

from __future__ import annotations

from collections import Counter
from typing import Mapping

from weei.api import TrainingController
from weei.core.wire.commands import Send
from weei.core.wire.messages import Assign
from weei.core.wire.messages import RelayPiece
from weei.demo.network import MemoryNetwork
from weei.runtime.wasmtime_engine import WasmtimeEngine

from test_controller import networked, on_network, package, run_until_done

SETTINGS = {"epochs": 1, "localEpochs": 1, "batchSize": 16, "coordinatorParticipates": False}
HELPERS = ("h1", "h2", "h3")


def test_participants_relay_each_checkpoint_to_each_other() -> None:
    async def main(network: MemoryNetwork, engine: WasmtimeEngine) -> None:
        sent: Counter[tuple[str, str]] = Counter()  # (sender, what) -> checkpoint bytes
        types: Counter[str] = Counter()
        post = network.post

        def counting(src: str, send: Send, blobs: Mapping[str, bytes]) -> None:
            types[send.message.TYPE] += 1
            if isinstance(send.message, RelayPiece):
                sent[src, "piece"] += send.message.data.bytes
            if isinstance(send.message, Assign) and send.message.checkpoint.sha256 in blobs:
                sent[src, "assign"] += send.message.checkpoint.bytes
            post(src, send, blobs)

        network.post = counting  # type: ignore[method-assign]

        def make(peer: str) -> TrainingController:
            return networked(network, engine, peer)

        coordinator = make("coord")
        helpers = [make(p) for p in HELPERS]
        for c in (coordinator, *helpers):
            await c.init()
        job_id = await coordinator.create_job(**package("digits-mlp"), settings=SETTINGS)
        machine = coordinator.coordinator
        assert machine is not None
        machine.relays.min_relay_bytes, machine.relays.piece_bytes = 1, 4096
        for peer in HELPERS:
            coordinator.invite(peer)
        await network.settle()
        for helper in helpers:
            await helper.decide_invitation(job_id, True)
        await network.settle()
        await coordinator.start()
        await run_until_done(coordinator, timeout=120)
        await network.settle()
        state = coordinator.get_state()
        rounds = len(state["job"]["checkpoints"]) - 1
        weights = machine.spec.weight_bytes
        assert rounds >= 2 and not network.refused and network.lost == 0
        assert types["relayPlan"] > 0 and types["relayDone"] == types["relayPlan"]
        # Each round's checkpoint: one copy from the coordinator, two relayed (a chain h -> h -> h).
        relayed_rounds = types["relayPlan"] // 3
        assert sent["coord", "piece"] == relayed_rounds * weights
        assert sum(n for (src, what), n in sent.items() if src != "coord") == 2 * relayed_rounds * weights
        assert sent["coord", "assign"] == 0  # every Assign named the relayed checkpoint as held
        # Every accepted update trained from the checkpoint it was relayed.
        assert all(r["state"] != "failed" for r in state["job"]["participants"].values())
        log = [e["event"] for e in coordinator.get_debug_log()["events"]]
        assert "relay.failed" not in log
        for helper in helpers:
            assert helper.get_state()["job"]["status"] in ("completed", "running")

    on_network(main)
