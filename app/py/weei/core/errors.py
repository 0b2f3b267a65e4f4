"""The error types of Weei, and the reason codes each may carry.

Two kinds, kept apart on purpose (as in h11): ``UsageError`` means our caller
asked for something not allowed now; every other ``WeeiError`` means some
input (a file, a manifest, a peer's message) is bad. Each carries a stable
``reason`` code so callers and tests can tell problems apart without parsing
prose, and the message names the field or file at fault.

Reason codes are data: each error family lists its codes in a ``str`` enum
and its constructor takes only a member of that enum (a mistyped or
undeclared code fails when the error is built, not on a caller's screen).
The error keeps the member's string, so it compares, prints and crosses to
JavaScript exactly as the plain code did. The enums of the errors a caller
sees are tabled in docs/api.md, "Error reasons" (tests/unit/test_reason_codes.py
keeps both in step). Here: ``WeeiReason``, ``UsageReason``, ``SettingsReason``,
``ManifestReason``, ``ModelInfoReason``, ``CheckpointReason``,
``ModelReason``, ``AggregationReason``; beside their errors: ``FrameReason``
(``wire.framing.frames``), ``MessageReason`` (``wire.messages``),
``DiagnosticsReason`` (``observe.diagnostics.records``), ``StorageReason``
(``api.ports``), ``GpuReason`` (``gpu.errors``), ``OnnxReason``
(``onnx.errors``), ``Reason`` (``server.signaling_rules``).
"""

from __future__ import annotations

from enum import Enum
from typing import ClassVar, TypeVar

__all__ = [
    "WeeiError",
    "WeeiReason",
    "UsageError",
    "UsageReason",
    "SettingsError",
    "SettingsReason",
    "ManifestError",
    "ManifestReason",
    "ModelInfoReason",
    "CheckpointError",
    "CheckpointReason",
    "ModelError",
    "ModelReason",
    "AggregationError",
    "AggregationReason",
    "member_of",
]

E = TypeVar("E", bound=Enum)


class WeeiReason(str, Enum):
    """Codes of the errors raised as a plain ``WeeiError`` (no narrower family fits)."""

    BAD_SEED = "bad-seed"
    """A stored seed is not a canonical u64 decimal string."""
    BAD_EXPERIENCE = "bad-experience"
    """A stored experience queue is malformed."""
    MISSING_ARTIFACT = "missing-artifact"
    """A file the job names is not in this browser."""
    HASH_MISMATCH = "hash-mismatch"
    """Bytes do not match the SHA-256 they are held under."""
    WORKER_START_FAILED = "worker-start-failed"
    """A training Worker could not start its Python."""
    INTERNAL_ERROR = "internal-error"
    """A bug: the message names the Python exception."""
    WORKER_FAILED = "worker-failed"
    """A training Worker failed without a reason."""
    CANCELLED = "cancelled"
    """A Worker task was cancelled before it finished."""


def member_of(families: tuple[type[E], ...], code: str) -> E | None:
    """The member of ``families`` whose value is ``code`` (a code read back from a Worker or a peer), or None."""
    for family in families:
        try:
            return family(code)
        except ValueError:
            pass
    return None


class WeeiError(Exception):
    """Base of every Weei error: ``reason`` is a short kebab-case code.

    ``reasons`` is the family's enum (or enums); the constructor refuses
    anything else with ``TypeError``, so a raw string never becomes a code.
    """

    reasons: ClassVar[tuple[type[Enum], ...]] = (WeeiReason,)

    def __init__(self, reason: Enum, message: str) -> None:
        if not isinstance(reason, self.reasons):
            allowed = ", ".join(family.__name__ for family in self.reasons)
            raise TypeError(f"{type(self).__name__} takes a reason of {allowed}, not {reason!r}")
        super().__init__(message)
        self.reason: str = reason.value
        self.message = message

    def __str__(self) -> str:
        return f"{self.message} [{self.reason}]"


