"""Turn an ONNX graph into the graph runtime's blob (c/onnx/runtime.c, docs/onnx.md).

Shapes are resolved here, with the batch as a symbol: a dim of -k in the blob
means k times the batch. Float initializers become weights (trained ones
first, then running statistics, which ``aggregation.averageOnly`` lists);
integer initializers and Constants that give shapes are consumed here;
float Constants become constants of the blob.
"""

from __future__ import annotations

import json
import math
import struct
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from .errors import OnnxError, OnnxReason
from .model import FLOAT, MAX_ELEMENTS, Graph, Node, Tensor

__all__ = ["LOSSES", "OPTIMIZERS", "FORMATS", "OPERATORS", "Settings", "Compiled", "compile_graph"]

LOSSES = {"cross-entropy": 0, "mse": 1, "next-token": 2}
OPTIMIZERS = {"sgd": 0, "adam": 1, "adamw": 2}
FORMATS = {"records": 0, "digits": 1, "tokens": 2}
FORMAT_IDS = {"records": "weei-records-v1", "digits": "weei-digits-v1", "tokens": "weei-bytes-v1"}
OP_CODES = {"MatMul": 1, "Gemm": 2, "Add": 3, "Sub": 4, "Mul": 5, "Div": 6, "Relu": 7, "Tanh": 8, "Sigmoid": 9,
            "Softmax": 10, "LogSoftmax": 11, "Flatten": 12, "Reshape": 12, "Identity": 12, "Conv": 13, "MaxPool": 14,
            "AveragePool": 15, "GlobalAveragePool": 16, "BatchNormalization": 17, "Dropout": 18, "LeakyRelu": 19,
            "LayerNormalization": 20, "Gelu": 21, "Transpose": 22, "Concat": 23, "Gather": 24}
#: Every operator the importer takes (Constant is folded, the rest run in the runtime).
OPERATORS = tuple(sorted([*OP_CODES, "Constant"]))
T_INPUT, T_PARAM, T_STATE, T_CONST, T_ACT = range(5)
MAX_DIMS = 6
MAX_EXAMPLES = 10_000
#: Values per example of one activation (the runtime plans batch x this).
MAX_PER_EXAMPLE = 1 << 22
NODE_WORDS = 26


@dataclass
class Settings:
    loss: str = "cross-entropy"
    optimizer: str = "adam"
    lr: float = 0.01
    batch_size: int = 32
    data: str = "records"
    model_id: str = "onnx-model"
    name: str = "Imported ONNX model"
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.01


@dataclass
class Compiled:
    blob: bytes
    info: dict[str, Any]
    weights: list[float]
    #: initializer name -> (offset in floats, dims) for the exporter
    layout: dict[str, tuple[int, list[int]]] = field(default_factory=dict)


@dataclass
class _T:
    kind: int
    dims: list[int]
    offset: int = 0


def _prod(dims: list[int]) -> tuple[int, bool]:
    k, batch = 1, False
    for d in dims:
        if d < 0:
            batch = True
            k *= -d
        else:
            k *= d
    return k, batch


def _enc(k: int, batch: bool) -> int:
    return -k if batch else k


def _broadcast(a: list[int], b: list[int], where: str) -> list[int]:
    r = max(len(a), len(b))
    a = [1] * (r - len(a)) + a
    b = [1] * (r - len(b)) + b
    out = []
    for x, y in zip(a, b):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            raise OnnxError(OnnxReason.BAD_SHAPE, f"{where}: shapes {a} and {b} do not broadcast")
    return out


def _ints(node: Node, name: str, default: list[int]) -> list[int]:
    v = node.attrs.get(name, default)
    v = v if isinstance(v, list) else [v]
    if not all(isinstance(x, int) for x in v):
        raise OnnxError(OnnxReason.UNSUPPORTED_ATTRIBUTE, f"{node.label()}: attribute {name!r} must be integers")
    return v


def _int(node: Node, name: str, default: int) -> int:
    v = node.attrs.get(name, default)
    if not isinstance(v, int):
        raise OnnxError(OnnxReason.UNSUPPORTED_ATTRIBUTE, f"{node.label()}: attribute {name!r} must be an integer")
    return v


