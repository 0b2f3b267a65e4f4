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
import re
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Mapping

from .errors import WeeiError
from .seeds import parse_seed

__all__ = [
    "MessageError",
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
    "UpdateReceipt",
    "PauseContribution",
    "Leave",
    "JobFinished",
    "DiagnosticsReport",
    "Message",
    "decode_message",
    "encode_message",
]

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
# Bounded so a hostile peer cannot make us keep megabytes of "reason".
MAX_TEXT = 2000


class MessageError(WeeiError):
    """A peer sent a message that is not valid; ``reason`` says how."""


def _str(obj: Mapping[str, Any], key: str, *, optional: bool = False, limit: int = 256) -> Any:
    value = obj.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value or len(value) > limit:
        raise MessageError("bad-field", f"message field {key!r} must be a non-empty string of at most {limit} characters")
    return value


def _int(obj: Mapping[str, Any], key: str, *, optional: bool = False, minimum: int = 0) -> Any:
    value = obj.get(key)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise MessageError("bad-field", f"message field {key!r} must be a whole number >= {minimum}")
    return value


def _sha(obj: Mapping[str, Any], key: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not _SHA256.match(value):
        raise MessageError("bad-field", f"message field {key!r} must be a lowercase hex SHA-256")
    return value


def _seed(obj: Mapping[str, Any], key: str) -> int:
    try:
        return parse_seed(obj.get(key))
    except WeeiError:
        raise MessageError("bad-field", f"message field {key!r} must be an unsigned 64-bit decimal string") from None


def _obj(obj: Mapping[str, Any], key: str, *, optional: bool = False) -> Any:
    value = obj.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, dict):
        raise MessageError("bad-field", f"message field {key!r} must be an object")
    return value


def _metrics(obj: Mapping[str, Any], key: str) -> dict[str, float]:
    value = _obj(obj, key)
    if len(value) > 64:
        raise MessageError("bad-field", f"message field {key!r} has more than 64 metrics")
    out: dict[str, float] = {}
    for name, v in value.items():
        if not isinstance(name, str) or len(name) > 64:
            raise MessageError("bad-field", f"metric names in {key!r} must be short strings")
        try:
            number = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan
        except OverflowError:  # a JSON integer too large for a float
            number = math.inf
        if not math.isfinite(number):
            raise MessageError("non-finite-metric", f"metric {name!r} in {key!r} must be a finite number")
        out[name] = number
    return out


@dataclass(frozen=True)
class ArtifactRef:
    """A content-addressed artifact: the bytes travel beside the message."""

    kind: str  # module | chunk | checkpoint | update | auxiliary | snapshot
    sha256: str
    bytes: int

    KINDS: ClassVar[frozenset[str]] = frozenset({"module", "chunk", "checkpoint", "update", "auxiliary", "snapshot"})

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "sha256": self.sha256, "bytes": self.bytes}

    @classmethod
    def from_json(cls, obj: Any) -> ArtifactRef:
        if not isinstance(obj, dict):
            raise MessageError("bad-field", "an artifact reference must be an object")
        kind = _str(obj, "kind")
        if kind not in cls.KINDS:
            raise MessageError("bad-field", f"unknown artifact kind {kind!r}")
        return cls(kind, _sha(obj, "sha256"), _int(obj, "bytes"))


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
    def from_json(cls, obj: Any) -> ChunkRef:
        if not isinstance(obj, dict):
            raise MessageError("bad-field", "chunk must be an object")
        return cls(_str(obj, "id"), _str(obj, "format"), _int(obj, "exampleCount"), ArtifactRef.from_json(obj.get("data")))


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
    def from_json(cls, obj: Any) -> UnitRange:
        if not isinstance(obj, dict):
            raise MessageError("bad-field", "experience must be an object")
        return cls(_int(obj, "unitStart"), _int(obj, "unitCount", minimum=1), _seed(obj, "seed"),
                   _seed(obj, "jobSeed"))


