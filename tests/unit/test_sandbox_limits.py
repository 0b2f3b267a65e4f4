"""A model module's memory and time come from its package and the device's pace (weei.runtime.sandbox).

Memory: estimatedWorkingBytes + inputs + headroom, up to the device's cap;
a declared minimum above it is refused by name before instantiation, and
the browser's copy of the module declares the limit as its maximum. Time:
units × measured seconds per unit × a factor, within a floor and a ceiling,
measured with a simulated clock here (no wall-clock assertions on it).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import wasmtime
from test_cancel import ENDLESS, digits
from test_runtime import wat_module

from weei.api.local_training import LocalWorkers
from weei.api.ports import WorkerTask
from weei.runtime import sandbox
from weei.core.errors import ModelError, WeeiError
from weei.demo.run import models_dir
from weei.host.worker_pool import ThreadWorkerPool
from weei.kernel.numpy_kernel import NumpyKernel
from weei.runtime import ModelRuntime
from weei.runtime.wasmtime_engine import WasmtimeEngine

MiB = 1 << 20
PAGE = sandbox.PAGE


# -- the rules -------------------------------------------------------------------


def test_memory_limit_is_the_estimate_plus_inputs_plus_headroom_within_the_device_cap() -> None:
    assert sandbox.memory_limit(4 * MiB, 1 * MiB, 1 << 30) == 69 * MiB  # 5 MiB + 64 MiB headroom
    assert sandbox.memory_limit(200 * MiB, 56 * MiB, 1 << 30) == 384 * MiB  # headroom: half of 256 MiB
    assert sandbox.memory_limit(800 * MiB, 0, 1 << 30) == 1 << 30  # 1200 MiB wanted: the cap wins
    assert sandbox.memory_limit(None, 10 * MiB, 512 * MiB) == 512 * MiB  # no estimate: the cap, as before
    assert sandbox.memory_limit(1000, 3, 1 << 30) % PAGE == 0
    with pytest.raises(ModelError) as err:
        sandbox.memory_limit(900 * MiB, 200 * MiB, 1 << 30)
    assert err.value.reason == "memory-over-limit"


def test_operation_deadline_is_units_times_pace_times_factor_within_floor_and_ceiling() -> None:
    assert sandbox.operation_deadline_s(1000, None) == sandbox.DEADLINE_CEILING_S  # nothing measured yet
    assert sandbox.operation_deadline_s(1000, 0.02) == 1000 * 0.02 * sandbox.DEADLINE_FACTOR
    assert sandbox.operation_deadline_s(10, 0.001) == sandbox.DEADLINE_FLOOR_S
    assert sandbox.operation_deadline_s(10**6, 0.01) == sandbox.DEADLINE_CEILING_S
    meter = sandbox.SpeedMeter()
    meter.observe("train", 100, 2.0)
    meter.observe("train", 100, 1.0)  # a faster task never shortens the next deadline
    meter.observe("train", 0, 50.0)  # nothing to learn from
    assert meter.pace("train") == 0.02 and meter.pace("evaluate") is None
    assert meter.deadline_s("train", 1000) == 400.0


def test_the_memory_section_is_read_and_capped_and_the_reference_models_still_train() -> None:
    for name in ("digits-mlp", "cartpole-reinforce"):
        root = models_dir() / name
        wasm = (root / "model.wasm").read_bytes()
        assert sandbox.module_memory(wasm) == (17, None)  # clang's default: no declared maximum
        manifest = json.loads((root / "manifest.json").read_text())
        working = max(b["estimatedWorkingBytes"] for b in manifest["execution"]["backends"] if b["kind"] == "cpu")
        limit = sandbox.memory_limit(working, 1 * MiB)
        capped = sandbox.cap_module_memory(wasm, limit)
        assert sandbox.module_memory(capped) == (17, limit // PAGE)
        assert sandbox.cap_module_memory(capped, limit) == capped  # already bounded: unchanged
        rt = ModelRuntime.load(capped, WasmtimeEngine(memory_limit_bytes=limit))
        weights = rt.create_initial_weights(3)
        rt.load_model(weights)
        if name == "digits-mlp":
            chunk = digits()[1]
            trained = rt.train(data=chunk, format="weei-digits-v1", seed=1, settings={"localEpochs": 1})
        else:
            trained = rt.train(experience=(0, 32, 7), seed=1, settings={})
        assert len(trained.weights) == len(weights) and trained.examples > 0


def test_a_capped_module_cannot_grow_past_the_limit_and_a_larger_minimum_is_refused() -> None:
    grow = '(func (export "grow") (result i32) i32.const 100 memory.grow)'
    wasm = wasmtime.wat2wasm(f'(module (memory (export "memory") 2) {grow})')
    capped = sandbox.cap_module_memory(wasm, 64 * PAGE)
    # A plain engine (no store limit, as in a browser): the declared maximum alone stops the growth.
    instance = wasmtime.Instance(store := wasmtime.Store(), wasmtime.Module(store.engine, capped), [])
    assert instance.exports(store)["grow"](store) == -1
    high = wasmtime.wat2wasm('(module (memory (export "memory") 2 60000))')  # a maximum above the limit
    assert sandbox.module_memory(sandbox.cap_module_memory(high, 64 * PAGE)) == (2, 64)
    with pytest.raises(ModelError) as err:
        sandbox.cap_module_memory(wasmtime.wat2wasm('(module (memory 100))'), 64 * PAGE)
    assert err.value.reason == "memory-over-limit"
    for bad in (b"\0asm\x01\0\0\0\x05\x05\x01\x01\x02", b"\0asm\x01\0\0\0\x05\x7f", b"nope"):
        with pytest.raises(ModelError) as err:
            sandbox.module_memory(bad)
        assert err.value.reason == "invalid-module"


# -- the hosts -------------------------------------------------------------------


def _big_minimum(pages: int) -> bytes:
    return wat_module(override={"memory": f'(memory (export "memory") {pages})'})


def test_the_pool_derives_the_limit_from_the_task_and_refuses_a_module_over_it_by_name() -> None:
    async def main() -> None:
        pool = ThreadWorkerPool(WasmtimeEngine(), 1)
        wasm = _big_minimum(2000)  # 125 MiB declared
        small = WorkerTask("evaluate", b"", {}, experience=(0, 1, 1), working_bytes=1 * MiB)
        with pytest.raises(ModelError) as err:
            await pool.run(0, "big", wasm, small)
        assert err.value.reason == "memory-over-limit" and f"{65 * MiB:,}" in str(err.value)  # 1 MiB + 64 MiB
        # With a larger estimate (or none: the device's cap) the same module loads (this trivial
        # module then fails its loadModel: it got past loading), under the limit the rule gives.
        for working, limit in ((100 * MiB, 164 * MiB), (None, 1 << 30)):
            with pytest.raises(ModelError) as err:
                await pool.run(0, "big", wasm, WorkerTask("evaluate", b"", {}, experience=(0, 1, 1),
                                                          working_bytes=working))
            assert err.value.reason == "malformed-result"
            assert pool._runtimes[0][2] == limit == pool._engines[0].memory_limit_bytes
        # The device's cap bounds every task: a smaller engine limit refuses it even without an estimate.
        capped = ThreadWorkerPool(WasmtimeEngine(memory_limit_bytes=64 * MiB), 1)
        with pytest.raises(ModelError) as err:
            await capped.run(0, "big", wasm, WorkerTask("evaluate", b"", {}, experience=(0, 1, 1)))
        assert err.value.reason == "memory-over-limit"

    asyncio.run(main())


def test_a_task_deadline_reaches_the_engine_and_stops_an_endless_chunk_by_name() -> None:
    async def main() -> None:
        wasm, chunk = digits()
        pool = ThreadWorkerPool(WasmtimeEngine(), 1)
        weights = ModelRuntime.load(wasm, WasmtimeEngine()).create_initial_weights(5)
        endless = WorkerTask("train", weights, {}, data=chunk, format="weei-digits-v1", seed=1, settings=ENDLESS,
                             deadline_s=0.5)
        with pytest.raises(ModelError) as err:
            await asyncio.wait_for(pool.run(0, "digits", wasm, endless), 30)
        assert err.value.reason == "deadline-exceeded" and "0.5 s" in str(err.value)

    asyncio.run(main())


class _Clock:
    """A simulated monotonic clock: each reading advances it by ``step`` seconds."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_local_training_gives_each_task_a_deadline_from_the_measured_pace() -> None:
    async def main() -> None:
        wasm, chunk = digits()
        pool = ThreadWorkerPool(WasmtimeEngine(), 1)
        init = ModelRuntime.load(wasm, WasmtimeEngine())
        weights = init.create_initial_weights(5)
        examples = int.from_bytes(chunk[4:8], "little")  # weei-digits-v1: 'WDG1', the count, the examples
        clock = _Clock(step=examples * 0.01)  # each task "takes" 0.01 s per example
        local = LocalWorkers(pool, NumpyKernel(), monotonic=clock)
        seen: list[Any] = []
        task = WorkerTask("train", weights, {}, data=chunk, format="weei-digits-v1", seed=1,
                          settings={"localEpochs": 1, "batchSize": 16})
        await local.run(0, "digits", wasm, task, examples)
        seen.append(pool._engines[0].call_deadline_s)  # the first task: nothing measured, the ceiling
        await local.run(0, "digits", wasm, task, examples)
        seen.append(pool._engines[0].call_deadline_s)
        await local.run(0, "digits", wasm, task, examples * 30)  # a larger assignment, the same pace
        seen.append(pool._engines[0].call_deadline_s)
        assert local.speed.pace("train/data") == pytest.approx(0.01)
        assert seen == [sandbox.DEADLINE_CEILING_S, sandbox.DEADLINE_FLOOR_S,
                        pytest.approx(min(sandbox.DEADLINE_CEILING_S, examples * 30 * 0.01 * sandbox.DEADLINE_FACTOR))]

    asyncio.run(main())


