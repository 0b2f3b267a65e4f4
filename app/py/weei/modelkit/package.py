"""The weei-model-package manifest of a built module (spec: Package manifest).

Every fact comes from running the module through weei.runtime: getModelInfo
for the id, workSource and auxiliaryWeights, createInitialWeights for the
weight size, describeChunk for each dataset chunk (``training-*.bin`` of the
data folder), and one train and one evaluate for the CPU backend's
``estimatedWorkingBytes`` (:func:`measure_working_bytes`). Inline files are described by the size and SHA-256 of
JSON.stringify(value, null, 2) + "\\n".
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.formats.jsonfmt import descriptor
from .compile import BuildError

__all__ = ["INIT_SEED", "ARCHIVE_NAME", "WORKING_MARGIN", "GPU_WORKING_FLOOR", "ModelFacts", "probe_model",
           "measure_working_bytes", "measure_gpu_program", "gpu_programs", "gpu_backend", "auxiliary_file_name", "model_manifest"]

INIT_SEED = 0
ARCHIVE_NAME = "model.wgsl.json"
#: estimatedWorkingBytes = the measured peak × this, rounded up to a MiB: a chunk, a batch or a
#: unit count other than the measured ones may need a little more (weei.runtime.sandbox adds headroom too).
WORKING_MARGIN = 1.25
_MIB = 1 << 20
#: The least a GPU backend announces (what every one announced before programs were measured).
GPU_WORKING_FLOOR = 16 << 20


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class ModelFacts:
    """What the manifest needs from running the module."""

    info: dict[str, Any]
    weight_bytes: int
    chunks: list[dict[str, Any]]
    gpu: bool = False  # exports gpuBegin / gpuNext / gpuEnd
    peak_memory: int = 0  # the module's linear memory after one train and one evaluate (measure_working_bytes)
    gpu_program_bytes: int = 0  # the largest device program's buffers and staging (measure_gpu_program)
    gpu_modules: tuple[str, ...] = ()  # the WGSL modules its device programs name (gpu_programs), sorted

    @property
    def working_bytes(self) -> int:
        """The CPU backend's estimatedWorkingBytes: the measured peak with :data:`WORKING_MARGIN`."""
        return math.ceil(self.peak_memory * WORKING_MARGIN / _MIB) * _MIB

    @property
    def gpu_working_bytes(self) -> int:
        """The GPU backend's estimatedWorkingBytes: the measured program with :data:`WORKING_MARGIN`,
        at least :data:`GPU_WORKING_FLOOR`."""
        return max(GPU_WORKING_FLOOR, math.ceil(self.gpu_program_bytes * WORKING_MARGIN / _MIB) * _MIB)


def probe_model(wasm: bytes, data_dir: Path, engine: Any = None) -> ModelFacts:
    """Run the module (in ``engine``, default wasmtime): model info, initial weight size, dataset chunk entries.

    Raises: BuildError when a dataset model declares other than one data
    format or has no chunk to measure its memory on; the runtime's
    ModelError when an operation fails.
    """
    from ..runtime import ModelRuntime

    if engine is None:
        from ..runtime import WasmtimeEngine

        engine = WasmtimeEngine()
    runtime = ModelRuntime.load(wasm, engine)
    info = runtime.model_info()
    weight_bytes = len(runtime.create_initial_weights(INIT_SEED))
    chunks: list[dict[str, Any]] = []
    if "workSource" not in info and data_dir.is_dir():
        formats = [f["id"] for f in info.get("dataFormats", [])]
        if len(formats) != 1:
            raise BuildError(f"{info['id']}: expected one data format to describe its chunks, got {formats}")
        for k, path in enumerate(sorted(data_dir.glob("training-*.bin")), start=1):
            data = path.read_bytes()
            chunks.append({
                "id": f"chunk-{k:03d}",
                "fileName": path.name,
                "bytes": len(data),
                "sha256": _sha256(data),
                "format": formats[0],
                "exampleCount": runtime.describe_chunk(formats[0], data),
            })
    first = data_dir / chunks[0]["fileName"] if chunks else None
    auxiliary = {slot["id"]: data_dir / auxiliary_file_name(slot["id"]) for slot in info.get("auxiliaryWeights", [])}
    peak = measure_working_bytes(wasm, info, first.read_bytes() if first else None,
                                 {k: p.read_bytes() for k, p in auxiliary.items() if p.is_file()}, engine)
    programs = gpu_programs(wasm, info, first.read_bytes() if first else None, engine) if runtime.has_gpu_operations else []
    modules = sorted({str(p["module"]) for program in programs for p in program["pipelines"]})
    return ModelFacts(info, weight_bytes, chunks, runtime.has_gpu_operations, peak, _largest(programs), tuple(modules))