class UsageReason(str, Enum):
    """Why a caller's request was refused: not allowed now, or a bad argument."""

    INVALID_ARGUMENT = "invalid-argument"
    """An argument is missing, of the wrong type or out of range (the message names it)."""
    INVALID_REQUEST = "invalid-request"
    """A Worker request lacks a field or has one of the wrong type."""
    UNKNOWN_METHOD = "unknown-method"
    """The page's Python was asked for a method it does not have."""
    UNKNOWN_OP = "unknown-op"
    """A training Worker was asked for an operation it does not know."""
    NO_JOB = "no-job"
    """There is no job (or none this command applies to)."""
    UNKNOWN_JOB = "unknown-job"
    """No saved job has this id."""
    JOB_ACTIVE = "job-active"
    """A job is active and not completed."""
    JOB_COMPLETED = "job-completed"
    """The job is completed."""
    BUSY = "busy"
    """Another job is being prepared."""
    NOT_COORDINATOR = "not-coordinator"
    """Only the coordinator may do this."""
    NO_INVITATION = "no-invitation"
    """No pending invitation has this job id, or it was withdrawn meanwhile."""
    ROOM_PROOF_MISMATCH = "room-proof-mismatch"
    """The coordinator's room proof does not verify."""
    ROOM_PROOF_MISSING = "room-proof-missing"
    """The coordinator holds no room key."""
    ROOM_PROOF_TIMEOUT = "room-proof-timeout"
    """The coordinator did not prove the room key within 30 s."""
    PEER_NOT_CONNECTED = "peer-not-connected"
    """The peer is not in `state.peers`."""
    INVITE_SELF = "invite-self"
    """The coordinator invited itself."""
    ALREADY_PARTICIPATING = "already-participating"
    """The peer already takes part in the job."""
    ALREADY_RUNNING = "already-running"
    """The job is already running."""
    NOT_RUNNING = "not-running"
    """The job is not running."""
    NOT_PAUSED = "not-paused"
    """The job is not paused."""
    NOT_PARTICIPATING = "not-participating"
    """This device takes part in no job."""
    NOT_A_DATASET_JOB = "not-a-dataset-job"
    """An experience job has no chunks to shuffle."""
    NO_CHECKPOINT = "no-checkpoint"
    """There is no checkpoint yet."""
    VALIDATION_UNAVAILABLE = "validation-unavailable"
    """The validation file is not in this browser's storage."""
    NO_VALIDATION_FILE = "no-validation-file"
    """The job has no validation file."""
    NO_EVALUATION = "no-evaluation"
    """The model does not declare the evaluation capability."""
    NOT_TRYABLE = "not-tryable"
    """tryCheckpoint: the model reads no data format with a try-it view (weei-digits-v1, weei-bytes-v1)."""
    BAD_DATASET_MODE = "bad-dataset-mode"
    """`datasetMode` is not `'new'` or `'resume'`."""
    BAD_WORKER_COUNT = "bad-worker-count"
    """The local Worker count is not a whole number from 1 to 64."""
    BAD_GPU_BUDGET = "bad-gpu-budget"
    """The GPU memory budget is not a whole number of MiB from 0."""
    BAD_BACKEND = "bad-backend"
    """The backend preference is not `auto`, `cpu`, `gpu` or `hybrid`."""
    WRONG_WEIGHT_SIZE = "wrong-weight-size"
    """The initial weights' size differs from the model's."""
    MISSING_JOB_SEED = "missing-job-seed"
    """An experience job was planned without a job seed."""
    NO_CHUNKS = "no-chunks"
    """A dataset job was planned without chunks."""
    BAD_SEED = "bad-seed"
    """A seed is not an integer from 0 to 2**64-1."""
    BAD_ROUND = "bad-round"
    """A checkpoint round is negative or not an integer."""
    BAD_SPLIT = "bad-split"
    """A Worker split count is not an integer of at least 1."""
    NO_MODEL = "no-model"
    """A Worker was asked to train before `loadModel`."""
    INSTANCE_BROKEN = "instance-broken"
    """The model instance trapped or failed before and is unusable."""
    MODEL_NOT_LOADED = "model-not-loaded"
    """A model operation before `load_model`."""
    AUXILIARY_NOT_LOADED = "auxiliary-not-loaded"
    """The model declares auxiliary weights and none were loaded."""
    REENTRANT_CALL = "reentrant-call"
    """A model operation was called while another runs."""
    NO_GPU_OPERATIONS = "no-gpu-operations"
    """The module does not export `gpuBegin`/`gpuNext`/`gpuEnd`."""
    AUXILIARY_FILES_DIFFER = "auxiliary-files-differ"
    """Continuing from a checkpoint with other auxiliary weights files than it records."""
    BAD_DIAGNOSTICS = "bad-diagnostics"
    """A value given to the diagnostics recorder is not a valid field (the message names it)."""
    ILLEGAL_TRANSITION = "illegal-transition"
    """A state machine was asked for a move its table does not list."""
    UNSUPPORTED_JSON_KEY = "unsupported-json-key"
    """A JSON object key is not a string."""
    UNSUPPORTED_JSON_TYPE = "unsupported-json-type"
    """A value cannot be written as JSON."""
    HASH_MISMATCH = "hash-mismatch"
    """Bytes do not match the SHA-256 they were given under."""
    BAD_VALUE = "bad-value"
    """Storage was given a value it cannot store."""
    BAD_STORE = "bad-store"
    """A storage store name is not one of the allowed names."""
    BAD_KEY = "bad-key"
    """A storage key is not a string of 1 to 200 characters."""
    BAD_TIME = "bad-time"
    """A time is not finite milliseconds since the epoch."""
    BAD_EVENT = "bad-event"
    """A debug-log event name is empty or not a string."""
    BAD_DURATION = "bad-duration"
    """A phase ends before it starts, or lasts a non-finite time."""
    PHASE_RUNNING = "phase-running"
    """A phase was started twice."""
    PHASE_NOT_RUNNING = "phase-not-running"
    """A phase was ended that was not started."""
    BAD_PHASE = "bad-phase"
    """A phase name is not a string of 1 to 200 characters."""
    BAD_TRANSFER_ID = "bad-transfer-id"
    """A transfer id is outside 1..2**32-1."""
    BAD_FRAME_FIELD = "bad-frame-field"
    """A frame field cannot be encoded (kind, hash or size)."""
    BAD_FRAME_SIZE = "bad-frame-size"
    """`max_frame_bytes` of a frame writer is out of range."""
    BAD_LIMIT = "bad-limit"
    """A frame reader limit is out of range."""
    BAD_WATERMARKS = "bad-watermarks"
    """The writer's buffer watermarks are not 0 <= low < high <= 8 MiB."""
    TOO_MANY_ATTACHMENTS = "too-many-attachments"
    """A message names more artifacts than a frame may carry."""
    MESSAGE_TOO_LARGE = "message-too-large"
    """A message's JSON is over the wire limit."""
    TRANSFER_IDS_EXHAUSTED = "transfer-ids-exhausted"
    """A channel has used every transfer id."""
    ATTACHMENT_SIZE = "attachment-size"
    """An attachment's size differs from its reference."""
    UNREFERENCED_ATTACHMENT = "unreferenced-attachment"
    """An attachment is not named by its message."""
    ALREADY_CONNECTED = "already-connected"
    """The signaling client is connected already."""
    NOT_CONNECTED = "not-connected"
    """The signaling client is not connected."""
    BAD_SHA256 = "bad-sha256"
    """`--accept-model` is not 64 hex digits."""
    BAD_PEER_ID = "bad-peer-id"
    """`--accept-coordinator` is not a 26-character base32 peer ID."""
    BAD_INVITE = "bad-invite"
    """The text is neither a room key nor an invite link."""
    INVALID_ORIGIN = "invalid-origin"
    """An allowed origin is not of the form `https://example.org`."""
    INVALID_SIGNALING_SECRET = "invalid-signaling-secret"
    """The signaling secret is shorter than 16 bytes (or unreadable)."""
    INVALID_ICE_SERVER = "invalid-ice-server"
    """An ICE server option cannot be read."""
    INVALID_SIGNALING_CONFIG = "invalid-signaling-config"
    """The signaling configuration is inconsistent (for example a path without `/`)."""
    INVALID_SIGNALING_LIMITS = "invalid-signaling-limits"
    """A `--signal-limit` is not `NAME=VALUE` with a known name and a valid value."""
    INVALID_HTTP_LIMITS = "invalid-http-limits"
    """An HTTP limit is not positive."""
    BAD_MANIFEST = "bad-manifest"
    """A package's `manifest.json` cannot be read."""
    NO_MANIFEST = "no-manifest"
    """The folder is not a model package (no `manifest.json` and `model.wasm`)."""
    MISSING_DATA_FILE = "missing-data-file"
    """A file the dataset manifest lists is missing."""
    BAD_SETTINGS_FILE = "bad-settings-file"
    """A settings file is too large, not JSON or not an object."""
    NO_RECORDS = "no-records"
    """A records file holds no records."""
    BAD_RECORD = "bad-record"
    """A record is malformed (no features, no label, wrong width)."""
    BAD_CHUNK_COUNT = "bad-chunk-count"
    """The chunk or validation counts leave no training records."""
    OUTPUT_NOT_EMPTY = "output-not-empty"
    """The output folder holds chunks already."""


