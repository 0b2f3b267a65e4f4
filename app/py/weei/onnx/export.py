"""The way back: the user's ONNX file with trained weights (docs/onnx.md).

Every field of the original file is kept byte for byte except the float
initializers the runtime trains or keeps (running statistics), which are
rewritten as raw float32 from the weights, by name, in the layout the
importer chose (recomputed from the same file and settings).
"""

from __future__ import annotations

import struct

from .compiler import Settings, compile_graph
from .errors import OnnxError, OnnxReason
from .model import read_model
from .proto import Field, encode_fields, read_fields

__all__ = ["export_onnx"]


def _tensor_bytes(name: str, dims: list[int], values: tuple[float, ...]) -> bytes:
    fields: list[Field] = [(1, 0, d) for d in dims]
    fields += [(2, 0, 1), (8, 2, name.encode("utf-8")), (9, 2, struct.pack(f"<{len(values)}f", *values))]
    return encode_fields(fields)


def export_onnx(onnx: bytes, weights: bytes) -> bytes:
    """``onnx`` with its initializers replaced by ``weights`` (the float32-le weights of a checkpoint
    of a package imported from ``onnx``). Raises OnnxError."""
    # The layout depends on the graph alone, not on the training words.
    compiled = compile_graph(read_model(onnx), Settings(loss="mse", data="records"))
    if len(weights) != 4 * len(compiled.weights):
        raise OnnxError(OnnxReason.WEIGHT_SIZE_MISMATCH, f"the checkpoint has {len(weights)} weight bytes, "
                                                f"the graph {4 * len(compiled.weights)}")
    values = struct.unpack(f"<{len(weights) // 4}f", weights)
    model = read_fields(onnx)
    out: list[Field] = []
    replaced = 0
    for number, wire, value in model:
        if number == 7:
            graph: list[Field] = []
            for g_number, g_wire, g_value in read_fields(value):
                if g_number == 5:
                    name = next((bytes(v).decode("utf-8") for n, _, v in read_fields(g_value) if n == 8), "")
                    if name in compiled.layout:
                        offset, dims = compiled.layout[name]
                        count = 1
                        for d in dims:
                            count *= d
                        g_value = _tensor_bytes(name, dims, values[offset:offset + count])
                        replaced += 1
                graph.append((g_number, g_wire, g_value))
            value = encode_fields(graph)
        out.append((number, wire, value))
    if replaced != len(compiled.layout):
        raise OnnxError(OnnxReason.MALFORMED_ONNX, "the file's initializers do not match the graph's weights")
    return encode_fields(out)