def measure_gpu_program(wasm: bytes, info: dict[str, Any], chunk: bytes | None) -> int:
    """The bytes of the largest device program gpuBegin emits (buffers plus readback staging, the
    sum the budget rule checks, docs/gpu.md), among :func:`gpu_programs`."""
    return _largest(gpu_programs(wasm, info, chunk))


def _largest(programs: list[dict[str, Any]]) -> int:
    largest = 0
    for program in programs:
        ranges = [*program.get("stepReadback", []), *program.get("finalReadback", [])]
        largest = max(largest, sum(int(b["bytes"]) for b in program["buffers"]) + sum(int(r["bytes"]) for r in ranges))
    return largest


def gpu_programs(wasm: bytes, info: dict[str, Any], chunk: bytes | None, engine: Any = None) -> list[dict[str, Any]]:
    """The device programs gpuBegin emits at the model's default settings and, for a dataset model,
    with the whole chunk as one batch when the model takes it (the largest a batch gets); run in
    ``engine`` (default wasmtime)."""
    from ..core.errors import ModelError
    from ..runtime import ModelRuntime

    if engine is None:
        from ..runtime import WasmtimeEngine

        engine = WasmtimeEngine()
    runtime = ModelRuntime.load(wasm, engine)
    weights = runtime.create_initial_weights(INIT_SEED)
    source = info.get("workSource")
    tries: list[dict[str, Any]] = [{}]
    if source is None and chunk is not None:
        tries.append({"batchSize": max(1, runtime.describe_chunk(info["dataFormats"][0]["id"], chunk))})
    programs: list[dict[str, Any]] = []
    for settings in tries:
        runtime.load_model(weights)
        if info.get("auxiliaryWeights"):
            runtime.load_auxiliary({slot["id"]: weights for slot in info["auxiliaryWeights"]})
        try:
            if source is not None:
                units = int(source.get("unitsPerAssignment", {}).get("default", 1))
                begun, _, _ = runtime.gpu_begin(experience=(0, max(1, units), 1), seed=1, settings=settings)
            elif chunk is not None:
                begun, _, _ = runtime.gpu_begin(data=chunk, format=info["dataFormats"][0]["id"], seed=1,
                                                settings=settings)
            else:
                continue
        except ModelError:
            if not settings:
                raise
            continue  # a batch the GPU program does not take trains on the CPU: no program to size
        if "unsupported" in begun:  # an imported graph without kernels for it (docs/gpu.md): no program
            continue
        programs.append(begun["program"])
    return programs


def measure_working_bytes(wasm: bytes, info: dict[str, Any], chunk: bytes | None,
                          auxiliary: dict[str, bytes] | None = None, engine: Any = None) -> int:
    """The module's linear memory after one train and one evaluate in a fresh instance: its peak.

    A WebAssembly memory only grows, so its size after the calls is the
    most they used (the inputs the host copied in included). A dataset
    model trains one step on ``chunk`` with the whole chunk as its batch
    (a ``batchSize`` beyond the chunk changes nothing, so no batch needs
    more), then evaluates the chunk; an experience model trains one update
    on its default ``unitsPerAssignment`` and evaluates its
    ``evaluationUnits``. Auxiliary slots get their file from ``auxiliary``,
    else the initial weights (a snapshot slot's round-1 value).

    Raises: BuildError for a dataset model without a chunk.
    """
    from ..runtime import ModelRuntime

    if engine is None:
        from ..runtime import WasmtimeEngine

        engine = WasmtimeEngine()
    runtime = ModelRuntime.load(wasm, engine)
    weights = runtime.create_initial_weights(INIT_SEED)
    slots = [slot["id"] for slot in info.get("auxiliaryWeights", [])]

    def load(w: bytes) -> None:
        runtime.load_model(w)
        if slots:
            runtime.load_auxiliary({k: (auxiliary or {}).get(k, weights) for k in slots})

    load(weights)
    source = info.get("workSource")
    if source is not None:
        units = int(source.get("unitsPerAssignment", {}).get("default", 1))
        trained = runtime.train(experience=(0, max(1, units), 1), seed=1, settings={"localEpochs": 1}, step_limit=1)
        load(trained.weights)
        runtime.evaluate(experience=(0, int(source.get("evaluationUnits", 1)), 2))
    else:
        if chunk is None:
            raise BuildError(f"{info['id']}: no training-*.bin chunk in data/ to measure the model's memory on "
                             "(weei data chunk writes them)")
        fmt = info["dataFormats"][0]["id"]
        examples = runtime.describe_chunk(fmt, chunk)
        trained = runtime.train(data=chunk, format=fmt, seed=1,
                                settings={"localEpochs": 1, "batchSize": max(1, examples)}, step_limit=1)
        load(trained.weights)
        runtime.evaluate(data=chunk, format=fmt)
    # ModelRuntime has no public accessor for it (runtime/abi.py is at its 600-line bound).
    return runtime.memory_size()


