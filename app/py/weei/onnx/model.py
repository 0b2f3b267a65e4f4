"""Read an ONNX ModelProto into plain Python (the subset the graph runtime runs).

Bounded before anything is built: the file size, the node count, each
initializer's element count, the opset; external data is refused.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from .errors import OnnxError, OnnxReason
from .proto import packed_floats, packed_varints, read_fields, signed64

__all__ = ["MAX_ONNX_BYTES", "MAX_NODES", "MAX_ELEMENTS", "Tensor", "Node", "Graph", "read_model"]

MAX_ONNX_BYTES = 256 << 20
MAX_NODES = 10_000
#: Elements of one initializer or constant (2^26 float32 = 256 MiB).
MAX_ELEMENTS = 1 << 26
OPSET_RANGE = (7, 23)

FLOAT, INT32, INT64, DOUBLE = 1, 6, 7, 11


@dataclass
class Tensor:
    name: str
    dims: list[int]
    dtype: int
    values: list[float] | list[int]


@dataclass
class Node:
    op: str
    name: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)

    def label(self) -> str:
        return f"{self.op} node {self.name!r}" if self.name else f"{self.op} node producing {self.outputs[:1]}"


@dataclass
class Graph:
    opset: int
    nodes: list[Node]
    initializers: dict[str, Tensor]
    inputs: list[tuple[str, list[int | str]]]
    outputs: list[str]


def _text(value: Any) -> str:
    if not isinstance(value, (memoryview, bytes)):
        raise OnnxError(OnnxReason.MALFORMED_ONNX, "a string field has the wrong wire type")
    try:
        return bytes(value).decode("utf-8")
    except UnicodeDecodeError:
        raise OnnxError(OnnxReason.MALFORMED_ONNX, "a name is not UTF-8") from None


def _tensor(data: Any) -> Tensor:
    dims: list[int] = []
    dtype = 0
    name = ""
    raw: Any = None
    floats: list[float] = []
    ints: list[int] = []
    for number, wire, value in read_fields(data):
        if number == 1:
            dims += [signed64(v) for v in packed_varints(value, wire)]
        elif number == 2:
            dtype = value
        elif number == 4:
            floats += packed_floats(value, wire)
        elif number in (5, 7):
            ints += [signed64(v) for v in packed_varints(value, wire)]
        elif number == 8:
            name = _text(value)
        elif number == 9:
            raw = value
        elif number in (13, 14) and (number == 13 or value == 1):
            raise OnnxError(OnnxReason.EXTERNAL_DATA, f"tensor {name or '(unnamed)'} keeps its data in an external file; "
                                             "save the model with its weights inside (onnx.save(..., save_as_external_data=False))")
    count = 1
    for d in dims:
        if d < 0:
            raise OnnxError(OnnxReason.BAD_SHAPE, f"tensor {name!r} has a negative dimension")
        count *= d
        if count > MAX_ELEMENTS:
            raise OnnxError(OnnxReason.TENSOR_TOO_LARGE, f"tensor {name!r} has more than {MAX_ELEMENTS} elements")
    if dtype not in (FLOAT, INT32, INT64, DOUBLE):
        raise OnnxError(OnnxReason.UNSUPPORTED_TYPE, f"tensor {name!r} has ONNX data type {dtype}; Weei takes float32 and integer shapes")
    values: list[Any]
    if raw is not None:
        size = {FLOAT: 4, INT32: 4, INT64: 8, DOUBLE: 8}[dtype]
        if len(raw) != count * size:
            raise OnnxError(OnnxReason.MALFORMED_ONNX, f"tensor {name!r}: raw_data has {len(raw)} bytes, its shape needs {count * size}")
        values = list(struct.unpack(f"<{count}{ {FLOAT: 'f', INT32: 'i', INT64: 'q', DOUBLE: 'd'}[dtype]}", raw))
    else:
        values = floats if dtype == FLOAT else ints
        if dtype == DOUBLE:
            raise OnnxError(OnnxReason.UNSUPPORTED_TYPE, f"tensor {name!r} is float64; export the model in float32")
        if len(values) != count:
            raise OnnxError(OnnxReason.MALFORMED_ONNX, f"tensor {name!r}: {len(values)} values, its shape needs {count}")
    return Tensor(name, dims, dtype, values)


def _attribute(data: Any) -> tuple[str, Any]:
    name = ""
    value: Any = None
    ints: list[int] = []
    floats: list[float] = []
    for number, wire, v in read_fields(data):
        if number == 1:
            name = _text(v)
        elif number == 2:
            if wire != 5:
                raise OnnxError(OnnxReason.MALFORMED_ONNX, "a float attribute has the wrong wire type")
            value = struct.unpack("<f", v)[0]
        elif number == 3:
            value = signed64(v)
        elif number == 4:
            value = _text(v)
        elif number == 5:
            value = _tensor(v)
        elif number == 6:
            raise OnnxError(OnnxReason.UNSUPPORTED_OPERATOR, f"attribute {name!r} holds a subgraph (control flow is not supported)")
        elif number == 7:
            floats += packed_floats(v, wire)
        elif number == 8:
            ints += [signed64(x) for x in packed_varints(v, wire)]
    if value is None:
        value = ints if ints else floats
    return name, value


def _node(data: Any) -> Node:
    node = Node("", "", [], [])
    domain = ""
    for number, _, value in read_fields(data):
        if number == 1:
            node.inputs.append(_text(value))
        elif number == 2:
            node.outputs.append(_text(value))
        elif number == 3:
            node.name = _text(value)
        elif number == 4:
            node.op = _text(value)
        elif number == 7:
            domain = _text(value)
        elif number == 5:
            key, attr = _attribute(value)
            node.attrs[key] = attr
    if domain not in ("", "ai.onnx"):
        raise OnnxError(OnnxReason.UNSUPPORTED_OPERATOR, f"{node.op} (domain {domain}) used by {node.label()} is not supported")
    return node


def _value_info(data: Any) -> tuple[str, list[int | str]]:
    name = ""
    dims: list[int | str] = []
    for number, _, value in read_fields(data):
        if number == 1:
            name = _text(value)
        elif number == 2:
            for n2, _, tensor_type in read_fields(value):
                if n2 != 1:
                    continue
                for n3, _, shape in read_fields(tensor_type):
                    if n3 != 2:
                        continue
                    for n4, _, dim in read_fields(shape):
                        if n4 != 1:
                            continue
                        d: int | str = "?"
                        for n5, _, dv in read_fields(dim):
                            d = signed64(dv) if n5 == 1 else _text(dv) if n5 == 2 else d
                        dims.append(d)
    return name, dims


def read_model(data: bytes) -> Graph:
    """Parse an ONNX file. Raises OnnxError with a named reason."""
    if len(data) > MAX_ONNX_BYTES:
        raise OnnxError(OnnxReason.ONNX_TOO_LARGE, f"the file has {len(data)} bytes, over the {MAX_ONNX_BYTES} Weei imports")
    opset = None
    graph_bytes = None
    for number, _, value in read_fields(data):
        if number == 8:
            domain, version = "", 0
            for n2, _, v in read_fields(value):
                domain = _text(v) if n2 == 1 else domain
                version = v if n2 == 2 else version
            if domain in ("", "ai.onnx"):
                opset = version
        elif number == 7:
            graph_bytes = value
    if graph_bytes is None:
        raise OnnxError(OnnxReason.MALFORMED_ONNX, "the file has no graph (is it an ONNX model?)")
    if opset is None or not OPSET_RANGE[0] <= opset <= OPSET_RANGE[1]:
        raise OnnxError(OnnxReason.UNSUPPORTED_OPSET, f"opset {opset} of the default domain; Weei imports {OPSET_RANGE[0]}..{OPSET_RANGE[1]}")
    nodes: list[Node] = []
    inits: dict[str, Tensor] = {}
    inputs: list[tuple[str, list[int | str]]] = []
    outputs: list[str] = []
    graph_fields = read_fields(graph_bytes, {1: (MAX_NODES, OnnxReason.TOO_MANY_NODES, f"the graph has more than {MAX_NODES} nodes")})
    for number, _, value in graph_fields:
        if number == 1:
            nodes.append(_node(value))
        elif number == 5:
            t = _tensor(value)
            inits[t.name] = t
        elif number == 15:
            raise OnnxError(OnnxReason.UNSUPPORTED_TYPE, "sparse initializers are not supported")
        elif number == 11:
            inputs.append(_value_info(value))
        elif number == 12:
            outputs.append(_value_info(value)[0])
    return Graph(opset, nodes, inits, [i for i in inputs if i[0] not in inits], outputs)
