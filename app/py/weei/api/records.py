"""Job records: what storage keeps of a job so it survives a page reload."""

from __future__ import annotations

from typing import Any

from ..core.job import ChunkInfo, JobSpec, ModuleInfo
from ..core.messages import ArtifactRef
from ..core.modelinfo import ModelInfo
from ..core.settings import TrainingSettings

__all__ = ["spec_to_record", "spec_from_record"]


def spec_to_record(spec: JobSpec, *, job_seed: int | None, validation_sha256: str | None) -> dict[str, Any]:
    """The JSON record of a checked job (no bytes: artifacts are stored by SHA-256)."""
    return {
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
    )
    seed = record.get("jobSeed")
    return spec, int(seed) if seed is not None else None, validation["sha256"] if validation else None
