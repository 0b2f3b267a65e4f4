"""Job preparation: every check before anything is shared, then checkpoint 0.

Runs the spec's "Before anything is shared, Weei checks" list in order:
settings, the manifest (a chunk list or a weei-model-package) against the
selected files, then the module itself (getModelInfo, initial weights,
describeChunk of every file). Any failure raises the checker's named error
and no job exists. The same function serves the browser (over its engine)
and CPython hosts (over wasmtime).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Mapping

from .core.errors import ManifestError, ManifestReason, ModelError, ModelReason, WeeiError
from .core.job.spec import ChunkInfo, GpuOffer, JobSpec, ModuleInfo
from .core.limits import check_file_size, check_selection_sizes
from .core.formats.manifest import (
    DatasetManifest, ModelPackage, check_dataset_files, check_loaded_model, check_plain_manifest, check_selection,
    parse_manifest_file,
)
from .core.wire.messages import ArtifactRef
from .core.formats.modelinfo import ModelInfo, check_settings_for_model, check_weight_size
from .core.formats.seeds import job_seed_from_bytes
from .core.formats.settings import TrainingSettings
from .gpu.archive import ShaderArchive, check_descriptor, parse_archive
from .gpu.errors import GpuError
from .runtime import ModelRuntime

__all__ = ["GpuFiles", "PreparedJob", "prepare_job"]


@dataclass(frozen=True)
class GpuFiles:
    """The selected WGSL archive, checked module by module, and the package's GPU backend entry."""

    archive_sha256: str
    archive: ShaderArchive
    backend: Mapping[str, Any]  # the manifest's GPU backend object (weei.gpu.session.GpuBackendSpec.from_backend)


@dataclass(frozen=True)
class PreparedJob:
    """A checked job, its initial weights and the artifacts participants will need."""

    spec: JobSpec
    initial_weights: bytes
    job_seed: int | None
    runtime: ModelRuntime
    artifacts: dict[str, bytes]  # sha256 -> bytes: module, chunks, auxiliary files
    validation: bytes | None
    package: ModelPackage | None
    gpu: GpuFiles | None = None  # executionFiles were selected: the job may train on a GPU

    def load_checkpoint(self, weights: bytes) -> None:
        """Load a checkpoint's weights into the runtime, and its auxiliary slots after them, as after
        every loadModel (the module decides whether it continues from them): file slots from the
        selected files, snapshot slots the weights themselves, which are a continued job's first
        checkpoint and so what every snapshot rule picks at its start (``weei.core.job.round_rules.auxiliary_for``).

        Raises:
            ModelError: the module refuses the weights or a slot.
        """
        self.runtime.load_model(weights)
        slots = self.spec.info.auxiliary_weights
        if slots:
            self.runtime.load_auxiliary({
                slot.id: self.artifacts[self.spec.auxiliary_files[slot.id].sha256]
                if slot.id in self.spec.auxiliary_files else weights for slot in slots})


_MODULE_MISMATCH = frozenset({"wasm-name-mismatch", "wasm-size-mismatch", "wasm-sha256-mismatch"})


def _name_the_other_model(engine: Any, package: ModelPackage, wasm_name: str, wasm: bytes,
                          exc: ManifestError) -> None:
    """The selected module is not the package's: when it is another model altogether (the
    usual mistake: one demo's module with another's manifest, both named model.wasm), say
    which model the manifest is for instead of a size or hash mismatch. Raises the
    ManifestError (same reason) with that message; returns when the module is the same
    model (a rebuilt module: the original message stands) or does not load."""
    try:
        other = ModelInfo.from_json(ModelRuntime.load(wasm, engine).model_info()).id
    except WeeiError:
        return
    if other == package.model_id:
        return
    raise ManifestError(ManifestReason(exc.reason), f"this manifest is for model {package.model_id!r}, but the selected module "
                                     f"{wasm_name} is model {other!r}: choose the manifest that came with "
                                     f"{wasm_name}, or the module of {package.model_id!r}") from exc


