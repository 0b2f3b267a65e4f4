"""The widget's ONNX form in CPython: the package it answers is `weei model import`'s, byte for byte.

``weei.browser.onnx_form.import_in_page`` is what the page's ``importOnnx``
runs in Pyodide, with the site's ``onnx/runtime.wasm`` and
``onnx/kernels.wgsl.json`` fetched by the page. Given the same .onnx file
and the same answers, its files equal those the CLI writes: the GPU
backend and ``model.wgsl.json`` included where the graph has a device
program, neither where it has none.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
pytest.importorskip("onnx")
from test_onnx_import import DIGITS, mlp  # noqa: E402

from weei.browser.onnx_form import import_in_page  # noqa: E402
from weei.cli import main  # noqa: E402
from weei.runtime import WasmtimeEngine  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "app" / "static" / "onnx"


def doubled() -> bytes:
    """An MLP whose hidden layer is Add(h, h): one tensor as both operands, a form with no device program."""
    from onnx import TensorProto, helper, load_from_string

    model = load_from_string(mlp(16))
    graph = model.graph
    relu = next(n for n in graph.node if n.op_type == "Relu")
    relu.input[0] = "h2"
    graph.node.insert(1, helper.make_node("Add", ["h", "h"], ["h2"]))
    assert graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT
    return model.SerializeToString()


@pytest.mark.parametrize("name, onnx, gpu", [("mlp", mlp(16), True), ("doubled", doubled(), False)])
def test_the_page_import_writes_the_cli_package(tmp_path: Path, name: str, onnx: bytes, gpu: bool) -> None:
    path = tmp_path / f"{name}.onnx"
    path.write_bytes(onnx)
    chunks = ["training-001.bin", "training-002.bin", "validation.bin"]
    data = tmp_path / "data"
    data.mkdir()
    for chunk in chunks:
        (data / chunk).write_bytes((DIGITS / chunk).read_bytes())
    cli = tmp_path / "cli"
    assert main(["model", "import", str(path), "--loss", "cross-entropy", "--optimizer", "adam", "--lr", "0.01",
                 "--batch-size", "16", "--data-format", "digits", "--data", str(data), "--id", name,
                 "--out", str(cli)]) == 0

    args = {"onnxName": path.name, "loss": "cross-entropy", "optimizer": "adam", "learningRate": 0.01,
            "batchSize": 16, "dataFormat": "digits", "modelId": name}
    files = {f"some/folder/{c}": (data / c).read_bytes() for c in chunks}
    page = dict(import_in_page(WasmtimeEngine(), args, onnx, (SITE / "runtime.wasm").read_bytes(), files,
                               (SITE / "kernels.wgsl.json").read_bytes()))

    expected = {"model.wasm", "manifest.json"} | ({"model.wgsl.json"} if gpu else set())
    assert set(page) == expected
    assert all(page[n] == (cli / n).read_bytes() for n in expected)
    backends = [b["kind"] for b in json.loads(page["manifest.json"])["execution"]["backends"]]
    assert ("gpu" in backends) is gpu, backends
    assert (cli / "model.wgsl.json").exists() is gpu

