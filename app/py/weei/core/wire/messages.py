"""Wire messages between a coordinator and its participants.

Every message is a frozen dataclass with ``to_json``/``from_json``; bulk
bytes never travel inside a message. A message names its artifacts by
SHA-256 (``ArtifactRef``) and the transport delivers those bytes beside it,
verified against the hash, so the same messages work in memory, over WebRTC
and through the agent.

Messages from a peer are untrusted: ``decode_message`` turns any JSON value
into a message or raises ``MessageError`` naming what is wrong; nothing
malformed reaches the state machines.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import Enum
from functools import lru_cache
from typing import Any, ClassVar

from .._check import Where, as_bool, as_choice, as_int, as_list, as_number, as_object, as_sha256, as_str, first_duplicate
from ..errors import WeeiError
from ..limits import MAX_FILE_BYTES, MAX_METRIC_ID_CHARS, MAX_METRICS, MAX_SHADER_ARCHIVE_BYTES
from ..formats.seeds import parse_seed
from ..observe.peer_names import MAX_NAME_CHARS, PeerCard, clean_name
from ..privacy import shamir
from ..privacy.secagg import (COMMITMENT_BYTES, SALT_BYTES, SEALED_SHARE_BYTES, AdvertiseKeys, Roster, ShareKeys,
                              SharesFor, Unmask, UnmaskShares)
from ..privacy.x25519 import KEY_BYTES

__all__ = [
    "MessageReason",
    "MessageError",
    "Direction",
    "ArtifactRef",
    "ChunkRef",
    "UnitRange",
    "Invitation",
    "InvitationDecision",
    "Deliver",
    "ModuleStatus",
    "Assign",
    "TrainingStarted",
    "Update",
    "AssignmentFailed",
    "ArtifactMissing",
    "UpdateReceipt",
    "PauseContribution",
    "Leave",
    "JobFinished",
    "DiagnosticsReport",
    "Progress",
    "CheckpointNote",
    "MAX_PIECES",
    "MAX_FORWARD",
    "Piece",
    "RelayPlan",
    "RelayPiece",
    "RelayDone",
    "RoomChallenge",
    "RoomProof",
    "Presence",
    "MAX_SECAGG_PEERS",
    "SecAggKeys",
    "SecAggRoster",
    "SecAggShares",
    "SecAggSharesFor",
    "SecAggMasked",
    "SecAggUnmask",
    "SecAggReveal",
    "Message",
    "check_gpu_offer",
    "decode_message",
    "encode_message",
]

# Bounded so a hostile peer cannot make us keep megabytes of "reason".
MAX_TEXT = 2000
MAX_AUXILIARY_SLOTS = 8


class MessageReason(str, Enum):
    """Why a peer's message was refused (the error keeps the string)."""

    NOT_AN_OBJECT = "not-an-object"
    """The message is not a JSON object."""
    UNKNOWN_TYPE = "unknown-type"
    """``type`` is missing or not a message this version knows."""
    BAD_FIELD = "bad-field"
    """A field is missing, of the wrong type, or out of its range."""
    NON_FINITE_METRIC = "non-finite-metric"
    """A metric of an update or a progress report is not a finite number."""


class Direction(str, Enum):
    """Which way a message travels."""

    TO_PARTICIPANT = "coordinator->participant"
    """Sent by the coordinator, handled by a participant."""
    TO_COORDINATOR = "participant->coordinator"
    """Sent by a participant, handled by the coordinator."""
    ANY_PEER = "peer->peer"
    """Sent by any peer to any other of the room, outside a job (its name and what it does)."""


class MessageError(WeeiError):
    """A peer sent a message that is not valid; ``reason`` says how."""

    reasons = (MessageReason,)


# A bad field fails as ``message.<field>: <problem>`` with reason bad-field.
_AT = Where(MessageError, MessageReason.BAD_FIELD, "message")


def _str(obj: Mapping[str, Any], key: str, *, optional: bool = False, limit: int = 256, at: Where = _AT) -> Any:
    value = obj.get(key)
    if value is None and optional:
        return None
    return as_str(value, at.at(key), max_chars=limit)


def _int(obj: Mapping[str, Any], key: str, *, optional: bool = False, minimum: int = 0, at: Where = _AT) -> Any:
    value = obj.get(key)
    if value is None and optional:
        return None
    return as_int(value, at.at(key), minimum)


def _sha(obj: Mapping[str, Any], key: str, at: Where = _AT) -> str:
    return as_sha256(obj.get(key), at.at(key))


def _bool(obj: Mapping[str, Any], key: str) -> bool:
    return as_bool(obj.get(key), _AT.at(key))


def _seed(obj: Mapping[str, Any], key: str, at: Where = _AT) -> int:
    try:
        return parse_seed(obj.get(key))
    except WeeiError:
        at.at(key)("must be an unsigned 64-bit decimal string")


def _obj(obj: Mapping[str, Any], key: str, *, optional: bool = False) -> Any:
    value = obj.get(key)
    if value is None and optional:
        return None
    return as_object(value, _AT.at(key))


def _auxiliary(obj: Mapping[str, Any]) -> dict[str, ArtifactRef]:
    aux = _obj(obj, "auxiliary", optional=True) or {}
    if len(aux) > MAX_AUXILIARY_SLOTS:
        _AT.at("auxiliary")(f"must have at most {MAX_AUXILIARY_SLOTS} slots")
    return {k: ArtifactRef.from_json(v, _AT.at("auxiliary").at(k)) for k, v in aux.items()}