class UsageError(WeeiError):
    """The caller asked for something not allowed in the current role or state."""

    reasons = (UsageReason,)


class SettingsReason(str, Enum):
    """Why training or aggregation settings were refused."""

    INVALID_SETTING = "invalid-setting"
    """A setting is of the wrong type or not allowed (the message names `settings.<field>`)."""
    OUT_OF_RANGE = "out-of-range"
    """A setting is outside its range."""
    MISSING_SETTING = "missing-setting"
    """A required setting is missing."""
    UNKNOWN_SETTING = "unknown-setting"
    """A key is not a setting (or not an option of `aggregation`)."""
    OPTION_NOT_FOR_METHOD = "option-not-for-method"
    """An aggregation option belongs to another method, or needs another option."""
    METHOD_NOT_ALLOWED = "method-not-allowed"
    """The model's `aggregation.methods` does not allow the method."""
    CONFLICTING_SETTING = "conflicting-setting"
    """Two settings contradict each other."""
    NOT_EXPERIENCE = "not-experience"
    """Experience settings for a dataset model, or an experience figure asked of one."""
    EPOCHS_NOT_ABOVE_CHECKPOINT = "epochs-not-above-checkpoint"
    """Continuing from a checkpoint with `epochs` not above the checkpoint's epoch."""


