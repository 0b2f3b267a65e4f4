"""The error types of Weei.

Two kinds, kept apart on purpose (as in h11): ``UsageError`` means our caller
asked for something not allowed now; every other ``WeeiError`` means some
input (a file, a manifest, a peer's message) is bad. Each carries a stable
``reason`` code so callers and tests can tell problems apart without parsing
prose, and the message names the field or file at fault.

Each family lists its codes in a ``str`` enum beside its error class:
``ManifestReason`` and ``ModelInfoReason`` here, ``FrameReason`` in
``framing.frames``, ``MessageReason`` in ``messages``, ``DiagnosticsReason``
in ``diagnostics.records`` (and ``Reason`` in ``server.rooms``).
"""

from __future__ import annotations

from enum import Enum

__all__ = [
    "WeeiError",
    "UsageError",
    "SettingsError",
    "ManifestError",
    "ManifestReason",
    "ModelInfoReason",
    "CheckpointError",
    "ModelError",
    "AggregationError",
]


class WeeiError(Exception):
    """Base of every Weei error: ``reason`` is a short kebab-case code.

    Each family lists its codes in a ``str`` enum (``FrameReason``,
    ``MessageReason``, ...); the error keeps the plain string value, so it
    compares, prints and crosses to JavaScript exactly as before.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason: str = reason.value if isinstance(reason, Enum) else reason
        self.message = message

    def __str__(self) -> str:
        return f"{self.message} [{self.reason}]"


class UsageError(WeeiError):
    """The caller asked for something not allowed in the current role or state."""


class SettingsError(WeeiError):
    """Training or aggregation settings are invalid; ``field`` names the culprit."""

    def __init__(self, field: str, message: str, reason: str = "invalid-setting") -> None:
        super().__init__(reason, f"settings.{field}: {message}")
        self.field = field


class ManifestError(WeeiError):
    """A dataset manifest, model package manifest or model info is invalid."""


class ManifestReason(str, Enum):
    """Why a manifest or a selection of files was refused (the error keeps the string)."""

    FILE_NAME_MISMATCH = "file-name-mismatch"
    """File facts given under another file's name."""
    INVALID_DATASET_MANIFEST = "invalid-dataset-manifest"
    """A dataset manifest is not a list of well-formed chunk entries."""
    DUPLICATE_CHUNK_ID = "duplicate-chunk-id"
    """Two chunk entries share an id."""
    DUPLICATE_FILE_NAME = "duplicate-file-name"
    """Two entries name the same file."""
    UNKNOWN_FORMAT = "unknown-format"
    """A chunk's format is not one the model accepts."""
    CHUNK_TOO_LARGE = "chunk-too-large"
    """A chunk is above the model's maxChunkBytes."""
    TOO_MANY_EXAMPLES = "too-many-examples"
    """A chunk holds more examples than the model takes."""
    PACKAGE_REQUIRED = "package-required"
    """A package manifest is needed for what was selected."""
    DUPLICATE_FILE = "duplicate-file"
    """The same file name was selected twice."""
    FILE_SIZE_MISMATCH = "file-size-mismatch"
    """A selected file's size differs from the manifest."""
    FILE_SHA256_MISMATCH = "file-sha256-mismatch"
    """A selected file's SHA-256 differs from the manifest."""
    UNEXPECTED_FILE = "unexpected-file"
    """A selected file is not named in the manifest."""
    MISSING_FILE = "missing-file"
    """A file named in the manifest was not selected."""
    INVALID_PACKAGE = "invalid-package"
    """A weei-model-package manifest is malformed."""
    UNSUPPORTED_SCHEMA = "unsupported-schema"
    """Not a weei-model-package (or execution) manifest of version 1."""
    UNSUPPORTED_HOST_RUNTIME = "unsupported-host-runtime"
    """The package needs a host runtime other than this one."""
    UNSUPPORTED_WEIGHT_FORMAT = "unsupported-weight-format"
    """The weights are not float32 little-endian."""
    INLINE_FILE_UNDESCRIBED = "inline-file-undescribed"
    """An inlineJson file has no descriptor."""
    INLINE_FILE_MISSING = "inline-file-missing"
    """An inlineJson file was not given."""
    INLINE_FILE_SIZE_MISMATCH = "inline-file-size-mismatch"
    """An inlineJson file's size differs from its descriptor."""
    INLINE_FILE_SHA256_MISMATCH = "inline-file-sha256-mismatch"
    """An inlineJson file's SHA-256 differs from its descriptor."""
    DATASET_NOT_EMPTY = "dataset-not-empty"
    """A dataset was given for a model that reads none."""
    AUXILIARY_SIZE_MISMATCH = "auxiliary-size-mismatch"
    """An auxiliary weights file's size or alignment is wrong."""
    GPU_BACKEND_WITHOUT_SHADER_ARCHIVE = "gpu-backend-without-shader-archive"
    """A GPU backend names no WGSL archive."""
    CPU_ARTIFACT_MISMATCH = "cpu-artifact-mismatch"
    """The CPU backend's artifact is not the package's wasm."""
    NO_CPU_BACKEND = "no-cpu-backend"
    """The package lists no CPU backend."""
    COMPATIBILITY_MISMATCH = "compatibility-mismatch"
    """The compatibility file names another model or size."""
    INVALID_MANIFEST = "invalid-manifest"
    """The selected manifest is neither a chunk list nor a package."""
    WASM_NAME_MISMATCH = "wasm-name-mismatch"
    """The selected module is not the package's wasm file."""
    WASM_SIZE_MISMATCH = "wasm-size-mismatch"
    """The selected module's size differs from the package."""
    WASM_SHA256_MISMATCH = "wasm-sha256-mismatch"
    """The selected module's SHA-256 differs from the package."""
    VALIDATION_NOT_ALLOWED = "validation-not-allowed"
    """Validation was asked of a model without evaluation."""
    NOT_SHADER_ARCHIVE = "not-shader-archive"
    """The selected WGSL file is not the package's archive."""
    MODEL_ID_MISMATCH = "model-id-mismatch"
    """The loaded module is another model than the package says."""
    WEIGHT_SIZE_MISMATCH = "weight-size-mismatch"
    """The module's initial weights differ in size from the package."""
    WORK_SOURCE_MISMATCH = "work-source-mismatch"
    """The module's work source differs from the package's."""
    AUXILIARY_WEIGHTS_MISMATCH = "auxiliary-weights-mismatch"
    """The module's auxiliary slots differ from the package's."""
    AUXILIARY_FILES_DIFFER = "auxiliary-files-differ"
    """A continued job's auxiliary files differ from those recorded."""


