"""Stop stops: a Worker task is interrupted at once, and the next one trains (real wasmtime, digits-mlp).

localEpochs 10^6 makes one chunk take hours, so every test here would hang
(or time out) if a cancellation did not interrupt the model mid-call.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from test_controller import DIGITS_SETTINGS, controller, on_network, package, run_until_done
from weei.api.ports import TaskCancelled, WorkerTask
from weei.core.errors import ModelError
from weei.demo.run import models_dir
from weei.host.worker_pool import ThreadWorkerPool
from weei.runtime import Interrupted, Interruptible, ModelRuntime
from weei.runtime.wasmtime_engine import WasmtimeEngine

DIGITS = models_dir() / "digits-mlp"
NO_VALIDATION = {"enabled": False, "unit": "epoch", "every": 1}
ENDLESS = {"localEpochs": 10**6, "batchSize": 16, "learningRate": 0.05}
#: "At once": an interrupted task ends within this, where an uninterrupted one would run for hours. Quiet it
#: takes milliseconds; the bound is generous because a loaded 2-core machine delays the threads that
#: deliver the interrupt, not because cancelling may be slow.
PROMPT_S = 5.0


def digits() -> tuple[bytes, bytes]:
    """The module and one chunk of digits-mlp."""
    wasm = (DIGITS / "model.wasm").read_bytes()
    chunk = next(p for p in sorted((DIGITS / "data").iterdir()) if p.name != "validation.bin").read_bytes()
    return wasm, chunk


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_interrupt_stops_a_running_train_call_and_the_engine_trains_again() -> None:
    wasm, chunk = digits()
    engine = WasmtimeEngine()
    assert isinstance(engine, Interruptible)
    progress: list[Any] = []
    runtime = ModelRuntime.load(wasm, engine, on_progress=progress.append)
    weights = runtime.create_initial_weights(1)
    runtime.load_model(weights)
    failure: list[BaseException] = []

    def train() -> None:
        try:
            runtime.train(data=chunk, format=runtime.model_info()["dataFormats"][0]["id"], seed=2, settings=ENDLESS)
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            failure.append(exc)

    thread = threading.Thread(target=train)
    thread.start()
    wait_for(lambda: progress, 30, "the first progress report")
    started = time.monotonic()
    engine.interrupt("cancelled")
    thread.join(PROMPT_S)
    assert not thread.is_alive() and time.monotonic() - started < PROMPT_S
    [error] = failure
    assert isinstance(error, ModelError) and error.reason == "cancelled"
    assert runtime.broken is not None  # mid-operation: the instance is not called again
    with pytest.raises(ModelError) as refused:
        runtime.load_model(weights)
    assert refused.value.reason == "instance-broken"

    # Until resume(), new calls are refused before they start; then the same engine trains.
    with pytest.raises(ModelError) as early:
        ModelRuntime.load(wasm, engine).create_initial_weights(1)
    assert early.value.reason == "cancelled"
    engine.resume()
    again = ModelRuntime.load(wasm, engine)
    again.load_model(weights)
    fmt = again.model_info()["dataFormats"][0]["id"]
    result = again.train(data=chunk, format=fmt, seed=2, settings={"localEpochs": 1, "batchSize": 16})
    assert len(result.weights) == len(weights) and result.weights != weights


def test_interrupt_of_one_engine_leaves_a_fork_alone() -> None:
    engine = WasmtimeEngine()
    fork = engine.fork()
    engine.interrupt("cancelled")
    wasm, _ = digits()
    assert len(ModelRuntime.load(wasm, fork).create_initial_weights(3)) > 0
    with pytest.raises(ModelError):
        ModelRuntime.load(wasm, engine).create_initial_weights(3)


def test_an_interrupted_instance_raises_the_named_engine_error() -> None:
    engine = WasmtimeEngine()
    wasm, _ = digits()
    instance = engine.compile(wasm).instantiate(lambda _p, _n: None)
    engine.interrupt("deadline")
    with pytest.raises(Interrupted) as caught:
        instance.call("resultLength")
    assert caught.value.reason == "deadline"


def test_pool_cancel_interrupts_the_running_task_and_the_worker_trains_the_next() -> None:
    async def main() -> None:
        wasm, chunk = digits()
        pool = ThreadWorkerPool(WasmtimeEngine(), 2)
        init = ModelRuntime.load(wasm, WasmtimeEngine())
        weights = init.create_initial_weights(5)
        fmt = init.model_info()["dataFormats"][0]["id"]
        reports: list[dict[str, Any]] = []
        endless = WorkerTask("train", weights, {}, data=chunk, format=fmt, seed=1, settings=ENDLESS)
        running = asyncio.ensure_future(pool.run(0, "digits", wasm, endless, lambda _i, p: reports.append(p),
                                                 tag="old"))
        # Queued behind it on the same Worker: cancelled without running.
        queued = asyncio.ensure_future(pool.run(0, "digits", wasm, endless, tag="old"))
        other = asyncio.ensure_future(pool.run(1, "digits", wasm, WorkerTask(
            "train", weights, {}, data=chunk, format=fmt, seed=1, settings={"localEpochs": 1, "batchSize": 16}),
            tag="other"))
        while not reports:
            await asyncio.sleep(0.01)
        # The endless task runs; the other tag's one-epoch task may already be done (a module compiled once per
        # process loads in under a millisecond), so only the first is sure to be active.
        assert pool.active >= 1
        started = time.monotonic()
        assert pool.cancel("old") == 2
        for task in (running, queued):
            with pytest.raises(TaskCancelled) as caught:
                await asyncio.wait_for(task, PROMPT_S)
            assert caught.value.reason == "cancelled"
        assert time.monotonic() - started < PROMPT_S
        seen = len(reports)
        # Another tag's task is untouched.
        assert (await other).weights is not None
        # The Worker is reused: the next task trains, and no report of the old one arrives.
        quick = WorkerTask("train", weights, {}, data=chunk, format=fmt, seed=1,
                           settings={"localEpochs": 1, "batchSize": 16})
        fresh: list[dict[str, Any]] = []
        result = await asyncio.wait_for(pool.run(0, "digits", wasm, quick, lambda _i, p: fresh.append(p)), 30)
        assert result.weights is not None and len(result.weights) == len(weights) and result.count > 0
        assert len(reports) == seen and fresh and pool.active == 0
        assert pool.cancel() == 0  # nothing runs

    asyncio.run(main())


def test_stop_interrupts_the_local_training_and_the_next_job_trains_at_once() -> None:
    async def main() -> None:
        c = controller()
        await c.init()
        await c.create_job(**package("digits-mlp"), settings={**DIGITS_SETTINGS, "localEpochs": 10**6,
                                                              "validationSchedule": NO_VALIDATION})
        await c.start()
        deadline = time.monotonic() + 30
        while "me" not in c.get_state()["progress"]:
            assert time.monotonic() < deadline, "the endless job never reported progress"
            await asyncio.sleep(0.01)
        old_job = c.get_state()["job"]["id"]
        started = time.monotonic()
        await c.stop()
        assert c.get_state()["progress"] == {}
        await asyncio.wait_for(c.idle(), PROMPT_S)  # the training task ended: it was interrupted
        assert time.monotonic() - started < PROMPT_S and c.pool.active == 0
        assert c.get_state()["job"]["status"] == "completed"

        await c.create_job(**package("digits-mlp"), settings={**DIGITS_SETTINGS, "epochs": 1,
                                                              "validationSchedule": NO_VALIDATION})
        new_job = c.get_state()["job"]["id"]
        assert new_job != old_job
        await c.start()
        await run_until_done(c, timeout=60)
        assert len(c.get_state()["job"]["checkpoints"]) == 16
        assert c.get_state().get("error") is None

    asyncio.run(main())


def test_leave_interrupts_the_local_training() -> None:
    async def main() -> None:
        c = controller()
        await c.init()
        await c.create_job(**package("digits-mlp"), settings={**DIGITS_SETTINGS, "localEpochs": 10**6})
        await c.start()
        deadline = time.monotonic() + 30
        while not c.pool.active:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        await c.leave()
        await asyncio.wait_for(c.idle(), 2)
        assert c.pool.active == 0 and "job" not in c.get_state()

    asyncio.run(main())


@pytest.mark.parametrize("how", ["stop", "coordinator-lost"])
def test_a_remote_participant_stops_training_an_attempt_it_no_longer_holds(how: str) -> None:
    """The participant's state machine drops the attempt (JobFinished, or its coordinator is gone):
    the Worker's task ends at once and its progress leaves the state."""
    from weei.demo.network import MemoryNetwork
    from weei.demo.run import _controller

    async def main(network: MemoryNetwork, engine: WasmtimeEngine) -> None:
        coordinator, peer = _controller("coordinator", network, engine), _controller("peer-1", network, engine)
        for c in (coordinator, peer):
            await c.init()
        job_id = await coordinator.create_job(**package("digits-mlp"), settings={
            **DIGITS_SETTINGS, "localEpochs": 10**6, "coordinatorParticipates": False,
            "validationSchedule": NO_VALIDATION})
        coordinator.invite("peer-1")
        await network.settle()
        await peer.decide_invitation(job_id, True)
        await network.settle()
        await coordinator.start()
        deadline = time.monotonic() + 30
        while "peer-1" not in peer.get_state()["progress"]:
            assert time.monotonic() < deadline, "the peer never trained"
            await asyncio.sleep(0.01)
        started = time.monotonic()
        if how == "stop":
            await coordinator.stop()
            await network.settle()
        else:
            await peer.peer_disconnected("coordinator")
        await asyncio.wait_for(peer.idle(), PROMPT_S)
        assert time.monotonic() - started < PROMPT_S and peer.pool.active == 0
        assert peer.get_state()["progress"] == {}

    on_network(main)
