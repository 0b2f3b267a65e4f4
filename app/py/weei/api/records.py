"""Job records: what storage keeps of a job so it survives a page reload."""

from __future__ import annotations

from typing import Any

from ..core.job import ChunkInfo, GpuOffer, JobSpec, ModuleInfo
from ..core.messages import ArtifactRef
from ..core.modelinfo import ModelInfo
from ..core.settings import TrainingSettings

__all__ = ["spec_to_record", "spec_from_record", "record_artifacts"]


def spec_to_record(spec: JobSpec, *, job_seed: int | None, validation_sha256: str | None) -> dict[str, Any]:
    """The JSON record of a checked job (no bytes: artifacts are stored by SHA-256)."""
    record = {
        "id": spec.job_id,
        "modelInfo": spec.info.raw,
        "module": {"fileName": spec.module.file_name, "bytes": spec.module.bytes, "sha256": spec.module.sha256},
        "settings": spec.settings.to_json(),
        "weightBytes": spec.weight_bytes,
        "chunks": [{"id": c.id, "fileName": c.file_name, "bytes": c.bytes, "sha256": c.sha256, "format": c.format,
                    "exampleCount": c.example_count} for c in spec.chunks],
        "auxiliaryFiles": {k: v.to_json() for k, v in spec.auxiliary_files.items()},
        "validation": {"sha256": validation_sha256, "format": spec.validation_format} if spec.has_validation else None,
        "jobSeed": str(job_seed) if job_seed is not None else None,
    }
    if spec.gpu is not None:  # executionFiles: the WGSL archive is one of the job's stored files
        record["gpu"] = spec.gpu.to_json()
    if spec.cpu_backend is not None:
        record["cpuBackend"] = spec.cpu_backend
    return record


def spec_from_record(record: dict[str, Any]) -> tuple[JobSpec, int | None, str | None]:
    """Rebuild (spec, job seed, validation SHA-256) from a record; raises the parsers' errors."""
    validation = record.get("validation")
    spec = JobSpec(
        job_id=record["id"],
        info=ModelInfo.from_json(record["modelInfo"]),
        module=ModuleInfo(record["module"]["fileName"], record["module"]["bytes"], record["module"]["sha256"]),
        settings=TrainingSettings.from_json(record["settings"]),
        weight_bytes=int(record["weightBytes"]),
        chunks=tuple(ChunkInfo(c["id"], c["fileName"], c["bytes"], c["sha256"], c["format"], c["exampleCount"])
                     for c in record["chunks"]),
        auxiliary_files={k: ArtifactRef.from_json(v) for k, v in record.get("auxiliaryFiles", {}).items()},
        has_validation=validation is not None,
        validation_format=validation["format"] if validation else None,
        gpu=GpuOffer.from_json(record["gpu"]) if record.get("gpu") is not None else None,
        cpu_backend=str(record["cpuBackend"]) if isinstance(record.get("cpuBackend"), str) else None,
    )
    seed = record.get("jobSeed")
    return spec, int(seed) if seed is not None else None, validation["sha256"] if validation else None


def record_artifacts(record: dict[str, Any]) -> set[str]:
    """The SHA-256 of every artifact a job record names (module, chunks, auxiliary files, validation,
    the WGSL archive).

    Checkpoint weights are not among them: they live inside the checkpoint files.
    A record too damaged to name anything names nothing.
    """
    named: set[str] = set()
    try:
        named.add(str(record["module"]["sha256"]))
        named.update(str(c["sha256"]) for c in record.get("chunks") or [])
        named.update(str(ref["sha256"]) for ref in (record.get("auxiliaryFiles") or {}).values())
        validation = record.get("validation")
        if validation and validation.get("sha256"):
            named.add(str(validation["sha256"]))
        gpu = record.get("gpu")
        if gpu:
            named.add(str(gpu["shaderArchive"]["sha256"]))
    except (KeyError, TypeError, AttributeError):
        pass
    return named
