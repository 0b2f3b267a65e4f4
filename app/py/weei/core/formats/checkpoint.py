"""The .weei-checkpoint file: one writer, one reader, every check of the spec.

Layout (docs/checkpoint-format.md has the full description)::

    u32 LE  metadata length M (at most 1 MiB)
    M bytes UTF-8 JSON metadata (JSON.stringify of CheckpointMetadata)
    W bytes weights, float32-le, W = metadata.checkpoint.bytes
    S bytes version 2 only: aggregation state, float32-le,
            S = metadata.aggregationState.bytes = c W, c the method's state copies
            (weei.core.aggregation.methods: 1 for FedAvgM, 2 for FedAdam)

Nothing may follow the last part. The reader checks lengths before every
slice, so any truncated or corrupted file gives a CheckpointError with a
reason code, never another exception. The metadata is kept as the validated
JSON dict (:class:`CheckpointMetadata` adds typed accessors), so fields this
version does not know survive a read and a write.
"""

from __future__ import annotations

import copy
import hashlib
import struct
from dataclasses import dataclass
from typing import Any, Callable, Mapping, NoReturn

from .. import _check
from ..errors import CheckpointError, ManifestError, SettingsError, WeeiError, CheckpointReason
from ..floats import first_non_finite
from .jsonfmt import stringify
from ..aggregation.methods import METHODS
from ..privacy.dp_accountant import DpLedger
from ..limits import MAX_FILE_BYTES
from .modelinfo import ModelInfo, check_weight_size
from .seeds import parse_retry
from .settings import TrainingSettings

__all__ = [
    "Checkpoint",
    "CheckpointMetadata",
    "checkpoint_file_name",
    "checkpoint_summary",
    "read_checkpoint",
    "describe",
    "write_checkpoint",
    "prepare_checkpoint",
    "CheckpointFile",
    "MAX_CHECKPOINT_FILE_BYTES",
    "MAX_METADATA_BYTES",
]

#: "Weei accepts checkpoint and module files of up to 256 MB" (see weei.core.limits).
MAX_CHECKPOINT_FILE_BYTES = MAX_FILE_BYTES
#: "The metadata length ... is at most 1 MiB".
MAX_METADATA_BYTES = 1024 * 1024


def _fail(reason: CheckpointReason, path: str) -> _check.Fail:
    def fail(message: str) -> NoReturn:
        raise CheckpointError(reason, f"checkpoint metadata {path}: {message}")

    return fail


def _field(obj: dict[str, Any], key: str, check: Callable[..., Any], path: str, reason: CheckpointReason = CheckpointReason.INVALID_METADATA,
           **options: Any) -> Any:
    """``obj[key]``, required and passed through the toolkit's ``check``; errors name ``path`` and ``reason``."""
    fail = _fail(reason, path)
    return check(_check.require(obj, key, fail), fail, **options)


def _string_list(value: Any, path: str) -> list[str]:
    items = _check.as_list(value, _fail(CheckpointReason.INVALID_METADATA, path))
    for item in items:
        _check.as_str(item, _fail(CheckpointReason.INVALID_METADATA, path), nonempty=False)
    dup = _check.first_duplicate(items)
    if dup is not None:
        raise CheckpointError(CheckpointReason.DUPLICATE_CHUNK_ID, f"checkpoint metadata {path}: {dup!r} is listed twice")
    return items


