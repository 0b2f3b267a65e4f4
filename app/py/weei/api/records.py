"""Job records: what storage keeps of a job so it survives a page reload."""

from __future__ import annotations

from typing import Any

from ..core._check import Where, as_int, as_list, as_object, as_sha256, as_str, nullable
from ..core.job.spec import ChunkInfo, GpuOffer, JobSpec, ModuleInfo
from ..core.wire.messages import ArtifactRef
from ..core.formats.modelinfo import ModelInfo
from ..core.formats.seeds import parse_seed
from ..core.formats.settings import TrainingSettings
from .ports import StorageError, StorageReason

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
    if spec.working_bytes is not None:
        record["workingBytes"] = spec.working_bytes
    if spec.gpu is not None:  # executionFiles: the WGSL archive is one of the job's stored files
        record["gpu"] = spec.gpu.to_json()
    if spec.cpu_backend is not None:
        record["cpuBackend"] = spec.cpu_backend
    return record


def spec_from_record(record: Any) -> tuple[JobSpec, int | None, str | None]:
    """Rebuild (spec, job seed, validation SHA-256) from a record read back from storage.

    Storage can hand back damaged records: every field is checked before use.
    Raises StorageError('corrupt') naming the bad field, and the errors of the
    parsers of its documents (ManifestError for the model info, SettingsError,
    MessageError for file references, WeeiError 'bad-seed').
    """
    at = Where(StorageError, StorageReason.CORRUPT, "job record")
    record = as_object(record, at)
    module = at.read(record, "module", as_object)
    chunks = at.read(record, "chunks", as_list)
    validation = nullable(as_object)(record.get("validation"), at.at("validation"))
    validation_sha = validation_format = None
    if validation is not None:
        validation_sha = nullable(as_sha256)(validation.get("sha256"), at.at("validation").at("sha256"))
        validation_format = nullable(as_str)(validation.get("format"), at.at("validation").at("format"))
    auxiliary = as_object(record.get("auxiliaryFiles", {}), at.at("auxiliaryFiles"))
    spec = JobSpec(
        job_id=at.read(record, "id", as_str),
        info=ModelInfo.from_json(at.get(record, "modelInfo")),
        module=_module(module, at.at("module")),
        settings=TrainingSettings.from_json(at.get(record, "settings")),
        weight_bytes=at.read(record, "weightBytes", as_int, minimum=0),
        chunks=tuple(_chunk(c, at.at("chunks").at(k)) for k, c in enumerate(chunks)),
        auxiliary_files={k: ArtifactRef.from_json(v) for k, v in auxiliary.items()},
        has_validation=validation is not None,
        validation_format=validation_format,
        gpu=GpuOffer.from_json(record["gpu"]) if record.get("gpu") is not None else None,
        working_bytes=_working_bytes(record.get("workingBytes")),
        cpu_backend=str(record["cpuBackend"]) if isinstance(record.get("cpuBackend"), str) else None,
    )
    seed = record.get("jobSeed")
    return spec, parse_seed(seed) if seed is not None else None, validation_sha


def _module(obj: dict[str, Any], at: Where) -> ModuleInfo:
    return ModuleInfo(at.read(obj, "fileName", as_str), at.read(obj, "bytes", as_int, minimum=0),
                      at.read(obj, "sha256", as_sha256))


def _chunk(obj: Any, at: Where) -> ChunkInfo:
    obj = as_object(obj, at)
    return ChunkInfo(at.read(obj, "id", as_str), at.read(obj, "fileName", as_str), at.read(obj, "bytes", as_int, minimum=0),
                     at.read(obj, "sha256", as_sha256), at.read(obj, "format", as_str),
                     at.read(obj, "exampleCount", as_int, minimum=0))


def _working_bytes(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def record_artifacts(record: Any) -> set[str]:
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