def test_a_validation_deadline_follows_the_pace_measured_per_byte_of_the_validation_file() -> None:
    async def main() -> None:
        wasm, chunk = digits()
        pool = ThreadWorkerPool(WasmtimeEngine(), 1)
        weights = ModelRuntime.load(wasm, WasmtimeEngine()).create_initial_weights(5)
        clock = _Clock(step=len(chunk) * 1e-6)  # each evaluation "takes" a microsecond per byte
        local = LocalWorkers(pool, NumpyKernel(), monotonic=clock)
        task = WorkerTask("evaluate", weights, {}, data=chunk, format="weei-digits-v1")
        seen = []
        for data in (chunk, chunk, chunk * 2000):  # the third: a file 2000 times larger (the engine is not run)
            seen.append(local.speed.deadline_s("evaluate/data", len(data)))
            if data is chunk:
                await local.evaluate("digits", wasm, task)
                assert pool._engines[0].call_deadline_s == seen[-1]
        assert local.speed.pace("evaluate/data") == pytest.approx(1e-6)
        assert seen == [sandbox.DEADLINE_CEILING_S, sandbox.DEADLINE_FLOOR_S,
                        pytest.approx(min(sandbox.DEADLINE_CEILING_S, len(chunk) * 2000 * 1e-6 * sandbox.DEADLINE_FACTOR))]
        assert seen[2] < sandbox.DEADLINE_CEILING_S, "a measured device no longer waits the ceiling for a hung module"

    asyncio.run(main())


