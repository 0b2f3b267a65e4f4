"""Calling an all-i32 wasm export without wasmtime-py's per-call type checks.

``wasmtime.Func.__call__`` asks the store for the function's type on every
call and converts each argument against it: ~80 µs of Python per call,
measured with cProfile on digits-mlp chunks of 100 examples, where a chunk
makes a dozen calls (alloc, loadModel, train, resultLength, free, ...) and
that overhead was most of the chunk's time. Every ABI export takes and
returns only i32 (``abi._SIGNATURES``, checked at load), so the type is
read once here and each call goes straight to the C API's
``wasmtime_func_call`` with i32 values, inside wasmtime-py's own
``enter_wasm``, which turns a trap into ``wasmtime.Trap`` and re-raises an
exception the progress import raised (how a host aborts training).

Both of those are wasmtime-py internals (``wasmtime._ffi``,
``wasmtime._func``); where they are missing, :func:`fast_call` gives None
and the caller uses the public ``Func.__call__``.
"""

from __future__ import annotations

from ctypes import byref
from typing import Any

import wasmtime

try:
    from wasmtime import _ffi as ffi
    from wasmtime._func import enter_wasm

    _I32 = ffi.WASMTIME_I32.value
except (ImportError, AttributeError):  # another wasmtime-py: its public call path
    ffi = None

__all__ = ["I32Call", "fast_call"]


class I32Call:
    """One export of ``n_params`` i32 parameters and ``n_results`` (0 or 1) i32 results."""

    __slots__ = ("_func", "_params", "_results", "_call")

    def __init__(self, func: wasmtime.Func, n_params: int, n_results: int) -> None:
        self._func = func
        self._params = ffi.wasmtime_val_t * n_params
        self._results = ffi.wasmtime_val_t * n_results
        self._call = ffi.wasmtime_func_call

    def __call__(self, store: wasmtime.Store, *args: int) -> int | None:
        params = self._params()
        if len(args) != len(params):
            raise wasmtime.WasmtimeError(f"expected {len(params)} parameters, got {len(args)}")
        for slot, value in zip(params, args):
            slot.kind = _I32
            slot.of.i32 = value
        results = self._results()
        with enter_wasm(store) as trap:
            error = self._call(store._context(), byref(self._func._func), params, len(params), results,
                               len(results), trap)
            if error:
                raise wasmtime.WasmtimeError._from_ptr(error)
        return int(results[0].of.i32) if len(results) else None


def fast_call(store: wasmtime.Store, func: wasmtime.Func) -> Any:
    """The fast caller of ``func`` when its signature is all i32 with at most one result, else None."""
    if ffi is None:
        return None
    ty = func.type(store)
    i32 = wasmtime.ValType.i32()
    if len(ty.results) > 1 or any(t != i32 for t in (*ty.params, *ty.results)):
        return None
    return I32Call(func, len(ty.params), len(ty.results))