@dataclass(frozen=True)
class CheckpointMetadata:
    """Validated checkpoint metadata: the JSON dict plus typed accessors.

    Build it with :meth:`from_json` (which runs every metadata check). The
    dict is a private deep copy; :meth:`to_json` returns another copy.
    """

    _raw: dict[str, Any]
    model_info: ModelInfo
    settings: TrainingSettings

    @classmethod
    def from_json(cls, obj: Any) -> CheckpointMetadata:
        """Check metadata JSON (everything that needs no weight bytes).

        Takes: the parsed JSON object.
        Returns: the metadata. Raises: CheckpointError with a reason code.
        """
        if not isinstance(obj, dict):
            raise CheckpointError(CheckpointReason.INVALID_METADATA, "checkpoint metadata: must be a JSON object")
        _check.check_depth(obj, _fail(CheckpointReason.INVALID_METADATA, "document"))
        raw = copy.deepcopy(obj)
        return cls(raw, *_check_metadata(raw))

    def to_json(self) -> dict[str, Any]:
        """The metadata JSON (a deep copy)."""
        return copy.deepcopy(self._raw)

    @property
    def version(self) -> int:
        """1, or 2 when an aggregation state follows the weights."""
        return int(self._raw["version"])

    @property
    def round(self) -> int:
        """The round that produced the checkpoint, 0 for the initial weights."""
        return int(self._raw["round"])

    @property
    def job_id(self) -> str | None:
        """The job's ID."""
        return self._raw.get("jobId")

    @property
    def weight_bytes(self) -> int:
        """checkpoint.bytes."""
        return int(self._raw["checkpoint"]["bytes"])

    @property
    def weight_sha256(self) -> str:
        """checkpoint.sha256."""
        return str(self._raw["checkpoint"]["sha256"])

    @property
    def aggregation_state(self) -> dict[str, Any] | None:
        """aggregationState (method, step, bytes, sha256), or None in version 1."""
        state = self._raw.get("aggregationState")
        return None if state is None else dict(state)

    @property
    def remaining_chunk_ids(self) -> list[str] | None:
        """remainingChunkIds, if recorded."""
        value = self._raw.get("remainingChunkIds")
        return None if value is None else list(value)

    @property
    def trained_chunk_ids(self) -> list[str] | None:
        """trainedChunkIds, if recorded."""
        value = self._raw.get("trainedChunkIds")
        return None if value is None else list(value)

    @property
    def experience(self) -> dict[str, Any] | None:
        """experience: jobSeed, nextUnit and the ranges to retry (``retry``, when any), for experience jobs."""
        value = self._raw.get("experience")
        return None if value is None else dict(value)

    @property
    def dp_ledger(self) -> DpLedger:
        """The privacy spent up to this checkpoint (``privacy.dp``; none recorded: nothing spent)."""
        privacy = self._raw.get("privacy")
        return DpLedger.from_json(privacy["dp"]) if isinstance(privacy, dict) and "dp" in privacy else DpLedger()

    @property
    def auxiliary_weights(self) -> dict[str, str]:
        """SHA-256 of each auxiliary weights file, by slot id."""
        return dict(self._raw.get("auxiliaryWeights", {}))