def _float(node: Node, name: str, default: float) -> float:
    v = node.attrs.get(name, default)
    if not isinstance(v, (int, float)) or not math.isfinite(v):
        raise OnnxError(OnnxReason.UNSUPPORTED_ATTRIBUTE, f"{node.label()}: attribute {name!r} must be a finite number")
    return float(v)


#: Inputs each operator needs (ONNX's required ones).
MIN_INPUTS = {"MatMul": 2, "Gemm": 2, "Add": 2, "Sub": 2, "Mul": 2, "Div": 2, "Reshape": 2, "Conv": 2,
              "BatchNormalization": 5, "LayerNormalization": 2, "Gather": 2, "Constant": 0}


class _Builder:
    def __init__(self, graph: Graph, settings: Settings) -> None:
        self.g = graph
        self.s = settings
        self.t: dict[str, _T] = {}
        self.consts: list[float] = []
        self.int_values: dict[str, list[int]] = {}
        self.nodes: list[tuple[int, list[str], str, list[int], list[float]]] = []
        self.alias: dict[str, str] = {}

    def name(self, n: str) -> str:
        while n in self.alias:
            n = self.alias[n]
        return n

    def shape(self, n: str, node: Node) -> list[int]:
        n = self.name(n)
        if n not in self.t:
            raise OnnxError(OnnxReason.BAD_GRAPH, f"{node.label()} reads {n!r}, which nothing produced before it")
        return self.t[n].dims

    def out(self, node: Node, dims: list[int]) -> None:
        if len(dims) > MAX_DIMS:
            raise OnnxError(OnnxReason.BAD_SHAPE, f"{node.label()}: more than {MAX_DIMS} dimensions")
        k, _ = _prod(dims)
        if k > MAX_PER_EXAMPLE or any(d == 0 for d in dims):
            raise OnnxError(OnnxReason.BAD_SHAPE, f"{node.label()}: output of {dims} is empty or over {MAX_PER_EXAMPLE} values per example")
        self.t[node.outputs[0]] = _T(T_ACT, dims)

    def weight(self, n: str, node: Node, kind: int = T_PARAM) -> list[int]:
        n = self.name(n)
        init = self.g.initializers.get(n)
        if init is None:
            return self.shape(n, node)
        if init.dtype != FLOAT:
            raise OnnxError(OnnxReason.UNSUPPORTED_TYPE, f"{node.label()}: initializer {n!r} is not float32")
        have = self.t.get(n)
        if have is not None and have.kind != kind:
            raise OnnxError(OnnxReason.BAD_GRAPH, f"{node.label()}: initializer {n!r} is both trained and a running statistic")
        if have is None:
            self.t[n] = _T(kind, list(init.dims))
        return list(init.dims)

    def ints(self, n: str, node: Node) -> list[int]:
        n = self.name(n)
        if n in self.int_values:
            return self.int_values[n]
        init = self.g.initializers.get(n)
        if init is None:
            raise OnnxError(OnnxReason.UNSUPPORTED_GRAPH, f"{node.label()}: input {n!r} must be a constant (an initializer or Constant)")
        return [int(v) for v in init.values]

    def emit(self, node: Node, inputs: list[str], ia: list[int] | None = None, fa: list[float] | None = None) -> None:
        self.nodes.append((OP_CODES[node.op], [self.name(i) if i else "" for i in inputs], node.outputs[0], ia or [], fa or []))

    def run(self) -> Compiled:
        s = self.s
        if len(self.g.inputs) != 1:
            raise OnnxError(OnnxReason.UNSUPPORTED_GRAPH, f"the graph has {len(self.g.inputs)} inputs; Weei takes exactly one (the features)")
        in_name, in_dims = self.g.inputs[0]
        if len(in_dims) < 2 or any(not isinstance(d, int) or d <= 0 for d in in_dims[1:]):
            raise OnnxError(OnnxReason.BAD_SHAPE, f"input {in_name!r} has shape {in_dims}: Weei needs [batch, fixed dims...]")
        dims = [-1, *[int(d) for d in in_dims[1:]]]
        features, _ = _prod(dims)
        if features > MAX_PER_EXAMPLE:
            raise OnnxError(OnnxReason.BAD_SHAPE, f"input {in_name!r} has {features} values per example, over {MAX_PER_EXAMPLE}")
        if s.data == "tokens" and len(dims) != 2:
            raise OnnxError(OnnxReason.BAD_SHAPE, f"input {in_name!r} has shape {in_dims}: token sequences are [batch, context]")
        if s.data == "digits" and features != 64:
            raise OnnxError(OnnxReason.BAD_SHAPE, f"weei-digits-v1 gives 64 pixels per example, the input {in_name!r} takes {features}")
        self.t[in_name] = _T(T_INPUT, dims)
        for node in _topological(self.g):
            self.node(node)
        if len(self.g.outputs) < 1:
            raise OnnxError(OnnxReason.UNSUPPORTED_GRAPH, "the graph has no output")
        out_name = self.name(self.g.outputs[0])
        if out_name not in self.t or self.t[out_name].kind != T_ACT:
            raise OnnxError(OnnxReason.UNSUPPORTED_GRAPH, f"the output {out_name!r} is not computed from the input")
        loss_name = out_name
        producer = next((n for n in self.nodes if n[2] == out_name), None)
        if s.loss != "mse" and producer is not None and producer[0] == OP_CODES["Softmax"]:
            loss_name = producer[1][0]   # cross-entropy takes logits: train on the Softmax's input
        odims = self.t[out_name].dims
        per, batch = _prod(odims)
        if not batch or odims[0] != -1:
            raise OnnxError(OnnxReason.BAD_SHAPE, f"the output {out_name!r} has shape {odims}: Weei needs [batch, ...]")
        return self.finish(in_name, out_name, loss_name, features, per)

    def node(self, node: Node) -> None:
        op = node.op
        if op not in OPERATORS:
            raise OnnxError(OnnxReason.UNSUPPORTED_OPERATOR, f"{op} used by {node.label()} is not supported "
                                                    f"(supported: {', '.join(OPERATORS)})")
        if not node.outputs:
            raise OnnxError(OnnxReason.BAD_GRAPH, f"{node.label()} has no output")
        need = MIN_INPUTS.get(op, 1)
        if len(node.inputs) < need or not all(node.inputs[:need]):
            raise OnnxError(OnnxReason.BAD_GRAPH, f"{node.label()} has {len(node.inputs)} inputs; {op} needs {need}")
        for extra in node.outputs[1:]:
            if extra and any(extra in n.inputs for n in self.g.nodes) or extra in self.g.outputs:
                raise OnnxError(OnnxReason.UNSUPPORTED_GRAPH, f"{node.label()}: its output {extra!r} is used; Weei computes only the first")
        if op == "Constant":
            value = node.attrs.get("value")
            if isinstance(value, Tensor):
                vals, dims, dtype = value.values, value.dims, value.dtype
            elif "value_float" in node.attrs:
                vals, dims, dtype = [node.attrs["value_float"]], [], FLOAT
            elif "value_floats" in node.attrs:
                vals, dims, dtype = node.attrs["value_floats"], [len(node.attrs["value_floats"])], FLOAT
            elif "value_int" in node.attrs or "value_ints" in node.attrs:
                v = node.attrs.get("value_ints", node.attrs.get("value_int"))
                vals, dims, dtype = (v if isinstance(v, list) else [v]), [], 7
            else:
                raise OnnxError(OnnxReason.UNSUPPORTED_GRAPH, f"{node.label()}: a Constant of this kind is not supported")
            if dtype == FLOAT:
                if len(vals) > MAX_ELEMENTS:
                    raise OnnxError(OnnxReason.TENSOR_TOO_LARGE, f"{node.label()}: too many values")
                self.t[node.outputs[0]] = _T(T_CONST, list(dims) or [1], len(self.consts))
                self.consts += [float(v) for v in vals]
            else:
                self.int_values[node.outputs[0]] = [int(v) for v in vals]
            return
        x = self.shape(node.inputs[0], node) if op not in ("MatMul", "Gemm", "Add", "Sub", "Mul", "Div", "Concat", "Gather") else None
        if op in ("Add", "Sub", "Mul", "Div", "MatMul", "Gemm"):
            a = self.weight(node.inputs[0], node)
            b = self.weight(node.inputs[1], node)
            if op == "MatMul":
                if len(a) < 2 or len(b) < 2:
                    raise OnnxError(OnnxReason.BAD_SHAPE, f"{node.label()}: MatMul of rank-1 operands is not supported")
                if a[-1] != b[-2]:
                    raise OnnxError(OnnxReason.BAD_SHAPE, f"{node.label()}: {a} x {b} do not multiply")
                if len(b) > 2 and a[:-2] != b[:-2]:
                    raise OnnxError(OnnxReason.BAD_SHAPE, f"{node.label()}: batched MatMul needs equal leading dims, got {a} and {b}")
                if b[-1] < 0 or b[-2] < 0 and len(b) == 2:
                    raise OnnxError(OnnxReason.BAD_SHAPE, f"{node.label()}: the right operand may not depend on the batch")
                self.out(node, [*a[:-1], b[-1]])
                self.emit(node, node.inputs[:2])
            elif op == "Gemm":
                ta, tb = _int(node, "transA", 0), _int(node, "transB", 0)
                if len(a) != 2 or len(b) != 2:
                    raise OnnxError(OnnxReason.BAD_SHAPE, f"{node.label()}: Gemm takes 2-D operands")
                m, k = (a[1], a[0]) if ta else (a[0], a[1])
                k2, n = (b[1], b[0]) if tb else (b[0], b[1])
                if k != k2 or n < 0 or k < 0:
                    raise OnnxError(OnnxReason.BAD_SHAPE, f"{node.label()}: Gemm of {a} and {b} does not multiply")
                if len(node.inputs) > 2 and node.inputs[2]:
                    c = self.weight(node.inputs[2], node)
                    if len(c) > 2 or _broadcast([m, n], c, node.label()) != [m, n] or (len(c) == 2 and c[0] not in (1, m)):
                        raise OnnxError(OnnxReason.BAD_SHAPE, f"{node.label()}: C of shape {c} does not broadcast to {[m, n]}")
                self.out(node, [m, n])
                self.emit(node, node.inputs[:3], [ta, tb], [_float(node, "alpha", 1.0), _float(node, "beta", 1.0)])
            else:
                self.out(node, _broadcast(a, b, node.label()))
                self.emit(node, node.inputs[:2])
            return
        if op in ("Concat", "Gather"):
            self.join(node)
            return
        assert x is not None
        if op in ("Relu", "Tanh", "Sigmoid", "Identity"):
            self.out(node, list(x))
            self.emit(node, node.inputs[:1])
        elif op == "Gelu":
            approx = node.attrs.get("approximate", "none")
            approx = approx.decode() if isinstance(approx, bytes) else approx
            if approx not in ("none", "tanh"):
                raise OnnxError(OnnxReason.UNSUPPORTED_ATTRIBUTE, f"{node.label()}: approximate {approx!r} is not none or tanh")
            self.out(node, list(x))
            self.emit(node, node.inputs[:1], [int(approx == "tanh")])
        elif op == "LayerNormalization":
            r = len(x)
            axis = _int(node, "axis", -1)
            axis = axis + r if axis < 0 else axis
            if not 0 <= axis < r or any(d < 0 for d in x[axis:]):
                raise OnnxError(OnnxReason.BAD_SHAPE, f"{node.label()}: axis {axis} of {x} must lie after the batch")
            span, _ = _prod(x[axis:])
            for i in (1, 2):
                if len(node.inputs) > i and node.inputs[i] and _prod(self.weight(node.inputs[i], node))[0] != span:
                    raise OnnxError(OnnxReason.BAD_SHAPE, f"{node.label()}: input {i} must have the normalized shape {x[axis:]}")
            if len(node.inputs) < 2 or not node.inputs[1]:
                raise OnnxError(OnnxReason.BAD_GRAPH, f"{node.label()}: the scale is missing")
            self.out(node, list(x))
            self.emit(node, node.inputs[:3], [axis, span], [_float(node, "epsilon", 1e-5)])
        elif op == "Transpose":
            perm = _ints(node, "perm", list(range(len(x) - 1, -1, -1)))
            if sorted(perm) != list(range(len(x))):
                raise OnnxError(OnnxReason.BAD_SHAPE, f"{node.label()}: perm {perm} is not a permutation of {len(x)} dims")
            out = [x[p] for p in perm]
            if sum(d < 0 for d in x) != 1 or out[0] >= 0:
                raise OnnxError(OnnxReason.UNSUPPORTED_GRAPH, f"{node.label()}: the batch must stay the first dimension")
            self.out(node, out)
            self.emit(node, node.inputs[:1], perm)
        elif op == "LeakyRelu":
            self.out(node, list(x))
            self.emit(node, node.inputs[:1], [], [_float(node, "alpha", 0.01)])
        elif op in ("Softmax", "LogSoftmax"):
            r = len(x)
            axis = _int(node, "axis", -1 if self.g.opset >= 13 else 1)
            axis = axis + r if axis < 0 else axis
            if not 0 <= axis < r:
                raise OnnxError(OnnxReason.BAD_SHAPE, f"{node.label()}: axis out of range")
            span = [axis, axis + 1] if self.g.opset >= 13 else [axis, r]
            if any(d < 0 for d in x[span[0]:span[1]]):
                raise OnnxError(OnnxReason.UNSUPPORTED_GRAPH, f"{node.label()}: a softmax across the batch is not supported")
            self.out(node, list(x))
            self.emit(node, node.inputs[:1], span)
        elif op == "Flatten":
            axis = _int(node, "axis", 1)
            axis = axis + len(x) if axis < 0 else axis
            self.out(node, [_enc(*_prod(x[:axis])), _enc(*_prod(x[axis:]))])
            self.emit(node, node.inputs[:1])
        elif op == "Reshape":
            self.out(node, _reshape(x, self.ints(node.inputs[1], node), node))
            self.emit(node, node.inputs[:1])
        elif op == "Dropout":
            ratio = _float(node, "ratio", 0.5)
            if len(node.inputs) > 1 and node.inputs[1]:
                n = self.name(node.inputs[1])
                if n in self.g.initializers:
                    ratio = float(self.g.initializers[n].values[0])
                elif n in self.t and self.t[n].kind == T_CONST:
                    ratio = self.consts[self.t[n].offset]
                else:
                    raise OnnxError(OnnxReason.UNSUPPORTED_GRAPH, f"{node.label()}: the ratio must be a constant")
            if not 0.0 <= ratio < 1.0:
                raise OnnxError(OnnxReason.BAD_GRAPH, f"{node.label()}: ratio {ratio} is not in [0, 1)")
            self.out(node, list(x))
            self.emit(node, node.inputs[:1], [], [ratio])
        elif op in ("Conv", "MaxPool", "AveragePool"):
            self.pool_like(node, x)
        elif op == "GlobalAveragePool":
            if len(x) != 4:
                raise OnnxError(OnnxReason.BAD_SHAPE, f"{node.label()}: only 2-D images (NCHW) are supported")
            self.out(node, [x[0], x[1], 1, 1])
            self.emit(node, node.inputs[:1])
        elif op == "BatchNormalization":
            if len(x) < 2 or x[1] < 0:
                raise OnnxError(OnnxReason.BAD_SHAPE, f"{node.label()}: needs [N, C, ...]")
            for i, kind in ((1, T_PARAM), (2, T_PARAM), (3, T_STATE), (4, T_STATE)):
                if self.weight(node.inputs[i], node, kind) != [x[1]]:
                    raise OnnxError(OnnxReason.BAD_SHAPE, f"{node.label()}: input {i} must have shape [{x[1]}]")
                if self.name(node.inputs[i]) not in self.g.initializers:
                    raise OnnxError(OnnxReason.UNSUPPORTED_GRAPH, f"{node.label()}: scale, bias and statistics must be initializers")
            self.out(node, list(x))
            self.emit(node, node.inputs[:5], [], [_float(node, "epsilon", 1e-5), _float(node, "momentum", 0.9)])

    def join(self, node: Node) -> None:
        """Concat and Gather, whose operands may be weights, constants or activations."""
        if node.op == "Gather":
            if _int(node, "axis", 0) != 0:
                raise OnnxError(OnnxReason.UNSUPPORTED_ATTRIBUTE, f"{node.label()}: only axis 0 (embeddings) is supported")
            table = self.weight(node.inputs[0], node)
            idx = self.name(node.inputs[1])
            if idx in self.int_values or (idx in self.g.initializers and self.g.initializers[idx].dtype != FLOAT):
                values = self.ints(idx, node)
                dims = list(self.g.initializers[idx].dims) if idx in self.g.initializers else [len(values)]
                self.t[idx] = _T(T_CONST, dims or [1], len(self.consts))
                self.consts += [float(v) for v in values]
            ind = self.shape(idx, node)
            if not table or any(d < 0 for d in table):
                raise OnnxError(OnnxReason.BAD_SHAPE, f"{node.label()}: the table {table} must not depend on the batch")
            self.out(node, [*ind, *table[1:]])
            self.emit(node, [node.inputs[0], idx])
            return
        if not 1 <= len(node.inputs) <= 5:
            raise OnnxError(OnnxReason.UNSUPPORTED_GRAPH, f"{node.label()}: Concat of {len(node.inputs)} inputs (1..5 are supported)")
        shapes = [self.weight(i, node) for i in node.inputs]
        r = len(shapes[0])
        axis = _int(node, "axis", 0)
        axis = axis + r if axis < 0 else axis
        if not 0 <= axis < r or any(len(d) != r or d[:axis] + d[axis + 1:] != shapes[0][:axis] + shapes[0][axis + 1:] for d in shapes) \
                or any(d[axis] < 0 for d in shapes):
            raise OnnxError(OnnxReason.BAD_SHAPE, f"{node.label()}: shapes {shapes} do not concatenate on axis {axis} (not the batch)")
        self.out(node, [*shapes[0][:axis], sum(d[axis] for d in shapes), *shapes[0][axis + 1:]])
        self.emit(node, node.inputs, [axis])

    def pool_like(self, node: Node, x: list[int]) -> None:
        op = node.op
        if len(x) != 4 or x[0] != -1 or any(d < 0 for d in x[1:]):
            raise OnnxError(OnnxReason.BAD_SHAPE, f"{node.label()}: only 2-D images [batch, C, H, W] are supported, got {x}")
        if node.attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
            raise OnnxError(OnnxReason.UNSUPPORTED_ATTRIBUTE, f"{node.label()}: auto_pad {node.attrs['auto_pad']} is not supported (give pads)")
        if any(d != 1 for d in _ints(node, "dilations", [1, 1])):
            raise OnnxError(OnnxReason.UNSUPPORTED_ATTRIBUTE, f"{node.label()}: dilations other than 1 are not supported")
        if op == "Conv":
            w = self.weight(node.inputs[1], node)
            if _int(node, "group", 1) != 1:
                raise OnnxError(OnnxReason.UNSUPPORTED_ATTRIBUTE, f"{node.label()}: group other than 1 is not supported")
            if len(w) != 4 or w[1] != x[1]:
                raise OnnxError(OnnxReason.BAD_SHAPE, f"{node.label()}: weights {w} do not fit input {x}")
            kernel = w[2:]
            if len(node.inputs) > 2 and node.inputs[2] and self.weight(node.inputs[2], node) != [w[0]]:
                raise OnnxError(OnnxReason.BAD_SHAPE, f"{node.label()}: bias must have shape [{w[0]}]")
            channels = w[0]
        else:
            kernel = _ints(node, "kernel_shape", [])
            channels = x[1]
            if _int(node, "storage_order", 0) != 0:
                raise OnnxError(OnnxReason.UNSUPPORTED_ATTRIBUTE, f"{node.label()}: storage_order 1 is not supported")
        if len(kernel) != 2:
            raise OnnxError(OnnxReason.BAD_SHAPE, f"{node.label()}: kernel_shape must have 2 values")
        strides = _ints(node, "strides", [1, 1])
        pads = _ints(node, "pads", [0, 0, 0, 0])
        if len(strides) != 2 or len(pads) != 4 or min(strides) < 1 or min(pads) < 0 or min(kernel) < 1:
            raise OnnxError(OnnxReason.BAD_SHAPE, f"{node.label()}: strides, pads or kernel out of range")
        ceil = _int(node, "ceil_mode", 0)
        size = []
        for i in range(2):
            span = x[2 + i] + pads[i] + pads[i + 2] - kernel[i]
            if span < 0:
                raise OnnxError(OnnxReason.BAD_SHAPE, f"{node.label()}: the kernel is larger than the padded input")
            o = (-(-span // strides[i]) if ceil else span // strides[i]) + 1
            if ceil and (o - 1) * strides[i] >= x[2 + i] + pads[i]:
                o -= 1
            size.append(o)
        self.out(node, [x[0], channels, *size])
        ia = [kernel[0], kernel[1], strides[0], strides[1], pads[0], pads[1],
              _int(node, "count_include_pad", 0), 0, pads[2], pads[3]]
        self.emit(node, node.inputs[:3] if op == "Conv" else node.inputs[:1], ia)

    def finish(self, in_name: str, out_name: str, loss_name: str, features: int, per: int) -> Compiled:
        s = self.s
        weights: list[float] = []
        layout: dict[str, tuple[int, list[int]]] = {}
        for kind in (T_PARAM, T_STATE):
            for n, t in self.t.items():
                if t.kind == kind:
                    t.offset = len(weights)
                    layout[n] = (t.offset, t.dims)
                    weights += [float(v) for v in self.g.initializers[n].values]
        n_params = sum(len(self.g.initializers[n].values) for n, t in self.t.items() if t.kind == T_PARAM)
        if not weights:
            raise OnnxError(OnnxReason.UNSUPPORTED_GRAPH, "the graph has no float initializers to train")
        if len(weights) > MAX_ELEMENTS:
            raise OnnxError(OnnxReason.TENSOR_TOO_LARGE, f"the graph has {len(weights)} weights, over {MAX_ELEMENTS}")
        names = list(self.t)
        ids = {n: i for i, n in enumerate(names)}
        classes = per if s.loss == "cross-entropy" else 0
        if s.loss == "cross-entropy" and per < 2:
            raise OnnxError(OnnxReason.BAD_SHAPE, f"cross-entropy needs at least 2 classes; the output {out_name!r} has {per} per example")
        if s.loss == "next-token":
            ldims = self.t[loss_name].dims
            if len(ldims) != 3 or ldims[1] != features or ldims[2] < 256:
                raise OnnxError(OnnxReason.BAD_SHAPE, f"next-token needs logits [batch, {features}, vocabulary of at least 256]; "
                                             f"{loss_name!r} has {ldims}")
            classes = ldims[2]
        metrics = [{"id": "loss", "label": "Loss", "direction": "minimize"}]
        if s.loss != "mse":
            metrics.append({"id": "accuracy", "label": "Accuracy", "direction": "maximize"})
        record = 65 if s.data == "digits" else features + 1 if s.data == "tokens" else 4 * features + 4
        info: dict[str, Any] = {
            "id": s.model_id, "version": "1.0.0", "name": s.name, "abiVersion": 1, "weightFormat": "float32-le",
            "maxWorkers": 1, "maxChunkBytes": (12 if s.data == "records" else 8) + MAX_EXAMPLES * record,
            "maxExamplesPerChunk": MAX_EXAMPLES,
            "dataFormats": [{"id": FORMAT_IDS[s.data], "label": FORMAT_IDS[s.data],
                             "acceptedMimeTypes": ["application/octet-stream"]}],
            "metrics": metrics,
        }
        if len(weights) > n_params:
            info["aggregation"] = {"averageOnly": [{"offset": n_params * 4, "bytes": (len(weights) - n_params) * 4}]}
        info_bytes = json.dumps(info, separators=(",", ":")).encode("utf-8")
        out = bytearray(b"WOG1" + struct.pack("<I", len(info_bytes)) + info_bytes)
        out += bytes(-len(out) % 4)
        cfg = [ids[in_name], ids[out_name], ids[loss_name], LOSSES[s.loss], OPTIMIZERS[s.optimizer], FORMATS[s.data],
               features, s.batch_size, n_params, len(weights), len(names), len(self.nodes), len(self.consts),
               MAX_EXAMPLES, classes, 0]
        out += struct.pack("<16I", *cfg)
        out += struct.pack("<8f", s.lr, s.beta1, s.beta2, s.eps, s.weight_decay, 0, 0, 0)
        for n in names:
            t = self.t[n]
            dims = t.dims + [0] * (MAX_DIMS - len(t.dims))
            out += struct.pack("<II6iI", t.kind, len(t.dims), *dims, t.offset)
        for op, inputs, output, ia, fa in self.nodes:
            ins = [ids[i] if i else 0xFFFFFFFF for i in inputs] + [0xFFFFFFFF] * (5 - len(inputs))
            out += struct.pack("<7I", op, len(inputs), *ins)
            out += struct.pack("<3I", 1, ids[output], 0xFFFFFFFF)
            out += struct.pack("<12i", *(ia + [0] * (12 - len(ia))))
            out += struct.pack("<4f", *(fa + [0.0] * (4 - len(fa))))
        out += struct.pack(f"<{len(self.consts)}f", *self.consts)
        out += struct.pack(f"<{len(weights)}f", *weights)
        return Compiled(bytes(out), info, weights, layout)


def _reshape(x: list[int], shape: list[int], node: Node) -> list[int]:
    total, batch = _prod(x)
    out: list[int] = []
    infer = -1
    for i, d in enumerate(shape):
        if d == 0:
            out.append(x[i] if i < len(x) else 0)
        elif d == -1:
            if infer >= 0:
                raise OnnxError(OnnxReason.BAD_SHAPE, f"{node.label()}: two -1 in the shape")
            infer = i
            out.append(0)
        elif d > 0:
            out.append(d)
        else:
            raise OnnxError(OnnxReason.BAD_SHAPE, f"{node.label()}: dimension {d}")
    known, kbatch = _prod([d for i, d in enumerate(out) if i != infer])
    if infer >= 0:
        if known == 0 or total % known or (kbatch and not batch):
            raise OnnxError(OnnxReason.BAD_SHAPE, f"{node.label()}: cannot reshape {x} to {shape}")
        out[infer] = _enc(total // known, batch and not kbatch)
    elif (known, kbatch) != (total, batch):
        raise OnnxError(OnnxReason.BAD_SHAPE, f"{node.label()}: cannot reshape {x} to {shape} (the batch must stay a free dimension)")
    return out


def _topological(graph: Graph) -> list[Node]:
    """The nodes in an order where each runs after its inputs; a cycle is refused."""
    produced = {o: i for i, n in enumerate(graph.nodes) for o in n.outputs if o}
    indegree = [0] * len(graph.nodes)
    users: dict[int, list[int]] = {}
    for i, n in enumerate(graph.nodes):
        for name in {x for x in n.inputs if x}:
            j = produced.get(name)
            if j is not None:
                indegree[i] += 1
                users.setdefault(j, []).append(i)
    ready = deque(i for i, d in enumerate(indegree) if d == 0)
    order: list[Node] = []
    while ready:
        i = ready.popleft()
        order.append(graph.nodes[i])
        for k in users.get(i, ()):
            indegree[k] -= 1
            if indegree[k] == 0:
                ready.append(k)
    if len(order) != len(graph.nodes):
        stuck = next(n for i, n in enumerate(graph.nodes) if indegree[i] > 0)
        raise OnnxError(OnnxReason.GRAPH_CYCLE, f"the graph has a cycle through {stuck.label()}")
    return order


def compile_graph(graph: Graph, settings: Settings) -> Compiled:
    """The blob, ModelInfo and initial weights of ``graph``. Raises OnnxError."""
    if settings.loss not in LOSSES or settings.optimizer not in OPTIMIZERS or settings.data not in FORMATS:
        raise OnnxError(OnnxReason.BAD_SETTING, f"loss {settings.loss!r}, optimizer {settings.optimizer!r} or data {settings.data!r} is unknown")
    if (settings.loss == "next-token") != (settings.data == "tokens"):
        raise OnnxError(OnnxReason.BAD_SETTING, "the next-token loss and the tokens data format go together")
    if not (math.isfinite(settings.lr) and settings.lr > 0) or not 1 <= settings.batch_size <= MAX_EXAMPLES:
        raise OnnxError(OnnxReason.BAD_SETTING, "the learning rate must be a positive number and the batch size 1..10000")
    return _Builder(graph, settings).run()
