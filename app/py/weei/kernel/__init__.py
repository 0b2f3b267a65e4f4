"""Hosts of the aggregation kernel for :mod:`weei.core.aggregation.aggregate`.

Three implementations of ``AggregationKernel`` that give identical bits:
``NumpyKernel`` (the oracle, blocked numpy), ``NativeKernel`` (the C kernel
built natively, through ctypes; the fast CPython path) and ``WasmKernel``
(the same C as WebAssembly, the browser's path, runnable here in wasmtime).
Imports are lazy so that a host without numpy can still use the wasm one.
"""

from __future__ import annotations

__all__ = ["kernel_source"]

from pathlib import Path


def kernel_source(name: str = "aggregate") -> Path:
    """Path of ``c/kernel/<name>.c`` in the source tree (``WEEI_KERNEL_SRC``
    overrides the directory). Raises FileNotFoundError if it is missing."""
    import os

    root = os.environ.get("WEEI_KERNEL_SRC")
    base = Path(root) if root else Path(__file__).resolve().parents[4] / "c" / "kernel"
    path = base / f"{name}.c"
    if not path.is_file():
        raise FileNotFoundError(f"kernel source {path} not found (set WEEI_KERNEL_SRC)")
    return path