def _metrics(obj: Mapping[str, Any], key: str) -> dict[str, float]:
    value = _obj(obj, key)
    where = _AT.at(key)
    if len(value) > MAX_METRICS:
        where(f"must have at most {MAX_METRICS} metrics")
    out: dict[str, float] = {}
    for name, v in value.items():
        if len(name) > MAX_METRIC_ID_CHARS:
            where(f"metric names must be at most {MAX_METRIC_ID_CHARS} characters")
        try:
            number = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan
        except OverflowError:  # a JSON integer too large for a float
            number = math.inf
        if not math.isfinite(number):
            where.at(name).because(MessageReason.NON_FINITE_METRIC)("must be a finite number")
        out[name] = number
    return out


_MAX_NAME = 64  # characters of a backend id, feature or limit name


def check_gpu_offer(value: Any, at: Where = _AT.at("gpu")) -> dict[str, Any]:
    """A job's GPU offer (docs/wire.md, Deliver.gpu): its WGSL archive by name, size and SHA-256, and what
    a participant needs of the package's GPU backend. Returns the checked JSON (unknown keys dropped)."""
    obj = as_object(value, at)
    a_at = at.at("shaderArchive")
    archive = as_object(obj.get("shaderArchive"), a_at)
    b_at = at.at("backend")
    backend = as_object(obj.get("backend"), b_at)
    features = as_list(backend.get("requiredFeatures", []), b_at.at("requiredFeatures"), 32)
    limits = as_object(backend.get("minimumDeviceLimits", {}), b_at.at("minimumDeviceLimits"))
    if len(limits) > 32:
        b_at.at("minimumDeviceLimits")("must have at most 32 limits")
    out: dict[str, Any] = {
        "shaderArchive": {"fileName": _str(archive, "fileName", at=a_at),
                          "bytes": as_int(archive.get("bytes"), a_at.at("bytes"), 1, MAX_SHADER_ARCHIVE_BYTES),
                          "sha256": _sha(archive, "sha256", a_at)},
        "backend": {"id": _str(backend, "id", limit=_MAX_NAME, at=b_at),
                    "estimatedWorkingBytes": _int(backend, "estimatedWorkingBytes", at=b_at),
                    "numericalMode": as_choice(backend.get("numericalMode"), b_at.at("numericalMode"),
                                               ("fp32-exact", "fp32-standard")),
                    "requiredFeatures": [as_str(f, b_at.at("requiredFeatures").at(i), max_chars=_MAX_NAME)
                                         for i, f in enumerate(features)],
                    "minimumDeviceLimits": {as_str(k, b_at.at("minimumDeviceLimits"), max_chars=_MAX_NAME):
                                            as_int(v, b_at.at("minimumDeviceLimits").at(k[:_MAX_NAME]), 0)
                                            for k, v in limits.items()}},
    }
    if obj.get("cpuBackend") is not None:
        out["cpuBackend"] = _str(obj, "cpuBackend", limit=_MAX_NAME, at=at)
    return out


@dataclass(frozen=True)
class ArtifactRef:
    """A content-addressed artifact: the bytes travel beside the message."""

    kind: str  # module | chunk | checkpoint | update | qdelta (a compressed update) | auxiliary | snapshot | wgsl
    sha256: str
    bytes: int

    KINDS: ClassVar[frozenset[str]] = frozenset({"module", "chunk", "checkpoint", "update", "qdelta", "auxiliary",
                                                 "snapshot", "wgsl"})

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "sha256": self.sha256, "bytes": self.bytes}

    @classmethod
    def from_json(cls, obj: Any, at: Where = _AT.at("artifact")) -> ArtifactRef:
        obj = as_object(obj, at)
        kind = _str(obj, "kind", at=at)
        if kind not in cls.KINDS:
            at.at("kind")(f"unknown artifact kind {kind!r}")
        return cls(kind, _sha(obj, "sha256", at), _int(obj, "bytes", at=at))


@dataclass(frozen=True)
class ChunkRef:
    """The dataset chunk of an assignment."""

    id: str
    format: str
    example_count: int
    data: ArtifactRef

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "format": self.format, "exampleCount": self.example_count, "data": self.data.to_json()}

    @classmethod
    def from_json(cls, obj: Any, at: Where = _AT.at("chunk")) -> ChunkRef:
        obj = as_object(obj, at)
        return cls(_str(obj, "id", at=at), _str(obj, "format", at=at), _int(obj, "exampleCount", at=at),
                   ArtifactRef.from_json(obj.get("data"), at.at("data")))


@dataclass(frozen=True)
class UnitRange:
    """The experience units of an assignment and the seed they are played with.

    ``job_seed`` lets a participant split the range across its local
    Workers, each range seeded as an assignment starting at its first unit
    (docs/experience.md), so the first Worker plays with ``seed`` itself.
    """

    unit_start: int
    unit_count: int
    seed: int
    job_seed: int

    def to_json(self) -> dict[str, Any]:
        return {"unitStart": self.unit_start, "unitCount": self.unit_count, "seed": str(self.seed),
                "jobSeed": str(self.job_seed)}

    @classmethod
    def from_json(cls, obj: Any, at: Where = _AT.at("experience")) -> UnitRange:
        obj = as_object(obj, at)
        return cls(_int(obj, "unitStart", at=at), _int(obj, "unitCount", minimum=1, at=at), _seed(obj, "seed", at),
                   _seed(obj, "jobSeed", at))