def _check_metadata(raw: dict[str, Any]) -> tuple[ModelInfo, TrainingSettings]:
    """Every metadata check, on ``raw`` as it is (no copy): the model info and settings it holds.

    Raises: CheckpointError with a reason code.
    """
    version = raw.get("version")
    if not _check.is_integer(version) or version not in (1, 2):
        raise CheckpointError(CheckpointReason.UNSUPPORTED_VERSION, f"checkpoint metadata version: must be 1 or 2, not {version!r}")
    round_ = raw.get("round")
    if not _check.is_integer(round_) or round_ < 0:
        raise CheckpointError(CheckpointReason.INVALID_ROUND, f"checkpoint metadata round: must be a whole number 0 or more, not {round_!r}")
    ck = _field(raw, "checkpoint", _check.as_object, "checkpoint")
    if ck.get("format") != "float32-le":
        raise CheckpointError(CheckpointReason.UNSUPPORTED_WEIGHT_FORMAT, f"checkpoint metadata checkpoint.format: must be 'float32-le', not {ck.get('format')!r}")
    size = _field(ck, "bytes", _check.as_int, "checkpoint.bytes", minimum=4)
    if size % 4:
        raise CheckpointError(CheckpointReason.INVALID_METADATA, f"checkpoint metadata checkpoint.bytes: {size} is not a whole number of float32 values")
    _field(ck, "sha256", _check.as_sha256, "checkpoint.sha256")
    if ck.get("kind", "checkpoint") != "checkpoint":
        raise CheckpointError(CheckpointReason.INVALID_METADATA, f"checkpoint metadata checkpoint.kind: must be 'checkpoint', not {ck.get('kind')!r}")
    if "round" in ck and ck["round"] != round_:
        raise CheckpointError(CheckpointReason.INVALID_ROUND, f"checkpoint metadata checkpoint.round {ck['round']!r} differs from round {round_}")
    if "jobId" in raw:
        _check.as_str(raw["jobId"], _fail(CheckpointReason.INVALID_METADATA, "jobId"))
    if "incomplete" in raw:
        _check.as_bool(raw["incomplete"], _fail(CheckpointReason.INVALID_METADATA, "incomplete"))

    state = raw.get("aggregationState")
    if version == 1 and state is not None:
        raise CheckpointError(CheckpointReason.UNEXPECTED_AGGREGATION_STATE, "checkpoint metadata aggregationState: version 1 has no aggregation state")
    if version == 2:
        if state is None:
            raise CheckpointError(CheckpointReason.MISSING_AGGREGATION_STATE, "checkpoint metadata aggregationState: version 2 needs it")
        state = _check.as_object(state, _fail(CheckpointReason.INVALID_AGGREGATION_STATE, "aggregationState"))
        method = state.get("method")
        row = METHODS.get(method) if isinstance(method, str) else None
        if row is None or not row.state_copies:
            stateful = ", ".join(m.name for m in METHODS.values() if m.state_copies)
            raise CheckpointError(CheckpointReason.INVALID_AGGREGATION_STATE, f"checkpoint metadata aggregationState.method: must be one of {stateful}, not {method!r}")
        _field(state, "step", _check.as_int, "aggregationState.step", CheckpointReason.INVALID_AGGREGATION_STATE, minimum=1)
        state_bytes = _field(state, "bytes", _check.as_int, "aggregationState.bytes", CheckpointReason.INVALID_AGGREGATION_STATE, minimum=0)
        if state_bytes != row.state_copies * size:
            raise CheckpointError(
                CheckpointReason.STATE_SIZE_MISMATCH,
                f"checkpoint metadata aggregationState.bytes: {state_bytes}, {method} needs {row.state_copies} x {size}",
            )
        _field(state, "sha256", _check.as_sha256, "aggregationState.sha256", CheckpointReason.INVALID_AGGREGATION_STATE)

    try:
        info = ModelInfo.from_json(_check.require(raw, "modelInfo", _fail(CheckpointReason.INVALID_MODEL_INFO, "modelInfo")))
        check_weight_size(info, size)
    except ManifestError as exc:
        raise CheckpointError(CheckpointReason.INVALID_MODEL_INFO, f"checkpoint metadata modelInfo: {exc}") from exc
    try:
        settings = TrainingSettings.from_json(_check.require(raw, "settings", _fail(CheckpointReason.INVALID_SETTINGS, "settings")))
    except SettingsError as exc:
        raise CheckpointError(CheckpointReason.INVALID_SETTINGS, f"checkpoint metadata {exc}") from exc
    _check_metrics(_check.require(raw, "metrics", _fail(CheckpointReason.INVALID_METRICS, "metrics")))
    _check_progress(raw)
    return info, settings


def _check_metrics(value: Any) -> None:
    metrics = _check.as_object(value, _fail(CheckpointReason.INVALID_METRICS, "metrics"))
    values = _field(metrics, "values", _check.as_object, "metrics.values", CheckpointReason.INVALID_METRICS)
    for key, number in values.items():
        _check.as_number(number, _fail(CheckpointReason.INVALID_METRICS, f"metrics.values.{key}"))
    _field(metrics, "examplesProcessed", _check.as_int, "metrics.examplesProcessed", CheckpointReason.INVALID_METRICS, minimum=0)