class SettingsError(WeeiError):
    """Training or aggregation settings are invalid; ``field`` names the culprit."""

    reasons = (SettingsReason,)

    def __init__(self, field: str, message: str, reason: SettingsReason = SettingsReason.INVALID_SETTING) -> None:
        super().__init__(reason, f"settings.{field}: {message}")
        self.field = field


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
    ARCHIVE_SIZE_MISMATCH = "archive-size-mismatch"
    """An ``executionFiles`` entry has the shader archive's name but another size."""
    ARCHIVE_HASH_MISMATCH = "archive-hash-mismatch"
    """An ``executionFiles`` entry has the shader archive's name but another SHA-256."""
    ARCHIVE_MALFORMED = "archive-malformed"
    """The shader archive is not a well-formed WGSL archive (docs/gpu.md)."""
    ARCHIVE_FORMAT = "archive-format"
    """The shader archive is of another format or version."""
    MODULE_DUPLICATE = "module-duplicate"
    """Two modules of the shader archive share a name."""
    MODULE_HASH_MISMATCH = "module-hash-mismatch"
    """A module of the shader archive does not match its SHA-256."""
    MODULE_ENTRY_POINT_MISSING = "module-entry-point-missing"
    """A module of the shader archive lacks an entry point its index names."""
    INVALID_JSON = "invalid-json"
    """The selected manifest is not JSON."""
    FILE_TOO_LARGE = "file-too-large"
    """A selected file is over its size limit."""
    EXAMPLE_COUNT_MISMATCH = "example-count-mismatch"
    """A chunk holds another number of examples than the manifest says."""


