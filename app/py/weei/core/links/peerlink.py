"""One peer link per other peer in the room: docs/peers.md as a sans-I/O state machine.

Theory of operation
-------------------
:class:`LinkManager` decides everything docs/peers.md says about peer
connections; its hosts (``weei.adapters.link_transport`` over aiortc in the agent,
over the page's ``RTCPeerConnection`` in the browser) only carry out what it
asks. Inputs are method calls with ``now`` (ms, monotonic); outputs are the
commands of :mod:`weei.core.links.peerlink_commands`, returned in the order they
must be carried out. Each link has a number (``link``) that no later link
reuses: a command or a result about a link that is gone is ignored.

* **Who offers.** For a pair, the peer whose ID sorts lower offers
  (:func:`offers_to`); on every ``peers`` list it opens a link to each listed
  peer it has none to, and tears down links to peers no longer listed. An
  offer from a peer that has a link replaces it.
* **Session setup.** Offerer: ``CreateLink`` + ``MakeOffer``; the SDP goes out
  with ``SendSignal`` when :meth:`LinkManager.local_description` reports it,
  then the local candidates gathered before it (trickle). Answerer:
  ``CreateLink`` + ``SetRemote(offer)``, then ``MakeAnswer``. Remote
  candidates wait until the remote description is set; one the platform
  refuses is logged and skipped (:meth:`LinkManager.candidate_refused`):
  others may work.
* **Timing.** A link not open ``connect_timeout_ms`` after it was made is torn
  down; the offerer retries a torn-down link to a listed peer after 1, 2, 4 …
  (at most 30) s; every 5 s open readers expire stalled transfers.
  :meth:`LinkManager.next_timer` says when to call
  :meth:`LinkManager.handle_timer`.
* **Teardown** closes the link, fails its open transfers, forgets the peer's
  transfers and queues ``disconnected`` once, and only if the channel opened.
* **Frames.** An open channel gets a ``FrameWriter`` + ``SendQueue`` and a
  ``FrameReader``; ``Pump`` asks the host to send what
  :meth:`LinkManager.frames` yields under the channel's ``bufferedAmount``.
* **Delivery.** ``connected``, complete messages, ``transfer-failed`` (an
  artifact the reader refused, named so a relayed piece's node reports its
  relay at once) and ``disconnected`` queue per peer in arrival order; ``Wake(peer)`` asks the host to drain that peer's
  queue with :meth:`LinkManager.take` (one drainer per peer at a time, so a
  slow receiver delays only its own peer).
* **Errors.** Transfer progress and refusals go to a ``TransferBook``;
  refusals with no artifact to name are kept under ``channel:<peer>`` and
  ``message:<peer>`` (:meth:`LinkManager.transfers_state`).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..wire.commands import Send
from ..wire.framing import (ChannelBroken, FrameError, FrameReader, FrameWriter, MessageReceived, SendQueue,
                      referenced_artifacts)
from ..wire.framing import FrameReason
from .peerlink_commands import (AddCandidate, CloseLink, LinkCommand, CreateLink, Delivery, MakeAnswer, MakeOffer, Note,
                                Pump, SendSignal, SetRemote, TransferRecord, Wake)
from ..observe.transfers import TransferBook, TransferFailed, TransferProgress

__all__ = ["LinkManager", "offers_to", "CHANNEL_LABEL", "LOW_WATER", "HIGH_WATER", "CANDIDATE_FIELDS"]

CHANNEL_LABEL = "weei"
LOW_WATER = 1024 * 1024  # bufferedAmountLowThreshold
HIGH_WATER = 4 * 1024 * 1024
CANDIDATE_FIELDS = ("candidate", "sdpMid", "sdpMLineIndex", "usernameFragment")
CONNECT_TIMEOUT_MS = 30_000.0
RETRY_MAX_MS = 30_000.0
EXPIRE_EVERY_MS = 5_000.0
STALL_MS = 120_000.0  # a transfer with no frame for this long is dropped ('stalled')
MAX_ERRORS = 256  # channel:/message: entries kept
MAX_LOG = 10_000  # transfer records kept


def offers_to(me: str | None, peer: str) -> bool:
    """docs/peers.md: the peer whose ID sorts lower offers."""
    return me is not None and me < peer


@dataclass
class _Link:
    id: int
    peer: str
    offerer: bool
    deadline: float  # torn down unless open by then
    remote_set: bool = False
    sdp_sent: bool = False
    opened: bool = False
    closed: bool = False
    remote_candidates: list[dict[str, Any]] = field(default_factory=list)
    local_candidates: list[dict[str, Any]] = field(default_factory=list)
    writer: FrameWriter | None = None
    queue: SendQueue | None = None
    reader: FrameReader | None = None


class LinkManager:
    """Every peer link of one peer; see the module docstring."""

    def __init__(self, *, connect_timeout_ms: float = CONNECT_TIMEOUT_MS, retry_max_ms: float = RETRY_MAX_MS,
                 stall_ms: float = STALL_MS, expire_every_ms: float = EXPIRE_EVERY_MS) -> None:
        self.connect_timeout_ms = connect_timeout_ms
        self.retry_max_ms = retry_max_ms
        self.stall_ms = stall_ms
        self.expire_every_ms = expire_every_ms
        self.peer_id: str | None = None
        self.has: Callable[[str, int], bool] | None = None  # which artifacts (SHA-256, size) the receiver holds
        # The job this device shares with a peer: names incoming transfers, whose message (and its
        # jobId) arrives only after their artifacts.
        self.job_of: Callable[[str], str | None] | None = None
        self.book = TransferBook()
        self.errors: OrderedDict[str, str] = OrderedDict()
        self.log: deque[TransferRecord] = deque(maxlen=MAX_LOG)
        self.dropped = 0  # sends to a peer without an open channel
        self.bytes_sent = 0
        self.bytes_received = 0
        self.closing = False
        self._ice: tuple[dict[str, Any], ...] = ()
        self._room: tuple[str, ...] = ()
        self._links: dict[str, _Link] = {}
        self._by_id: dict[int, _Link] = {}
        self._next_id = 1
        self._attempts: dict[str, int] = {}
        self._retries: dict[str, float] = {}  # peer -> when to offer again
        self._next_expire: float | None = None
        self._inboxes: dict[str, deque[Delivery]] = {}
        self._draining: set[str] = set()
        self._out: list[LinkCommand] = []

    # ------------------------------------------------------------------ queries

    def peers(self) -> list[str]:
        """Peers with an open channel."""
        return sorted(p for p, link in self._links.items() if link.opened)

    def members(self) -> tuple[str, ...]:
        """The room as signaling last listed it (a channel can close before that list says the peer left)."""
        return self._room

    def links(self) -> dict[str, tuple[int, bool]]:
        """Every live link: peer -> (link number, open)."""
        return {p: (link.id, link.opened) for p, link in self._links.items()}

    def pending(self) -> bool:
        """Whether any open link's writer still holds frames."""
        return any(link.writer is not None and link.writer.pending for link in self._links.values())

    def writer(self, peer: str) -> FrameWriter | None:
        """The writer of ``peer``'s open channel (tests forge frames with its transfer ids)."""
        link = self._links.get(peer)
        return link.writer if link is not None else None

    def transfers_state(self) -> dict[str, Any]:
        """``{"transfers": [...], "transferErrors": {id: "reason: message"}}`` for ``getState()``."""
        state = self.book.state()
        state["transferErrors"].update(self.errors)
        return state

    def next_timer(self) -> float | None:
        """When :meth:`handle_timer` must run next (ms), or None."""
        times = [link.deadline for link in self._links.values() if not link.opened]
        times += self._retries.values()
        if self._next_expire is not None and any(link.reader is not None for link in self._links.values()):
            times.append(self._next_expire)
        return min(times) if times else None

    # ----------------------------------------------------------- signaling in

    def welcomed(self, peer_id: str, ice_servers: tuple[Mapping[str, Any], ...], now: float) -> list[LinkCommand]:
        """Our peer ID (again, after a reconnection); a new one ends every pairing made under the old."""
        if self.peer_id is not None and peer_id != self.peer_id:
            for link in list(self._links.values()):
                self._teardown(link, "our peer ID changed", now, retry=False)
        self.peer_id = peer_id
        self._ice = tuple(dict(server) for server in ice_servers)
        return self._flush()

    def room(self, peers: tuple[str, ...], now: float) -> list[LinkCommand]:
        """A ``peers`` list: open links we offer, tear down links to peers that left."""
        self._room = tuple(peers)
        for link in [link for p, link in self._links.items() if p not in self._room]:
            self._teardown(link, "left the room", now, retry=False)
        for peer in self._room:
            if peer != self.peer_id and offers_to(self.peer_id, peer) and peer not in self._links:
                self._open(peer, now)
        return self._flush()

    def signal(self, sender: str, kind: str, payload: Any, now: float) -> list[LinkCommand]:
        """An ``offer``/``answer``/``candidate`` relayed from ``sender``."""
        link = self._links.get(sender)
        if kind == "offer" and isinstance(payload, str):
            if link is not None:  # a restarted peer starts afresh
                self._teardown(link, "re-negotiation", now, retry=False)
            link = self._new(sender, offerer=False, now=now)
            self._out.append(SetRemote(link.id, "offer", payload))
        elif link is None:
            self._note("info", f"{kind} from {sender}, which has no connection: ignored")
        elif kind == "answer" and isinstance(payload, str) and link.offerer and not link.remote_set:
            self._out.append(SetRemote(link.id, "answer", payload))
        elif kind == "candidate" and isinstance(payload, dict):
            init = {k: payload[k] for k in CANDIDATE_FIELDS if k in payload}
            if link.remote_set:
                self._out.append(AddCandidate(link.id, init))
            else:
                link.remote_candidates.append(init)
        else:
            self._note("info", f"unexpected {kind} from {sender}: ignored")
        return self._flush()

    # ------------------------------------------------------ results of commands

    def remote_set(self, link_id: int) -> list[LinkCommand]:
        """``SetRemote`` done: apply the candidates kept until now; the answerer answers."""
        link = self._live(link_id)
        if link is None:
            return []
        link.remote_set = True
        pending, link.remote_candidates = link.remote_candidates, []
        self._out.extend(AddCandidate(link.id, init) for init in pending)
        if not link.offerer:
            self._out.append(MakeAnswer(link.id))
        return self._flush()

    def local_description(self, link_id: int, sdp: str) -> list[LinkCommand]:
        """``MakeOffer``/``MakeAnswer`` done: signal the SDP, then the candidates gathered before it."""
        link = self._live(link_id)
        if link is None:
            return []
        self._out.append(SendSignal(link.peer, "offer" if link.offerer else "answer", sdp))
        link.sdp_sent = True
        pending, link.local_candidates = link.local_candidates, []
        self._out.extend(SendSignal(link.peer, "candidate", init) for init in pending)
        return self._flush()

    def local_candidate(self, link_id: int, init: Mapping[str, Any] | None) -> list[LinkCommand]:
        """A candidate we gathered (None: the end of gathering); never signalled before our SDP."""
        link = self._live(link_id)
        if link is None:
            return []
        out = {"candidate": ""} if init is None else {k: init[k] for k in CANDIDATE_FIELDS if k in init}
        if link.sdp_sent:
            return [SendSignal(link.peer, "candidate", out)]
        link.local_candidates.append(out)
        return []

    def candidate_refused(self, link_id: int, error: object) -> list[LinkCommand]:
        """A remote candidate we cannot use is not fatal: others may work."""
        link = self._by_id.get(link_id)
        peer = link.peer if link is not None else f"link {link_id}"
        return [Note("info", f"candidate from {peer} refused: {error}")]

    def setup_failed(self, link_id: int, why: str, now: float) -> list[LinkCommand]:
        """Creating, offering or answering failed: the link counts as failed."""
        link = self._live(link_id)
        if link is not None:
            self._note("warning", f"{link.peer}: {why}")
            self._teardown(link, why, now)
        return self._flush()

    def accepts_channel(self, link_id: int, label: str) -> bool:
        """The answerer takes the first channel labelled ``weei``; the host closes any other."""
        link = self._live(link_id)
        return link is not None and not link.offerer and link.writer is None and label == CHANNEL_LABEL

    def channel_open(self, link_id: int, now: float) -> list[LinkCommand]:
        """The data channel opened: new framing state, ``connected`` delivered."""
        link = self._live(link_id)
        if link is None or link.opened:
            return []
        link.writer = FrameWriter(link.peer)
        link.queue = SendQueue(link.writer, high_water=HIGH_WATER, low_water=LOW_WATER)
        link.reader = FrameReader(link.peer, has=self.has)
        link.opened = True
        self._attempts.pop(link.peer, None)
        self.errors.pop(f"channel:{link.peer}", None)
        if self._next_expire is None:
            self._next_expire = now + self.expire_every_ms
        self._note("info", f"data channel to {link.peer} open")
        self._deliver(Delivery(link.peer, "connected"))
        return self._flush()

    def link_closed(self, link_id: int, why: str, now: float) -> list[LinkCommand]:
        """The channel closed, the connection failed or closed, or a send failed."""
        link = self._live(link_id)
        if link is not None:
            self._teardown(link, why, now)
        return self._flush()

    # -------------------------------------------------------------- frames

    def send(self, send: Send, blobs: Mapping[str, bytes]) -> list[LinkCommand]:
        """Queue ``send`` for its peer; lost (and counted in ``dropped``) without an open channel."""
        link = self._links.get(send.peer)
        if link is None or link.writer is None:
            self.dropped += 1
            return [Note("info", f"dropped {send.message.TYPE} to {send.peer}: no open channel")]
        parts = [(ref, blobs[ref.sha256] if ref.sha256 in blobs else send.blobs[ref.sha256])
                 for ref in send.attachments]
        link.writer.enqueue(send.message, parts)
        self.log.append(TransferRecord(send.peer, "send", send.message.TYPE, tuple(r.sha256 for r, _ in parts),
                                       sum(r.bytes for r, _ in parts), tuple(r.kind for r, _ in parts)))
        return [Pump(link.id)]

    def frames(self, link_id: int, buffered_amount: int, now: float) -> list[bytes]:
        """What to send on the channel now, given its ``bufferedAmount``."""
        link = self._live(link_id)
        if link is None or link.queue is None or link.writer is None:
            return []
        frames = list(link.queue.pump(buffered_amount, now))
        self.bytes_sent += sum(len(frame) for frame in frames)
        self._record(link.writer.take_events())
        return frames

    def frame(self, link_id: int, data: bytes | str, now: float) -> list[LinkCommand]:
        """A message arrived on the channel (``str``: a text message, which breaks it)."""
        link = self._live(link_id)
        if link is None or link.reader is None:
            return []
        if isinstance(data, str):
            events: list[Any] = [ChannelBroken(link.peer, FrameError(FrameReason.BAD_FRAME, "a text message on the channel"))]
        else:
            self.bytes_received += len(data)
            events = link.reader.feed(data, now)
        for event in events:
            if isinstance(event, MessageReceived):
                self._deliver(Delivery(link.peer, "message", event.message, event.blobs))
            elif isinstance(event, ChannelBroken):
                self._note("warning", f"channel from {link.peer} broken: {event.error}")
                self._error(f"channel:{link.peer}", event.error)
                self._teardown(link, f"channel broken: {event.error}", now)
            else:
                self._record([event])
        return self._flush()

    # -------------------------------------------------------------- delivery

    def take(self, peer: str) -> Delivery | None:
        """The next delivery for ``peer``'s drainer; None ends the drainer (the next one wakes a new one)."""
        inbox = self._inboxes.get(peer)
        if not inbox:
            self._draining.discard(peer)
            self._inboxes.pop(peer, None)
            return None
        item = inbox.popleft()
        if item.kind == "message" and item.message is not None:
            refs = {r.sha256: r.kind for r in referenced_artifacts(item.message) if r.sha256 in item.blobs}
            self.log.append(TransferRecord(peer, "receive", item.message.TYPE, tuple(refs),
                                           sum(len(item.blobs[sha]) for sha in refs), tuple(refs.values())))
        return item

    # ----------------------------------------------------------------- time

    def handle_timer(self, now: float) -> list[LinkCommand]:
        """Connect watchdogs, retries and stall expiry that are due."""
        for link in [link for link in self._links.values() if not link.opened and link.deadline <= now]:
            self._teardown(link, f"not open after {self.connect_timeout_ms / 1000:.0f} s", now)
        for peer in [p for p, due in self._retries.items() if due <= now]:
            del self._retries[peer]
            if not self.closing and peer in self._room and peer not in self._links:
                self._open(peer, now)
        if self._next_expire is not None and self._next_expire <= now:
            readers = [link.reader for link in self._links.values() if link.reader is not None]
            for reader in readers:
                self._record(reader.expire(now, self.stall_ms))
            self._next_expire = now + self.expire_every_ms if readers else None
        return self._flush()

    def close(self, now: float) -> list[LinkCommand]:
        """Tear every link down for good: nothing more is delivered or retried."""
        self.closing = True
        for link in list(self._links.values()):
            self._teardown(link, "transport closed", now, retry=False)
        self._retries.clear()
        self._inboxes.clear()
        self._draining.clear()
        self._next_expire = None
        return self._flush()

    # ----------------------------------------------------------------- inside

    def _flush(self) -> list[LinkCommand]:
        out, self._out = self._out, []
        return out

    def _live(self, link_id: int) -> _Link | None:
        link = self._by_id.get(link_id)
        return None if link is None or link.closed else link

    def _new(self, peer: str, *, offerer: bool, now: float) -> _Link:
        link = _Link(self._next_id, peer, offerer, deadline=now + self.connect_timeout_ms)
        self._next_id += 1
        self._links[peer] = self._by_id[link.id] = link
        self._out.append(CreateLink(link.id, peer, offerer, self._ice))
        return link

    def _open(self, peer: str, now: float) -> None:
        link = self._new(peer, offerer=True, now=now)
        self._out.append(MakeOffer(link.id))

    def _teardown(self, link: _Link, why: str, now: float, *, retry: bool = True) -> None:
        """docs/peers.md 'Disconnection': close, fail open transfers, tell the receiver once."""
        if link.closed:
            return
        link.closed = True
        del self._by_id[link.id]
        if self._links.get(link.peer) is link:
            del self._links[link.peer]
        self._note("info", f"connection to {link.peer} closed: {why}")
        self._out.append(CloseLink(link.id))
        if link.reader is not None:
            self._record(link.reader.close())
        if link.writer is not None:
            self._record(link.writer.take_events())
        self.book.peer_gone(link.peer)
        if self.closing:
            return
        if link.opened:
            self._deliver(Delivery(link.peer, "disconnected"))
        if retry and offers_to(self.peer_id, link.peer) and link.peer in self._room and link.peer not in self._retries:
            attempt = self._attempts.get(link.peer, 0)
            self._attempts[link.peer] = attempt + 1
            self._retries[link.peer] = now + min(self.retry_max_ms, 1000.0 * 2.0 ** attempt)

    def _deliver(self, item: Delivery) -> None:
        self._inboxes.setdefault(item.peer, deque()).append(item)
        if item.peer not in self._draining:
            self._draining.add(item.peer)
            self._out.append(Wake(item.peer))

    def _record(self, events: list[Any]) -> None:
        for event in events:
            if isinstance(event, TransferProgress) and event.job_id is None and self.job_of is not None:
                event = replace(event, job_id=self.job_of(event.peer_id))
            if isinstance(event, TransferFailed) and event.artifact_id is None:
                self._error(f"message:{event.peer_id}", event.error)
            else:
                self.book.apply(event)
            if (isinstance(event, TransferFailed) and event.artifact_id is not None and event.direction == "receive"
                    and not self.closing):
                self._deliver(Delivery(event.peer_id, "transfer-failed", reason=event.reason,
                                       artifact=event.artifact_id))

    def _error(self, key: str, error: Any) -> None:
        self.errors[key] = f"{error.reason}: {error.message}"
        self.errors.move_to_end(key)
        while len(self.errors) > MAX_ERRORS:
            self.errors.popitem(last=False)

    def _note(self, level: str, text: str) -> None:
        self._out.append(Note(level, text))
