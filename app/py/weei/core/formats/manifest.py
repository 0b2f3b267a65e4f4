"""Dataset manifests, weei-model-package manifests, and the checks on selected files.

Everything here is a pure function over JSON values, names and bytes (or
precomputed sizes and hashes): the browser adapter reads the ``File``
objects, hashes them (SubtleCrypto is faster than Pyodide's hashlib) and
passes :class:`FileFacts`; tests and the agent may pass bytes directly.

Job creation runs, in order: :func:`parse_manifest_file` on the selected
manifest JSON (a plain chunk list or a package), :func:`check_selection`
(or :func:`check_dataset_files` for a plain list) on the selected files, then
after loading the module :func:`check_loaded_model` (or
:func:`check_plain_manifest`). Each failure is a ManifestError whose reason
code names the check and whose message names the file or field.

Decisions where the spec is silent:

* a dataset chunk has at least 1 byte and 1 example; file names are plain
  names (no ``/`` or ``\\``); unknown keys in chunk entries are kept, not refused;
* ``shaderArchive`` is read from the GPU backend (or ``execution``); a
  dataset package (no workSource) may list a GPU backend, as generators
  write them, but selecting its WGSL archive is refused because GPU training
  over dataset inputs is not available yet;
* every inlineJson file must have a descriptor, and every descriptor of an
  inline file must match it;
* a WGSL archive is checked here by name, size and SHA-256; compiling it
  module by module is the browser's part (WebGPU).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from .. import _check
from ..floats import BytesLike
from ..errors import ManifestError, ManifestReason
from .jsonfmt import descriptor
from .modelinfo import AuxiliarySlot, ModelInfo, WorkSource, check_weight_size, parse_auxiliary_weights, parse_work_source

__all__ = [
    "FileFacts",
    "file_facts",
    "ChunkEntry",
    "DatasetManifest",
    "FileDescriptor",
    "Backend",
    "ModelPackage",
    "Selection",
    "parse_dataset_manifest",
    "parse_package",
    "parse_manifest_file",
    "check_dataset_manifest",
    "check_plain_manifest",
    "check_dataset_files",
    "check_selection",
    "check_loaded_model",
    "check_recorded_auxiliary",
    "PACKAGE_SCHEMA",
    "HOST_RUNTIME_ID",
]

PACKAGE_SCHEMA = "weei-model-package"
EXECUTION_SCHEMA = "weei-model-execution"
HOST_RUNTIME_ID = "weei-device-program-v1"
HOST_RUNTIME_DELIVERY = "installed-in-host"



def _at(reason: Enum, path: str) -> _check.Where:
    return _check.Where(ManifestError, reason, path)


def _file_name(value: Any, path: str, reason: Enum) -> str:
    name = _check.as_str(value, _at(reason, path))
    if "/" in name or "\\" in name or "\x00" in name or name in (".", ".."):
        raise ManifestError(reason, f"{path}: {name!r} is not a plain file name")
    return name


@dataclass(frozen=True)
class FileFacts:
    """A selected file as the checks see it: name, size and lowercase SHA-256."""

    name: str
    bytes: int
    sha256: str


def file_facts(name: str, data: BytesLike) -> FileFacts:
    """FileFacts of in-memory bytes (hashlib; the browser hashes with SubtleCrypto)."""
    return FileFacts(name, len(data), hashlib.sha256(data).hexdigest())


def _facts(name: str, value: FileFacts | BytesLike) -> FileFacts:
    if isinstance(value, FileFacts):
        if value.name != name:
            raise ManifestError(ManifestReason.FILE_NAME_MISMATCH, f"{name}: facts are for {value.name!r}")
        return value
    return file_facts(name, value)


# --------------------------------------------------------------------------- dataset manifest


@dataclass(frozen=True)
class ChunkEntry:
    """One dataset file of a manifest."""

    id: str
    file_name: str
    bytes: int
    sha256: str
    format: str
    example_count: int


@dataclass(frozen=True)
class DatasetManifest:
    """A checked dataset manifest; ``raw`` is the JSON list."""

    entries: tuple[ChunkEntry, ...]
    raw: list[Any] = field(compare=False)


def parse_dataset_manifest(obj: Any, path: str = "manifest") -> DatasetManifest:
    """Parse a dataset manifest: a JSON array of chunk entries.

    Takes: the parsed JSON; ``path`` to name it in errors.
    Returns: the manifest. Raises: ManifestError (``invalid-dataset-manifest``,
    ``duplicate-chunk-id``, ``duplicate-file-name``).
    """
    r = ManifestReason.INVALID_DATASET_MANIFEST
    items = _check.as_list(obj, _at(r, path))
    entries: list[ChunkEntry] = []
    ids: set[str] = set()
    names: set[str] = set()
    for i, item in enumerate(items):
        p = f"{path}[{i}]"
        item = _check.as_object(item, _at(r, p))
        # Entry by entry, not the whole array first: a bad entry is refused before the rest is walked.
        _check.check_depth(item, _at(r, p), _check.MAX_JSON_DEPTH - 1)
        chunk_id = _at(r, p).read(item, "id", _check.as_str)
        name = _file_name(_at(r, p).get(item, "fileName"), f"{p}.fileName", r)
        size = _at(r, p).read(item, "bytes", _check.as_int, minimum=1)
        sha = _at(r, p).read(item, "sha256", _check.as_sha256)
        fmt = _at(r, p).read(item, "format", _check.as_str)
        examples = _at(r, p).read(item, "exampleCount", _check.as_int, minimum=1)
        if chunk_id in ids:
            raise ManifestError(ManifestReason.DUPLICATE_CHUNK_ID, f"{p}.id: chunk {chunk_id!r} is listed twice")
        if name in names:
            raise ManifestError(ManifestReason.DUPLICATE_FILE_NAME, f"{p}.fileName: file {name!r} is listed twice")
        ids.add(chunk_id)
        names.add(name)
        entries.append(ChunkEntry(chunk_id, name, size, sha, fmt, examples))
    return DatasetManifest(tuple(entries), list(items))


def check_dataset_manifest(manifest: DatasetManifest, info: ModelInfo) -> None:
    """Check chunks against the model: format, maxChunkBytes, maxExamplesPerChunk.

    Raises: ManifestError ``unknown-format``, ``chunk-too-large`` or
    ``too-many-examples`` naming the chunk.
    """
    formats = {f.id for f in info.data_formats}
    for e in manifest.entries:
        if e.format not in formats:
            raise ManifestError(ManifestReason.UNKNOWN_FORMAT, f"chunk {e.id!r} ({e.file_name}): the model does not read format {e.format!r}")
        if info.max_chunk_bytes is not None and e.bytes > info.max_chunk_bytes:
            raise ManifestError(
                ManifestReason.CHUNK_TOO_LARGE, f"chunk {e.id!r} ({e.file_name}): {e.bytes} bytes, the model takes at most {info.max_chunk_bytes}"
            )
        if info.max_examples_per_chunk is not None and e.example_count > info.max_examples_per_chunk:
            raise ManifestError(
                ManifestReason.TOO_MANY_EXAMPLES,
                f"chunk {e.id!r} ({e.file_name}): {e.example_count} examples, "
                f"the model takes at most {info.max_examples_per_chunk}",
            )


def check_plain_manifest(manifest: DatasetManifest, info: ModelInfo) -> None:
    """Check a plain chunk list (no package) against the loaded model.

    Raises: ManifestError ``package-required`` for an experience model (which
    comes only as a package), else as :func:`check_dataset_manifest`.
    """
    if info.is_experience:
        raise ManifestError(ManifestReason.PACKAGE_REQUIRED, "manifest: an experience model needs its package manifest, not a list of chunks")
    check_dataset_manifest(manifest, info)


def _selection_items(files: Mapping[str, FileFacts | BytesLike] | Iterable[tuple[str, FileFacts | BytesLike]]) -> list[FileFacts]:
    pairs = files.items() if isinstance(files, Mapping) else files
    out: list[FileFacts] = []
    seen: set[str] = set()
    for name, value in pairs:
        if name in seen:
            raise ManifestError(ManifestReason.DUPLICATE_FILE, f"{name}: selected twice")
        seen.add(name)
        out.append(_facts(name, value))
    return out


def _match(facts: FileFacts, size: int, sha256: str, what: str) -> None:
    if facts.bytes != size:
        raise ManifestError(ManifestReason.FILE_SIZE_MISMATCH, f"{facts.name}: {facts.bytes} bytes, {what} says {size}")
    if facts.sha256 != sha256:
        raise ManifestError(ManifestReason.FILE_SHA256_MISMATCH, f"{facts.name}: SHA-256 differs from {what}")


def check_dataset_files(
    manifest: DatasetManifest,
    files: Mapping[str, FileFacts | BytesLike] | Iterable[tuple[str, FileFacts | BytesLike]],
    auxiliary: Iterable[AuxiliarySlot] = (),
) -> None:
    """Check the selected files against the manifest (and package file slots).

    Takes: the manifest, the selected files by name (bytes or FileFacts),
    and the package's auxiliary slots (those with a fileName are expected).
    Raises: ManifestError ``unexpected-file``, ``missing-file``,
    ``file-size-mismatch``, ``file-sha256-mismatch``, ``duplicate-file``.
    """
    expected: dict[str, tuple[int, str, str]] = {
        e.file_name: (e.bytes, e.sha256, f"the manifest (chunk {e.id!r})") for e in manifest.entries
    }
    for slot in auxiliary:
        if slot.file_name is not None and slot.sha256 is not None:
            expected[slot.file_name] = (slot.bytes, slot.sha256, f"auxiliary weights slot {slot.id!r}")
    selected = _selection_items(files)
    for facts in selected:
        if facts.name not in expected:
            raise ManifestError(ManifestReason.UNEXPECTED_FILE, f"{facts.name}: not named in the manifest")
        size, sha, what = expected[facts.name]
        _match(facts, size, sha, what)
    names = {f.name for f in selected}
    for name in expected:
        if name not in names:
            raise ManifestError(ManifestReason.MISSING_FILE, f"{name}: named in the manifest but not selected")


# --------------------------------------------------------------------------- package manifest


@dataclass(frozen=True)
class FileDescriptor:
    """``{fileName, bytes, sha256}`` of a package file."""

    file_name: str
    bytes: int
    sha256: str

    def matches(self, facts: FileFacts) -> bool:
        """True when name, size and hash are all equal."""
        return (facts.name, facts.bytes, facts.sha256) == (self.file_name, self.bytes, self.sha256)


def _descriptor(obj: Any, path: str, reason: Enum = ManifestReason.INVALID_PACKAGE) -> FileDescriptor:
    obj = _check.as_object(obj, _at(reason, path))
    name = _file_name(_at(reason, path).get(obj, "fileName"), f"{path}.fileName", reason)
    size = _at(reason, path).read(obj, "bytes", _check.as_int, minimum=0)
    sha = _at(reason, path).read(obj, "sha256", _check.as_sha256)
    return FileDescriptor(name, size, sha)


@dataclass(frozen=True)
class Backend:
    """One execution backend of a package."""

    id: str
    kind: str
    artifacts: tuple[FileDescriptor, ...]
    shader_archive: FileDescriptor | None
    raw: dict[str, Any] = field(compare=False)


@dataclass(frozen=True)
class ModelPackage:
    """A checked weei-model-package manifest; ``raw`` is its JSON."""

    wasm: FileDescriptor
    work_source: WorkSource | None
    auxiliary_weights: tuple[AuxiliarySlot, ...]
    model_id: str
    weight_bytes: int
    compatibility: FileDescriptor
    dataset_manifest_file: FileDescriptor
    dataset_manifest: DatasetManifest
    backends: tuple[Backend, ...]
    shader_archive: FileDescriptor | None
    raw: dict[str, Any] = field(compare=False)

    @property
    def is_experience(self) -> bool:
        """True for an experience package (it has a workSource)."""
        return self.work_source is not None

    @property
    def gpu_usable(self) -> bool:
        """True when a selected shader archive may enable GPU training (dataset and experience packages)."""
        return self.shader_archive is not None


def parse_package(obj: Any) -> ModelPackage:
    """Parse a weei-model-package manifest and run every check that needs no files.

    Checks: schema and hostRuntime; workSource and auxiliaryWeights; the
    execution block; a GPU backend has a shaderArchive; the wasm is the CPU
    backend's artifact; inline files match their descriptors (size and
    SHA-256 of ``JSON.stringify(value, null, 2) + "\\n"``); compatibility.json
    names the same model and weight size; for inputs "none" the dataset
    manifest is empty; snapshot slots have the weight size.
    Returns: the package. Raises: ManifestError with a reason code.
    """
    r = ManifestReason.INVALID_PACKAGE
    obj = _check.as_object(obj, _at(r, "package"))
    _check.check_depth(obj, _at(r, "package"))
    if obj.get("schema") != PACKAGE_SCHEMA or not _check.is_integer(obj.get("schemaVersion")) or obj["schemaVersion"] != 1:
        raise ManifestError(
            ManifestReason.UNSUPPORTED_SCHEMA, f"package: schema must be {PACKAGE_SCHEMA!r} version 1, not {obj.get('schema')!r} {obj.get('schemaVersion')!r}"
        )
    host = _at(ManifestReason.UNSUPPORTED_HOST_RUNTIME, "package").read(obj, "hostRuntime", _check.as_object)
    if host.get("id") != HOST_RUNTIME_ID or host.get("delivery") != HOST_RUNTIME_DELIVERY:
        raise ManifestError(
            ManifestReason.UNSUPPORTED_HOST_RUNTIME,
            f"package.hostRuntime: must be {HOST_RUNTIME_ID!r} {HOST_RUNTIME_DELIVERY!r}, not {host.get('id')!r} {host.get('delivery')!r}",
        )
    wasm = _descriptor(_at(r, "package").get(obj, "wasm"), "package.wasm")
    work_source = parse_work_source(obj["workSource"], "package.workSource") if "workSource" in obj else None
    slots: tuple[AuxiliarySlot, ...] = ()
    if "auxiliaryWeights" in obj:
        slots = parse_auxiliary_weights(obj["auxiliaryWeights"], in_package=True, path="package.auxiliaryWeights")

    ex = _at(r, "package").read(obj, "execution", _check.as_object)
    if ex.get("schema") != EXECUTION_SCHEMA or not _check.is_integer(ex.get("schemaVersion")) or ex["schemaVersion"] != 1:
        raise ManifestError(ManifestReason.UNSUPPORTED_SCHEMA, f"package.execution: schema must be {EXECUTION_SCHEMA!r} version 1")
    model_id = _at(r, "package.execution").read(ex, "modelId", _check.as_str)
    if ex.get("weightFormat") != "float32-le":
        raise ManifestError(ManifestReason.UNSUPPORTED_WEIGHT_FORMAT, f"package.execution.weightFormat: must be 'float32-le', not {ex.get('weightFormat')!r}")
    weight_bytes = _at(r, "package.execution").read(ex, "weightBytes", _check.as_int, minimum=4)
    if weight_bytes % 4:
        raise ManifestError(r, f"package.execution.weightBytes: {weight_bytes} is not a whole number of float32 values")
    compat_desc = _descriptor(_at(r, "package.execution").get(ex, "compatibility"), "package.execution.compatibility")
    dm_desc = _descriptor(_at(r, "package.execution").get(ex, "datasetManifest"), "package.execution.datasetManifest")

    backends, shader_archive = _parse_backends(ex, wasm)
    _check_policy(ex, backends)

    # Inline files: each described file must be present and match, nothing undescribed.
    inline = _at(r, "package").read(obj, "inlineJson", _check.as_object)
    described = {compat_desc.file_name: compat_desc, dm_desc.file_name: dm_desc}
    for name in inline:
        if name not in described:
            raise ManifestError(ManifestReason.INLINE_FILE_UNDESCRIBED, f"package.inlineJson[{name!r}]: no descriptor in execution names it")
    for name, desc in described.items():
        if name not in inline:
            raise ManifestError(ManifestReason.INLINE_FILE_MISSING, f"package.inlineJson: {name} is described but missing")
        size, sha = descriptor(inline[name])
        if size != desc.bytes:
            raise ManifestError(ManifestReason.INLINE_FILE_SIZE_MISMATCH, f"{name}: {size} bytes, its descriptor says {desc.bytes}")
        if sha != desc.sha256:
            raise ManifestError(ManifestReason.INLINE_FILE_SHA256_MISMATCH, f"{name}: SHA-256 differs from its descriptor")

    _check_compatibility(inline[compat_desc.file_name], compat_desc.file_name, model_id, weight_bytes)
    dataset = parse_dataset_manifest(inline[dm_desc.file_name], dm_desc.file_name)
    if work_source is not None and dataset.entries:
        raise ManifestError(ManifestReason.DATASET_NOT_EMPTY, f"{dm_desc.file_name}: a model with inputs 'none' takes no dataset files")

    # The package knows the weight size already, so a snapshot slot of
    # another size is refused before the module is even loaded.
    for slot in slots:
        if slot.source_kind is not None and slot.bytes != weight_bytes:
            raise ManifestError(
                ManifestReason.AUXILIARY_SIZE_MISMATCH,
                f"package.auxiliaryWeights {slot.id!r}: a slot with a source must have the weight size {weight_bytes}, not {slot.bytes}",
            )

    # No two package files may share a name: selection matches files by name.
    names = [wasm.file_name] + [e.file_name for e in dataset.entries] + [s.file_name for s in slots if s.file_name]
    if shader_archive is not None:
        names.append(shader_archive.file_name)
    dup = _check.first_duplicate(names)
    if dup is not None:
        raise ManifestError(ManifestReason.DUPLICATE_FILE_NAME, f"{dup}: names two different package files")
    return ModelPackage(
        wasm, work_source, slots, model_id, weight_bytes, compat_desc, dm_desc, dataset, backends, shader_archive, obj
    )


def _parse_backends(ex: dict[str, Any], wasm: FileDescriptor) -> tuple[tuple[Backend, ...], FileDescriptor | None]:
    r = ManifestReason.INVALID_PACKAGE
    items = _at(r, "package.execution").read(ex, "backends", _check.as_list)
    top_archive = _descriptor(ex["shaderArchive"], "package.execution.shaderArchive") if "shaderArchive" in ex else None
    backends: list[Backend] = []
    backend_ids: set[str] = set()
    shader_archive: FileDescriptor | None = None
    for i, item in enumerate(items):
        p = f"package.execution.backends[{i}]"
        item = _check.as_object(item, _at(r, p))
        bid = _at(r, p).read(item, "id", _check.as_str)
        if bid in backend_ids:
            raise ManifestError(r, f"{p}.id: duplicate backend {bid!r}")
        backend_ids.add(bid)
        kind = _at(r, p).get(item, "kind")
        if kind not in ("cpu", "gpu"):
            raise ManifestError(r, f"{p}.kind: must be 'cpu' or 'gpu', not {kind!r}")
        artifacts = tuple(
            _descriptor(a, f"{p}.artifacts[{j}]") for j, a in enumerate(_at(r, p).read(item, "artifacts", _check.as_list))
        )
        archive = _descriptor(item["shaderArchive"], f"{p}.shaderArchive") if "shaderArchive" in item else None
        if kind == "gpu":
            archive = archive or top_archive
            if archive is None:
                raise ManifestError(ManifestReason.GPU_BACKEND_WITHOUT_SHADER_ARCHIVE, f"{p}: a GPU backend needs a shaderArchive")
            if top_archive is not None and archive != top_archive:
                raise ManifestError(r, f"{p}.shaderArchive: differs from execution.shaderArchive")
            if shader_archive is not None and archive != shader_archive:
                raise ManifestError(r, f"{p}.shaderArchive: GPU backends name different archives")
            shader_archive = archive
        else:
            # The module checked against the selection must be this backend's artifact.
            same_name = [a for a in artifacts if a.file_name == wasm.file_name]
            if not same_name:
                raise ManifestError(ManifestReason.CPU_ARTIFACT_MISMATCH, f"{p}.artifacts: does not list the package's wasm {wasm.file_name}")
            if any(a != wasm for a in same_name):
                raise ManifestError(ManifestReason.CPU_ARTIFACT_MISMATCH, f"{p}.artifacts: {wasm.file_name} differs in size or SHA-256 from package.wasm")
        backends.append(Backend(bid, kind, artifacts, archive, item))
    if not any(b.kind == "cpu" for b in backends):
        raise ManifestError(ManifestReason.NO_CPU_BACKEND, "package.execution.backends: needs a CPU backend with the wasm")
    return tuple(backends), shader_archive


def _check_policy(ex: dict[str, Any], backends: tuple[Backend, ...]) -> None:
    if "policy" not in ex:
        return
    policy = _check.as_object(ex["policy"], _at(ManifestReason.INVALID_PACKAGE, "package.execution.policy"))
    ids = {b.id for b in backends}
    for bid in _check.as_list(policy.get("preference", []), _at(ManifestReason.INVALID_PACKAGE, "package.execution.policy.preference")):
        if not isinstance(bid, str) or bid not in ids:
            raise ManifestError(ManifestReason.INVALID_PACKAGE, f"package.execution.policy.preference: unknown backend {bid!r}")


def _check_compatibility(value: Any, name: str, model_id: str, weight_bytes: int) -> None:
    r = ManifestReason.COMPATIBILITY_MISMATCH
    compat = _check.as_object(value, _at(r, name))
    identity = _check.as_object(compat.get("identity"), _at(r, f"{name}.identity"))
    if identity.get("modelId") != model_id:
        raise ManifestError(r, f"{name}: names model {identity.get('modelId')!r}, the package {model_id!r}")
    if not _check.is_integer(compat.get("weightBytes")) or compat["weightBytes"] != weight_bytes:
        raise ManifestError(r, f"{name}: weightBytes {compat.get('weightBytes')!r}, the package {weight_bytes}")
    if "weightCount" in compat and (not _check.is_integer(compat["weightCount"]) or compat["weightCount"] * 4 != weight_bytes):
        raise ManifestError(r, f"{name}: weightCount {compat['weightCount']!r} does not match {weight_bytes} bytes")


def parse_manifest_file(obj: Any) -> DatasetManifest | ModelPackage:
    """Parse the manifest a user selected: a chunk list or a package.

    Returns: a DatasetManifest for a JSON array, a ModelPackage for an
    object. Raises: ManifestError.
    """
    if isinstance(obj, list):
        return parse_dataset_manifest(obj)
    if isinstance(obj, dict):
        return parse_package(obj)
    raise ManifestError(ManifestReason.INVALID_MANIFEST, "manifest: must be a list of chunks or a weei-model-package object")


@dataclass(frozen=True)
class Selection:
    """What the selected files turned out to be."""

    gpu: bool  # a shader archive was selected: the package may train on the GPU
    chunk_files: dict[str, str]  # chunk id -> file name
    auxiliary_files: dict[str, str]  # slot id -> file name


def check_selection(
    package: ModelPackage,
    wasm_name: str,
    wasm: FileFacts | BytesLike,
    files: Mapping[str, FileFacts | BytesLike] | Iterable[tuple[str, FileFacts | BytesLike]],
    validation_name: str | None = None,
    wgsl: Mapping[str, FileFacts | BytesLike] | Iterable[tuple[str, FileFacts | BytesLike]] = (),
) -> Selection:
    """Check the files selected with a package, before anything is shared.

    Takes: the package; the module's name and bytes (or facts); the selected
    dataset and auxiliary files; the validation file's name if any; the
    selected execution files (the WGSL archive).
    Returns: a Selection. Raises: ManifestError ``wasm-name-mismatch``,
    ``wasm-size-mismatch``, ``wasm-sha256-mismatch``, ``validation-not-allowed``,
    ``not-shader-archive`` or as :func:`check_dataset_files`.
    """
    w = _facts(wasm_name, wasm)
    if w.name != package.wasm.file_name:
        raise ManifestError(ManifestReason.WASM_NAME_MISMATCH, f"{w.name}: the package's module is {package.wasm.file_name}")
    if w.bytes != package.wasm.bytes:
        raise ManifestError(ManifestReason.WASM_SIZE_MISMATCH, f"{w.name}: {w.bytes} bytes, the package says {package.wasm.bytes}")
    if w.sha256 != package.wasm.sha256:
        raise ManifestError(ManifestReason.WASM_SHA256_MISMATCH, f"{w.name}: SHA-256 differs from the package's wasm")
    check_dataset_files(package.dataset_manifest, files, package.auxiliary_weights)
    if validation_name is not None and package.is_experience:
        raise ManifestError(ManifestReason.VALIDATION_NOT_ALLOWED, f"{validation_name}: a model with inputs 'none' takes no validation file")
    gpu = False
    for facts in _selection_items(wgsl):
        if package.shader_archive is None or not package.shader_archive.matches(facts):
            raise ManifestError(ManifestReason.NOT_SHADER_ARCHIVE, f"{facts.name}: is not the package's shaderArchive")
        gpu = True
    return Selection(
        gpu,
        {e.id: e.file_name for e in package.dataset_manifest.entries},
        {s.id: s.file_name for s in package.auxiliary_weights if s.file_name is not None},
    )


def _without_file_name(slots: tuple[AuxiliarySlot, ...]) -> list[dict[str, Any]]:
    return [{k: v for k, v in s.raw.items() if k != "fileName"} for s in slots]


def check_loaded_model(package: ModelPackage, info: ModelInfo, initial_weight_bytes: int) -> None:
    """Check the loaded module against its package.

    Takes: the package, the module's getModelInfo(), the size of its initial
    weights. Raises: ManifestError ``model-id-mismatch``,
    ``weight-size-mismatch``, ``work-source-mismatch``,
    ``auxiliary-weights-mismatch``, ``auxiliary-size-mismatch`` (a slot with a
    source sized unlike the weights), or a dataset check of
    :func:`check_dataset_manifest`.
    """
    if info.id != package.model_id:
        raise ManifestError(ManifestReason.MODEL_ID_MISMATCH, f"module: model ID {info.id!r}, execution.modelId {package.model_id!r}")
    if initial_weight_bytes != package.weight_bytes:
        raise ManifestError(
            ManifestReason.WEIGHT_SIZE_MISMATCH, f"module: initial weights of {initial_weight_bytes} bytes, execution.weightBytes {package.weight_bytes}"
        )
    if package.raw.get("workSource") != info.raw.get("workSource"):
        raise ManifestError(ManifestReason.WORK_SOURCE_MISMATCH, "workSource: the package and getModelInfo() differ")
    if _without_file_name(package.auxiliary_weights) != list(info.raw.get("auxiliaryWeights", [])):
        raise ManifestError(ManifestReason.AUXILIARY_WEIGHTS_MISMATCH, "auxiliaryWeights: the package (without fileName) and getModelInfo() differ")
    check_weight_size(info, initial_weight_bytes)
    check_dataset_manifest(package.dataset_manifest, info)


def check_recorded_auxiliary(recorded: Mapping[str, str], slots: Iterable[AuxiliarySlot]) -> None:
    """Check a checkpoint's recorded auxiliary files against the package's file slots.

    Takes: the checkpoint's ``auxiliaryWeights`` (slot id -> SHA-256) and the
    package's (or model's) slots. Snapshot slots (with a source) are not
    recorded and not compared.
    Raises: ManifestError ``auxiliary-files-differ`` naming the slot, when
    continuing would use other files than the checkpoint was trained with.
    """
    files = {s.id: s.sha256 for s in slots if s.sha256 is not None}
    for slot_id in sorted(set(files) | set(recorded)):
        if files.get(slot_id) != recorded.get(slot_id):
            raise ManifestError(
                ManifestReason.AUXILIARY_FILES_DIFFER,
                f"auxiliary weights {slot_id!r}: the checkpoint was trained with another file (or none)",
            )
