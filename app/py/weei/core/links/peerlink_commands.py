"""What :class:`weei.core.links.peerlink.LinkManager` asks its host to do, and what it hands back.

Every command names a link by its number; the host keeps the platform's
objects (peer connection, data channel, handlers) under that number and
skips a command whose link it no longer holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Union

from ..wire.messages import Message

__all__ = [
    "CreateLink",
    "MakeOffer",
    "SetRemote",
    "MakeAnswer",
    "AddCandidate",
    "SendSignal",
    "Pump",
    "CloseLink",
    "Wake",
    "Note",
    "LinkCommand",
    "Delivery",
    "TransferRecord",
]


@dataclass(frozen=True)
class CreateLink:
    """Make a peer connection with ``ice_servers``; the offerer also makes the ``weei`` channel
    (ordered, reliable); the answerer waits for it (``ondatachannel``, :meth:`LinkManager.accepts_channel`)."""

    link: int
    peer: str
    offerer: bool
    ice_servers: tuple[dict[str, Any], ...]


@dataclass(frozen=True)
class MakeOffer:
    """``createOffer`` + ``setLocalDescription``; report the SDP to ``local_description``."""

    link: int


@dataclass(frozen=True)
class SetRemote:
    """``setRemoteDescription({type: kind, sdp})``; report to ``remote_set``."""

    link: int
    kind: Literal["offer", "answer"]
    sdp: str


@dataclass(frozen=True)
class MakeAnswer:
    """``createAnswer`` + ``setLocalDescription``; report the SDP to ``local_description``."""

    link: int


@dataclass(frozen=True)
class AddCandidate:
    """``addIceCandidate(init)`` (``{"candidate": ""}``: end of candidates); a refusal goes to ``candidate_refused``."""

    link: int
    init: dict[str, Any]


@dataclass(frozen=True)
class SendSignal:
    """Relay through signaling: an SDP (offer, answer) or an ``RTCIceCandidateInit`` (candidate)."""

    peer: str
    kind: Literal["offer", "answer", "candidate"]
    payload: Any


@dataclass(frozen=True)
class Pump:
    """Send on the link's channel what ``frames(link, bufferedAmount, now)`` returns (it may be nothing)."""

    link: int


@dataclass(frozen=True)
class CloseLink:
    """Detach the handlers, close the channel and the peer connection, release what the link holds."""

    link: int


@dataclass(frozen=True)
class Wake:
    """``peer`` has deliveries and no drainer: start one that hands ``take(peer)`` to the receiver until None."""

    peer: str


@dataclass(frozen=True)
class Note:
    """A line for the host's log (``level``: info or warning)."""

    level: str
    text: str


LinkCommand = Union[CreateLink, MakeOffer, SetRemote, MakeAnswer, AddCandidate, SendSignal, Pump, CloseLink, Wake, Note]


@dataclass(frozen=True)
class Delivery:
    """One item for the receiver: ``connected``, a complete ``message`` (attachments verified), ``disconnected``,
    or ``transfer-failed``: the reader refused an artifact from ``peer`` (``reason``), so whoever waits for
    it from that peer (a relayed checkpoint's piece) need not wait for its deadline; ``artifact`` is its SHA-256
    (for ``missing-attachment``: the one a message named as held and this device lacks)."""

    peer: str
    kind: Literal["connected", "message", "disconnected", "transfer-failed"]
    message: Message | None = None
    blobs: Mapping[str, bytes] = field(default_factory=dict)
    reason: str = ""
    artifact: str = ""


@dataclass(frozen=True)
class TransferRecord:
    """One message sent or received: the transfer log the tests (and operators) read."""

    peer: str
    direction: str  # 'send' | 'receive'
    type: str
    attachments: tuple[str, ...]  # SHA-256 of the artifacts that travelled with it
    bytes: int  # attachment bytes
    kinds: tuple[str, ...] = ()  # the artifact kind of each attachment
