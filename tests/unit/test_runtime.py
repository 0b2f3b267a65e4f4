"""Tests of weei.runtime: the ABI-1 host over the wasmtime engine.

The well-behaved and misbehaving model is tests/unit/fixtures/echo_model.c,
built with clang once per session; refusals at load time use small WAT
modules; the FakeEngine at the end shows the engine protocol can be met
without wasm (as the browser engine will) and lets hypothesis fuzz results.
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import wasmtime
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weei.core.errors import ModelError, UsageError
from weei.runtime import (
    REQUIRED_EXPORTS,
    Engine,
    ExternInfo,
    Instance,
    ModelRuntime,
    TrainProgress,
    TrainResult,
    WasmtimeEngine,
)
from weei.runtime.results import field_count, field_metrics, parse_result_json

FIXTURES = Path(__file__).parent / "fixtures"
MiB = 1 << 20


# -- fixtures ------------------------------------------------------------------


def _build(tmp: Path, name: str, *defines: str) -> bytes:
    clang = shutil.which("clang") or shutil.which("clang-14")
    if clang is None:
        pytest.skip("clang is not installed (make setup installs it)")
    out = tmp / f"{name}.wasm"
    cmd = [clang, "--target=wasm32", "-O2", "-nostdlib", "-mbulk-memory", "-Wl,--no-entry",
           *defines, "-o", str(out), str(FIXTURES / "echo_model.c")]
    subprocess.run(cmd, check=True, capture_output=True)
    return out.read_bytes()


@pytest.fixture(scope="session")
def echo_wasm(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return _build(tmp_path_factory.mktemp("wasm"), "echo")


@pytest.fixture(scope="session")
def echo_aux_wasm(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return _build(tmp_path_factory.mktemp("wasm"), "echo_aux", "-DWITH_AUX")


@pytest.fixture(scope="session")
def engine() -> WasmtimeEngine:
    return WasmtimeEngine()


@pytest.fixture
def progress() -> list[TrainProgress]:
    return []


@pytest.fixture
def rt(echo_wasm: bytes, engine: WasmtimeEngine, progress: list[TrainProgress]) -> ModelRuntime:
    """The echo module, every progress report parsed (how often they are: test_progress_reports)."""
    runtime = ModelRuntime.load(echo_wasm, engine, on_progress=progress.append)
    runtime.progress.interval_s = 0
    return runtime


def f32(*values: float) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


WEIGHTS = f32(1.0, 2.0, 3.0, 4.0)


def loaded(rt: ModelRuntime, weights: bytes = WEIGHTS) -> ModelRuntime:
    rt.load_model(weights)
    return rt


def train_mode(rt: ModelRuntime, mode: str) -> TrainResult:
    return loaded(rt).train(data=bytes(8), format="echo-v1", settings={"mode": mode})


def wat_module(*, imports: str = "", skip: tuple[str, ...] = (), override: dict[str, str] | None = None,
               start: bool = False) -> bytes:
    """A module with every required export, trivially implemented."""
    override = override or {}
    body = {
        "alloc": '(func (export "alloc") (param i32) (result i32) i32.const 1024)',
        "free": '(func (export "free") (param i32))',
        "resultLength": '(func (export "resultLength") (result i32) i32.const 0)',
        "memory": '(memory (export "memory") 1)',
    }
    parts = [imports]
    for name in REQUIRED_EXPORTS:
        if name in skip:
            continue
        default = body.get(name, f'(func (export "{name}") (param i32 i32) (result i32) i32.const 0)')
        parts.append(override.get(name, default))
    if start:
        parts.append("(func $boom unreachable) (start $boom)")
    return wasmtime.wat2wasm("(module " + "\n".join(parts) + ")")


# -- loading -------------------------------------------------------------------


def test_engine_lists_imports_and_exports(echo_wasm: bytes, engine: WasmtimeEngine) -> None:
    module = engine.compile(echo_wasm)
    assert module.imports == (ExternInfo("weei", "onProgress", "func", (("i32", "i32"), ())),)
    exports = {e.name: e for e in module.exports}
    assert set(REQUIRED_EXPORTS) <= set(exports)
    assert exports["memory"].kind == "memory"
    assert exports["train"].signature == (("i32", "i32"), ("i32",))
    assert isinstance(engine, Engine)


@pytest.mark.parametrize(
    "imports",
    [
        '(import "env" "foo" (func))',
        '(import "weei" "other" (func (param i32 i32)))',
        '(import "weei" "onProgress" (global i32))',
        '(import "weei" "onProgress" (func (param i32)))',
        '(import "wasi_snapshot_preview1" "fd_write" (func (param i32 i32 i32 i32) (result i32)))',
    ],
)
def test_forbidden_import_is_refused(engine: WasmtimeEngine, imports: str) -> None:
    with pytest.raises(ModelError) as err:
        ModelRuntime.load(wat_module(imports=imports), engine)
    assert err.value.reason == "forbidden-import"
    assert "load" in err.value.message


def test_module_without_imports_loads(engine: WasmtimeEngine) -> None:
    assert ModelRuntime.load(wat_module(), engine).broken is None


@pytest.mark.parametrize("missing", ["memory", "alloc", "resultLength", "describeChunk", "evaluate"])
def test_missing_export_is_named(engine: WasmtimeEngine, missing: str) -> None:
    with pytest.raises(ModelError) as err:
        ModelRuntime.load(wat_module(skip=(missing,)), engine)
    assert err.value.reason == "missing-export"
    assert missing in err.value.message


@pytest.mark.parametrize(
    "override",
    [
        {"alloc": '(func (export "alloc") (result i32) i32.const 0)'},
        {"train": '(func (export "train") (param i32) (result i32) i32.const 0)'},
        {"memory": '(memory 1) (global (export "memory") i32 (i32.const 0))'},
        {"free": '(table (export "free") 1 funcref)'},
    ],
)
def test_export_of_wrong_kind_or_signature_is_refused(engine: WasmtimeEngine, override: dict[str, str]) -> None:
    with pytest.raises(ModelError) as err:
        ModelRuntime.load(wat_module(override=override), engine)
    assert err.value.reason == "bad-export"


@pytest.mark.parametrize("data", [b"", b"not wasm", b"(module)", b"\0asm\x01\0\0\0\xff"])
def test_invalid_module_bytes(engine: WasmtimeEngine, data: bytes) -> None:
    with pytest.raises(ModelError) as err:
        ModelRuntime.load(data, engine)
    assert err.value.reason == "invalid-module"


def test_trapping_start_function_fails_instantiation(engine: WasmtimeEngine) -> None:
    with pytest.raises(ModelError) as err:
        ModelRuntime.load(wat_module(start=True), engine)
    assert err.value.reason == "instantiate-failed"


# -- operations --------------------------------------------------------------------


def test_model_info_is_cached_and_copied(rt: ModelRuntime) -> None:
    info = rt.model_info()
    assert info["id"] == "echo" and info["abiVersion"] == 1
    info["id"] = "changed"
    assert rt.model_info()["id"] == "echo"


def test_unsupported_abi_version(engine: WasmtimeEngine) -> None:
    text = b'{"abiVersion":2}'
    wasm = wat_module(override={
        "memory": f'(memory (export "memory") 1) (data (i32.const 64) "{text.decode().replace(chr(34), chr(92) + "22")}")',
        "getModelInfo": '(func (export "getModelInfo") (param i32 i32) (result i32) i32.const 64)',
        "resultLength": f'(func (export "resultLength") (result i32) i32.const {len(text)})',
    })
    with pytest.raises(ModelError) as err:
        ModelRuntime.load(wasm, engine).model_info()
    assert err.value.reason == "unsupported-abi"


def test_create_initial_weights_passes_u64_seed(rt: ModelRuntime) -> None:
    weights = rt.create_initial_weights(2**64 - 1)  # 18446744073709551615 % 100 == 15
    assert struct.unpack("<4f", weights) == (15.0, 16.0, 17.0, 18.0)
    assert rt.weight_bytes == 16


@pytest.mark.parametrize("seed", [-1, 2**64, True, 1.0, "1"])
def test_bad_seed_is_usage_error(rt: ModelRuntime, seed: Any) -> None:
    with pytest.raises(UsageError) as err:
        rt.create_initial_weights(seed)
    assert err.value.reason == "invalid-argument"


def test_train_round_trip_on_data(rt: ModelRuntime, progress: list[TrainProgress]) -> None:
    data = bytes(range(40))
    result = loaded(rt).train(data=data, format="echo-v1", seed=123456789012, settings={"batchSize": 4})
    assert struct.unpack("<4f", result.weights) == (2.0, 3.0, 4.0, 5.0)
    assert result.metrics == {"loss": 0.5, "seedMod": 12.0, "dataSum": float(sum(data)), "auxSlots": 0.0}
    assert (result.unique_examples, result.completed_units, result.optimizer_steps) == (10, None, 3)
    assert result.examples == 10
    assert json.dumps(result.metrics)  # plain dict, serialisable
    assert progress == [TrainProgress(2, 4, {"loss": 0.75}), TrainProgress(4, 4, {})]
    assert rt.progress_rejections == ()


def test_train_on_experience(rt: ModelRuntime) -> None:
    result = loaded(rt).train(experience=(96, 32, 9311704355372934012), settings={"localEpochs": 1})
    assert result.completed_units == 32 and result.unique_examples is None
    assert result.metrics["seedMod"] == 12.0 and result.metrics["dataSum"] == 0.0


def test_train_accepts_numpy_and_memoryview(rt: ModelRuntime) -> None:
    weights = np.arange(4, dtype="<f4")
    result = loaded(rt, memoryview(weights)).train(data=np.ones(8, dtype=np.uint8), format="echo-v1")
    assert np.array_equal(np.frombuffer(result.weights, "<f4"), weights + 1)


def test_each_train_needs_a_fresh_load_model(rt: ModelRuntime) -> None:
    with pytest.raises(UsageError) as err:
        rt.train(data=b"", format="echo-v1")
    assert err.value.reason == "model-not-loaded"
    loaded(rt).train(data=b"", format="echo-v1")
    with pytest.raises(UsageError):
        rt.train(data=b"", format="echo-v1")
    loaded(rt).train(data=b"", format="echo-v1")


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"data": b"", "experience": (0, 1, 0), "format": "echo-v1"},
        {"data": b""},
        {"experience": (0, 1, 0), "format": "echo-v1"},
        {"experience": (0, -1, 0)},
        {"experience": (0, 1)},
        {"experience": (0, 1, 2**64)},
        {"data": b"", "format": "echo-v1", "settings": {"x": float("nan")}},
        {"data": b"", "format": "echo-v1", "settings": {"x": object()}},
        {"data": b"", "format": "echo-v1", "settings": [1]},
    ],
)
def test_bad_train_arguments(rt: ModelRuntime, kwargs: dict[str, Any]) -> None:
    with pytest.raises(UsageError) as err:
        loaded(rt).train(**kwargs)
    assert err.value.reason == "invalid-argument"


def test_describe_chunk(rt: ModelRuntime) -> None:
    assert rt.describe_chunk("echo-v1", bytes(40)) == 10
    assert rt.describe_chunk("echo-v1", b"") == 0
    with pytest.raises(ModelError) as err:
        rt.describe_chunk("other", bytes(40))
    assert err.value.reason == "operation-failed"
    assert "describeChunk" in err.value.message and "unknown format" in err.value.message


def test_evaluate(rt: ModelRuntime) -> None:
    result = loaded(rt).evaluate(data=bytes([1, 2, 3, 4]), format="echo-v1")
    assert (result.metrics, result.examples) == ({"loss": 0.25, "dataSum": 10.0}, 1)
    assert rt.evaluate(experience=(0, 7, 1)).examples == 7


def test_auxiliary_weights_are_required_after_load_model(echo_aux_wasm: bytes, engine: WasmtimeEngine) -> None:
    rt = ModelRuntime.load(echo_aux_wasm, engine)
    with pytest.raises(UsageError) as err:
        loaded(rt).train(data=b"", format="echo-v1")
    assert err.value.reason == "auxiliary-not-loaded"
    rt.load_auxiliary({"ref": WEIGHTS})
    assert rt.train(data=b"", format="echo-v1").metrics["auxSlots"] == 1.0
    loaded(rt)  # a new loadModel needs a new loadAuxiliary
    with pytest.raises(UsageError):
        rt.evaluate(data=b"", format="echo-v1")


# -- failures of the module ------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        ("error", "operation-failed"),
        ("badjson", "malformed-result"),
        ("notobject", "malformed-result"),
        ("oob", "region-out-of-bounds"),
        ("resultoob", "region-out-of-bounds"),
        ("notregion", "invalid-result"),
        ("nan", "non-finite-metric"),
        ("boolmetric", "invalid-result"),
        ("nometrics", "invalid-result"),
        ("shortweights", "weight-size-mismatch"),
        ("negative", "invalid-result"),
        ("stringcount", "invalid-result"),
    ],
)
def test_bad_results_are_model_errors_and_runtime_goes_on(rt: ModelRuntime, mode: str, reason: str) -> None:
    with pytest.raises(ModelError) as err:
        train_mode(rt, mode)
    assert err.value.reason == reason
    assert err.value.message.startswith("train")
    assert rt.broken is None
    assert struct.unpack("<4f", train_mode(rt, "none").weights) == (2.0, 3.0, 4.0, 5.0)


def test_integral_float_count_is_accepted(rt: ModelRuntime) -> None:
    assert train_mode(rt, "floatcount").unique_examples == 2


def test_completed_units_above_unit_count(rt: ModelRuntime) -> None:
    with pytest.raises(ModelError) as err:
        loaded(rt).train(experience=(0, 4, 1), settings={"mode": "overcomplete"})
    assert err.value.reason == "invalid-result"


def test_trap_breaks_the_instance(rt: ModelRuntime) -> None:
    with pytest.raises(ModelError) as err:
        train_mode(rt, "trap")
    assert err.value.reason == "trap" and "train" in err.value.message
    assert rt.broken is not None
    with pytest.raises(ModelError) as again:
        rt.describe_chunk("echo-v1", bytes(4))
    assert again.value.reason == "instance-broken"


def test_alloc_returning_zero(rt: ModelRuntime) -> None:
    with pytest.raises(ModelError) as err:
        rt.describe_chunk("echo-v1", bytes(12345))  # the fixture's alloc refuses this size
    assert err.value.reason == "alloc-failed"
    assert rt.describe_chunk("echo-v1", bytes(16)) == 4


def test_input_regions_are_freed_also_on_error(rt: ModelRuntime) -> None:
    data = bytes(MiB)
    train_mode(rt, "none")
    before = rt.memory_size()
    for i in range(20):
        with pytest.raises(ModelError):
            loaded(rt).train(data=data, format="echo-v1", settings={"mode": "error"})
        assert rt.describe_chunk("echo-v1", data) == MiB // 4
        with pytest.raises(ModelError):
            rt.describe_chunk("other", data)
    # Without frees this would have grown by ~60 MiB.
    assert rt.memory_size() - before <= 3 * MiB


def test_memory_size_is_the_linear_memory_and_only_grows(rt: ModelRuntime) -> None:
    # The public size that weei.modelkit measures estimatedWorkingBytes with: whole 64 KiB pages,
    # grown by an input larger than the memory, never shrunk after the input is freed.
    start = rt.memory_size()
    assert start > 0 and start % 65536 == 0
    data = bytes(start + MiB)
    assert rt.describe_chunk("echo-v1", data) == len(data) // 4
    grown = rt.memory_size()
    assert grown >= start + MiB and grown % 65536 == 0
    assert rt.describe_chunk("echo-v1", bytes(16)) == 4
    assert rt.memory_size() == grown


# -- progress ---------------------------------------------------------------------------


def test_malformed_progress_is_recorded_not_fatal(rt: ModelRuntime, progress: list[TrainProgress]) -> None:
    result = train_mode(rt, "badprogress")
    assert result.unique_examples == 2
    assert progress == [TrainProgress(2, 4, {"loss": 0.75}), TrainProgress(4, 4, {})]
    notes = rt.progress_rejections
    assert len(notes) == 6
    assert all(note.startswith("train") for note in notes)
    assert "malformed-result" in notes[0] and "region-out-of-bounds" in notes[1]
    assert "non-finite-metric" in notes[4]


def test_progress_callback_exception_aborts_and_breaks(rt: ModelRuntime) -> None:
    class Cancelled(Exception):
        pass

    def cancel(_: TrainProgress) -> None:
        raise Cancelled

    rt.on_progress = cancel
    with pytest.raises(Cancelled):
        train_mode(rt, "none")
    assert rt.broken is not None


def test_reentrant_call_from_progress_is_refused(rt: ModelRuntime) -> None:
    rt.on_progress = lambda _: rt.describe_chunk("echo-v1", b"") and None
    with pytest.raises(UsageError) as err:
        train_mode(rt, "none")
    assert err.value.reason == "reentrant-call"
    assert rt.broken is not None  # the exception unwound the module


def test_no_progress_callback(echo_wasm: bytes, engine: WasmtimeEngine) -> None:
    rt = ModelRuntime.load(echo_wasm, engine)
    assert train_mode(rt, "none").optimizer_steps == 3


# -- bulk copies ---------------------------------------------------------------------------


def test_16_mib_round_trip(rt: ModelRuntime) -> None:
    weights = np.random.default_rng(1).standard_normal(4 * MiB, dtype=np.float32)  # 16 MiB
    start = time.thread_time()  # CPU time: a loaded machine does not stretch it
    result = loaded(rt, weights.tobytes()).train(data=bytes(16 * MiB), format="echo-v1")
    elapsed = time.thread_time() - start
    assert rt.weight_bytes == 16 * MiB
    assert np.array_equal(np.frombuffer(result.weights, "<f4"), weights + np.float32(1))
    assert result.unique_examples == 4 * MiB
    assert elapsed < 5  # per-byte copying would take minutes


def test_engine_bulk_copy_and_bounds(echo_wasm: bytes, engine: WasmtimeEngine) -> None:
    instance = engine.compile(echo_wasm).instantiate(lambda p, n: None)
    assert isinstance(instance, Instance)
    size = instance.memory_size()
    payload = bytes(range(256)) * 64
    for data in (payload, bytearray(payload), memoryview(payload), np.frombuffer(payload, np.uint8)):
        instance.write(size - len(payload), data)
        assert instance.read(size - len(payload), len(payload)) == payload
    assert instance.read(0, 0) == b""
    for ptr, n in ((size - 1, 2), (-1, 1), (size, 1)):
        with pytest.raises(IndexError):
            instance.read(ptr, n)
        with pytest.raises(IndexError):
            instance.write(ptr, bytes(n))


def test_copy_throughput_16_mib(echo_wasm: bytes, engine: WasmtimeEngine) -> None:
    instance = engine.compile(echo_wasm).instantiate(lambda p, n: None)
    ptr = instance.call("alloc", 16 * MiB)
    assert isinstance(ptr, int) and ptr > 0
    data = np.random.default_rng(2).bytes(16 * MiB)
    start = time.thread_time()  # CPU time: a loaded machine does not stretch it
    instance.write(ptr, data)
    back = instance.read(ptr, 16 * MiB)
    elapsed = time.thread_time() - start
    assert back == data
    assert elapsed < 1.0, f"16 MiB write+read took {elapsed:.3f} CPU-s (per-byte copying takes minutes)"


# -- the protocol without wasm, and fuzzing ------------------------------------------------------


class FakeInstance:
    """A pure-Python Instance: what any engine (the browser's) must provide."""

    def __init__(self, respond: Callable[[str, dict[str, Any], "FakeInstance"], bytes]) -> None:
        self.memory = bytearray(1 << 16)
        self.respond = respond
        self.top = 8
        self.live: set[int] = set()
        self.result_at = 1 << 15
        self.result_len = 0

    def call(self, name: str, *args: int) -> int | None:
        if name == "alloc":
            ptr, self.top = self.top, self.top + ((args[0] + 7) & ~7)
            self.live.add(ptr)
            return ptr
        if name == "free":
            self.live.remove(args[0])
            return None
        if name == "resultLength":
            return self.result_len
        request = json.loads(self.read(*args))
        text = self.respond(name, request, self)
        self.write(self.result_at, text)
        self.result_len = len(text)
        return self.result_at

    def read(self, ptr: int, size: int) -> bytes:
        if ptr < 0 or ptr + size > len(self.memory):
            raise IndexError(ptr)
        return bytes(self.memory[ptr:ptr + size])

    def write(self, ptr: int, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data).cast("B")
        if ptr < 0 or ptr + view.nbytes > len(self.memory):
            raise IndexError(ptr)
        self.memory[ptr:ptr + view.nbytes] = view

    def memory_size(self) -> int:
        return len(self.memory)


def fake_runtime(respond: Callable[[str, dict[str, Any], FakeInstance], bytes]) -> tuple[ModelRuntime, FakeInstance]:
    instance = FakeInstance(respond)
    assert isinstance(instance, Instance)
    return ModelRuntime(instance, None), instance


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)
train_results = st.fixed_dictionaries(
    {},
    optional={
        "weights": st.fixed_dictionaries({"ptr": json_values | st.integers(0, 70000), "bytes": json_values | st.just(16)}),
        "metrics": json_values | st.dictionaries(st.text(max_size=4), st.floats() | st.integers(), max_size=3),
        "uniqueExamples": json_values,
        "optimizerSteps": json_values,
        "error": json_values,
    },
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(result=train_results)
def test_fuzzed_train_results_give_a_result_or_a_model_error(result: dict[str, Any]) -> None:
    def respond(name: str, request: dict[str, Any], inst: FakeInstance) -> bytes:
        if name == "loadModel":
            return b'{"ok":true}'
        return json.dumps(result).encode()

    rt, instance = fake_runtime(respond)
    rt._info = {"abiVersion": 1}
    rt.load_model(WEIGHTS)
    try:
        out = rt.train(data=b"abc", format="x")
    except ModelError:
        pass
    else:
        assert len(out.weights) == 16 and isinstance(out.unique_examples, int)
    assert instance.live == set()  # everything the host allocated was freed


@settings(max_examples=500, deadline=None)
@given(raw=st.binary(max_size=64) | json_values.map(lambda v: json.dumps(v).encode()))
def test_parse_result_json_accepts_objects_or_raises_model_error(raw: bytes) -> None:
    try:
        value = parse_result_json("op", raw)
    except ModelError as exc:
        assert exc.reason in {"malformed-result", "operation-failed"}
    else:
        assert isinstance(value, dict) and "error" not in value


@pytest.mark.parametrize(
    ("value", "expected"),
    [(0, 0), (7, 7), (7.0, 7), (2**70, 2**70)],
)
def test_field_count_valid(value: Any, expected: int) -> None:
    assert field_count("op", {"n": value}, "n") == expected


@pytest.mark.parametrize("value", [-1, 1.5, True, None, "3", float("inf"), float("nan"), [1]])
def test_field_count_invalid(value: Any) -> None:
    with pytest.raises(ModelError):
        field_count("op", {"n": value}, "n")


def test_field_metrics_huge_integer_is_non_finite() -> None:
    with pytest.raises(ModelError) as err:
        field_metrics("op", {"metrics": {"loss": 10**400}})
    assert err.value.reason == "non-finite-metric"


def test_nan_literal_in_json_is_malformed() -> None:
    with pytest.raises(ModelError) as err:
        parse_result_json("op", b'{"metrics":{"loss":NaN}}')
    assert err.value.reason == "malformed-result"


# -- smoke test of the reference models (when built; tests/unit/test_models.py owns them) ------

MODELS = Path(__file__).resolve().parents[2] / "app" / "static" / "models"


def _reference(name: str) -> bytes:
    path = MODELS / name / "model.wasm"
    if not path.exists():
        pytest.skip(f"{path} not built")
    return path.read_bytes()


def test_reference_digits_model_trains_through_the_runtime(engine: WasmtimeEngine) -> None:
    rt = ModelRuntime.load(_reference("digits-mlp"), engine)
    assert rt.model_info()["abiVersion"] == 1
    weights = rt.create_initial_weights(7)
    rng = np.random.default_rng(0)
    records = np.concatenate(
        [rng.integers(0, 17, (64, 64), dtype=np.uint8), rng.integers(0, 10, (64, 1), dtype=np.uint8)], axis=1
    )
    chunk = b"WDG1" + struct.pack("<I", 64) + records.tobytes()
    assert rt.describe_chunk("weei-digits-v1", chunk) == 64
    rt.load_model(weights)
    result = rt.train(data=chunk, format="weei-digits-v1", seed=1,
                      settings={"localEpochs": 1, "batchSize": 16, "learningRate": 0.01})
    assert len(result.weights) == len(weights) and result.unique_examples == 64


def test_reference_cartpole_model_trains_through_the_runtime(engine: WasmtimeEngine) -> None:
    rt = ModelRuntime.load(_reference("cartpole-reinforce"), engine)
    assert rt.model_info()["workSource"]["kind"] == "experience"
    weights = rt.create_initial_weights(7)
    rt.load_model(weights)
    result = rt.train(experience=(0, 2, 11), settings={"localEpochs": 1, "batchSize": 16})
    assert len(result.weights) == len(weights) and result.completed_units == 2


def test_a_module_without_gpu_operations(rt: ModelRuntime) -> None:
    # The echo model exports no gpuBegin/gpuNext/gpuEnd: gpuBegin is a named usage error.
    assert not rt.has_gpu_operations
    with pytest.raises(UsageError) as info:
        loaded(rt).gpu_begin(experience=(0, 1, 1))
    assert info.value.reason == "no-gpu-operations"
