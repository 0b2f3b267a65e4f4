"""The three messages of the checkpoint relay (docs/wire.md, "Relayed broadcast").

* ``RelayPlan`` (coordinator -> participant): the pieces of one artifact
  will come from ``source``; forward each verified piece to ``forward_to``.
* ``RelayPiece`` (the plan's source -> participant): piece ``index`` of the
  artifact, its bytes attached.
* ``RelayDone`` (participant -> coordinator): every piece arrived and the
  artifact is assembled, or the source sent something the plan does not
  name (``ok`` false, ``error`` says what, ``source`` who).

Kept out of ``messages.py`` only for its size: they register themselves in
its ``decode_message`` table below, and ``messages.py`` imports this module. A
plan lists its pieces as ``Piece`` values, not ``ArtifactRef``: a plan
travels without attachments, and the frame reader refuses a message naming
an artifact that neither came with it nor is held.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from .._check import as_list, as_object, first_duplicate
from ..limits import MAX_FILE_BYTES
from .messages import _AT, _TYPES, MAX_TEXT, ArtifactRef, Direction, _bool, _int, _Message, _sha, _str

__all__ = ["MAX_PIECES", "MAX_FORWARD", "Piece", "RelayPlan", "RelayPiece", "RelayDone"]

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


_TYPES.update({cls.TYPE: cls for cls in (RelayPlan, RelayPiece, RelayDone)})
