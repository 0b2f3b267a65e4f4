"""``weei model import`` and ``weei model export`` (docs/onnx.md).

Import writes a package folder the page and ``weei.prepare.prepare_job``
accept: ``model.wasm`` (the runtime plus the graph), ``manifest.json``
(measured like ``weei model build``'s), ``model.onnx`` (the file as given,
which export rewrites) and ``data/`` (the chunks, described by the model).
It then prepares a job from exactly those files and trains and evaluates
once, as ``weei model build`` does.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

from ..core.formats.jsonfmt import stringify
from .package import ARCHIVE_NAME
from ..onnx import OnnxError, Settings, OnnxReason

__all__ = ["ONNX_NAME", "default_model_id", "import_package", "export_checkpoint"]

ONNX_NAME = "model.onnx"


def default_model_id(file_name: str) -> str:
    """A model ID from an ONNX file's name (a job's model ID is lower-case letters, digits and dashes)."""
    stem = file_name.rsplit("/", 1)[-1].removesuffix(".onnx")
    return re.sub(r"[^a-z0-9-]+", "-", stem.lower()).strip("-")[:48] or "onnx-model"


def _read(path: Path, limit: int) -> bytes:
    size = path.stat().st_size
    if size > limit:  # refused before a byte is read (a 2 GB initializer never reaches memory)
        raise OnnxError(OnnxReason.ONNX_TOO_LARGE, f"{path}: {size} bytes, over the {limit} Weei imports")
    return path.read_bytes()


def import_package(onnx_path: Path, settings: Settings, out: Path, data: Path | None = None, *,
                   engine: Any = None, runtime: bytes | None = None, kernels: bytes | None = None) -> dict[str, Any]:
    """Write the package into ``out``; returns {"info", "weights", "train", "evaluate"} of the check run.

    ``data`` holds training-*.bin chunks (and an optional validation.bin) of the
    model's format; they are copied into ``out/data`` unless they are there.
    ``engine`` runs the checks (default wasmtime; the page gives its own) and
    ``runtime`` is the graph runtime's bytes (default the package data; the
    page fetches the site's onnx/runtime.wasm, which weei-py.zip does not hold);
    ``kernels`` the WGSL archive beside it (default the package data): when
    the graph's device program runs (docs/gpu.md, "Imported ONNX graphs"),
    the package gets ``model.wgsl.json`` and a GPU backend, else none
    (``gpu`` in the result says which, or why not).
    Raises: OnnxError; the checker's ManifestError/SettingsError/ModelError.
    """
    from ..onnx import import_onnx
    from ..onnx.model import MAX_ONNX_BYTES
    from .builder import BuildReport, _train_once
    from .package import model_manifest, probe_model
    from ..prepare import prepare_job

    if engine is None:
        from ..runtime import WasmtimeEngine

        engine = WasmtimeEngine()
    onnx = _read(onnx_path, MAX_ONNX_BYTES)
    wasm, compiled = import_onnx(onnx, settings, runtime)
    out.mkdir(parents=True, exist_ok=True)
    data_dir = out / "data"
    if data is not None and data.resolve() != data_dir.resolve():
        data_dir.mkdir(exist_ok=True)
        for path in sorted(data.glob("training-*.bin")) + sorted(data.glob("validation.bin")):
            shutil.copyfile(path, data_dir / path.name)
    if not any(data_dir.glob("training-*.bin")):
        raise OnnxError(OnnxReason.NO_DATA, f"{data_dir} has no training-*.bin chunks (weei data chunk writes them; "
                                   "give --data DIR)")
    facts = probe_model(wasm, data_dir, engine)
    from ..onnx.gpu import gpu_archive, kernels as packaged_kernels

    source = kernels if kernels is not None else packaged_kernels()
    archive = gpu_archive(facts.gpu_modules, source) if facts.gpu_modules and source is not None else None
    manifest = model_manifest(wasm, facts, archive)
    if archive is not None:
        gpu = next(b for b in manifest["execution"]["backends"] if b["kind"] == "gpu")
        # onnx_conv.wgsl's bn_param_grad binds six storage buffers (WebGPU guarantees eight)
        gpu["minimumDeviceLimits"]["maxStorageBuffersPerShaderStage"] = 6
        (out / ARCHIVE_NAME).write_bytes(archive)
    elif (out / ARCHIVE_NAME).exists():
        (out / ARCHIVE_NAME).unlink()  # a package imported again without a device program
    (out / "model.wasm").write_bytes(wasm)
    (out / "manifest.json").write_text(stringify(manifest, 2) + "\n", encoding="utf-8")
    (out / ONNX_NAME).write_bytes(onnx)
    (data_dir / "dataset-manifest.json").write_text(stringify(manifest["inlineJson"]["dataset-manifest.json"], 2) + "\n",
                                                    encoding="utf-8")
    files = {c["fileName"]: (data_dir / c["fileName"]).read_bytes() for c in facts.chunks}
    validation_path = data_dir / "validation.bin"
    validation = ("validation.bin", validation_path.read_bytes()) if validation_path.is_file() else None
    prepared = prepare_job(engine, job_id="weei-model-import", wasm_name="model.wasm", wasm=wasm,
                           manifest=json.loads(stringify(manifest)), files=files,
                           settings={"epochs": 1, "localEpochs": 1, "batchSize": settings.batch_size,
                                     "coordinatorParticipates": True},
                           random_bytes=bytes(range(16)), validation=validation)
    report = BuildReport(out)
    _train_once(prepared, files, False, report)
    return {"info": facts.info, "weights": len(compiled.weights), "train": report.train_metrics,
            "evaluate": report.eval_metrics, "chunks": len(facts.chunks),
            "gpu": list(facts.gpu_modules) if archive is not None else _why_not_gpu(wasm, data_dir, facts.info, engine)}


def _why_not_gpu(wasm: bytes, data_dir: Path, info: dict[str, Any], engine: Any) -> str:
    """gpuBegin's reason the graph has no device program (the first chunk, default settings)."""
    from ..runtime import ModelRuntime

    first = sorted(data_dir.glob("training-*.bin"))
    runtime = ModelRuntime.load(wasm, engine)
    runtime.load_model(runtime.create_initial_weights(0))
    begun, _, _ = runtime.gpu_begin(data=first[0].read_bytes(), format=info["dataFormats"][0]["id"], seed=1)
    return str(begun.get("unsupported", "no WGSL kernels shipped with this runtime"))


def export_checkpoint(checkpoint: Path, package: Path, out: Path) -> int:
    """Write ``package``'s ONNX file with the checkpoint's weights to ``out``; the weight count.
    Raises: OnnxError, CheckpointError."""
    from ..core.formats.checkpoint import read_checkpoint
    from ..onnx import export_onnx
    from ..onnx.model import MAX_ONNX_BYTES

    source = package / ONNX_NAME
    if not source.is_file():
        raise OnnxError(OnnxReason.NOT_AN_ONNX_PACKAGE, f"{package} has no {ONNX_NAME} (only imported ONNX packages export)")
    manifest = json.loads((package / "manifest.json").read_text(encoding="utf-8"))
    ck = read_checkpoint(_read(checkpoint, 1 << 31))
    model_id = ck.metadata.model_info.id
    if model_id != manifest["execution"]["modelId"]:
        raise OnnxError(OnnxReason.CHECKPOINT_MISMATCH, f"the checkpoint is of model {model_id!r}, the package of "
                                               f"{manifest['execution']['modelId']!r}")
    out.write_bytes(export_onnx(_read(source, MAX_ONNX_BYTES), ck.weights))
    return len(ck.weights) // 4
