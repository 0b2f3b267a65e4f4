"""The ABI's exports are called straight through wasmtime's C API (weei/runtime/wasmtime_calls.py), with the
same results, traps and aborts as through wasmtime-py's public ``Func.__call__``, which stays the fallback."""

from __future__ import annotations

import pytest
import wasmtime

import weei.runtime.wasmtime_calls as calls
from weei.demo.run import models_dir
from weei.runtime import ModelRuntime, WasmtimeEngine
from weei.runtime.results import TrainProgress

DIGITS = models_dir() / "digits-mlp"


def _train(runtime: ModelRuntime) -> tuple[bytes, bytes]:
    weights = runtime.create_initial_weights(3)
    runtime.load_model(weights)
    chunk = (DIGITS / "data" / "training-001.bin").read_bytes()
    return weights, runtime.train(data=chunk, format="weei-digits-v1", seed=11,
                                  settings={"localEpochs": 2, "batchSize": 16}).weights


def test_every_abi_export_gets_the_direct_call_and_trains_the_bits_the_public_call_trains(
        monkeypatch: pytest.MonkeyPatch) -> None:
    wasm = (DIGITS / "model.wasm").read_bytes()
    fast = ModelRuntime.load(wasm, WasmtimeEngine())
    funcs = fast._instance._funcs  # type: ignore[attr-defined]
    assert {"alloc", "free", "resultLength", "train", "loadModel"} <= funcs.keys()
    assert all(isinstance(f, calls.I32Call) for f in funcs.values())
    monkeypatch.setattr(calls, "ffi", None)  # a wasmtime-py without the internals: the public call
    public = ModelRuntime.load(wasm, WasmtimeEngine())
    assert all(isinstance(f, wasmtime.Func) for f in public._instance._funcs.values())  # type: ignore[attr-defined]
    assert _train(fast) == _train(public)
    assert fast.model_info() == public.model_info()


def test_a_direct_call_with_the_wrong_arity_is_refused_not_run() -> None:
    runtime = ModelRuntime.load((DIGITS / "model.wasm").read_bytes(), WasmtimeEngine())
    alloc = runtime._instance._funcs["alloc"]  # type: ignore[attr-defined]
    store = runtime._instance._store  # type: ignore[attr-defined]
    assert isinstance(alloc(store, 16), int)
    with pytest.raises(wasmtime.WasmtimeError, match="expected 1 parameters, got 2"):
        alloc(store, 16, 16)


def test_an_exception_from_the_progress_callback_still_aborts_a_direct_call() -> None:
    class Stop(Exception):
        pass

    def stop(_: TrainProgress) -> None:
        raise Stop

    runtime = ModelRuntime.load((DIGITS / "model.wasm").read_bytes(), WasmtimeEngine(), on_progress=stop)
    assert isinstance(runtime._instance._funcs["train"], calls.I32Call)  # type: ignore[attr-defined]
    with pytest.raises(Stop):
        _train(runtime)