class _Message:
    """Shared JSON plumbing; subclasses set TYPE and implement _body/_parse."""

    TYPE: ClassVar[str] = ""

    def to_json(self) -> dict[str, Any]:
        body = {"type": self.TYPE}
        body.update(self._body())
        return body

    def _body(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if value is None:
                continue
            out[_camel(f.name)] = value.to_json() if hasattr(value, "to_json") else value
        return out


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


@dataclass(frozen=True)
class Invitation(_Message):
    """What a participant sees before deciding: nothing is downloaded yet."""

    TYPE: ClassVar[str] = "invitation"
    job_id: str
    coordinator: str
    model_info: dict[str, Any]
    module: dict[str, Any]  # {fileName, bytes, sha256}
    data_bytes: int
    settings: dict[str, Any]

    @classmethod
    def _parse(cls, obj: dict[str, Any]) -> Invitation:
        module = _obj(obj, "module")
        _sha(module, "sha256")
        _int(module, "bytes")
        return cls(_str(obj, "jobId"), _str(obj, "coordinator"), _obj(obj, "modelInfo"), module,
                   _int(obj, "dataBytes"), _obj(obj, "settings"))


@dataclass(frozen=True)
class InvitationDecision(_Message):
    TYPE: ClassVar[str] = "invitationDecision"
    job_id: str
    accepted: bool

    @classmethod
    def _parse(cls, obj: dict[str, Any]) -> InvitationDecision:
        if not isinstance(obj.get("accepted"), bool):
            raise MessageError("bad-field", "accepted must be true or false")
        return cls(_str(obj, "jobId"), obj["accepted"])


@dataclass(frozen=True)
class Deliver(_Message):
    """After acceptance: the module and the auxiliary weights files travel beside this."""

    TYPE: ClassVar[str] = "deliver"
    job_id: str
    module: ArtifactRef
    model_info: dict[str, Any]
    auxiliary: dict[str, ArtifactRef] = field(default_factory=dict)

    @classmethod
    def _parse(cls, obj: dict[str, Any]) -> Deliver:
        aux = _obj(obj, "auxiliary", optional=True) or {}
        if len(aux) > 8:
            raise MessageError("bad-field", "at most 8 auxiliary slots")
        return cls(_str(obj, "jobId"), ArtifactRef.from_json(obj.get("module")), _obj(obj, "modelInfo"),
                   {str(k): ArtifactRef.from_json(v) for k, v in aux.items()})

    def _body(self) -> dict[str, Any]:
        body = super()._body()
        body["auxiliary"] = {k: v.to_json() for k, v in self.auxiliary.items()}
        return body


@dataclass(frozen=True)
class ModuleStatus(_Message):
    """The participant loaded (or failed to load) the job's model module."""

    TYPE: ClassVar[str] = "moduleStatus"
    job_id: str
    loaded: bool
    error: str | None = None
    held: tuple[str, ...] = ()  # artifact hashes the participant already holds

    @classmethod
    def _parse(cls, obj: dict[str, Any]) -> ModuleStatus:
        if not isinstance(obj.get("loaded"), bool):
            raise MessageError("bad-field", "loaded must be true or false")
        held = obj.get("held", [])
        if not isinstance(held, list) or len(held) > 10_000:
            raise MessageError("bad-field", "held must be a list of SHA-256 hashes")
        for h in held:
            if not isinstance(h, str) or not _SHA256.match(h):
                raise MessageError("bad-field", "held must be a list of SHA-256 hashes")
        return cls(_str(obj, "jobId"), obj["loaded"], _str(obj, "error", optional=True, limit=MAX_TEXT), tuple(held))

    def _body(self) -> dict[str, Any]:
        body = super()._body()
        body["held"] = list(self.held)
        return body


@dataclass(frozen=True)
class Assign(_Message):
    """One round's work for one participant, from one checkpoint."""

    TYPE: ClassVar[str] = "assign"
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

    @classmethod
    def _parse(cls, obj: dict[str, Any]) -> Assign:
        chunk = obj.get("chunk")
        experience = obj.get("experience")
        if (chunk is None) == (experience is None):
            raise MessageError("bad-field", "an assignment has a chunk or an experience range, not both")
        aux = _obj(obj, "auxiliary", optional=True) or {}
        if len(aux) > 8:
            raise MessageError("bad-field", "at most 8 auxiliary slots")
        return cls(
            _str(obj, "jobId"), _int(obj, "round", minimum=1), _str(obj, "assignmentId"), _str(obj, "attemptId"),
            ArtifactRef.from_json(obj.get("checkpoint")), _obj(obj, "settings"), _seed(obj, "seed"),
            ChunkRef.from_json(chunk) if chunk is not None else None,
            UnitRange.from_json(experience) if experience is not None else None,
            {str(k): ArtifactRef.from_json(v) for k, v in aux.items()},
        )

    def _body(self) -> dict[str, Any]:
        body = super()._body()
        body["seed"] = str(self.seed)
        body["auxiliary"] = {k: v.to_json() for k, v in self.auxiliary.items()}
        return body


@dataclass(frozen=True)
class TrainingStarted(_Message):
    TYPE: ClassVar[str] = "trainingStarted"
    job_id: str
    attempt_id: str

    @classmethod
    def _parse(cls, obj: dict[str, Any]) -> TrainingStarted:
        return cls(_str(obj, "jobId"), _str(obj, "attemptId"))


@dataclass(frozen=True)
class Update(_Message):
    """Trained weights for one attempt; ``weights`` travels beside it."""

    TYPE: ClassVar[str] = "update"
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
            _sha(obj, "baseCheckpoint"), ArtifactRef.from_json(obj.get("weights")), _metrics(obj, "metrics"),
            _int(obj, "count"), _int(obj, "optimizerSteps", optional=True),
        )