class ModelInfoReason(str, Enum):
    """Why a model's info was refused (settings checked against it are a ``SettingsError``)."""

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


class ManifestError(WeeiError):
    """A dataset manifest, model package manifest or model info is invalid."""

    reasons = (ManifestReason, ModelInfoReason)


class CheckpointReason(str, Enum):
    """Why a .weei-checkpoint file (or a stored one) was refused."""

    FILE_TOO_LARGE = "file-too-large"
    """The checkpoint file is over 256 MB."""
    NO_CHECKPOINT = "no-checkpoint"
    """A saved job has no stored checkpoint."""
    TRUNCATED_HEADER = "truncated-header"
    """The file is too short for the metadata length."""
    METADATA_TOO_LARGE = "metadata-too-large"
    """The metadata is over 1 MiB."""
    TRUNCATED_METADATA = "truncated-metadata"
    """The metadata does not fit in the file."""
    INVALID_METADATA_JSON = "invalid-metadata-json"
    """The metadata is not JSON."""
    INVALID_METADATA = "invalid-metadata"
    """A metadata field is missing or malformed (the message names it)."""
    UNSUPPORTED_VERSION = "unsupported-version"
    """The metadata version is not 1 or 2."""
    INVALID_ROUND = "invalid-round"
    """The round is not a whole number of 0 or more, or disagrees with the queue."""
    UNSUPPORTED_WEIGHT_FORMAT = "unsupported-weight-format"
    """The weights are not float32 little-endian."""
    WEIGHTS_LENGTH_MISMATCH = "weights-length-mismatch"
    """The weights' length differs from `checkpoint.bytes`."""
    WEIGHTS_NON_FINITE = "weights-non-finite"
    """A weight is NaN or infinite."""
    WEIGHTS_SHA256_MISMATCH = "weights-sha256-mismatch"
    """The weights' SHA-256 differs from the metadata."""
    UNEXPECTED_AGGREGATION_STATE = "unexpected-aggregation-state"
    """A version 1 checkpoint has an aggregation state."""
    MISSING_AGGREGATION_STATE = "missing-aggregation-state"
    """A version 2 checkpoint has no aggregation state."""
    INVALID_AGGREGATION_STATE = "invalid-aggregation-state"
    """The aggregation state names a method without state."""
    STATE_SIZE_MISMATCH = "state-size-mismatch"
    """The aggregation state's size is not the method's."""
    STATE_LENGTH_MISMATCH = "state-length-mismatch"
    """The state's length differs from `aggregationState.bytes`."""
    STATE_NON_FINITE = "state-non-finite"
    """An aggregation state value is NaN or infinite."""
    STATE_SHA256_MISMATCH = "state-sha256-mismatch"
    """The state's SHA-256 differs from the metadata."""
    INVALID_MODEL_INFO = "invalid-model-info"
    """The recorded model info is malformed."""
    OTHER_MODEL = "checkpoint-of-another-model"
    """The checkpoint's weights do not load into the chosen model: it was written by another model (or
    another version of it); the message names the checkpoint's model and round."""
    INVALID_SETTINGS = "invalid-settings"
    """The recorded settings are malformed."""
    INVALID_METRICS = "invalid-metrics"
    """The recorded metrics are malformed."""
    DUPLICATE_CHUNK_ID = "duplicate-chunk-id"
    """A chunk id is listed twice."""
    CHUNK_IDS_UNPAIRED = "chunk-ids-unpaired"
    """Only one of trainedChunkIds and remainingChunkIds is present."""
    CHUNK_IDS_OVERLAP = "chunk-ids-overlap"
    """A chunk is both trained and remaining."""
    WORK_ITEM_NOT_REMAINING = "work-item-not-remaining"
    """remainingWorkItems names a chunk that is not remaining."""