def prepare_job(engine: Any, *, job_id: str, wasm_name: str, wasm: bytes, manifest: Any,
                files: Mapping[str, bytes], settings: Any, random_bytes: bytes,
                validation: tuple[str, bytes] | None = None,
                execution_files: Mapping[str, bytes] | None = None) -> PreparedJob:
    """Check everything and create the job's initial weights.

    ``manifest`` is the parsed JSON of the selected manifest file,
    ``settings`` the TrainingSettings JSON, ``random_bytes`` 16 bytes from
    the host's random source (job seed, initial weights seed),
    ``execution_files`` the selected WGSL archive (name -> bytes): it must
    be the package's ``shaderArchive`` (name, size, SHA-256) and pass the
    module-by-module checks of ``weei.gpu.archive`` (a GpuError's reason
    becomes the ManifestError's); compiling is checked on the device.

    Raises:
        SettingsError, ManifestError, ModelError: the named problem.
    """
    check_file_size("module", wasm_name, len(wasm))
    parsed_settings = TrainingSettings.from_json(settings)
    parsed = parse_manifest_file(manifest)
    package = parsed if isinstance(parsed, ModelPackage) else None
    # Sizes first, per kind: a module 256 MB, an auxiliary weights file 2 GiB.
    check_selection_sizes({name: len(data) for name, data in files.items()},
                          [s.file_name for s in package.auxiliary_weights if s.file_name] if package else [])
    if validation is not None:
        check_file_size("validation", validation[0], len(validation[1]))
    dataset: DatasetManifest = package.dataset_manifest if package is not None else parsed  # type: ignore[assignment]
    execution_files = dict(execution_files or {})
    for name, data in execution_files.items():
        check_file_size("wgsl", name, len(data))  # the limit the archive has on the wire too
    gpu = None
    if package is not None:
        _check_archive_descriptor(package, execution_files)
        try:
            selection = check_selection(package, wasm_name, wasm, files, validation[0] if validation else None,
                                        execution_files)
        except ManifestError as exc:
            if exc.reason in _MODULE_MISMATCH:
                _name_the_other_model(engine, package, wasm_name, wasm, exc)
            raise
        if selection.gpu:
            gpu = _gpu_files(package, execution_files)
    else:
        if execution_files:
            raise ManifestError(ManifestReason.NOT_SHADER_ARCHIVE, f"{next(iter(execution_files))}: only a model package "
                                                      "with a GPU backend takes executionFiles")
        check_dataset_files(dataset, files)

    runtime = ModelRuntime.load(wasm, engine)
    info = ModelInfo.from_json(runtime.model_info())
    init_seed = int.from_bytes(random_bytes[8:16], "little")
    initial = runtime.create_initial_weights(init_seed)
    if package is not None:
        check_loaded_model(package, info, len(initial))
    else:
        check_plain_manifest(dataset, info)
    check_weight_size(info, len(initial))
    check_settings_for_model(parsed_settings, info)

    chunks = []
    for entry in dataset.entries:
        data = files[entry.file_name]
        count = runtime.describe_chunk(entry.format, data)
        if count != entry.example_count:
            raise ManifestError(ManifestReason.EXAMPLE_COUNT_MISMATCH, f"{entry.file_name}: the model reads {count} examples, "
                                                          f"the manifest says {entry.example_count}")
        chunks.append(ChunkInfo(entry.id, entry.file_name, entry.bytes, entry.sha256, entry.format, count))

    validation_format = None
    if validation is not None:
        if info.is_experience:
            raise ManifestError(ManifestReason.VALIDATION_NOT_ALLOWED, f"{validation[0]}: a model with inputs 'none' takes no validation file")
        validation_format = chunks[0].format if chunks else info.data_formats[0].id
        try:
            runtime.describe_chunk(validation_format, validation[1])
        except ModelError as exc:
            raise ModelError(ModelReason(exc.reason), f"the validation file {validation[0]} is not {validation_format} "
                                                      f"data of {info.id}: {exc.message}") from None

    wasm_sha = hashlib.sha256(wasm).hexdigest()
    artifacts = {wasm_sha: bytes(wasm)}
    for chunk in chunks:
        artifacts[chunk.sha256] = bytes(files[chunk.file_name])
    aux_files: dict[str, ArtifactRef] = {}
    if package is not None:
        for slot in package.auxiliary_weights:
            if slot.file_name is not None and slot.sha256 is not None:
                data = files[slot.file_name]
                artifacts[slot.sha256] = bytes(data)
                aux_files[slot.id] = ArtifactRef("auxiliary", slot.sha256, len(data))
    if gpu is not None:
        artifacts[gpu.archive_sha256] = bytes(next(iter(execution_files.values())))

    job_seed = job_seed_from_bytes(random_bytes[:8]) if info.is_experience else None
    offer = _gpu_offer(package, execution_files, gpu) if gpu is not None and package is not None else None
    spec = JobSpec(job_id=job_id, info=info, module=ModuleInfo(wasm_name, len(wasm), wasm_sha),
                   settings=parsed_settings, weight_bytes=len(initial), chunks=tuple(chunks),
                   auxiliary_files=aux_files, has_validation=validation is not None,
                   validation_format=validation_format, gpu=offer, working_bytes=_working_bytes(package),
                   cpu_backend=next((b.id for b in package.backends if b.kind == "cpu"), None)
                   if package is not None else None)
    return PreparedJob(spec, initial, job_seed, runtime, artifacts,
                       bytes(validation[1]) if validation else None, package, gpu)