@dataclass(frozen=True)
class AssignmentFailed(_Message):
    TYPE: ClassVar[str] = "assignmentFailed"
    job_id: str
    attempt_id: str
    error: str

    @classmethod
    def _parse(cls, obj: dict[str, Any]) -> AssignmentFailed:
        return cls(_str(obj, "jobId"), _str(obj, "attemptId"), _str(obj, "error", limit=MAX_TEXT))


@dataclass(frozen=True)
class UpdateReceipt(_Message):
    """The coordinator's answer to an update: accepted, or rejected and why."""

    TYPE: ClassVar[str] = "updateReceipt"
    job_id: str
    attempt_id: str
    accepted: bool
    reason: str | None = None

    @classmethod
    def _parse(cls, obj: dict[str, Any]) -> UpdateReceipt:
        if not isinstance(obj.get("accepted"), bool):
            raise MessageError("bad-field", "accepted must be true or false")
        return cls(_str(obj, "jobId"), _str(obj, "attemptId"), obj["accepted"],
                   _str(obj, "reason", optional=True, limit=MAX_TEXT))


@dataclass(frozen=True)
class PauseContribution(_Message):
    TYPE: ClassVar[str] = "pauseContribution"
    job_id: str
    paused: bool

    @classmethod
    def _parse(cls, obj: dict[str, Any]) -> PauseContribution:
        if not isinstance(obj.get("paused"), bool):
            raise MessageError("bad-field", "paused must be true or false")
        return cls(_str(obj, "jobId"), obj["paused"])


@dataclass(frozen=True)
class Leave(_Message):
    TYPE: ClassVar[str] = "leave"
    job_id: str

    @classmethod
    def _parse(cls, obj: dict[str, Any]) -> Leave:
        return cls(_str(obj, "jobId"))


@dataclass(frozen=True)
class JobFinished(_Message):
    TYPE: ClassVar[str] = "jobFinished"
    job_id: str
    incomplete: bool

    @classmethod
    def _parse(cls, obj: dict[str, Any]) -> JobFinished:
        if not isinstance(obj.get("incomplete"), bool):
            raise MessageError("bad-field", "incomplete must be true or false")
        return cls(_str(obj, "jobId"), obj["incomplete"])


@dataclass(frozen=True)
class DiagnosticsReport(_Message):
    """A participant's PeerExecutionDiagnostics snapshot (validated by the book)."""

    TYPE: ClassVar[str] = "diagnostics"
    job_id: str
    snapshot: dict[str, Any]

    @classmethod
    def _parse(cls, obj: dict[str, Any]) -> DiagnosticsReport:
        return cls(_str(obj, "jobId"), _obj(obj, "snapshot"))


Message = (
    Invitation | InvitationDecision | Deliver | ModuleStatus | Assign | TrainingStarted | Update | AssignmentFailed
    | UpdateReceipt | PauseContribution | Leave | JobFinished | DiagnosticsReport
)

_TYPES: dict[str, Any] = {
    cls.TYPE: cls
    for cls in (Invitation, InvitationDecision, Deliver, ModuleStatus, Assign, TrainingStarted, Update, AssignmentFailed,
                UpdateReceipt, PauseContribution, Leave, JobFinished, DiagnosticsReport)
}


def decode_message(obj: Any) -> Message:
    """Parse an untrusted JSON value into a message.

    Raises:
        MessageError: the value is not a known, well-formed message.
    """
    if not isinstance(obj, dict):
        raise MessageError("not-an-object", "a message must be a JSON object")
    kind = obj.get("type")
    cls = _TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise MessageError("unknown-type", f"unknown message type {str(kind)[:64]!r}")
    return cls._parse(obj)  # type: ignore[no-any-return]


def encode_message(message: Message) -> dict[str, Any]:
    """The JSON form of a message (the inverse of ``decode_message``)."""
    return message.to_json()