class _Message:
    """Shared JSON plumbing; subclasses set TYPE and DIRECTION and implement _body/_parse."""

    TYPE: ClassVar[str] = ""
    #: Which way the message travels: whoever routes messages (the controller,
    #: the simulator) hands it to the coordinator or to a participant by this.
    DIRECTION: ClassVar[Direction]

    def to_json(self) -> dict[str, Any]:
        body = {"type": self.TYPE}
        body.update(self._body())
        return body

    def _body(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        cls: type = type(self)
        for name, key in _wire_names(cls):
            value = getattr(self, name)
            if value is None:
                continue
            out[key] = value.to_json() if hasattr(value, "to_json") else value
        return out


@lru_cache(maxsize=128)  # the message classes: asked for every message encoded, and fields() walks a class dict
def _wire_names(cls: type) -> tuple[tuple[str, str], ...]:
    return tuple((f.name, _camel(f.name)) for f in fields(cls))


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


@dataclass(frozen=True)
class Invitation(_Message):
    """What a participant sees before deciding: nothing is downloaded yet."""

    TYPE: ClassVar[str] = "invitation"
    DIRECTION: ClassVar[Direction] = Direction.TO_PARTICIPANT
    job_id: str
    coordinator: str
    model_info: dict[str, Any]
    module: dict[str, Any]  # {fileName, bytes, sha256}
    data_bytes: int
    settings: dict[str, Any]
    #: The coordinator's display name (core/observe/peer_names.py), cleaned on arrival; None from older peers.
    coordinator_name: str | None = None

    @classmethod
    def _parse(cls, obj: dict[str, Any]) -> Invitation:
        module = _obj(obj, "module")
        _sha(module, "sha256", _AT.at("module"))
        _int(module, "bytes", at=_AT.at("module"))
        name = clean_name(_str(obj, "coordinatorName", optional=True, limit=4 * MAX_NAME_CHARS))
        return cls(_str(obj, "jobId"), _str(obj, "coordinator"), _obj(obj, "modelInfo"), module,
                   _int(obj, "dataBytes"), _obj(obj, "settings"), name or None)


@dataclass(frozen=True)
class InvitationDecision(_Message):
    TYPE: ClassVar[str] = "invitationDecision"
    DIRECTION: ClassVar[Direction] = Direction.TO_COORDINATOR
    job_id: str
    accepted: bool
    # Why a peer said no without a person deciding (it coordinates or takes part in a job, the
    # invitation expired, an agent's policy): the inviter's window says it (issue 24, item 3).
    reason: str | None = None

    @classmethod
    def _parse(cls, obj: dict[str, Any]) -> InvitationDecision:
        accepted = _bool(obj, "accepted")
        reason = _str(obj, "reason", optional=True, limit=MAX_TEXT)
        if accepted and reason is not None:
            _AT.at("reason")("is only for a declined invitation")
        return cls(_str(obj, "jobId"), accepted, reason)


@dataclass(frozen=True)
class Deliver(_Message):
    """After acceptance: the module and the auxiliary weights files travel beside this.

    ``gpu`` (a job created with executionFiles) announces the WGSL archive
    without sending it (:func:`check_gpu_offer`): a participant that will
    train on its GPU asks for it in its ModuleStatus. ``cpu_backend`` is the
    package's CPU backend id (what the participant's diagnostics name when
    it trains on the CPU; absent for a job without a package)."""

    TYPE: ClassVar[str] = "deliver"
    DIRECTION: ClassVar[Direction] = Direction.TO_PARTICIPANT
    job_id: str
    module: ArtifactRef
    model_info: dict[str, Any]
    auxiliary: dict[str, ArtifactRef] = field(default_factory=dict)
    gpu: dict[str, Any] | None = None
    working_bytes: int | None = None  # the package's estimatedWorkingBytes: bounds the module's memory
    cpu_backend: str | None = None

    @classmethod
    def _parse(cls, obj: dict[str, Any]) -> Deliver:
        gpu = check_gpu_offer(obj["gpu"]) if obj.get("gpu") is not None else None
        return cls(_str(obj, "jobId"), ArtifactRef.from_json(obj.get("module"), _AT.at("module")),
                   _obj(obj, "modelInfo"), _auxiliary(obj), gpu, _int(obj, "workingBytes", optional=True),
                   _str(obj, "cpuBackend", optional=True, limit=_MAX_NAME))

    def _body(self) -> dict[str, Any]:
        body = super()._body()
        body["auxiliary"] = {k: v.to_json() for k, v in self.auxiliary.items()}
        return body


@dataclass(frozen=True)
class ModuleStatus(_Message):
    """The participant loaded (or failed to load) the job's model module."""

    TYPE: ClassVar[str] = "moduleStatus"
    DIRECTION: ClassVar[Direction] = Direction.TO_COORDINATOR
    job_id: str
    loaded: bool
    error: str | None = None
    held: tuple[str, ...] = ()  # artifact hashes the participant already holds
    fetch_shader_archive: bool = False  # send the announced WGSL archive with the next assignment

    @classmethod
    def _parse(cls, obj: dict[str, Any]) -> ModuleStatus:
        at = _AT.at("held")
        held = [as_sha256(h, at.at(i)) for i, h in enumerate(as_list(obj.get("held", []), at, 10_000))]
        fetch = _bool(obj, "fetchShaderArchive") if "fetchShaderArchive" in obj else False
        return cls(_str(obj, "jobId"), _bool(obj, "loaded"), _str(obj, "error", optional=True, limit=MAX_TEXT),
                   tuple(held), fetch)

    def _body(self) -> dict[str, Any]:
        body = super()._body()
        body["held"] = list(self.held)
        if not self.fetch_shader_archive:
            del body["fetchShaderArchive"]  # only a participant that asks says so
        return body


@dataclass(frozen=True)
class Assign(_Message):
    """One round's work for one participant, from one checkpoint."""

    TYPE: ClassVar[str] = "assign"
    DIRECTION: ClassVar[Direction] = Direction.TO_PARTICIPANT
    job_id: str
    round: int
    assignment_id: str
    attempt_id: str
    checkpoint: ArtifactRef
    settings: dict[str, Any]
    seed: int
    chunk: ChunkRef | None = None
    experience: UnitRange | None = None
    auxiliary: dict[str, ArtifactRef] = field(default_factory=dict)
    shader_archive: ArtifactRef | None = None  # to a participant that asked for the job's WGSL archive

    @classmethod
    def _parse(cls, obj: dict[str, Any]) -> Assign:
        chunk = obj.get("chunk")
        experience = obj.get("experience")
        if (chunk is None) == (experience is None):
            _AT("an assignment has a chunk or an experience range, not both")
        archive = None
        if obj.get("shaderArchive") is not None:
            archive = ArtifactRef.from_json(obj["shaderArchive"], _AT.at("shaderArchive"))
            if archive.kind != "wgsl" or not 0 < archive.bytes <= MAX_SHADER_ARCHIVE_BYTES:
                _AT.at("shaderArchive")(f"must be a wgsl artifact of 1 to {MAX_SHADER_ARCHIVE_BYTES} bytes")
        return cls(
            _str(obj, "jobId"), _int(obj, "round", minimum=1), _str(obj, "assignmentId"), _str(obj, "attemptId"),
            ArtifactRef.from_json(obj.get("checkpoint"), _AT.at("checkpoint")), _obj(obj, "settings"), _seed(obj, "seed"),
            ChunkRef.from_json(chunk) if chunk is not None else None,
            UnitRange.from_json(experience) if experience is not None else None,
            _auxiliary(obj), archive,
        )

    def artifacts(self) -> set[str]:
        """The SHA-256 of every artifact it names: the weights it trains from, its auxiliary weights,
        its chunk, the WGSL archive it brings."""
        refs = {self.checkpoint.sha256, *(ref.sha256 for ref in self.auxiliary.values())}
        if self.chunk is not None:
            refs.add(self.chunk.data.sha256)
        if self.shader_archive is not None:
            refs.add(self.shader_archive.sha256)
        return refs

    def _body(self) -> dict[str, Any]:
        body = super()._body()
        body["seed"] = str(self.seed)
        body["auxiliary"] = {k: v.to_json() for k, v in self.auxiliary.items()}
        return body


@dataclass(frozen=True)
class TrainingStarted(_Message):
    TYPE: ClassVar[str] = "trainingStarted"
    DIRECTION: ClassVar[Direction] = Direction.TO_COORDINATOR
    job_id: str
    attempt_id: str

    @classmethod
    def _parse(cls, obj: dict[str, Any]) -> TrainingStarted:
        return cls(_str(obj, "jobId"), _str(obj, "attemptId"))


@dataclass(frozen=True)
class Update(_Message):
    """Trained weights for one attempt; ``weights`` travels beside it."""

    TYPE: ClassVar[str] = "update"
    DIRECTION: ClassVar[Direction] = Direction.TO_COORDINATOR
    job_id: str
    round: int
    assignment_id: str
    attempt_id: str
    base_checkpoint: str  # SHA-256 of the weights training started from
    weights: ArtifactRef
    metrics: dict[str, float]
    count: int  # unique examples, or completed units for experience jobs
    optimizer_steps: int | None = None

    @classmethod
    def _parse(cls, obj: dict[str, Any]) -> Update:
        return cls(
            _str(obj, "jobId"), _int(obj, "round", minimum=1), _str(obj, "assignmentId"), _str(obj, "attemptId"),
            _sha(obj, "baseCheckpoint"), ArtifactRef.from_json(obj.get("weights"), _AT.at("weights")),
            _metrics(obj, "metrics"),
            _int(obj, "count"), _int(obj, "optimizerSteps", optional=True),
        )


@dataclass(frozen=True)
class AssignmentFailed(_Message):
    TYPE: ClassVar[str] = "assignmentFailed"
    DIRECTION: ClassVar[Direction] = Direction.TO_COORDINATOR
    job_id: str
    attempt_id: str
    error: str

    @classmethod
    def _parse(cls, obj: dict[str, Any]) -> AssignmentFailed:
        return cls(_str(obj, "jobId"), _str(obj, "attemptId"), _str(obj, "error", limit=MAX_TEXT))


@dataclass(frozen=True)
class ArtifactMissing(_Message):
    """The frame reader refused a message from this participant's coordinator because it named
    ``artifact`` as held when it is not (evicted, or never arrived): send it again."""

    TYPE: ClassVar[str] = "artifactMissing"
    DIRECTION: ClassVar[Direction] = Direction.TO_COORDINATOR
    job_id: str
    artifact: str

    @classmethod
    def _parse(cls, obj: dict[str, Any]) -> ArtifactMissing:
        return cls(_str(obj, "jobId"), _sha(obj, "artifact"))


@dataclass(frozen=True)
class UpdateReceipt(_Message):
    """The coordinator's answer to an update: accepted, or rejected and why."""

    TYPE: ClassVar[str] = "updateReceipt"
    DIRECTION: ClassVar[Direction] = Direction.TO_PARTICIPANT
    job_id: str
    attempt_id: str
    accepted: bool
    reason: str | None = None

    @classmethod
    def _parse(cls, obj: dict[str, Any]) -> UpdateReceipt:
        return cls(_str(obj, "jobId"), _str(obj, "attemptId"), _bool(obj, "accepted"),
                   _str(obj, "reason", optional=True, limit=MAX_TEXT))


@dataclass(frozen=True)
class PauseContribution(_Message):
    TYPE: ClassVar[str] = "pauseContribution"
    DIRECTION: ClassVar[Direction] = Direction.TO_COORDINATOR
    job_id: str
    paused: bool

    @classmethod
    def _parse(cls, obj: dict[str, Any]) -> PauseContribution:
        return cls(_str(obj, "jobId"), _bool(obj, "paused"))


@dataclass(frozen=True)
class Leave(_Message):
    TYPE: ClassVar[str] = "leave"
    DIRECTION: ClassVar[Direction] = Direction.TO_COORDINATOR
    job_id: str

    @classmethod
    def _parse(cls, obj: dict[str, Any]) -> Leave:
        return cls(_str(obj, "jobId"))


@dataclass(frozen=True)
class JobFinished(_Message):
    TYPE: ClassVar[str] = "jobFinished"
    DIRECTION: ClassVar[Direction] = Direction.TO_PARTICIPANT
    job_id: str
    incomplete: bool

    @classmethod
    def _parse(cls, obj: dict[str, Any]) -> JobFinished:
        return cls(_str(obj, "jobId"), _bool(obj, "incomplete"))


@dataclass(frozen=True)
class DiagnosticsReport(_Message):
    """A participant's PeerExecutionDiagnostics snapshot (validated by the book)."""

    TYPE: ClassVar[str] = "diagnostics"
    DIRECTION: ClassVar[Direction] = Direction.TO_COORDINATOR
    job_id: str
    snapshot: dict[str, Any]

    @classmethod
    def _parse(cls, obj: dict[str, Any]) -> DiagnosticsReport:
        return cls(_str(obj, "jobId"), _obj(obj, "snapshot"))


@dataclass(frozen=True)
class Progress(_Message):
    """A participant's live progress on one attempt (sent at most every
    ``live_progress.PROGRESS_INTERVAL_MS``, and on completion)."""

    TYPE: ClassVar[str] = "progress"
    DIRECTION: ClassVar[Direction] = Direction.TO_COORDINATOR
    job_id: str
    attempt_id: str
    processed_examples: int
    total_examples: int
    elapsed_ms: int  # since training of the attempt started, on the participant's clock
    metrics: dict[str, float] = field(default_factory=dict)

    @classmethod
    def _parse(cls, obj: dict[str, Any]) -> Progress:
        processed, total = _int(obj, "processedExamples"), _int(obj, "totalExamples")
        if processed > total:
            _AT.at("processedExamples")("must not exceed totalExamples")
        metrics = _metrics(obj, "metrics") if obj.get("metrics") is not None else {}
        return cls(_str(obj, "jobId"), _str(obj, "attemptId"), processed, total, _int(obj, "elapsedMs"), metrics)


# ------------------------------------------------------------ checkpoint notes (docs/wire.md, "Checkpoint notes")


@dataclass(frozen=True)
class CheckpointNote(_Message):
    """A checkpoint the coordinator saved (or its validation result), so a participant's window
    lists the job's checkpoints and charts its metrics: the summary, never the weights."""

    TYPE: ClassVar[str] = "checkpoint"
    DIRECTION: ClassVar[Direction] = Direction.TO_PARTICIPANT
    job_id: str
    round: int
    sha256: str
    bytes: int
    file_name: str
    examples_processed: int
    metrics: dict[str, float]
    created_at: float  # on the coordinator's clock (ms since the epoch)
    validation_metrics: dict[str, float] | None = None
    validation_examples: int | None = None
    validation_error: str | None = None

    @classmethod
    def _parse(cls, obj: dict[str, Any]) -> CheckpointNote:
        created = as_number(obj.get("createdAt"), _AT.at("createdAt"), 0)
        validation = _metrics(obj, "validationMetrics") if obj.get("validationMetrics") is not None else None
        return cls(_str(obj, "jobId"), _int(obj, "round"), _sha(obj, "sha256"), _int(obj, "bytes"),
                   _str(obj, "fileName"), _int(obj, "examplesProcessed"), _metrics(obj, "metrics"), float(created),
                   validation, _int(obj, "validationExamples", optional=True),
                   _str(obj, "validationError", optional=True, limit=MAX_TEXT))

    @classmethod
    def of(cls, job_id: str, summary: Mapping[str, Any]) -> CheckpointNote:
        """The note of a coordinator's CheckpointSummary."""
        artifact, metrics = summary["artifact"], summary["metrics"]
        validation = summary.get("validationMetrics")
        return cls(job_id, artifact["round"], artifact["sha256"], artifact["bytes"], artifact["fileName"],
                   metrics.get("examplesProcessed", 0), dict(metrics.get("values", {})), summary["createdAt"],
                   dict(validation["values"]) if validation else None,
                   validation["examplesProcessed"] if validation else None, summary.get("validationError"))

    def summary(self) -> dict[str, Any]:
        """The CheckpointSummary a participant's job view lists (docs/api.md)."""
        out: dict[str, Any] = {
            "artifact": {"round": self.round, "sha256": self.sha256, "bytes": self.bytes, "fileName": self.file_name},
            "metrics": {"values": dict(self.metrics), "examplesProcessed": self.examples_processed},
            "createdAt": self.created_at,
        }
        if self.validation_metrics is not None:
            out["validationMetrics"] = {"values": dict(self.validation_metrics),
                                        "examplesProcessed": self.validation_examples or 0}
        if self.validation_error is not None:
            out["validationError"] = self.validation_error
        return out


# ------------------------------------------------------------ the checkpoint relay (docs/wire.md, "Relayed broadcast")
# A plan lists its pieces as ``Piece`` values, not ``ArtifactRef``: a plan travels without attachments, and the
# frame reader refuses a message naming an artifact that neither came with it nor is held.

#: At most this many pieces per artifact (a 256 MB checkpoint in pieces of 250 kB or more).
MAX_PIECES = 1024
#: A node forwards to at most this many peers (a tree's fan-out).
MAX_FORWARD = 8
_PEER = 64  # characters of a peer ID (the signaling server's are 26)


@dataclass(frozen=True)
class Piece:
    """One piece of a relayed artifact: its SHA-256 and size (offsets follow from the order)."""

    sha256: str
    bytes: int

    def to_json(self) -> dict[str, Any]:
        return {"sha256": self.sha256, "bytes": self.bytes}


@dataclass(frozen=True)
class RelayPlan(_Message):
    """Where this participant gets the pieces of ``artifact`` from, and whom it passes them on to."""

    TYPE: ClassVar[str] = "relayPlan"
    DIRECTION: ClassVar[Direction] = Direction.TO_PARTICIPANT
    job_id: str
    round: int
    artifact: str  # SHA-256 of the whole artifact (the concatenated pieces)
    bytes: int
    source: str  # the peer the pieces come from: a relay, or the coordinator itself
    forward_to: tuple[str, ...]
    pieces: tuple[Piece, ...]

    def _body(self) -> dict[str, Any]:
        return {"jobId": self.job_id, "round": self.round, "artifact": self.artifact, "bytes": self.bytes,
                "source": self.source, "forwardTo": list(self.forward_to),
                "pieces": [p.to_json() for p in self.pieces]}

    @classmethod
    def _parse(cls, obj: dict[str, Any]) -> RelayPlan:
        total = _int(obj, "bytes", minimum=1)
        if total > MAX_FILE_BYTES:
            _AT.at("bytes")(f"must be at most {MAX_FILE_BYTES}")
        source = _str(obj, "source", limit=_PEER)
        at = _AT.at("forwardTo")
        forward = tuple(_str({"p": p}, "p", limit=_PEER, at=at) for p in as_list(obj.get("forwardTo"), at, MAX_FORWARD))
        if first_duplicate(forward) is not None or source in forward:
            at("must name distinct peers other than the source")
        at = _AT.at("pieces")
        pieces = []
        for i, item in enumerate(as_list(obj.get("pieces"), at, MAX_PIECES)):
            piece = as_object(item, at.at(str(i)))
            pieces.append(Piece(_sha(piece, "sha256", at.at(str(i))), _int(piece, "bytes", minimum=1, at=at.at(str(i)))))
        if not pieces or sum(p.bytes for p in pieces) != total:
            at("must be 1 or more pieces whose sizes add up to bytes")
        return cls(_str(obj, "jobId"), _int(obj, "round", minimum=1), _sha(obj, "artifact"), total, source, forward,
                   tuple(pieces))


@dataclass(frozen=True)
class RelayPiece(_Message):
    """Piece ``index`` of ``artifact``; ``data`` travels beside it (verified by the frame reader)."""

    TYPE: ClassVar[str] = "relayPiece"
    DIRECTION: ClassVar[Direction] = Direction.TO_PARTICIPANT
    job_id: str
    round: int
    artifact: str
    index: int
    data: ArtifactRef

    @classmethod
    def _parse(cls, obj: dict[str, Any]) -> RelayPiece:
        data = ArtifactRef.from_json(obj.get("data"), _AT.at("data"))
        if data.kind != "checkpoint" or data.bytes < 1:
            _AT.at("data")("must be a checkpoint piece of 1 byte or more")
        index = _int(obj, "index")
        if index >= MAX_PIECES:
            _AT.at("index")(f"must be below {MAX_PIECES}")
        return cls(_str(obj, "jobId"), _int(obj, "round", minimum=1), _sha(obj, "artifact"), index, data)


@dataclass(frozen=True)
class RelayDone(_Message):
    """A participant holds ``artifact`` (``ok``), or names the ``source`` that sent it a bad piece."""

    TYPE: ClassVar[str] = "relayDone"
    DIRECTION: ClassVar[Direction] = Direction.TO_COORDINATOR
    job_id: str
    round: int
    artifact: str
    source: str
    ok: bool
    error: str | None = None

    @classmethod
    def _parse(cls, obj: dict[str, Any]) -> RelayDone:
        ok = _bool(obj, "ok")
        error = _str(obj, "error", optional=True, limit=MAX_TEXT)
        if ok == (error is not None):
            _AT.at("error")("is required when ok is false, and only then")
        return cls(_str(obj, "jobId"), _int(obj, "round", minimum=1), _sha(obj, "artifact"),
                   _str(obj, "source", limit=_PEER), ok, error)


# ------------------------------------------------------------ the room proof (docs/agent.md; weei.core.links.room_proof)


@dataclass(frozen=True)
class RoomChallenge(_Message):
    """Prove the room key for ``job_id`` over this ``nonce`` (64 hex digits: 32 fresh random bytes)."""

    TYPE: ClassVar[str] = "roomChallenge"
    DIRECTION: ClassVar[Direction] = Direction.TO_COORDINATOR
    job_id: str
    nonce: str

    @classmethod
    def _parse(cls, obj: dict[str, Any]) -> RoomChallenge:
        return cls(_str(obj, "jobId"), _sha(obj, "nonce"))


@dataclass(frozen=True)
class RoomProof(_Message):
    """The answer to a challenge: the HMAC in 64 hex digits, or None (no room key on this coordinator)."""

    TYPE: ClassVar[str] = "roomProof"
    DIRECTION: ClassVar[Direction] = Direction.TO_PARTICIPANT
    job_id: str
    proof: str | None = None

    @classmethod
    def _parse(cls, obj: dict[str, Any]) -> RoomProof:
        return cls(_str(obj, "jobId"), _sha(obj, "proof") if obj.get("proof") is not None else None)


# ------------------------------------------------------------ names (core/observe/peer_names.py)


@dataclass(frozen=True)
class Presence(_Message):
    """A peer's card: its display name, whether it is an agent, what it does. Sent to every peer whose
    channel opens, and to all again when it changes."""

    TYPE: ClassVar[str] = "presence"
    DIRECTION: ClassVar[Direction] = Direction.ANY_PEER
    card: PeerCard

    @property
    def job_id(self) -> str:
        """About no job: a state machine handed one by mistake finds it names none of its jobs."""
        return ""

    def _body(self) -> dict[str, Any]:
        return {"card": self.card.to_json()}

    @classmethod
    def _parse(cls, obj: dict[str, Any]) -> Presence:
        raw = _obj(obj, "card")
        _str(raw, "name", limit=4 * MAX_NAME_CHARS, at=_AT.at("card"))
        if raw.get("job") is not None:
            as_str(raw["job"], _AT.at("card").at("job"), nonempty=False, max_chars=4 * MAX_NAME_CHARS)
        card = PeerCard.from_json(raw)
        if card is None:
            _AT.at("card").at("name")("has no printable character")
        return cls(card)


# ------------------------------------------------------------ secure aggregation (docs/privacy.md; weei.core.privacy)

#: At most this many participants in one secure-aggregation round (each message lists them once).
MAX_SECAGG_PEERS = 256


def _hex(value: Any, at: Where, nbytes: int) -> bytes:
    text = as_str(value, at, max_chars=2 * nbytes)
    if len(text) != 2 * nbytes or text.strip("0123456789abcdef"):
        at(f"must be {2 * nbytes} lowercase hex digits")
    return bytes.fromhex(text)


def _peers(obj: Mapping[str, Any], key: str) -> tuple[str, ...]:
    at = _AT.at(key)
    peers = tuple(as_str(p, at.at(i), max_chars=_PEER) for i, p in enumerate(as_list(obj.get(key), at, MAX_SECAGG_PEERS)))
    if first_duplicate(peers) is not None:
        at("must name distinct peers")
    return peers


def _rows(obj: Mapping[str, Any], key: str, columns: tuple[tuple[str, int], ...]) -> list[tuple[Any, ...]]:
    """A list of objects, each ``{peer: id, <column>: hex of n bytes, ...}``, at most one per peer."""
    at = _AT.at(key)
    rows = []
    for i, item in enumerate(as_list(obj.get(key), at, MAX_SECAGG_PEERS)):
        row = as_object(item, at.at(i))
        rows.append((_str(row, "peer", limit=_PEER, at=at.at(i)),
                     *(_hex(row.get(name), at.at(i).at(name), n) for name, n in columns)))
    if first_duplicate(r[0] for r in rows) is not None:
        at("must name each peer once")
    return rows


@dataclass(frozen=True)
class _SecAgg(_Message):
    """A secure-aggregation message of one round's attempt (a retry is a new attempt with fresh keys)."""

    job_id: str
    round: int
    attempt: int

    def _head(self) -> dict[str, Any]:
        return {"jobId": self.job_id, "round": self.round, "attempt": self.attempt}

    @staticmethod
    def _parse_head(obj: dict[str, Any]) -> tuple[str, int, int]:
        return _str(obj, "jobId"), _int(obj, "round", minimum=1), _int(obj, "attempt", minimum=1)


@dataclass(frozen=True)
class SecAggKeys(_SecAgg):
    """A participant's two public keys for this attempt (``AdvertiseKeys``)."""

    TYPE: ClassVar[str] = "secaggKeys"
    DIRECTION: ClassVar[Direction] = Direction.TO_COORDINATOR
    keys: AdvertiseKeys

    def _body(self) -> dict[str, Any]:
        return {**self._head(), "cPk": self.keys.c_pk.hex(), "sPk": self.keys.s_pk.hex()}

    @classmethod
    def _parse(cls, obj: dict[str, Any]) -> SecAggKeys:
        return cls(*cls._parse_head(obj), AdvertiseKeys(_hex(obj.get("cPk"), _AT.at("cPk"), KEY_BYTES),
                                                         _hex(obj.get("sPk"), _AT.at("sPk"), KEY_BYTES)))


@dataclass(frozen=True)
class SecAggRoster(_SecAgg):
    """U1 and each member's keys (``Roster``), with the threshold and vector length every member checks."""

    TYPE: ClassVar[str] = "secaggRoster"
    DIRECTION: ClassVar[Direction] = Direction.TO_PARTICIPANT
    threshold: int
    length: int
    roster: Roster

    def _body(self) -> dict[str, Any]:
        return {**self._head(), "threshold": self.threshold, "length": self.length,
                "keys": [{"peer": p, "cPk": k.c_pk.hex(), "sPk": k.s_pk.hex()} for p, k in self.roster.keys]}

    @classmethod
    def _parse(cls, obj: dict[str, Any]) -> SecAggRoster:
        rows = _rows(obj, "keys", (("cPk", KEY_BYTES), ("sPk", KEY_BYTES)))
        threshold = _int(obj, "threshold", minimum=2)
        if threshold > len(rows):
            _AT.at("threshold")("must be at most the number of keys")
        return cls(*cls._parse_head(obj), threshold, _int(obj, "length", minimum=1),
                   Roster(tuple((p, AdvertiseKeys(c, s)) for p, c, s in rows)))


@dataclass(frozen=True)
class SecAggShares(_SecAgg):
    """A participant's sealed share pair for each peer, its commitments and its seed's (``ShareKeys``)."""

    TYPE: ClassVar[str] = "secaggShares"
    DIRECTION: ClassVar[Direction] = Direction.TO_COORDINATOR
    shares: ShareKeys

    def _body(self) -> dict[str, Any]:
        return {**self._head(), "sealed": [{"peer": p, "data": d.hex()} for p, d in self.shares.sealed],
                "commitments": [{"peer": p, "key": k.hex(), "seed": b.hex()} for p, k, b in self.shares.commitments],
                "seedCommitment": self.shares.seed_commitment.hex()}

    @classmethod
    def _parse(cls, obj: dict[str, Any]) -> SecAggShares:
        sealed = tuple((p, d) for p, d in _rows(obj, "sealed", (("data", SEALED_SHARE_BYTES),)))
        commitments = tuple((p, k, b) for p, k, b in _rows(obj, "commitments", (("key", COMMITMENT_BYTES), ("seed", COMMITMENT_BYTES))))
        return cls(*cls._parse_head(obj), ShareKeys(sealed, commitments,
                                                    _hex(obj.get("seedCommitment"), _AT.at("seedCommitment"), COMMITMENT_BYTES)))


@dataclass(frozen=True)
class SecAggSharesFor(_SecAgg):
    """U2 and the sealed shares its peers dealt this participant (``SharesFor``)."""

    TYPE: ClassVar[str] = "secaggSharesFor"
    DIRECTION: ClassVar[Direction] = Direction.TO_PARTICIPANT
    shares: SharesFor

    def _body(self) -> dict[str, Any]:
        return {**self._head(), "u2": list(self.shares.u2),
                "inbox": [{"peer": p, "data": d.hex()} for p, d in self.shares.inbox]}

    @classmethod
    def _parse(cls, obj: dict[str, Any]) -> SecAggSharesFor:
        inbox = tuple((p, d) for p, d in _rows(obj, "inbox", (("data", SEALED_SHARE_BYTES),)))
        return cls(*cls._parse_head(obj), SharesFor(_peers(obj, "u2"), inbox))


@dataclass(frozen=True)
class SecAggMasked(_SecAgg):
    """The masked update: ``length`` little-endian u64 ring elements, travelling beside the message."""

    TYPE: ClassVar[str] = "secaggMasked"
    DIRECTION: ClassVar[Direction] = Direction.TO_COORDINATOR
    masked: ArtifactRef

    def _body(self) -> dict[str, Any]:
        return {**self._head(), "masked": self.masked.to_json()}

    @classmethod
    def _parse(cls, obj: dict[str, Any]) -> SecAggMasked:
        masked = ArtifactRef.from_json(obj.get("masked"), _AT.at("masked"))
        if masked.kind != "update" or masked.bytes < 8 or masked.bytes % 8 or masked.bytes > MAX_FILE_BYTES:
            _AT.at("masked")("must be an update of whole 8-byte ring elements")
        return cls(*cls._parse_head(obj), masked)


@dataclass(frozen=True)
class SecAggUnmask(_SecAgg):
    """U3: whose self masks to reveal shares of; the rest of U2 dropped (``Unmask``)."""

    TYPE: ClassVar[str] = "secaggUnmask"
    DIRECTION: ClassVar[Direction] = Direction.TO_PARTICIPANT
    unmask: Unmask

    def _body(self) -> dict[str, Any]:
        return {**self._head(), "u3": list(self.unmask.u3)}

    @classmethod
    def _parse(cls, obj: dict[str, Any]) -> SecAggUnmask:
        return cls(*cls._parse_head(obj), Unmask(_peers(obj, "u3")))


@dataclass(frozen=True)
class SecAggReveal(_SecAgg):
    """A survivor's shares: of dropped peers' keys and of survivors' seeds (``UnmaskShares``)."""

    TYPE: ClassVar[str] = "secaggReveal"
    DIRECTION: ClassVar[Direction] = Direction.TO_COORDINATOR
    reveal: UnmaskShares

    def _body(self) -> dict[str, Any]:
        def rows(entries: tuple[tuple[str, int, bytes], ...]) -> list[dict[str, str]]:
            return [{"peer": p, "share": y.to_bytes(shamir.SHARE_BYTES, "big").hex(), "salt": s.hex()} for p, y, s in entries]
        return {**self._head(), "keyShares": rows(self.reveal.key_shares), "seedShares": rows(self.reveal.seed_shares)}

    @classmethod
    def _parse(cls, obj: dict[str, Any]) -> SecAggReveal:
        def rows(key: str) -> tuple[tuple[str, int, bytes], ...]:
            return tuple((p, int.from_bytes(y, "big"), s)
                         for p, y, s in _rows(obj, key, (("share", shamir.SHARE_BYTES), ("salt", SALT_BYTES))))
        return cls(*cls._parse_head(obj), UnmaskShares(rows("keyShares"), rows("seedShares")))


Message = (
    Invitation | InvitationDecision | Deliver | ModuleStatus | Assign | TrainingStarted | Update | AssignmentFailed
    | ArtifactMissing | UpdateReceipt | PauseContribution | Leave | JobFinished | DiagnosticsReport | Progress | CheckpointNote
    | RelayPlan | RelayPiece | RelayDone | RoomChallenge | RoomProof | Presence | SecAggKeys | SecAggRoster | SecAggShares
    | SecAggSharesFor | SecAggMasked | SecAggUnmask | SecAggReveal
)

#: The one decode table: every message type on the wire.
_TYPES: dict[str, Any] = {
    cls.TYPE: cls
    for cls in (Invitation, InvitationDecision, Deliver, ModuleStatus, Assign, TrainingStarted, Update, AssignmentFailed,
                ArtifactMissing, UpdateReceipt, PauseContribution, Leave, JobFinished, DiagnosticsReport, Progress, CheckpointNote,
                RelayPlan, RelayPiece, RelayDone, RoomChallenge, RoomProof, Presence, SecAggKeys, SecAggRoster, SecAggShares,
                SecAggSharesFor, SecAggMasked, SecAggUnmask, SecAggReveal)
}


def decode_message(obj: Any) -> Message:
    """Parse an untrusted JSON value into a message.

    Raises:
        MessageError: the value is not a known, well-formed message.
    """
    if not isinstance(obj, dict):
        raise MessageError(MessageReason.NOT_AN_OBJECT, "a message must be a JSON object")
    kind = obj.get("type")
    cls = _TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise MessageError(MessageReason.UNKNOWN_TYPE, f"unknown message type {str(kind)[:64]!r}")
    return cls._parse(obj)  # type: ignore[no-any-return]


def encode_message(message: Message) -> dict[str, Any]:
    """The JSON form of a message (the inverse of ``decode_message``)."""
    return message.to_json()
