"""The ``Transport`` port over any WebRTC stack: runs :class:`weei.core.links.peerlink.LinkManager` on asyncio.

Theory of operation
-------------------
:class:`LinkTransport` is what the agent's aiortc adapter
(``weei.agent.transport``) and the page's ``RTCPeerConnection`` adapter
(``weei.browser.rtc``) have in common: it reads signaling events, feeds them
to the link manager with the time, carries out its commands through a few
platform primitives (the abstract ``_create``, ``_set_remote``,
``_add_candidate``, ``_signal``, ``_buffered``, ``_send_frame``, ``_close``,
``_state``; offers and answers go through the W3C ``RTCPeerConnection``
methods both platforms share) and hands deliveries to the receiver. It
decides nothing itself.

* Session setup is serialised by one lock: signaling events and the commands
  that await the platform (``MakeOffer``, ``SetRemote``, ``MakeAnswer``,
  ``AddCandidate``, ``SendSignal``) run under it, in order, so an answer
  never races a re-offer. Commands produced outside it (a platform event, a
  timer) run at once up to the first such command; the rest waits for the
  lock in a task (tasks take the lock in the order they were made).
* A platform operation is abandoned when its link closes, and bounded by the
  connect timeout: a closed ``RTCPeerConnection`` never settles the
  operations still queued on it, and one such promise awaited under the lock
  would stall every later signaling event of this transport for good.
* One timer handle follows :meth:`LinkManager.next_timer`.
* ``Wake(peer)`` starts one drainer task for that peer: each peer's
  deliveries reach the receiver in arrival order, and a slow receiver never
  blocks the platform's event handlers nor another peer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Protocol, TypeVar

from ..core.wire.commands import Send
from ..core.errors import WeeiError
from ..core.wire.messages import Message
from ..core.links.peerlink import LinkManager
from ..core.links.peerlink_commands import (AddCandidate, CloseLink, LinkCommand, CreateLink, Delivery, MakeAnswer, MakeOffer,
                                      Note, Pump, SendSignal, SetRemote, TransferRecord, Wake)
from ..core.wire.signaling_session import Closed, Peers, ServerError, Signal, Welcome

__all__ = ["LinkTransport", "Receiver"]

_ASYNC = (MakeOffer, SetRemote, MakeAnswer, AddCandidate, SendSignal)
_SETUP = {MakeOffer: "offer", SetRemote: "remote description", MakeAnswer: "answer"}
_T = TypeVar("_T")


class _LinkGone(Exception):
    """The link closed while the platform was still working on it: nothing is left to do."""


class Receiver(Protocol):
    """Who gets what arrives: a TrainingController, or anything shaped like one (``peer_connected`` and
    ``transfer_failed(peer, reason, artifact)`` optional)."""

    async def on_peer_message(self, peer: str, message: Message, blobs: Mapping[str, bytes]) -> None: ...

    async def peer_disconnected(self, peer: str) -> None: ...


def now_ms() -> float:
    """The link manager's clock (monotonic ms)."""
    return time.monotonic() * 1000.0