class CheckpointError(WeeiError):
    """A .weei-checkpoint file failed a check when read (or could not be written)."""

    reasons = (CheckpointReason,)


class ModelReason(str, Enum):
    """Why the model module was refused, or one of its operations failed."""

    INVALID_MODULE = "invalid-module"
    """The file is not a valid WebAssembly module, or not one this host runs."""
    FORBIDDEN_IMPORT = "forbidden-import"
    """The module imports something other than the allowed host functions."""
    MISSING_EXPORT = "missing-export"
    """The module lacks an export the ABI needs."""
    BAD_EXPORT = "bad-export"
    """An export has the wrong kind or signature."""
    INSTANTIATE_FAILED = "instantiate-failed"
    """Instantiating the module failed."""
    UNSUPPORTED_ABI = "unsupported-abi"
    """The module speaks another ABI version."""
    TRAP = "trap"
    """The module trapped."""
    INVALID_RESULT = "invalid-result"
    """An export returned a value outside its contract."""
    MALFORMED_RESULT = "malformed-result"
    """A result JSON is not what the ABI says."""
    OPERATION_FAILED = "operation-failed"
    """The model reported an error."""
    NON_FINITE_METRIC = "non-finite-metric"
    """A metric is NaN or infinite."""
    PROGRESS_INVALID = "progress-invalid"
    """A progress report is malformed or outside an operation."""
    WEIGHT_SIZE_MISMATCH = "weight-size-mismatch"
    """An operation returned weights of another size."""
    INSTANCE_BROKEN = "instance-broken"
    """The instance failed before and is unusable."""
    ALLOC_FAILED = "alloc-failed"
    """The module's `alloc` returned 0 (out of memory)."""
    REGION_OUT_OF_BOUNDS = "region-out-of-bounds"
    """An `alloc`ed region lies outside the module's memory."""
    RESULT_TOO_LARGE = "result-too-large"
    """A result is over its byte limit."""
    MEMORY_OVER_LIMIT = "memory-over-limit"
    """The task needs more module memory than allowed (1 GiB in a browser)."""
    DEADLINE_EXCEEDED = "deadline-exceeded"
    """An operation ran past its deadline and was stopped."""
    CANCELLED = "cancelled"
    """The operation was interrupted because its task was cancelled."""
    NO_UNITS_COMPLETED = "no-units-completed"
    """A training call completed no unit."""


class ModelError(WeeiError):
    """The model module was refused, or one of its operations failed."""

    reasons = (ModelReason,)


class AggregationReason(str, Enum):
    """Why a round could not be aggregated."""

    EMPTY_AVERAGE = "empty-average"
    """No contributions to average."""
    INVALID_COUNT = "invalid-count"
    """A contribution's count is not positive, or the total is over 2**53."""
    INVALID_CONTRIBUTION = "invalid-contribution"
    """A contribution's weights have the wrong length."""
    DUPLICATE_CONTRIBUTION = "duplicate-contribution"
    """An assignment contributed twice."""
    INVALID_STATE = "invalid-state"
    """The method's state has the wrong size."""
    NON_FINITE_RESULT = "non-finite-result"
    """The aggregate (or the new state) is not finite; the previous checkpoint stays."""
    UNKNOWN_COMBINE = "unknown-combine"
    """`combine` is not mean, trimmedMean or median."""
    NON_FINITE_NORM = "non-finite-norm"
    """A contribution's delta norm is not finite."""


class AggregationError(WeeiError):
    """A round could not be aggregated (for example a non-finite result)."""

    reasons = (AggregationReason,)