def _check_progress(raw: dict[str, Any]) -> None:
    has_trained, has_remaining = "trainedChunkIds" in raw, "remainingChunkIds" in raw
    if has_trained != has_remaining:
        raise CheckpointError(CheckpointReason.CHUNK_IDS_UNPAIRED, "checkpoint metadata: trainedChunkIds and remainingChunkIds come together")
    remaining: set[str] = set()
    if has_trained:
        trained = set(_string_list(raw["trainedChunkIds"], "trainedChunkIds"))
        remaining = set(_string_list(raw["remainingChunkIds"], "remainingChunkIds"))
        overlap = sorted(trained & remaining)
        if overlap:
            raise CheckpointError(CheckpointReason.CHUNK_IDS_OVERLAP, f"checkpoint metadata: chunk {overlap[0]!r} is both trained and remaining")
    if "chunkOrder" in raw:
        _string_list(raw["chunkOrder"], "chunkOrder")
    if "remainingWorkItems" in raw:
        items = _check.as_object(raw["remainingWorkItems"], _fail(CheckpointReason.INVALID_METADATA, "remainingWorkItems"))
        for key, item in items.items():
            if key not in remaining:
                raise CheckpointError(CheckpointReason.WORK_ITEM_NOT_REMAINING, f"checkpoint metadata remainingWorkItems: {key!r} is not in remainingChunkIds")
            p = f"remainingWorkItems.{key}"
            item = _check.as_object(item, _fail(CheckpointReason.INVALID_METADATA, p))
            _field(item, "partitionId", _check.as_str, f"{p}.partitionId")
            _field(item, "sourceChunkId", _check.as_str, f"{p}.sourceChunkId")
            _field(item, "recordStart", _check.as_int, f"{p}.recordStart", minimum=0)
            _field(item, "recordCount", _check.as_int, f"{p}.recordCount", minimum=1)
    if "experience" in raw:
        exp = _check.as_object(raw["experience"], _fail(CheckpointReason.INVALID_METADATA, "experience"))
        seed = _field(exp, "jobSeed", _check.as_str, "experience.jobSeed")
        # At most 20 digits before int(): 2**64-1 has 20, and int() of a long
        # digit string is quadratic (Python refuses over 4300 digits).
        if (len(seed) > 20 or not seed.isdigit() or not seed.isascii() or int(seed) >= 2**64
                or (len(seed) > 1 and seed[0] == "0")):
            raise CheckpointError(CheckpointReason.INVALID_METADATA, "checkpoint metadata experience.jobSeed: must be an unsigned 64-bit decimal")
        next_unit = _field(exp, "nextUnit", _check.as_int, "experience.nextUnit", minimum=0)
        if "retry" in exp:
            try:
                parse_retry(exp["retry"], next_unit)
            except WeeiError as exc:
                raise CheckpointError(CheckpointReason.INVALID_METADATA, f"checkpoint metadata {exc.message}") from None
    if "privacy" in raw:
        privacy = _check.as_object(raw["privacy"], _fail(CheckpointReason.INVALID_METADATA, "privacy"))
        if "dp" in privacy:
            try:
                DpLedger.from_json(privacy["dp"])
            except ValueError as exc:
                raise CheckpointError(CheckpointReason.INVALID_METADATA, f"checkpoint metadata: {exc}") from None
    if "auxiliaryWeights" in raw:
        aux = _check.as_object(raw["auxiliaryWeights"], _fail(CheckpointReason.INVALID_METADATA, "auxiliaryWeights"))
        for key, sha in aux.items():
            _check.as_sha256(sha, _fail(CheckpointReason.INVALID_METADATA, f"auxiliaryWeights.{key}"))


@dataclass(frozen=True)
class Checkpoint:
    """A read checkpoint: metadata, weights and (version 2) the aggregation state."""

    metadata: CheckpointMetadata
    weights: bytes
    state: bytes | None


