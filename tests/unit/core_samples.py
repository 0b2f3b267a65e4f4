"""Sample JSON for the format tests: the spec's own examples, made consistent."""

from __future__ import annotations

import copy
import hashlib
import struct
from typing import Any

from weei.core.formats.jsonfmt import descriptor

WASM = b"\x00asm\x01\x00\x00\x00" + b"model" * 20
WGSL = b"// shader archive\n" * 10
WEIGHT_BYTES = 456  # the spec's CartPole example: 114 float32 values


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def dataset_info() -> dict[str, Any]:
    """The spec's first getModelInfo() example."""
    return {
        "id": "my-model",
        "version": "1.0.0",
        "name": "My model",
        "abiVersion": 1,
        "weightFormat": "float32-le",
        "maxWorkers": 1,
        "maxChunkBytes": 8388608,
        "maxExamplesPerChunk": 10000,
        "dataFormats": [{"id": "my-binary", "label": "My binary format", "acceptedMimeTypes": ["application/octet-stream"]}],
        "metrics": [{"id": "loss", "label": "Loss", "direction": "minimize"}],
        "aggregation": {"methods": ["fedavgm", "fedadam"], "averageOnly": [{"offset": 1048576, "bytes": 4096}]},
    }


def work_source() -> dict[str, Any]:
    return {
        "kind": "experience",
        "inputs": "none",
        "unit": {"id": "episode", "label": "Episodes"},
        "unitsPerAssignment": {"default": 32, "minimum": 1, "maximum": 4096},
        "evaluationUnits": 32,
    }


def experience_info(aux: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The spec's CartPole getModelInfo() example."""
    return {
        "id": "cartpole-reinforce",
        "version": "1.0.0",
        "name": "CartPole policy (REINFORCE)",
        "abiVersion": 1,
        "weightFormat": "float32-le",
        "maxWorkers": 1,
        "dataFormats": [],
        "metrics": [{"id": "episodeReturn", "label": "Episode return", "direction": "maximize"}],
        "capabilities": {"evaluation": True},
        "workSource": work_source(),
        "auxiliaryWeights": copy.deepcopy(aux or []),
    }


AUX_FILE = struct.pack("<4f", 1, 2, 3, 4)


def package_aux() -> list[dict[str, Any]]:
    """Three slots as in the spec, sized for WEIGHT_BYTES weights; the file slot has a file."""
    return [
        {"id": "reward", "role": "reward-model", "bytes": len(AUX_FILE), "sha256": sha(AUX_FILE), "fileName": "reward.bin"},
        {"id": "start", "role": "reference-policy", "bytes": WEIGHT_BYTES, "source": {"kind": "initial"}},
        {"id": "old", "role": "opponent", "bytes": WEIGHT_BYTES, "source": {"kind": "checkpoint", "roundsAgo": 5}},
    ]


def info_aux() -> list[dict[str, Any]]:
    return [{k: v for k, v in slot.items() if k != "fileName"} for slot in package_aux()]


def package(
    *,
    experience: bool = True,
    aux: list[dict[str, Any]] | None = None,
    chunks: list[dict[str, Any]] | None = None,
    gpu: bool = False,
    model_id: str = "cartpole-reinforce",
) -> dict[str, Any]:
    """A consistent package manifest (descriptors computed from the inline files)."""
    wasm_desc = {"fileName": "model.wasm", "bytes": len(WASM), "sha256": sha(WASM)}
    compat = {"schemaVersion": 1, "identity": {"modelId": model_id}, "weightCount": WEIGHT_BYTES // 4, "weightBytes": WEIGHT_BYTES}
    dataset = chunks if chunks is not None else []
    cb, cs = descriptor(compat)
    db, ds = descriptor(dataset)
    backends: list[dict[str, Any]] = [
        {
            "id": "cpu-wasm-simd",
            "kind": "cpu",
            "runtime": "weei-wasm-abi1",
            "environments": ["browser", "agent"],
            "operations": ["train", "evaluate"],
            "artifacts": [dict(wasm_desc)],
            "requiredFeatures": ["wasm-simd128"],
            "minimumDeviceLimits": {},
            "estimatedWorkingBytes": 4194304,
            "numericalMode": "fp32-standard",
        }
    ]
    if gpu:
        backends.append(
            {
                "id": "gpu-webgpu",
                "kind": "gpu",
                "runtime": "weei-webgpu",
                "artifacts": [dict(wasm_desc)],
                "shaderArchive": {"fileName": "model.wgsl", "bytes": len(WGSL), "sha256": sha(WGSL)},
            }
        )
    obj: dict[str, Any] = {
        "schema": "weei-model-package",
        "schemaVersion": 1,
        "hostRuntime": {"id": "weei-device-program-v1", "delivery": "installed-in-host"},
        "wasm": wasm_desc,
    }
    if experience:
        obj["workSource"] = work_source()
        obj["auxiliaryWeights"] = copy.deepcopy(aux if aux is not None else [])
    obj["execution"] = {
        "schema": "weei-model-execution",
        "schemaVersion": 1,
        "modelId": model_id,
        "weightFormat": "float32-le",
        "weightBytes": WEIGHT_BYTES,
        "compatibility": {"fileName": "compatibility.json", "bytes": cb, "sha256": cs},
        "datasetManifest": {"fileName": "dataset-manifest.json", "bytes": db, "sha256": ds},
        "backends": backends,
        "policy": {
            "preference": [b["id"] for b in backends],
            "cpuFallback": "restart-assignment",
            "aggregationOwner": "peer",
            "assignmentExecution": "exclusive",
            "progressUnit": "episode",
            "optimizerUnit": "update",
        },
    }
    obj["inlineJson"] = {"compatibility.json": compat, "dataset-manifest.json": dataset}
    return obj


def refresh_descriptors(obj: dict[str, Any]) -> dict[str, Any]:
    """Recompute the inline descriptors after a test edited an inline file."""
    ex = obj["execution"]
    for key in ("compatibility", "datasetManifest"):
        name = ex[key]["fileName"]
        size, digest = descriptor(obj["inlineJson"][name])
        ex[key]["bytes"], ex[key]["sha256"] = size, digest
    return obj


CHUNK_DATA = {"training-001.bin": b"a" * 100, "training-002.bin": b"b" * 50}


def chunks() -> list[dict[str, Any]]:
    return [
        {"id": f"chunk-00{i}", "fileName": name, "bytes": len(data), "sha256": sha(data), "format": "my-binary", "exampleCount": 10}
        for i, (name, data) in enumerate(CHUNK_DATA.items(), 1)
    ]