def _working_bytes(package: ModelPackage | None) -> int | None:
    """The largest estimatedWorkingBytes of the package's CPU backends: the module's memory budget
    (weei.runtime.sandbox.memory_limit). None without a package (the device's cap applies)."""
    sizes = [b.raw.get("estimatedWorkingBytes") for b in package.backends if b.kind == "cpu"] if package else []
    valid = [n for n in sizes if isinstance(n, int) and not isinstance(n, bool) and n >= 0]
    return max(valid) if valid else None


def _check_archive_descriptor(package: ModelPackage, execution_files: Mapping[str, bytes]) -> None:
    """The package's archive by name with another size or SHA-256 is named as such (not just 'not ours')."""
    want = package.shader_archive
    for name, data in execution_files.items():
        if want is not None and name == want.file_name:
            try:
                check_descriptor(bytes(data), want.bytes, want.sha256)
            except GpuError as exc:
                raise ManifestError(ManifestReason(exc.reason), f"{name}: {exc.message}") from None


def _gpu_files(package: ModelPackage, execution_files: Mapping[str, bytes]) -> GpuFiles:
    """The archive (already the package's shaderArchive by name, size and SHA-256), module by module."""
    (name, data), = execution_files.items()
    backend = next(b for b in package.backends if b.kind == "gpu")
    try:
        archive = parse_archive(bytes(data))
    except GpuError as exc:
        raise ManifestError(ManifestReason(exc.reason), f"{name}: {exc.message}") from None
    return GpuFiles(hashlib.sha256(data).hexdigest(), archive, dict(backend.raw))


def _gpu_offer(package: ModelPackage, execution_files: Mapping[str, bytes], gpu: GpuFiles) -> GpuOffer:
    """What the job's record keeps and its Deliver announces of the archive and the GPU backend."""
    (name, data), = execution_files.items()
    backend = gpu.backend
    cpu_id = next((b.id for b in package.backends if b.kind == "cpu"), None)
    return GpuOffer.from_json({
        "shaderArchive": {"fileName": name, "bytes": len(data), "sha256": gpu.archive_sha256},
        "backend": {k: backend[k] for k in ("id", "estimatedWorkingBytes", "numericalMode", "requiredFeatures",
                                            "minimumDeviceLimits") if k in backend},
        **({"cpuBackend": cpu_id} if cpu_id is not None else {}),
    })