def _not_a_checkpoint(view: memoryview) -> str:
    """What to add to a header error when the file does not start as a checkpoint does (a u32 length, then
    the metadata's '{'): what it starts with, so a person sees which file they chose."""
    if view.nbytes > 4 and view[4] == ord("{"):
        return ""  # it looks like a checkpoint: damaged, not foreign
    head = bytes(view[:16])
    return f" (this is not a .weei-checkpoint file: it starts with {head!r}{'…' if view.nbytes > 16 else ''})"


def describe(meta: CheckpointMetadata) -> str:
    """'digits-mlp 1.0.0 round 12': the model and round a checkpoint holds, in a person's words."""
    info = meta.model_info
    return f"{info.id} {info.version} round {meta.round}"


def read_checkpoint(data: bytes | bytearray | memoryview) -> Checkpoint:
    """Read and check a .weei-checkpoint file.

    Takes: the whole file. Returns: the Checkpoint.
    Raises: CheckpointError; its reason names the failed check (see
    docs/checkpoint-format.md for the list).
    """
    view = memoryview(data).cast("B")
    total = view.nbytes
    if total > MAX_CHECKPOINT_FILE_BYTES:
        raise CheckpointError(CheckpointReason.FILE_TOO_LARGE, f"checkpoint: {total} bytes, at most {MAX_CHECKPOINT_FILE_BYTES} are accepted")
    if total < 4:
        raise CheckpointError(CheckpointReason.TRUNCATED_HEADER, f"checkpoint: {total} bytes, too short for the metadata length")
    (meta_len,) = struct.unpack_from("<I", view, 0)
    if meta_len > MAX_METADATA_BYTES:
        raise CheckpointError(CheckpointReason.METADATA_TOO_LARGE, f"checkpoint: metadata of {meta_len} bytes, at most "
                                                                   f"{MAX_METADATA_BYTES}{_not_a_checkpoint(view)}")
    if 4 + meta_len > total:
        raise CheckpointError(CheckpointReason.TRUNCATED_METADATA, f"checkpoint: metadata of {meta_len} bytes does not fit "
                                                                   f"the {total}-byte file"
                                                                   + (_not_a_checkpoint(view) or ": the file is cut short"))
    def not_json(message: str) -> NoReturn:
        raise CheckpointError(CheckpointReason.INVALID_METADATA_JSON, f"checkpoint metadata: {message}{_not_a_checkpoint(view)}")

    obj = _check.parse_json(view[4 : 4 + meta_len], not_json)
    meta = CheckpointMetadata.from_json(obj)

    start = 4 + meta_len
    size = meta.weight_bytes
    state_info = meta.aggregation_state
    state_size = 0 if state_info is None else int(state_info["bytes"])
    have = total - start
    if have < size:
        raise CheckpointError(CheckpointReason.WEIGHTS_LENGTH_MISMATCH, f"checkpoint: {have} bytes of weights, checkpoint.bytes "
                                                                        f"says {size}: the file of {describe(meta)} is cut "
                                                                        "short (a download or copy that did not finish?)")
    if meta.version == 1 and have != size:
        raise CheckpointError(CheckpointReason.WEIGHTS_LENGTH_MISMATCH, f"checkpoint: {have} bytes after the metadata, checkpoint.bytes says {size}")
    if meta.version == 2 and have - size != state_size:
        raise CheckpointError(CheckpointReason.STATE_LENGTH_MISMATCH, f"checkpoint: {have - size} bytes of state, aggregationState.bytes says {state_size}")
    weights = view[start : start + size]
    index = first_non_finite(weights)
    if index is not None:
        raise CheckpointError(CheckpointReason.WEIGHTS_NON_FINITE, f"checkpoint: weight {index} is not finite")
    if hashlib.sha256(weights).hexdigest() != meta.weight_sha256:
        raise CheckpointError(CheckpointReason.WEIGHTS_SHA256_MISMATCH, "checkpoint: the weights' SHA-256 differs from checkpoint.sha256")
    state = None
    if state_info is not None:
        state_view = view[start + size : start + size + state_size]
        index = first_non_finite(state_view)
        if index is not None:
            raise CheckpointError(CheckpointReason.STATE_NON_FINITE, f"checkpoint: aggregation state value {index} is not finite")
        if hashlib.sha256(state_view).hexdigest() != state_info["sha256"]:
            raise CheckpointError(CheckpointReason.STATE_SHA256_MISMATCH, "checkpoint: the state's SHA-256 differs from aggregationState.sha256")
        state = state_view.tobytes()
    return Checkpoint(meta, weights.tobytes(), state)