def _descriptor(file_name: str, value: Any) -> dict[str, Any]:
    size, sha = descriptor(value)
    return {"fileName": file_name, "bytes": size, "sha256": sha}


def gpu_backend(archive: bytes, working_bytes: int = GPU_WORKING_FLOOR) -> dict[str, Any]:
    """The GPU backend entry of a model with gpu* operations (docs/gpu.md)."""
    desc = {"fileName": ARCHIVE_NAME, "bytes": len(archive), "sha256": _sha256(archive)}
    return {
        "id": "gpu-webgpu",
        "kind": "gpu",
        "runtime": "weei-device-program-v1",
        "hostDelivery": "installed-in-host",
        "environments": ["browser", "agent"],
        "operations": ["train"],
        "artifacts": [dict(desc)],
        "shaderArchive": desc,
        "requiredFeatures": [],
        "minimumDeviceLimits": {"maxStorageBuffersPerShaderStage": 5, "maxComputeInvocationsPerWorkgroup": 64,
                                "maxComputeWorkgroupSizeX": 64},
        "estimatedWorkingBytes": working_bytes,
        "numericalMode": "fp32-standard",
    }


def auxiliary_file_name(slot_id: str) -> str:
    """The file of a file slot (one with a sha256) next to the chunks: auxiliary-<id>.bin."""
    return f"auxiliary-{slot_id}.bin"


def model_manifest(wasm: bytes, facts: ModelFacts, archive: bytes | None = None) -> dict[str, Any]:
    """The weei-model-package manifest of a built model (spec: Package manifest).

    A file slot of auxiliaryWeights (one with a sha256) is listed with its
    fileName, :func:`auxiliary_file_name`; slots with a source have none.
    """
    info = facts.info
    experience = "workSource" in info
    wasm_desc = {"fileName": "model.wasm", "bytes": len(wasm), "sha256": _sha256(wasm)}
    compatibility = {
        "schemaVersion": 1,
        "identity": {"modelId": info["id"]},
        "weightCount": facts.weight_bytes // 4,
        "weightBytes": facts.weight_bytes,
    }
    dataset_manifest = [] if experience else facts.chunks
    manifest: dict[str, Any] = {
        "schema": "weei-model-package",
        "schemaVersion": 1,
        "hostRuntime": {"id": "weei-device-program-v1", "delivery": "installed-in-host"},
        "wasm": wasm_desc,
    }
    if experience:
        manifest["workSource"] = info["workSource"]
        manifest["auxiliaryWeights"] = [
            {**slot, "fileName": auxiliary_file_name(slot["id"])} if "sha256" in slot else slot
            for slot in info.get("auxiliaryWeights", [])]
    manifest["execution"] = {
        "schema": "weei-model-execution",
        "schemaVersion": 1,
        "modelId": info["id"],
        "weightFormat": info["weightFormat"],
        "weightBytes": facts.weight_bytes,
        "compatibility": _descriptor("compatibility.json", compatibility),
        "datasetManifest": _descriptor("dataset-manifest.json", dataset_manifest),
        "backends": [{
            "id": "cpu-wasm-simd",
            "kind": "cpu",
            "runtime": "weei-wasm-abi1",
            "environments": ["browser", "agent"],
            "operations": ["train", "evaluate"],
            "artifacts": [dict(wasm_desc)],
            "requiredFeatures": ["wasm-simd128"],
            "minimumDeviceLimits": {},
            "estimatedWorkingBytes": facts.working_bytes,
            "numericalMode": "fp32-standard",
        }, *([gpu_backend(archive, facts.gpu_working_bytes)] if archive is not None else [])],
        "policy": {
            "preference": ["cpu-wasm-simd"],
            "cpuFallback": "restart-assignment",
            "aggregationOwner": "peer",
            "assignmentExecution": "exclusive",
            "progressUnit": info["workSource"]["unit"]["id"] if experience else "example",
            "optimizerUnit": "update" if experience else "step",
        },
    }
    manifest["inlineJson"] = {"compatibility.json": compatibility, "dataset-manifest.json": dataset_manifest}
    return manifest
