"""A hostile model module is bounded in time and memory on the wasmtime host.

Each module below is one an attacker could hand in as `model.wasm`: it must
fail by name within its deadline or limit, never hang the host or fill its
memory, and leave the host able to load the next module.
"""

from __future__ import annotations

import time

import pytest
import wasmtime
from test_runtime import wat_module

from weei.core.errors import ModelError
from weei.runtime import ModelRuntime, WasmtimeEngine
from weei.runtime.engine import DeadlineExceeded, InstantiateError, Interrupted

LOOP = "(loop $l (br $l))"
PAGE = 65536


def quick(**limits: float) -> WasmtimeEngine:
    return WasmtimeEngine(**{"call_deadline_s": 0.5, "start_deadline_s": 0.5, **limits})  # type: ignore[arg-type]


def test_an_endless_start_function_fails_load_by_name_within_its_deadline() -> None:
    wasm = wat_module(override={"memory": f'(memory (export "memory") 1) (func $spin {LOOP}) (start $spin)'})
    started = time.monotonic()
    with pytest.raises(ModelError) as err:
        ModelRuntime.load(wasm, quick())
    assert err.value.reason == "instantiate-failed" and "deadline" in str(err.value)
    assert time.monotonic() - started < 10


@pytest.mark.parametrize("op", ["createInitialWeights", "alloc"])
def test_an_endless_operation_is_stopped_at_its_deadline_and_named(op: str) -> None:
    signature = "(param i32) (result i32)" if op == "alloc" else "(param i32 i32) (result i32)"
    rt = ModelRuntime.load(wat_module(override={op: f'(func (export "{op}") {signature} {LOOP} i32.const 0)'}), quick())
    started = time.monotonic()
    with pytest.raises(ModelError) as err:
        rt.create_initial_weights(1)
    assert err.value.reason == "deadline-exceeded", err.value
    assert time.monotonic() - started < 10
    assert rt.broken is not None  # its state is unknown: it is not called again
    # The host is unharmed: the next module loads and runs on the same engine.
    assert ModelRuntime.load(wat_module(), quick()).broken is None


def test_the_deadline_is_per_call_and_interrupt_still_wins() -> None:
    engine = WasmtimeEngine(call_deadline_s=60)
    instance = engine.compile(wasmtime.wat2wasm(f'(module (func (export "spin") {LOOP}))')).instantiate(
        lambda _p, _n: None)
    import threading

    threading.Timer(0.3, engine.interrupt, ("stop",)).start()
    started = time.monotonic()
    with pytest.raises(Interrupted) as err:
        instance.call("spin")
    assert err.value.reason == "stop" and time.monotonic() - started < 5
    engine.resume()
    short = quick()
    instance = short.compile(wasmtime.wat2wasm(f'(module (func (export "spin") {LOOP}))')).instantiate(
        lambda _p, _n: None)
    with pytest.raises(DeadlineExceeded):
        instance.call("spin")


def test_memory64_shared_and_multiple_memories_are_refused_at_load() -> None:
    for memory in ('(memory (export "memory") i64 1)', '(memory (export "memory") 1 2 shared)',
                   '(memory (export "memory") 1) (memory $more 1)'):
        with pytest.raises(ModelError) as err:
            ModelRuntime.load(wat_module(override={"memory": memory}), quick())
        assert err.value.reason == "invalid-module", memory


def test_memory_is_capped_by_the_engine_limit() -> None:
    limit = 64 << 20
    big = f'(memory (export "memory") {2 * limit // PAGE})'
    # A declared minimum over the limit is refused by name before instantiation ...
    with pytest.raises(ModelError) as err:
        ModelRuntime.load(wat_module(override={"memory": big}), quick(memory_limit_bytes=limit))
    assert err.value.reason == "memory-over-limit" and f"{limit:,}" in str(err.value)
    # ... and the engine's store limit would not instantiate it either.
    with pytest.raises(InstantiateError):
        quick(memory_limit_bytes=limit).compile(wasmtime.wat2wasm(f"(module {big})")).instantiate(lambda _p, _n: None)
    # Growing past it fails inside the module (memory.grow gives -1); the host's memory stays small.
    grow = f'(func (export "grow") (result i32) i32.const {2 * limit // PAGE} memory.grow)'
    instance = quick(memory_limit_bytes=limit).compile(
        wasmtime.wat2wasm(f'(module (memory (export "memory") 1) {grow})')).instantiate(lambda _p, _n: None)
    assert instance.call("grow") == -1
    assert instance.memory_size() == PAGE


def test_a_result_too_large_is_refused_before_it_is_copied() -> None:
    pages = (4 << 20) // PAGE
    wasm = wat_module(override={"memory": f'(memory (export "memory") {pages})',
                                "resultLength": f'(func (export "resultLength") (result i32) i32.const {2 << 20})'})
    rt = ModelRuntime.load(wasm, quick())
    with pytest.raises(ModelError) as err:
        rt.create_initial_weights(1)
    assert err.value.reason == "result-too-large", err.value


def test_a_weights_region_over_2_gib_is_refused_by_name_not_copied() -> None:
    """Issue 9: a weights region over 2 GiB escaped as SystemError from ctypes.string_at. That needed a memory
    over 2 GiB, which the 1 GiB cap above now refuses; the region's size is refused first, by name, before
    its bounds are looked at (the code before issue 9 said region-out-of-bounds here)."""
    result = '{"weights":{"ptr":1024,"bytes":3000000000}}'
    rt = ModelRuntime.load(wat_module(override={
        "memory": f'(memory (export "memory") 1) (data (i32.const 2048) "{result.replace(chr(34), chr(92) + chr(34))}")',
        "createInitialWeights": '(func (export "createInitialWeights") (param i32 i32) (result i32) i32.const 2048)',
        "resultLength": f'(func (export "resultLength") (result i32) i32.const {len(result)})'}), quick())
    with pytest.raises(ModelError) as err:
        rt.create_initial_weights(1)
    assert err.value.reason == "result-too-large" and "3000000000" in str(err.value), err.value


def test_a_flood_of_progress_reports_is_stopped_at_its_deadline() -> None:
    """Issue 9: a module calling onProgress ten million times held the host for as long as it liked."""
    report = '{"processedExamples":1,"totalExamples":2}'
    calls = [0]
    flood = (f'(func (export "createInitialWeights") (param i32 i32) (result i32) '
             f'(loop $l (call $progress (i32.const 2048) (i32.const {len(report)})) (br $l)) i32.const 0)')
    rt = ModelRuntime.load(wat_module(
        imports='(import "weei" "onProgress" (func $progress (param i32 i32)))',
        override={"memory": f'(memory (export "memory") 1) '
                            f'(data (i32.const 2048) "{report.replace(chr(34), chr(92) + chr(34))}")',
                  "createInitialWeights": flood}), quick(), on_progress=lambda _p: calls.__setitem__(0, calls[0] + 1))
    started = time.monotonic()
    with pytest.raises(ModelError) as err:
        rt.create_initial_weights(1)
    assert err.value.reason == "deadline-exceeded", err.value
    assert time.monotonic() - started < 10 and calls[0] > 0, calls  # the reports arrived, and ended at the deadline
    assert rt.broken is not None