class LinkTransport:
    """docs/peers.md on asyncio; a subclass supplies the WebRTC primitives. See the module docstring."""

    logger = logging.getLogger("weei.link")

    def __init__(self, signaling: Any, *, connect_timeout_s: float = 30.0,
                 on_change: Callable[[], None] | None = None) -> None:
        self.signaling = signaling
        self.on_change = on_change
        #: Told the new peer ID when a later welcome names another one than the first (the server's secret
        #: changed, or another tab resumed ours): the receiver must not go on showing the old one.
        self.on_peer_id: Callable[[str], None] | None = None
        self.links = LinkManager(connect_timeout_ms=connect_timeout_s * 1000.0)
        self.connect_timeout_s = connect_timeout_s
        self._receiver: Any = None
        self._handles: dict[int, Any] = {}  # link number -> the platform's objects
        self._gone: dict[int, asyncio.Future[None]] = {}  # link number -> done when it closes
        self._setup = asyncio.Lock()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._drainers: dict[str, asyncio.Task[None]] = {}
        self._timer: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------ the port

    @property
    def peer_id(self) -> str | None:
        return self.links.peer_id

    @property
    def log(self) -> deque[TransferRecord]:
        """Messages sent and received (the newest 10,000), for tests and operators."""
        return self.links.log

    @property
    def dropped(self) -> int:
        return self.links.dropped

    @property
    def bytes_sent(self) -> int:
        return self.links.bytes_sent

    @property
    def bytes_received(self) -> int:
        return self.links.bytes_received

    def attach(self, receiver: Any, has: Callable[[str, int], bool] | None = None,
               job_of: Callable[[str], str | None] | None = None) -> None:
        """Deliver to ``receiver``; ``has(sha256, size)`` says which artifacts it already holds (dedupe),
        ``job_of(peer)`` which job this device shares with a peer (the jobId of incoming transfers)."""
        self._receiver = receiver
        self.links.has = has
        self.links.job_of = job_of

    def peers(self) -> list[str]:
        """Peers with an open channel."""
        return self.links.peers()

    def send(self, send: Send, blobs: Mapping[str, bytes]) -> None:
        """Queue ``send`` for its peer (synchronous); lost, and counted in ``dropped``, without an open channel."""
        self._apply(self.links.send(send, blobs))

    def transfers_state(self) -> dict[str, Any]:
        """``{"transfers": [...], "transferErrors": {id: "reason: message"}}`` for ``getState()``."""
        return self.links.transfers_state()

    def describe(self) -> dict[str, str]:
        """Each link's state, for messages, logs and test failures."""
        return {peer: "open" if is_open else self._state(self._handles.get(link))
                for peer, (link, is_open) in self.links.links().items()}

    def send_raw(self, peer: str, frames: list[bytes]) -> None:
        """Frames straight onto ``peer``'s open channel, past the writer (tests use it to misbehave)."""
        link, _ = self.links.links()[peer]
        for frame in frames:
            self._send_frame(self._handles[link], frame)

    async def wait_for_peer(self, peer: str, timeout: float) -> None:
        """Wait until ``peer`` has an open channel; raises TimeoutError naming it."""
        deadline = time.monotonic() + timeout
        while peer not in self.peers():
            if time.monotonic() > deadline:
                raise TimeoutError(f"no open data channel to peer {peer} after {timeout:.0f} s "
                                   f"(links: {self.describe()})")
            await asyncio.sleep(0.02)

    async def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every open channel has sent everything queued; False on timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            buffered = [self._buffered(self._handles.get(link)) for link, _ in self.links.links().values()]
            if not self.links.pending() and not any(buffered):
                return True
            await asyncio.sleep(0.02)
        return False

    # ------------------------------------------------------------ lifecycle

    def _welcomed(self, welcome: Welcome | None) -> None:
        if welcome is not None:
            previous = self.links.peer_id
            self._apply(self.links.welcomed(welcome.peer_id, welcome.ice_servers, now_ms()))
            if previous is not None and previous != welcome.peer_id and self.on_peer_id is not None:
                self.logger.warning("signaling gave this peer a new ID: %s (was %s)", welcome.peer_id, previous)
                self.on_peer_id(welcome.peer_id)

    def _listen(self) -> None:
        self._spawn(self._events())

    def _shutdown(self) -> None:
        """Stop the tasks and tear every link down; nothing more is delivered."""
        current = asyncio.current_task()
        for task in [*self._tasks, *self._drainers.values()]:
            if task is not current:
                task.cancel()
        self._drainers.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._apply(self.links.close(now_ms()))

    async def _events(self) -> None:
        while not self.links.closing:
            try:
                event = await self.signaling.next_event(3600)
            except (TimeoutError, asyncio.TimeoutError):
                continue
            try:
                async with self._setup:
                    if isinstance(event, Peers):
                        await self._run(self.links.room(event.peers, now_ms()))
                    elif isinstance(event, Signal):
                        await self._run(self.links.signal(event.sender, event.kind, event.payload, now_ms()))
                    elif isinstance(event, Welcome):
                        self._welcomed(event)
                    elif isinstance(event, ServerError):
                        self.logger.warning("signaling refused a frame: %s %s", event.reason, event.message)
                    elif isinstance(event, Closed):
                        self._signaling_closed(event)
            except asyncio.CancelledError:
                raise
            except Exception:  # one bad signal must not stop the transport
                self.logger.exception("signaling event %s failed", type(event).__name__)

    def _signaling_closed(self, event: Closed) -> None:
        """The signaling socket closed; open channels keep working. Subclasses reconnect if their client does not."""
        self.logger.warning("signaling closed (%s %s)", event.code, event.reason)

    # -------------------------------------------------- platform events in

    def _platform(self, link: int, what: str, arg: Any = None) -> None:
        """An event of link ``link``'s objects: ``open``, ``frame`` (arg: bytes or str), ``low``
        (bufferedamountlow), ``closed`` (arg: why), ``candidate`` (arg: init or None)."""
        if what == "open":
            self._apply(self.links.channel_open(link, now_ms()))
        elif what == "frame":
            self._apply(self.links.frame(link, arg, now_ms()))
        elif what == "low":
            self._pump(link)
        elif what == "closed":
            self._apply(self.links.link_closed(link, arg, now_ms()))
        elif what == "candidate":
            self._apply(self.links.local_candidate(link, arg))

    # ------------------------------------------------------- commands out

    def _apply(self, commands: list[LinkCommand]) -> None:
        """Carry out ``commands`` outside the setup lock (see the module docstring)."""
        for i, command in enumerate(commands):
            if isinstance(command, _ASYNC):
                self._spawn(self._locked(commands[i:]))
                break
            self._now(command)
        self._rearm()

    async def _locked(self, commands: list[LinkCommand]) -> None:
        async with self._setup:
            await self._run(commands)

    async def _run(self, commands: list[LinkCommand]) -> None:
        """Carry out ``commands`` in order, awaiting the platform (under the setup lock)."""
        for command in commands:
            if isinstance(command, _ASYNC):
                await self._await(command)
            else:
                self._now(command)
        self._rearm()

    async def _await(self, command: LinkCommand) -> None:
        if isinstance(command, SendSignal):
            try:
                await self._signal(command.peer, command.kind, command.payload)
            except Exception as exc:  # the peer connection recovers through its watchdog and the re-offer
                self.logger.warning("%s to %s not signalled: %s", command.kind, command.peer, exc)
            return
        handle = self._handles.get(command.link)
        if handle is None:  # the link is gone meanwhile
            return
        try:
            if isinstance(command, AddCandidate):
                try:
                    await self._platform_call(command.link, self._add_candidate(handle, command.init))
                except _LinkGone:
                    return
                except Exception as exc:
                    await self._run(self.links.candidate_refused(command.link, exc))
            elif isinstance(command, SetRemote):
                await self._platform_call(command.link, self._set_remote(handle, command.kind, command.sdp))
                await self._run(self.links.remote_set(command.link))
            else:
                kind = "offer" if isinstance(command, MakeOffer) else "answer"
                sdp = await self._platform_call(command.link, self._local_description(handle, kind))
                await self._run(self.links.local_description(command.link, sdp))
        except asyncio.CancelledError:
            raise
        except _LinkGone:
            return
        except Exception as exc:
            what = _SETUP.get(type(command), type(command).__name__)
            await self._run(self.links.setup_failed(command.link, f"{what} failed: {exc}", now_ms()))

    async def _platform_call(self, link: int, operation: Coroutine[Any, Any, _T]) -> _T:
        """``operation``'s result; raises _LinkGone if ``link`` closes first, TimeoutError after the connect
        timeout (see the module docstring)."""
        gone = self._gone.get(link)
        if gone is None:
            operation.close()  # never started: nothing to cancel, no "never awaited" warning
            raise _LinkGone()
        task = asyncio.ensure_future(operation)
        try:
            done, _ = await asyncio.wait({task, gone}, timeout=self.connect_timeout_s,
                                         return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            raise
        if task in done:
            return task.result()
        task.cancel()
        if gone in done:
            raise _LinkGone()
        raise TimeoutError(f"the platform did not answer in {self.connect_timeout_s:.0f} s")

    def _now(self, command: LinkCommand) -> None:
        if isinstance(command, Pump):
            self._pump(command.link)
        elif isinstance(command, Wake):
            if command.peer not in self._drainers:
                self._drainers[command.peer] = asyncio.ensure_future(self._drain(command.peer))
        elif isinstance(command, Note):
            (self.logger.warning if command.level == "warning" else self.logger.info)("%s", command.text)
        elif isinstance(command, CreateLink):
            self._handles[command.link] = self._create(command)
            self._gone[command.link] = asyncio.get_event_loop().create_future()
            self._changed()
        elif isinstance(command, CloseLink):
            gone = self._gone.pop(command.link, None)
            if gone is not None and not gone.done():
                gone.set_result(None)
            handle = self._handles.pop(command.link, None)
            if handle is not None:
                self._close(handle)
            self._changed()

    def _pump(self, link: int) -> None:
        handle = self._handles.get(link)
        buffered = self._buffered(handle) if handle is not None else None
        if buffered is None:  # no channel, or not open (any more)
            return
        try:
            for frame in self.links.frames(link, buffered, now_ms()):
                self._send_frame(handle, frame)
        except Exception as exc:  # the channel closed under us
            self._apply(self.links.link_closed(link, f"send failed: {exc}", now_ms()))

    def _rearm(self) -> None:
        due = self.links.next_timer()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if due is not None and not self.links.closing:
            # A millisecond late: the loop's clock may run a hair ahead of time.monotonic().
            delay = max(0.0, (due - now_ms()) / 1000.0) + 0.001
            self._timer = asyncio.get_event_loop().call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._apply(self.links.handle_timer(now_ms()))

    # ------------------------------------------------------------- delivery

    async def _drain(self, peer: str) -> None:
        try:
            while (item := self.links.take(peer)) is not None:
                await self._hand(item)
                self._changed()
        finally:
            # Nothing awaited since take() said None: a later Wake starts a new drainer.
            if self._drainers.get(peer) is asyncio.current_task():
                del self._drainers[peer]

    async def _hand(self, item: Delivery) -> None:
        receiver = self._receiver
        if receiver is None:
            return
        try:
            if item.kind == "message":
                await receiver.on_peer_message(item.peer, item.message, item.blobs)
            elif item.kind == "transfer-failed":
                hook = getattr(receiver, "transfer_failed", None)  # optional for a receiver
                if hook is not None:
                    await hook(item.peer, item.reason, item.artifact)
            elif item.kind == "connected":
                hook = getattr(receiver, "peer_connected", None)  # optional for a receiver
                if hook is not None:
                    await hook(item.peer)
            else:
                await receiver.peer_disconnected(item.peer)
        except asyncio.CancelledError:
            raise
        except WeeiError as exc:
            self.logger.warning("delivering %s from %s failed: %s", item.kind, item.peer, exc)
        except Exception:
            self.logger.exception("delivering %s from %s failed", item.kind, item.peer)

    # ----------------------------------------------------------------- helpers

    def _changed(self) -> None:
        if self.on_change is not None:
            try:
                self.on_change()
            except Exception:
                self.logger.exception("on_change failed")

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ----------------------------------------------- the platform's primitives

    def _create(self, command: CreateLink) -> Any:
        """A peer connection (and, for the offerer, the channel) whose events go to ``_platform(link, ...)``."""
        raise NotImplementedError

    @staticmethod
    async def _local_description(handle: Any, kind: str) -> str:
        """createOffer/createAnswer + setLocalDescription on ``handle.pc`` (aiortc's mirrors the W3C API; its
        setLocalDescription returns once ICE gathering is done); the local SDP."""
        pc = handle.pc
        await pc.setLocalDescription(await (pc.createOffer() if kind == "offer" else pc.createAnswer()))
        return str(pc.localDescription.sdp)

    async def _set_remote(self, handle: Any, kind: str, sdp: str) -> None:
        raise NotImplementedError

    async def _add_candidate(self, handle: Any, init: dict[str, Any]) -> None:
        """Raises when the platform refuses the candidate."""
        raise NotImplementedError

    async def _signal(self, peer: str, kind: str, payload: Any) -> None:
        raise NotImplementedError

    def _buffered(self, handle: Any) -> int | None:
        """The channel's bufferedAmount; None unless it is open."""
        raise NotImplementedError

    def _send_frame(self, handle: Any, frame: bytes) -> None:
        raise NotImplementedError

    def _close(self, handle: Any) -> None:
        """Detach the handlers, close the peer connection, release the platform's objects."""
        raise NotImplementedError

    def _state(self, handle: Any) -> str:
        """``connectionState/channel readyState`` of a link that is not open."""
        raise NotImplementedError
