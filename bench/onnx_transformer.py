"""A decoder-only transformer as an ONNX graph built with onnx.helper, for the training bench and
tests/unit/test_onnx_transformer.py: one builder, so what the bench measures is what the test trains.

Pre-norm layers (LayerNormalization, causal attention with one MatMul each for Q, K and V, a residual MLP),
learned positions, an untied output projection. The defaults are c/models/byte-transformer's shape
(transformer.h: vocabulary 256, width 128, 3 layers, 4 heads, a ReLU MLP of 448, context 64, biases as its
own; its output projection is tied to the embedding, this one's is a weight of its own: the same work).
"""

from __future__ import annotations

from typing import Any

__all__ = ["transformer_onnx"]


def transformer_onnx(seed: int = 1, *, width: int = 128, layers: int = 3, heads: int = 4, mlp: int = 448,
                     context: int = 64, vocab: int = 256, activation: str = "Relu", attention_bias: bool = True,
                     depth_scaled: bool = False, opset: int = 17) -> bytes:
    """The graph's bytes; ``seed`` draws the initializers (normal, 0.02). ``attention_bias`` adds biases to Q, K,
    V and the output projection; ``depth_scaled`` divides the init of the weights that feed the residual stream
    (Wo, W2) by sqrt(2 · layers), GPT-2's rule; ``activation`` is the MLP's ONNX op (Relu or Gelu)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    V, D, L, H, F, T = vocab, width, layers, heads, mlp, context
    rng = np.random.default_rng(seed)
    residual = 0.02 / np.sqrt(2 * L) if depth_scaled else 0.02
    inits: dict[str, Any] = {"E": rng.normal(0, 0.02, (V, D)), "P": rng.normal(0, 0.02, (T, D)),
                             "gf": np.ones(D), "bf": np.zeros(D), "Wout": rng.normal(0, 0.02, (D, V)),
                             "bout": np.zeros(V), "heads": np.array([0, 0, H, D // H], np.int64),
                             "width": np.array([0, 0, D], np.int64)}
    mask = np.triu(np.full((T, T), -1e9, np.float32), 1)
    nodes = [helper.make_node("Constant", [], ["mask"], value=numpy_helper.from_array(mask)),
             helper.make_node("Constant", [], ["scale"],
                              value=numpy_helper.from_array(np.array(1 / np.sqrt(D // H), np.float32))),
             helper.make_node("Gather", ["E", "x"], ["emb"]), helper.make_node("Add", ["emb", "P"], ["h0"])]
    h = "h0"
    for i in range(L):
        p = f"l{i}_"

        def n(op: str, ins: list[str], out: str, **kw: Any) -> None:
            shared = ("mask", "scale", "heads", "width")
            nodes.append(helper.make_node(op, [x if x in shared or x.startswith("h") else p + x for x in ins],
                                          [p + out], **kw))

        for k, shape in (("Wq", (D, D)), ("Wk", (D, D)), ("Wv", (D, D)), ("Wo", (D, D)), ("W1", (D, F)),
                         ("W2", (F, D))):
            inits[p + k] = rng.normal(0, residual if k in ("Wo", "W2") else 0.02, shape)
        biases = (("bq", D), ("bk", D), ("bv", D), ("bo", D)) if attention_bias else ()
        for k, size in (*biases, ("b1", F), ("b2", D), ("n1b", D), ("n2b", D)):
            inits[p + k] = np.zeros(size)
        inits[p + "n1g"], inits[p + "n2g"] = np.ones(D), np.ones(D)
        nodes.append(helper.make_node("LayerNormalization", [h, p + "n1g", p + "n1b"], [p + "n1"]))
        for k in ("q", "k", "v"):
            if attention_bias:
                n("MatMul", ["n1", "W" + k], k + "m")
                n("Add", [k + "m", "b" + k], k)
            else:
                n("MatMul", ["n1", "W" + k], k)
            n("Reshape", [k, "heads"], k + "4")
        n("Transpose", ["q4"], "qt", perm=[0, 2, 1, 3])
        n("Transpose", ["k4"], "kt", perm=[0, 2, 3, 1])
        n("Transpose", ["v4"], "vt", perm=[0, 2, 1, 3])
        n("MatMul", ["qt", "kt"], "s")
        n("Mul", ["s", "scale"], "ss")
        n("Add", ["ss", "mask"], "sm")
        n("Softmax", ["sm"], "a", axis=-1)
        n("MatMul", ["a", "vt"], "o")
        n("Transpose", ["o"], "ot", perm=[0, 2, 1, 3])
        n("Reshape", ["ot", "width"], "or")
        if attention_bias:
            n("MatMul", ["or", "Wo"], "pm")
            n("Add", ["pm", "bo"], "proj")
        else:
            n("MatMul", ["or", "Wo"], "proj")
        nodes.append(helper.make_node("Add", [h, p + "proj"], [p + "r1"]))
        n("LayerNormalization", ["r1", "n2g", "n2b"], "n2")
        n("MatMul", ["n2", "W1"], "f")
        n("Add", ["f", "b1"], "fb")
        n(activation, ["fb"], "fr")
        n("MatMul", ["fr", "W2"], "f2")
        n("Add", ["f2", "b2"], "f2b")
        n("Add", ["r1", "f2b"], "out")
        h = p + "out"
    nodes += [helper.make_node("LayerNormalization", [h, "gf", "bf"], ["nf"]),
              helper.make_node("MatMul", ["nf", "Wout"], ["lw"]), helper.make_node("Add", ["lw", "bout"], ["logits"])]
    graph = helper.make_graph(nodes, "byte-transformer",
                              [helper.make_tensor_value_info("x", TensorProto.INT64, ["N", T])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", T, V])],
                              [numpy_helper.from_array(v if v.dtype == np.int64 else v.astype(np.float32), k)
                               for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]).SerializeToString()