def test_the_package_estimate_travels_from_prepare_to_the_participant() -> None:
    from test_prepare import _package, _prepare

    from weei.api.records import spec_from_record, spec_to_record
    from weei.core.wire.messages import Deliver, decode_message

    wasm, manifest, files, _ = _package("digits-mlp")
    spec = _prepare(wasm, manifest, files).spec
    working = manifest["execution"]["backends"][0]["estimatedWorkingBytes"]  # measured by the build
    assert manifest["execution"]["backends"][0]["kind"] == "cpu" and working == 2097152
    assert spec.working_bytes == working  # the CPU backend's estimatedWorkingBytes
    assert spec_from_record(spec_to_record(spec, job_seed=None, validation_sha256=None))[0].working_bytes == working
    assert _prepare(wasm, manifest["inlineJson"]["dataset-manifest.json"], files).spec.working_bytes is None
    deliver = Deliver("job", spec.module.ref, spec.info.raw, {}, None, spec.working_bytes)
    assert deliver.to_json()["workingBytes"] == working and decode_message(deliver.to_json()) == deliver
    assert "workingBytes" not in Deliver("job", spec.module.ref, spec.info.raw).to_json()  # old peers: as before
    for bad in (-1, "4194304", 1.5, True):
        with pytest.raises(WeeiError):
            decode_message({**deliver.to_json(), "workingBytes": bad})
    # The real coordinator sends it in Deliver, and the participant keeps it for its Worker tasks.
    from dataclasses import replace

    from sim import Sim, dataset_spec

    small, store = dataset_spec(2)
    sim = Sim.start_job(replace(small, working_bytes=12345), store, peers=("p1",))
    assert sim.participants["p1"].working_bytes == 12345


def test_the_agent_flag_is_checked(capsys: Any) -> None:
    import argparse

    from weei.agent.main import add_arguments, run_cli

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--server", "ws://127.0.0.1:9/signal", "--room", "r", "--memory-limit-mib", "8"])
    assert run_cli(args) == 2 and "--memory-limit-mib must be 16 to 4096" in capsys.readouterr().err
    assert parser.parse_args(["--server", "s", "--room", "r"]).memory_limit_mib is None


def test_the_engine_deadline_bounds_a_task_deadline() -> None:
    async def main() -> None:
        wasm, chunk = digits()
        pool = ThreadWorkerPool(WasmtimeEngine(call_deadline_s=0.5), 1)
        weights = ModelRuntime.load(wasm, WasmtimeEngine()).create_initial_weights(5)
        endless = WorkerTask("train", weights, {}, data=chunk, format="weei-digits-v1", seed=1, settings=ENDLESS,
                             deadline_s=sandbox.DEADLINE_CEILING_S)
        with pytest.raises(ModelError) as err:
            await asyncio.wait_for(pool.run(0, "digits", wasm, endless), 30)
        assert err.value.reason == "deadline-exceeded" and "0.5 s" in str(err.value)

    asyncio.run(main())
