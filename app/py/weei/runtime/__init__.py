"""The model ABI host: ``ModelRuntime`` over a WebAssembly engine.

``ModelRuntime`` implements Weei WASM ABI 1 (docs/abi.md) once; engines
(``WasmtimeEngine`` in CPython, the browser's ``WebAssembly`` in Pyodide)
satisfy the small protocol in :mod:`weei.runtime.engine`. The wasmtime
engine is imported lazily so this package imports in Pyodide, where
``wasmtime`` does not exist.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .abi import ABI_VERSION, OPERATIONS, REQUIRED_EXPORTS, ModelRuntime, ProgressCallback
from .engine import (
    CompiledModule,
    CompileError,
    Engine,
    EngineError,
    ExternInfo,
    Instance,
    InstantiateError,
    Interruptible,
    Interrupted,
    Trap,
)
from .results import EvalResult, TrainProgress, TrainResult

if TYPE_CHECKING:
    from .wasmtime_engine import WasmtimeEngine

__all__ = [
    "ABI_VERSION",
    "OPERATIONS",
    "REQUIRED_EXPORTS",
    "ModelRuntime",
    "ProgressCallback",
    "TrainProgress",
    "TrainResult",
    "EvalResult",
    "Engine",
    "CompiledModule",
    "Instance",
    "ExternInfo",
    "EngineError",
    "CompileError",
    "InstantiateError",
    "Trap",
    "Interrupted",
    "Interruptible",
    "WasmtimeEngine",
]


def __getattr__(name: str) -> Any:
    # Lazy: `from weei.runtime import WasmtimeEngine` works in CPython without
    # making wasmtime a dependency of the browser build.
    if name == "WasmtimeEngine":
        from .wasmtime_engine import WasmtimeEngine

        return WasmtimeEngine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
