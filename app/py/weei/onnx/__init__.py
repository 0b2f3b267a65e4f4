"""Bring a model as an ONNX file (docs/onnx.md).

``import_onnx`` turns an ONNX file and the training words (loss, optimizer,
learning rate, data format) into a module of Weei WASM ABI 1: the graph
runtime (c/onnx, committed as app/static/onnx/runtime.wasm) with the graph
and its initializers appended. ``export_onnx`` writes the user's file back
with trained weights. Both are pure Python (CPython and Pyodide).
"""

from __future__ import annotations

from importlib import resources

from .compiler import OPERATORS, Compiled, Settings, compile_graph
from .errors import OnnxError, OnnxReason
from .export import export_onnx
from .model import read_model
from .wasm import attach_blob

__all__ = ["OPERATORS", "OnnxError", "OnnxReason", "Settings", "Compiled", "runtime_module", "import_onnx", "export_onnx"]


def runtime_module() -> bytes:
    """The graph runtime without a graph (package data; in a checkout, a symlink to app/static/onnx)."""
    return (resources.files(__package__) / "runtime.wasm").read_bytes()


def import_onnx(onnx: bytes, settings: Settings, runtime: bytes | None = None) -> tuple[bytes, Compiled]:
    """The model module of ``onnx`` and what the compiler made of it. Raises OnnxError."""
    compiled = compile_graph(read_model(onnx), settings)
    return attach_blob(runtime if runtime is not None else runtime_module(), compiled.blob), compiled