class ModelInfoReason(str, Enum):
    """Why model info, or settings checked against it, were refused (the error keeps the string)."""

    INVALID_WORK_SOURCE = "invalid-work-source"
    """workSource is malformed."""
    INVALID_AUXILIARY_WEIGHTS = "invalid-auxiliary-weights"
    """auxiliaryWeights is malformed."""
    INVALID_AGGREGATION_INFO = "invalid-aggregation-info"
    """aggregation is malformed, or its ranges do not fit the weights."""
    INVALID_MODEL_INFO = "invalid-model-info"
    """modelInfo is malformed."""
    UNSUPPORTED_ABI = "unsupported-abi"
    """The module speaks another ABI version."""
    UNSUPPORTED_WEIGHT_FORMAT = "unsupported-weight-format"
    """The weights are not float32 little-endian."""
    INVALID_WEIGHT_SIZE = "invalid-weight-size"
    """The weights are not a whole number of float32 values."""
    AUXILIARY_SIZE_MISMATCH = "auxiliary-size-mismatch"
    """An auxiliary weights file's size or alignment is wrong."""
    OVER_TASK_MEMORY = "over-task-memory"
    """The weights and auxiliary slots that every task loads exceed a module's 1 GiB of memory."""
    METHOD_NOT_ALLOWED = "method-not-allowed"
    """The settings name an aggregation method the model does not allow."""
    NOT_EXPERIENCE = "not-experience"
    """Experience settings for a dataset model (or the reverse)."""
    OUT_OF_RANGE = "out-of-range"
    """unitsPerAssignment is outside the model's range."""


class CheckpointError(WeeiError):
    """A .weei-checkpoint file failed a check when read (or could not be written)."""


class ModelError(WeeiError):
    """The model module was refused, or one of its operations failed."""


class AggregationError(WeeiError):
    """A round could not be aggregated (for example a non-finite result)."""