def write_checkpoint(
    metadata: CheckpointMetadata | dict[str, Any],
    weights: bytes | bytearray | memoryview,
    state: bytes | bytearray | memoryview | None = None,
    *,
    weights_sha256: str | None = None,
    finite_checked: bool = False,
) -> bytes:
    """Write a .weei-checkpoint file: :func:`prepare_checkpoint`, then its bytes at once."""
    return prepare_checkpoint(metadata, weights, state, weights_sha256=weights_sha256,
                              finite_checked=finite_checked).join()


# Stands for the state's SHA-256 while the metadata is checked: same length, so the checked text's size holds.
_STATE_SHA_PLACEHOLDER = "0" * 64


@dataclass(frozen=True)
class CheckpointFile:
    """A checkpoint file every check has passed, not yet joined into bytes (:func:`prepare_checkpoint`)."""

    metadata: dict[str, Any]  # complete but for aggregationState.sha256
    weights: bytes
    state: bytes | None

    def join(self) -> bytes:
        """The file's bytes: the state hashed, the metadata written, the parts joined (one copy of each)."""
        meta = self.metadata
        parts: tuple[bytes, ...] = (self.weights,)
        if self.state is not None:
            meta = {**meta, "aggregationState": {**meta["aggregationState"],
                                                 "sha256": hashlib.sha256(self.state).hexdigest()}}
            parts = (self.weights, self.state)
        # Same text JavaScript's JSON.stringify(metadata) gives, so files match.
        text = stringify(meta).encode("utf-8")
        return b"".join((struct.pack("<I", len(text)), text, *parts))


