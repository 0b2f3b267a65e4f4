"""byte-transformer: gradients, its generated dataset, and training through
the real coordinator (c/models/byte-transformer)."""

from __future__ import annotations

import importlib.util
import io
import json
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from weei.core.errors import ModelError
from weei.core.formats.jsonfmt import stringify
from weei.demo.run import DemoJob, run_job
from weei.runtime import ModelRuntime, WasmtimeEngine

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "c" / "models" / "byte-transformer"
PACKAGE = ROOT / "app" / "static" / "models" / "byte-transformer"
FMT = "weei-bytes-v1"
N_PARAMS = 586_944  # transformer.h at its default sizes

needs_clang = pytest.mark.skipif(shutil.which("clang") is None, reason="clang is not installed (make setup)")


def _load_file(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, module)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def gen() -> ModuleType:
    return _load_file("byte_transformer_gen", SRC / "gen.py")


@pytest.fixture(scope="module")
def build() -> ModuleType:
    return _load_file("weei_build", ROOT / "build.py")


def load(progress: list | None = None) -> ModelRuntime:
    return ModelRuntime.load((PACKAGE / "model.wasm").read_bytes(), WasmtimeEngine(),
                             on_progress=progress.append if progress is not None else None)


def chunk(k: int) -> bytes:
    return (PACKAGE / "data" / f"training-{k:03d}.bin").read_bytes()


@needs_clang
def test_gradients_match_finite_differences(tmp_path: Path, build: ModuleType) -> None:
    # The model's own C (net.c, model.c) with the SDK, compiled natively with
    # the benchmark's flags at a tiny size, so every weight is checked.
    exe = tmp_path / "gradcheck"
    sources = [*sorted(SRC.glob("*.c")), SRC / "check" / "gradcheck.c", *sorted((ROOT / "c" / "sdk").glob("*.c"))]
    tiny = ["-DTFM_D=8", "-DTFM_L=2", "-DTFM_H=2", "-DTFM_F=12", "-DTFM_T=6"]
    subprocess.run(["clang", *build.NATIVE_FLAGS, "-DWEEI_NATIVE", "-DWEEI_NATIVE_ARENA_BYTES=67108864u", *tiny,
                    "-o", str(exe), *map(str, sources)], check=True, capture_output=True)
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    m = re.match(r"checked (\d+) skipped (\d+) failures (\d+) maxabs (\S+) maxrel (\S+) params (\d+)", proc.stdout)
    assert m, proc.stdout + proc.stderr
    checked, skipped, failures, params = int(m[1]), int(m[2]), int(m[3]), int(m[6])
    assert failures == 0 and proc.returncode == 0, proc.stderr
    # Only weights whose step flips a ReLU are left out; nearly all are checked.
    assert checked + skipped == params and skipped < params // 20
    assert float(m[4]) < 2e-4


def test_info_and_weights_are_the_documented_sizes() -> None:
    rt = load()
    info = rt.model_info()
    assert info["id"] == "byte-transformer" and info["dataFormats"][0]["id"] == FMT
    assert info["maxChunkBytes"] == 8 + 65 * 4096 and info["maxExamplesPerChunk"] == 4096
    w0 = rt.create_initial_weights(0)
    assert len(w0) == 4 * N_PARAMS == 2_347_776
    assert rt.create_initial_weights(0) == w0 and rt.create_initial_weights(1) != w0
    values = np.frombuffer(w0, dtype="<f4")
    assert np.isfinite(values).all()
    embedding = values[:256 * 128]
    assert 0.018 < float(embedding.std()) < 0.022 and float(np.abs(embedding).max()) < 0.035
    assert int((values == 1.0).sum()) == 7 * 128  # the layer norms' gains (2 per layer, 1 final)


def test_generator_is_deterministic_and_the_committed_data_is_its_output(gen: ModuleType, tmp_path: Path) -> None:
    written = gen.write_data(tmp_path)
    assert len(written) == gen.CHUNKS + 1 == 56
    for path in written:
        assert path.read_bytes() == (PACKAGE / "data" / path.name).read_bytes(), path.name
    assert gen.records_file(7, 3, 5) == gen.records_file(7, 3, 5) != gen.records_file(8, 3, 5)
    data = chunk(1)
    assert data[:4] == b"WBT1" and struct.unpack("<I", data[4:8])[0] == gen.RECORDS_PER_CHUNK == 48
    # consecutive records overlap by one byte: every byte of the text is predicted once
    records = [data[8 + 65 * k:8 + 65 * (k + 1)] for k in range(48)]
    assert all(a[-1] == b[0] for a, b in zip(records, records[1:]))
    text = b"".join(r[:-1] for r in records).decode("ascii")
    assert "add " in text and " -> " in text


def test_manifest_lists_55_chunks_of_48_records() -> None:
    manifest = json.loads((PACKAGE / "manifest.json").read_text())
    entries = manifest["inlineJson"]["dataset-manifest.json"]
    assert [e["fileName"] for e in entries] == [f"training-{k:03d}.bin" for k in range(1, 56)]
    assert {e["exampleCount"] for e in entries} == {48} and {e["bytes"] for e in entries} == {8 + 48 * 65}
    assert manifest["execution"]["weightBytes"] == 2_347_776
    # the GPU backend (gpu.c) with the WGSL modules its program names: its own kernels and the shared
    # loss, reduction and Adam, not digits-mlp's dense layers (docs/gpu.md)
    assert [b["id"] for b in manifest["execution"]["backends"]] == ["cpu-wasm-simd", "gpu-webgpu"]
    archive = (PACKAGE / "model.wgsl.json").read_bytes()
    modules = [m["name"] for m in json.loads(archive)["modules"]]
    assert modules == ["optimizer.wgsl", "reduce.wgsl", "softmax_xent.wgsl", "transformer.wgsl"]
    assert manifest["execution"]["backends"][1]["shaderArchive"]["bytes"] == len(archive)


