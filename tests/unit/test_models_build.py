"""The committed model modules, kernels and package manifests (build.py)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import wasmtime

from weei.core.formats.jsonfmt import stringify
from weei.core.formats.manifest import check_loaded_model, parse_package
from weei.core.formats.modelinfo import ModelInfo
from weei.runtime import ModelRuntime, WasmtimeEngine

ROOT = Path(__file__).resolve().parents[2]
STATIC = ROOT / "app" / "static"
MODEL_IDS = ["byte-transformer", "cartpole-reinforce", "digits-mlp"]
OPERATIONS = ["getModelInfo", "createInitialWeights", "loadModel", "loadAuxiliary",
              "describeChunk", "train", "evaluate"]

needs_clang = pytest.mark.skipif(shutil.which("clang") is None, reason="clang is not installed (make setup)")
# The model builds (build.py, bench's native binaries) take most of the unit
# suite's time: they carry the `build` marker so `-m "not build"` (make test-unit) leaves them out.
model_build = pytest.mark.build


def _build_module():
    spec = importlib.util.spec_from_file_location("weei_build", ROOT / "build.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("weei_build", module)
    spec.loader.exec_module(module)
    return module


@model_build
@needs_clang
def test_committed_artifacts_match_a_fresh_build(tmp_path: Path) -> None:
    build = _build_module()
    built = build.build_all(tmp_path, STATIC)
    names = {p.relative_to(tmp_path).as_posix() for p in built}
    assert {f"models/{m}/{f}" for m in MODEL_IDS for f in ("model.wasm", "manifest.json")} <= names
    assert build.check_against(STATIC, built, tmp_path) == []
    # and a second build is byte-identical to the first (no paths, no time stamps)
    again = tmp_path / "again"
    for path in build.build_all(again, STATIC):
        assert path.read_bytes() == (tmp_path / path.relative_to(again)).read_bytes(), path


@model_build
@needs_clang
def test_check_reports_a_stale_artifact(tmp_path: Path) -> None:
    build = _build_module()
    built = build.build_all(tmp_path / "fresh", STATIC)
    committed = tmp_path / "committed"
    shutil.copytree(tmp_path / "fresh", committed)
    wasm = committed / "models" / "digits-mlp" / "model.wasm"
    wasm.write_bytes(wasm.read_bytes() + b"\x00")
    (committed / "models" / "old-model").mkdir()
    (committed / "models" / "old-model" / "model.wasm").write_bytes(b"\x00asm")
    problems = build.check_against(committed, built, tmp_path / "fresh")
    assert any("digits-mlp/model.wasm: differs" in p for p in problems)
    assert any("old-model/model.wasm" in p and "no source builds it" in p for p in problems)
    assert len(problems) == 2


@pytest.mark.parametrize("model_id", MODEL_IDS)
def test_module_imports_and_exports(model_id: str) -> None:
    module = wasmtime.Module(wasmtime.Engine(), (STATIC / "models" / model_id / "model.wasm").read_bytes())
    assert [(i.module, i.name) for i in module.imports] == [("weei", "onProgress")]
    exports = {e.name for e in module.exports}
    assert {"memory", "alloc", "free", "resultLength", *OPERATIONS} <= exports


@pytest.mark.parametrize("model_id", MODEL_IDS)
@pytest.mark.skipif(shutil.which("wasm-objdump") is None, reason="wabt is not installed")
def test_dense_layers_use_simd128(model_id: str) -> None:
    text = subprocess.run(
        ["wasm-objdump", "-d", str(STATIC / "models" / model_id / "model.wasm")],
        check=True, capture_output=True, text=True,
    ).stdout
    # the dense kernels: splat an input, multiply-add 4 lanes
    assert text.count("f32x4.mul") >= 8 and text.count("f32x4.add") >= 8
    assert "f32x4.splat" in text and "v128.load" in text


@pytest.mark.parametrize("model_id", MODEL_IDS)
def test_manifest_is_a_valid_package_for_its_module(model_id: str) -> None:
    raw_text = (STATIC / "models" / model_id / "manifest.json").read_text(encoding="utf-8")
    raw = json.loads(raw_text)
    assert raw_text == stringify(raw, 2) + "\n"
    package = parse_package(raw)
    wasm = (STATIC / "models" / model_id / "model.wasm").read_bytes()
    assert raw["wasm"] == {"fileName": "model.wasm", "bytes": len(wasm), "sha256": hashlib.sha256(wasm).hexdigest()}
    runtime = ModelRuntime.load(wasm, WasmtimeEngine())
    info = runtime.model_info()
    check_loaded_model(package, ModelInfo.from_json(info), len(runtime.create_initial_weights(0)))
    backend = raw["execution"]["backends"][0]
    assert backend["id"] == "cpu-wasm-simd" and backend["environments"] == ["browser", "agent"]
    assert backend["artifacts"] == [raw["wasm"]]


def test_cartpole_manifest_is_the_spec_example() -> None:
    raw = json.loads((STATIC / "models" / "cartpole-reinforce" / "manifest.json").read_text())
    assert raw["execution"]["weightBytes"] == 456
    assert raw["inlineJson"] == {
        "compatibility.json": {"schemaVersion": 1, "identity": {"modelId": "cartpole-reinforce"},
                               "weightCount": 114, "weightBytes": 456},
        "dataset-manifest.json": [],
    }
    assert raw["execution"]["datasetManifest"]["bytes"] == 3  # "[]\n"
    assert raw["auxiliaryWeights"] == []
    assert raw["workSource"]["unitsPerAssignment"] == {"default": 32, "minimum": 1, "maximum": 4096}
    assert raw["execution"]["policy"]["progressUnit"] == "episode"


def test_digits_dataset_manifest_lists_the_committed_chunks() -> None:
    raw = json.loads((STATIC / "models" / "digits-mlp" / "manifest.json").read_text())
    entries = raw["inlineJson"]["dataset-manifest.json"]
    assert "workSource" not in raw
    assert len(entries) == 15
    for k, entry in enumerate(entries, start=1):
        data = (STATIC / "models" / "digits-mlp" / "data" / entry["fileName"]).read_bytes()
        assert entry == {
            "id": f"chunk-{k:03d}", "fileName": f"training-{k:03d}.bin", "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(), "format": "weei-digits-v1", "exampleCount": 100,
        }


def test_digits_files_hold_all_of_sklearn_digits_once() -> None:
    sklearn = pytest.importorskip("sklearn.datasets")
    digits = sklearn.load_digits()
    data_dir = STATIC / "models" / "digits-mlp" / "data"
    records = []
    for path in sorted(data_dir.glob("*.bin")):
        blob = path.read_bytes()
        assert blob[:4] == b"WDG1"
        n = int.from_bytes(blob[4:8], "little")
        assert len(blob) == 8 + 65 * n
        records += [blob[8 + 65 * i: 8 + 65 * (i + 1)] for i in range(n)]
    expected = sorted(bytes(list(map(int, x)) + [int(y)]) for x, y in zip(digits.data, digits.target, strict=True))
    assert sorted(records) == expected


@model_build
@needs_clang
def test_wasm_and_native_builds_compute_the_same_bits(tmp_path: Path) -> None:
    """The models' C gives bit-identical weights in wasm32 and natively
    (-ffp-contract=off, no libm): guards against miscompiles such as the
    clang 14 wasm SLP-vectorizer bug that build.py's flags work around."""
    spec = importlib.util.spec_from_file_location("weei_bench_training", ROOT / "bench" / "bench_training.py")
    assert spec and spec.loader
    bench = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, bench)  # dataclasses look their module up
    spec.loader.exec_module(bench)
    engine = WasmtimeEngine()
    chunks = sorted((STATIC / "models" / "digits-mlp" / "data").glob("training-*.bin"))[:3]

    digits = ModelRuntime.load((STATIC / "models" / "digits-mlp" / "model.wasm").read_bytes(), engine)
    _, units, fingerprint = bench.wasm_dataset(digits, [p.read_bytes() for p in chunks], 2, 16)
    # Both native references of the benchmark: -march=native and the 128-bit one (SSE4.2, no AVX).
    for exe in (bench.native_binary("digits-mlp", tmp_path),
                bench.native_binary("digits-mlp", tmp_path, bench.SAME_WIDTH_FLAGS, "-sse")):
        out = json.loads(subprocess.run(
            [str(exe), "dataset", "weei-digits-v1", str(bench.SEED), "2", "16", *map(str, chunks)],
            check=True, capture_output=True, text=True).stdout)
        assert (out["units"], out["weightsFnv1a"]) == (units, fingerprint) == (600, fingerprint)

    cartpole = ModelRuntime.load((STATIC / "models" / "cartpole-reinforce" / "model.wasm").read_bytes(), engine)
    exe = bench.native_binary("cartpole-reinforce", tmp_path)
    out = json.loads(subprocess.run(
        [str(exe), "experience", str(bench.SEED), "6", "32"], check=True, capture_output=True, text=True).stdout)
    _, units, fingerprint = bench.wasm_experience(cartpole, 6, 32)
    assert (out["units"], out["weightsFnv1a"]) == (units, fingerprint) == (192, fingerprint)
