"""A round is an object the coordinator composes (issue 21, section 2): commands only append, a round
keeps the settings it opened with, and the job is transitioning from a round's last update to its save.

Coordinator and participants in memory under simulated time (tests/unit/sim.py).
"""

from __future__ import annotations

from typing import Any

from sim import Sim, dataset_spec

from weei.core.formats.settings import TrainingSettings
from weei.core.wire.commands import Outbox, RoundPhase, SaveCheckpoint, Send
from weei.core.wire.messages import Assign

PEERS = ("p1", "p2", "p3")


def waiting_sim(**settings: Any) -> Sim:
    """Three participants; each round waits for ``sim.finish()``."""
    spec, store = dataset_spec(6, settings={"epochs": 2, "localEpochs": 1, "batchSize": 4,
                                            "coordinatorParticipates": False, **settings})
    sim = Sim.create(spec, store)
    sim.auto_train = False
    for peer in PEERS:
        sim.join(peer)
    return sim


def test_the_command_list_only_appends_and_a_round_saves_after_the_next_rounds_work() -> None:
    box = Outbox()
    for rewrite in ("insert", "__setitem__", "__delitem__", "pop", "remove", "sort", "reverse", "clear"):
        assert not hasattr(box, rewrite), rewrite
    sim = waiting_sim()
    c = sim.coordinator
    assert isinstance(c._commands, Outbox)
    c.start(sim.now)
    sim.pump()
    # Round 1's last update: its checkpoint and round 2's work come out of one call, in that order.
    taken: list[Any] = []
    real = c.take_commands
    c.take_commands = lambda: (taken.extend(out := real()), out)[1]  # type: ignore[method-assign]
    sim.finish()
    saves = [i for i, cmd in enumerate(taken) if isinstance(cmd, SaveCheckpoint)]
    assigns = [i for i, cmd in enumerate(taken) if isinstance(cmd, Send) and isinstance(cmd.message, Assign)
               and cmd.message.round == 2]
    assert [taken[i].round for i in saves] == [1] and len(assigns) == len(PEERS)
    assert max(assigns) < saves[0]


def test_transitioning_from_the_rounds_last_update_until_its_checkpoint_goes_to_be_saved() -> None:
    sim = waiting_sim()
    c = sim.coordinator
    seen: list[tuple[int, bool, int, int]] = []
    c.closing_sink = lambda round_: seen.append((round_, c.transitioning, c.checkpoint_round, len(sim.saved)))
    c.start(sim.now)
    sim.pump()
    assert not c.transitioning
    sim.finish([0, 1])
    assert not c.transitioning and not seen  # one update still out: training, not averaging
    sim.finish()
    # Told before the averaging: transitioning, nothing of round 1 written down or saved yet.
    assert seen == [(1, True, 0, 1)]
    assert c.checkpoint_round == 1 and sim.rounds == [0, 1] and not c.transitioning


def test_settings_changed_mid_round_apply_from_the_next_round() -> None:
    sim = waiting_sim()
    c = sim.coordinator
    c.start(sim.now)
    sim.pump()
    new = TrainingSettings.from_json({**c.spec.settings.to_json(),
                                      "aggregation": {"method": "fedavgm", "momentum": 0.5}})
    c.update_settings(new, sim.now)
    sim.finish()
    # Round 1 opened under FedAvg: it averages, and its checkpoint records, FedAvg.
    ck1 = sim.checkpoint(1).metadata.to_json()
    assert ck1["settings"].get("aggregation", {"method": "fedavg"}) == {"method": "fedavg"}
    assert "aggregationState" not in ck1
    assert [p.name for p in sim.phases if isinstance(p, RoundPhase) and p.round == 1][-1] == "fedavg"
    sim.finish()
    ck2 = sim.checkpoint(2).metadata.to_json()
    assert ck2["settings"]["aggregation"] == {"method": "fedavgm", "momentum": 0.5}
    assert ck2["aggregationState"]["method"] == "fedavgm" and ck2["aggregationState"]["step"] == 1


def test_subscribers_see_transitioning_while_a_rounds_updates_are_averaged() -> None:
    """The host publishes the closing round before its averaging starts (the spec: ``transitioning``, "the
    coordinator is averaging updates into a checkpoint"), not only once the checkpoint is being written."""
    import asyncio

    from test_controller import DIGITS_SETTINGS, controller, digits_validation, package, run_until_done

    async def main() -> None:
        c = controller()
        await c.init()
        await c.create_job(**package("digits-mlp"), settings={**DIGITS_SETTINGS, "epochs": 1},
                           validation=digits_validation())
        await c.idle()  # checkpoint 0 written
        states: list[dict[str, Any]] = []
        stop = c.subscribe(states.append)
        await c.start()
        await run_until_done(c)
        stop()
        first = next(s for s in states if s["transitioning"])
        # Round 1 closing: its checkpoint is not made yet, the job shows only checkpoint 0.
        assert [cp["artifact"]["round"] for cp in first["job"]["checkpoints"]] == [0]

    asyncio.run(main())