@pytest.mark.parametrize("mutate, expected", [
    (lambda d: d[:7], "shorter than its 8-byte header"),
    (lambda d: b"WDG1" + d[4:], "bad magic"),
    (lambda d: d[:-1], "examples needs"),
    (lambda d: d[:4] + struct.pack("<I", 4097) + d[8:], "more than 4096"),
    (lambda d: d[:4] + struct.pack("<I", 0), "no examples"),
])
def test_bad_chunks_are_refused(mutate, expected: str) -> None:
    rt = load()
    rt.load_model(rt.create_initial_weights(0))
    with pytest.raises(ModelError, match=expected):
        rt.train(data=mutate(chunk(1)), format=FMT, seed=1)


def test_wrong_weight_size_and_format_are_refused() -> None:
    rt = load()
    with pytest.raises(ModelError, match="2347776 bytes \\(586944 float32\\)"):
        rt.load_model(b"\0" * 16)
    rt.load_model(rt.create_initial_weights(0))
    with pytest.raises(ModelError, match="unknown data format"):
        rt.evaluate(data=chunk(1), format="weei-digits-v1")


def test_local_training_is_deterministic_and_lowers_the_loss() -> None:
    progress: list = []
    rt = load(progress)
    w0 = rt.create_initial_weights(3)
    validation = (PACKAGE / "data" / "validation.bin").read_bytes()
    rt.load_model(w0)
    before = rt.evaluate(data=validation, format=FMT)
    assert before.examples == 64 and abs(before.metrics["loss"] - np.log(256)) < 0.2

    def train(weights: bytes, k: int) -> bytes:
        rt.load_model(weights)
        result = rt.train(data=chunk(k), format=FMT, seed=k, settings={"batchSize": 8})
        assert result.unique_examples == 48 and result.optimizer_steps == 6
        return result.weights

    w = w0
    for k in range(1, 4):
        w = train(w, k)
    assert w == train(train(train(w0, 1), 2), 3)  # same seeds, same bits
    assert progress and progress[-1].processed_examples == progress[-1].total_examples == 48
    rt.load_model(w)
    after = rt.evaluate(data=validation, format=FMT)
    assert after.metrics["loss"] < before.metrics["loss"] - 1.0


def test_federated_training_with_the_real_coordinator_lowers_validation_loss(
        build: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The committed package cut to 4 chunks (a manifest generated by build.py
    # for them), so two peers train 2 rounds per epoch for 2 epochs.
    package = tmp_path / "models" / "byte-transformer"
    (package / "data").mkdir(parents=True)
    wasm = (PACKAGE / "model.wasm").read_bytes()
    (package / "model.wasm").write_bytes(wasm)
    for k in range(1, 5):
        (package / "data" / f"training-{k:03d}.bin").write_bytes(chunk(k))
    shutil.copy(PACKAGE / "data" / "validation.bin", package / "data" / "validation.bin")
    facts = build.probe_model(wasm, package / "data")
    (package / "manifest.json").write_text(stringify(build.model_manifest(wasm, facts), 2) + "\n")
    monkeypatch.setenv("WEEI_MODELS", str(tmp_path / "models"))
    job = DemoJob("transformer", "byte-transformer", {
        "epochs": 2, "localEpochs": 1, "batchSize": 8, "coordinatorParticipates": True,
        "validationSchedule": {"enabled": True, "unit": "round", "every": 1},
    }, peers=2, validation="validation.bin")
    out = io.StringIO()
    report = run_job(job, tmp_path / "out", stream=out)
    losses = report.values()
    print(out.getvalue())
    assert len(losses) == 4 and report.rejected == 0
    assert losses[-1] < losses[0] - 0.5 and losses[-1] < 3.5, out.getvalue()


def test_a_large_batch_trains_in_the_memory_of_a_small_one() -> None:
    """Activations cost ~2.2 MB per record: a 48-record minibatch runs as
    micro-batches, so it fits where a batch of 8 does (48 MiB; whole it needs ~108)."""
    rt = ModelRuntime.load((PACKAGE / "model.wasm").read_bytes(), WasmtimeEngine(memory_limit_bytes=48 << 20))
    w0 = rt.create_initial_weights(3)
    validation = (PACKAGE / "data" / "validation.bin").read_bytes()
    losses = []
    for batch in (8, 48):
        rt.load_model(w0)
        result = rt.train(data=chunk(1), format=FMT, seed=1,
                          settings={"batchSize": batch, "learningRate": 0.004})
        assert result.optimizer_steps == 48 // batch
        rt.load_model(result.weights)
        losses.append(rt.evaluate(data=validation, format=FMT).metrics["loss"])
    rt.load_model(w0)
    untrained = rt.evaluate(data=validation, format=FMT).metrics["loss"]
    assert all(loss < untrained - 0.1 for loss in losses), (untrained, losses)