def prepare_checkpoint(
    metadata: CheckpointMetadata | dict[str, Any],
    weights: bytes | bytearray | memoryview,
    state: bytes | bytearray | memoryview | None = None,
    *,
    weights_sha256: str | None = None,
    finite_checked: bool = False,
) -> CheckpointFile:
    """Check a .weei-checkpoint file now; its bytes come from ``join()``, which cannot fail.

    Takes: the metadata (dict or CheckpointMetadata; ``checkpoint.bytes``/
    ``sha256``, ``version`` and ``aggregationState.bytes``/``sha256`` are
    filled in here; with ``state``, ``aggregationState.method`` and ``step``
    must be set), the weights and the optional aggregation state.
    Returns: the checked file (version 2 iff ``state`` is given), whose
    bytes :func:`read_checkpoint` accepts.
    Raises: CheckpointError with the reader's reason codes when the result
    would not pass its checks (non-finite values, invalid metadata...).
    A caller that already holds the weights' SHA-256 (``weights_sha256``) or
    has checked every value is finite (``finite_checked``, for example after
    aggregation) saves those passes over the weights. The state's SHA-256
    and the join (a copy of weights and state) wait for ``join()``: the
    coordinator sends the next round's work first.
    """
    # A shallow copy: only top-level keys, ``checkpoint`` and ``aggregationState`` (copied below) change.
    meta = metadata.to_json() if isinstance(metadata, CheckpointMetadata) else dict(metadata) \
        if isinstance(metadata, dict) else metadata
    if not isinstance(meta, dict):
        raise CheckpointError(CheckpointReason.INVALID_METADATA, "checkpoint metadata: must be a JSON object")
    w = weights if isinstance(weights, bytes) else memoryview(weights).cast("B").tobytes()
    # version first, as a reader skimming the file expects.
    meta = {"version": 1 if state is None else 2, **{k: v for k, v in meta.items() if k != "version"}}
    ck = dict(meta.get("checkpoint") or {})
    ck["bytes"] = len(w)
    ck["sha256"] = weights_sha256 if weights_sha256 is not None else hashlib.sha256(w).hexdigest()
    meta["checkpoint"] = ck
    parts = [w]
    s = None
    if state is None:
        meta.pop("aggregationState", None)
    else:
        s = state if isinstance(state, bytes) else memoryview(state).cast("B").tobytes()
        agg = dict(meta.get("aggregationState") or {})
        agg["bytes"] = len(s)
        agg["sha256"] = _STATE_SHA_PLACEHOLDER
        meta["aggregationState"] = agg
        parts.append(s)
    text = stringify(meta).encode("utf-8")
    # The writer never emits a file the reader refuses: run the reader's
    # checks on the metadata it wrote (lengths and hashes hold by
    # construction, so the weights are not hashed twice). The checks run on
    # the dict itself, not on a parse of ``text``: stringify refuses what
    # is not JSON, and NaN, which it writes as null, fails as_number either way.
    if len(text) > MAX_METADATA_BYTES:
        raise CheckpointError(CheckpointReason.METADATA_TOO_LARGE, f"checkpoint: metadata of {len(text)} bytes, at most {MAX_METADATA_BYTES}")
    _check.check_depth(meta, _fail(CheckpointReason.INVALID_METADATA, "document"))
    _check_metadata(meta)
    labels = (("weight", CheckpointReason.WEIGHTS_NON_FINITE), ("aggregation state value", CheckpointReason.STATE_NON_FINITE))
    for (what, reason), part in zip(labels, parts):
        if finite_checked:
            break
        index = first_non_finite(part)
        if index is not None:
            raise CheckpointError(reason, f"checkpoint: {what} {index} is not finite")
    total = 4 + len(text) + sum(len(p) for p in parts)
    if total > MAX_CHECKPOINT_FILE_BYTES:
        raise CheckpointError(CheckpointReason.FILE_TOO_LARGE, f"checkpoint: {total} bytes, at most {MAX_CHECKPOINT_FILE_BYTES} are accepted")
    return CheckpointFile(meta, w, s)


# ------------------------------------------------------------ what a checkpoint records


def checkpoint_file_name(model_id: str, round_: int) -> str:
    """The file name a checkpoint is saved and exported under."""
    return f"{model_id}-round-{round_:04d}.weei-checkpoint"


def checkpoint_summary(metadata: Mapping[str, Any], now: float, *,
                       dataset_progress: float | None = None) -> dict[str, Any]:
    """The CheckpointSummary (an entry of TrainingJob.checkpoints) of checkpointed ``metadata``.

    One builder for a checkpoint the coordinator just wrote and one read
    from a file (a continue's source): both list the same fields.
    ``dataset_progress`` is the share of the epoch trained, which only the
    running schedule knows.
    """
    ck = metadata["checkpoint"]
    round_ = metadata["round"]
    summary: dict[str, Any] = {
        "artifact": {"round": round_, "sha256": ck["sha256"], "bytes": ck["bytes"],
                     "fileName": ck.get("fileName") or checkpoint_file_name(metadata["modelInfo"]["id"], round_)},
        "metrics": copy.deepcopy(metadata["metrics"]),
        "remaining": list(metadata.get("remainingChunkIds") or []),
        "settings": copy.deepcopy(metadata["settings"]),
        "createdAt": now,
    }
    if "datasetEpoch" in metadata:
        summary["datasetEpoch"] = metadata["datasetEpoch"]
    if dataset_progress is not None:
        summary["datasetProgress"] = dataset_progress
    agg = metadata.get("aggregationState")
    if agg:
        summary["aggregation"] = {"method": agg["method"], "step": agg["step"], "bytes": agg["bytes"]}
    return summary
