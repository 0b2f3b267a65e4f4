"""The WGSL archive: packing, parsing and the named refusals (weei.gpu.archive)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from weei.core.formats.manifest import parse_package
from weei.gpu import GpuError, check_descriptor, pack_archive, parse_archive, require_modules
from weei.gpu.archive import MAX_ARCHIVE_BYTES, entry_points_of
from weei.modelkit.package import gpu_programs
from weei.runtime import ModelRuntime, WasmtimeEngine

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "app" / "static" / "models" / "digits-mlp"
SOURCES = {p.name: p.read_text(encoding="utf-8") for p in sorted((ROOT / "wgsl").glob("*.wgsl"))}


@pytest.mark.parametrize("model", ["digits-mlp", "cartpole-reinforce", "byte-transformer"])
def test_each_package_carries_the_kernels_its_programs_name_and_no_others(model: str) -> None:
    root = ROOT / "app" / "static" / "models" / model
    used = _named_modules(root)
    assert ("transformer.wgsl" in used) == (model == "byte-transformer")
    assert (root / "model.wgsl.json").read_bytes() == pack_archive({n: SOURCES[n] for n in used})


def _reason(data: bytes) -> str:
    with pytest.raises(GpuError) as info:
        parse_archive(data)
    return info.value.reason


def _doc() -> dict:
    return json.loads(pack_archive(SOURCES))


def _named_modules(model: Path) -> list[str]:
    """The WGSL modules the model's device programs name (at the default batch and the whole chunk's)."""
    wasm = (model / "model.wasm").read_bytes()
    info = ModelRuntime.load(wasm, WasmtimeEngine()).model_info()
    chunk = (model / "data" / "training-001.bin").read_bytes() if "workSource" not in info else None
    return sorted({p["module"] for program in gpu_programs(wasm, info, chunk) for p in program["pipelines"]})


def test_the_committed_archive_is_wgsl_packed_and_the_packages_own() -> None:
    data = (DIGITS / "model.wgsl.json").read_bytes()
    used = _named_modules(DIGITS)
    assert used == ["matmul.wgsl", "optimizer.wgsl", "reduce.wgsl", "softmax_xent.wgsl"]
    assert data == pack_archive({n: SOURCES[n] for n in used})  # only what its programs name
    archive = parse_archive(data)
    assert [m.name for m in archive.modules] == used
    assert archive.module("matmul.wgsl").entry_points == ("forward", "weight_grad", "input_grad")  # type: ignore[union-attr]
    assert archive.module_sha256s == [hashlib.sha256(SOURCES[n].encode()).hexdigest() for n in used]
    package = parse_package(json.loads((DIGITS / "manifest.json").read_text()))
    desc = package.shader_archive
    assert desc is not None and desc.file_name == "model.wgsl.json"
    check_descriptor(data, desc.bytes, desc.sha256)
    gpu = [b for b in package.backends if b.kind == "gpu"]
    assert len(gpu) == 1 and gpu[0].raw["runtime"] == "weei-device-program-v1"
    assert gpu[0].raw["hostDelivery"] == "installed-in-host"


def test_a_corrupted_archive_is_not_the_packages() -> None:
    data = bytearray((DIGITS / "model.wgsl.json").read_bytes())
    size, sha = len(data), hashlib.sha256(data).hexdigest()
    data[100] ^= 1
    with pytest.raises(GpuError) as info:
        check_descriptor(bytes(data), size, sha)
    assert info.value.reason == "archive-hash-mismatch"
    with pytest.raises(GpuError) as info:
        check_descriptor(bytes(data) + b" ", size, sha)
    assert info.value.reason == "archive-size-mismatch"


def test_malformed_archives() -> None:
    assert _reason(b"\xff\xfe") == "archive-malformed"
    assert _reason(b"{not json") == "archive-malformed"
    assert _reason(b"[]") == "archive-malformed"
    assert _reason(b" " * (MAX_ARCHIVE_BYTES + 1)) == "archive-malformed"
    assert _reason(json.dumps({"format": "zip", "modules": []}).encode()) == "archive-format"
    for change in (
        {"modules": []},
        {"modules": "x"},
        {"modules": [1]},
    ):
        assert _reason(json.dumps({**_doc(), **change}).encode()) == "archive-malformed"


@pytest.mark.parametrize(
    ("field", "value"),
    [("name", "../etc/passwd"), ("name", "matmul.js"), ("sha256", "ABC"), ("source", 3),
     ("entryPoints", []), ("entryPoints", ["forward", "forward"]), ("entryPoints", ["not an ident"])],
)
def test_module_fields_are_checked(field: str, value: object) -> None:
    doc = _doc()
    doc["modules"][0][field] = value
    assert _reason(json.dumps(doc).encode()) == "archive-malformed"


def test_module_hash_entry_points_and_duplicates() -> None:
    doc = _doc()
    doc["modules"][0]["source"] += "\n// changed"
    assert _reason(json.dumps(doc).encode()) == "module-hash-mismatch"
    doc = _doc()
    doc["modules"][0]["entryPoints"].append("nowhere")
    assert _reason(json.dumps(doc).encode()) == "module-entry-point-missing"
    doc = _doc()
    doc["modules"].append(dict(doc["modules"][0]))
    assert _reason(json.dumps(doc).encode()) == "module-duplicate"


def test_a_module_missing_from_the_archive() -> None:
    archive = parse_archive(pack_archive({k: v for k, v in SOURCES.items() if k != "reduce.wgsl"}))
    require_modules(archive, ["matmul.wgsl"])
    with pytest.raises(GpuError) as info:
        require_modules(archive, ["matmul.wgsl", "reduce.wgsl"])
    assert info.value.reason == "module-missing"


def test_entry_points_are_the_compute_functions() -> None:
    src = "fn helper() {}\n@compute @workgroup_size(64)\nfn a() {}\n@workgroup_size(8, 1) @compute fn b() {}\n@vertex fn v() {}"
    assert entry_points_of(src) == ("a", "b")
