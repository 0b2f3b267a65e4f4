"""``weei agent``: a participant without a browser.

The agent is the browser's participant side with other adapters: a
``TrainingController`` whose peer ID comes from the signaling server, disk
storage (``storage.py``), a wasmtime Worker pool, the native aggregation
kernel, and the aiortc transport (``transport.py``). It joins a room, lets
the acceptance policy (``policy.py``) decide every invitation (the
controller then asks the coordinator to prove the room key before it
accepts, ``api/room_check.py``), trains what it accepted, and stays for
the next job until SIGINT or SIGTERM, when it leaves the job it is in,
closes its connections and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, TextIO

from .. import __version__
from ..api.controller import TrainingController
from ..api.ports import StorageError
from ..api.records import record_artifacts
from ..core.errors import UsageError, WeeiError
from ..core.wire.messages import Invitation, Message
from ..core.links.room_proof import ProofVerdict
from ..core.wire.signaling_session import room_code
from .signaling_client import SignalingClient
from .keep import DEFAULT_DISK_BUDGET_MIB, DiskClaims, KeepRefusal
from .policy import AcceptancePolicy, CoordinatorTrust, Decision
from .storage import DiskKeyValue, DiskStorage

if TYPE_CHECKING:
    from .transport import AgentTransport

__all__ = ["AgentOptions", "Agent", "MAX_DECISIONS_KEPT", "agent_environment", "default_data_dir", "add_arguments",
           "run_cli"]

#: The decisions ``Agent.decisions`` keeps, the newest: an agent hears invitations for as long as it runs.
MAX_DECISIONS_KEPT = 64

_TOKEN_KEY = "weei.agent.signalingToken:"
# Participant states passed every round: not worth a line each ('assigned' marks each round).
_QUIET_STATES = frozenset({"training", "updateReady", "resultReceived"})
#: What the agent waits for in a participant state, said with the state.
_WAITS_FOR = {
    "approved": "waiting for the model module from the coordinator",
    "modelLoaded": "waiting for an assignment (the coordinator starts the job, or hands out the next round)",
    "assigned": "waiting for the assignment's files",
    "disconnected": "waiting for the coordinator to reconnect",
    "stopped": "waiting for the next invitation",
}


def assignment_line(trained: dict[str, Any]) -> str:
    """One line per trained assignment: round, chunk, examples, time, loss (or the first metric)."""
    metrics = trained.get("metrics") or {}
    name = "loss" if "loss" in metrics else next(iter(metrics), None)
    work = f"chunk {trained['chunkId']}" if trained.get("chunkId") else "episodes"
    metric = f" · {name} {metrics[name]:.4g}" if name is not None else ""
    return (f"round {trained['round']} · {work} · {trained['examples']} examples · {trained['ms'] / 1000:.1f} s{metric}"
            " · update sent; waiting for the round's merge")



def default_data_dir() -> Path:
    """``$XDG_DATA_HOME/weei/agent`` (``~/.local/share/weei/agent``)."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "weei" / "agent"


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "unknown"


def agent_environment() -> dict[str, Any]:
    """The diagnostics ``environment`` of an agent: 'agent' where a browser puts its name."""
    return {
        "browser": "agent",
        "browserVersion": f"weei-agent {__version__} (CPython {platform.python_version()}, "
                          f"aiortc {_version('aiortc')}, wasmtime {_version('wasmtime')})",
        "os": platform.platform()[:200],
        "logicalCores": os.cpu_count() or 1,
    }


@dataclass(frozen=True)
class AgentOptions:
    server: str  # the signaling WebSocket URL, e.g. ws://host:8000/signal
    room: str
    data_dir: Path
    accept_models: tuple[str, ...] = ()
    interactive: bool = False
    trust: CoordinatorTrust = CoordinatorTrust()
    """Whose invitations ``accept_models`` may accept (policy.py: a module hash alone accepts nothing)."""
    workers: int | None = None  # local Workers; default: every core
    backend: str = "auto"  # backendPreference: auto (a hardware GPU only), cpu, gpu (any adapter)
    memory_limit_mib: int | None = None  # a model module's memory cap (weei.runtime.sandbox); default 1 GiB
    disk_budget_mib: int = DEFAULT_DISK_BUDGET_MIB  # the most a coordinator's files may take on disk (keep.py)
    name: str | None = None  # the display name the room sees (default "Weei agent on <OS>"; core/observe/peer_names.py)


def restrict_host_addresses(addresses: tuple[str, ...]) -> None:
    """Gather ICE host candidates on ``addresses`` only (for this whole process: aioice keeps
    the choice in a module function)."""
    import aioice.ice

    v4 = [a for a in addresses if ":" not in a]
    v6 = [a for a in addresses if ":" in a]
    aioice.ice.get_host_addresses = lambda use_ipv4, use_ipv6: (v4 if use_ipv4 else []) + (v6 if use_ipv6 else [])


class Agent:
    """One agent: ``await start()``, then it works by itself until ``await close()``."""

    def __init__(self, options: AgentOptions, *, policy: AcceptancePolicy | None = None,
                 out: TextIO | None = None, engine: Any = None) -> None:
        self.options = options
        self.out = out or sys.stdout
        self.policy = policy or AcceptancePolicy(options.accept_models, trust=options.trust,
                                                 interactive=options.interactive, out=self.out)
        self._senders: dict[str, str] = {}  # job ID -> the peer its invitation came from
        self.engine = engine
        self.storage = DiskStorage(Path(options.data_dir) / "storage")
        self.kv = DiskKeyValue(Path(options.data_dir) / "kv.json")
        self.transport: AgentTransport | None = None
        self.controller: TrainingController | None = None
        self.decisions: dict[str, Decision] = {}  # job ID -> this agent's decision, the newest MAX_DECISIONS_KEPT
        self._deciding: dict[str, asyncio.Task[None]] = {}  # job ID -> its decision, while its invitation is pending
        self.disk = DiskClaims(options.disk_budget_mib << 20)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._last_state: tuple[Any, ...] | None = None
        self._last_error: str | None = None
        self._peers: tuple[str, ...] = ()
        self._said_trained: str | None = None  # the attempt whose line was printed last

    @property
    def peer_id(self) -> str | None:
        return self.transport.peer_id if self.transport is not None else None

    def say(self, text: str) -> None:
        print(f"[weei agent] {text}", file=self.out, flush=True)

    async def start(self) -> None:
        """Connect to signaling, build the controller, join the room.

        Raises SignalingError (or aiohttp/OS errors) when the server cannot be reached or refuses.
        """
        from ..host.worker_pool import ThreadWorkerPool
        from ..kernel.native import NativeKernel
        from ..runtime.wasmtime_engine import WasmtimeEngine
        from .transport import AgentTransport  # aiortc is imported only when an agent runs

        opts = self.options
        token_key = _TOKEN_KEY + opts.server
        # The resume token keeps this agent's peer ID across restarts (while the server keeps its secret).
        signaling = SignalingClient(opts.server, token=self.kv.get(token_key), room=opts.room)
        self.transport = AgentTransport(signaling, on_change=self._on_transport_change)
        welcome = await self.transport.connect()
        engine = self.engine or (WasmtimeEngine(memory_limit_bytes=opts.memory_limit_mib << 20)
                                 if opts.memory_limit_mib else WasmtimeEngine())
        controller = TrainingController(
            my_peer_id=welcome.peer_id, storage=self.storage, kv=self.kv,
            pool=ThreadWorkerPool(engine, device_limit=opts.workers), kernel=NativeKernel(), engine=engine,
            clock=lambda: time.time() * 1000.0, monotonic=lambda: time.monotonic() * 1000.0,
            random_bytes=os.urandom, transport=self.transport, environment=agent_environment(), gpu=_wgpu(Path(opts.data_dir)),
            room_key=opts.room, accept_archive=self._accept_archive)
        await controller.init()
        if opts.workers is not None:
            await controller.set_max_local_workers(opts.workers)
        await controller.set_backend_preference(opts.backend)
        if opts.name is not None:
            await controller.set_display_name(opts.name)
        self.controller = controller
        if controller.peer_events.room_check is not None:
            controller.peer_events.room_check.listeners.append(self._on_room_proof)
        controller.peer_events.on_release = self._keep  # held until a restored coordinator proved the key
        self.transport.attach(self, has=controller.holds, job_of=controller.job_with)
        self.transport.on_peer_id = controller.peer_id_changed
        controller.subscribe(self._on_state)
        peers = await self.transport.join(opts.room)
        if signaling.token is not None:
            self.kv.set(token_key, signaling.token)  # bound to this room now
        self.say(f"peer {welcome.peer_id} joined room {room_code(opts.room)} on {opts.server} "
                 f"({len(peers) - 1} other peer(s); data in {opts.data_dir}); waiting for an invitation")
        if not self.policy.accept_models and not self.policy.interactive:
            self.say("no --accept-model or --interactive: every invitation will be refused")
        elif self.policy.accept_models and not self.policy.trust.anyone and not self.policy.interactive:
            self.say("--accept-model without --trust-room or --accept-coordinator: every invitation will be refused")

    def _accept_archive(self, sha256: str) -> bool:
        decision = self.policy.archive_decision(sha256)
        if not decision.accepted:
            self.say(decision.reason)
        return decision.accepted

    # ------------------------------------------------------- the transport's receiver

    async def on_peer_message(self, peer: str, message: Message, blobs: Mapping[str, bytes]) -> None:
        controller = self.controller
        if controller is None:
            return
        if not controller.peer_events.holds_back(peer):  # else kept only once its coordinator proved the key
            await self._keep(peer, message, blobs)
        before = controller.invitations.get(message.job_id) if isinstance(message, Invitation) else None
        await controller.on_peer_message(peer, message, blobs)
        if isinstance(message, Invitation) and controller.invitations.get(message.job_id) is not before:
            self._senders[message.job_id] = peer  # the invitation the controller kept came from this peer
        pending = controller.invitations
        for job_id in pending:
            if job_id not in self._deciding:
                self._deciding[job_id] = self._spawn(self._decide(job_id))
        self._forget_decided(pending)

    def _forget_decided(self, pending: Mapping[str, Any]) -> None:
        """Drop what was kept to decide the invitations no longer pending: anyone in the room may invite, for
        as long as the agent runs. One still pending once decided (the controller refused the decision) stays,
        so that it is not decided again."""
        for job_id in [j for j, task in self._deciding.items() if task.done() and j not in pending]:
            del self._deciding[job_id]
        for job_id in [j for j in self._senders if j not in pending and j not in self._deciding]:
            del self._senders[job_id]

    async def _keep(self, peer: str, message: Message, blobs: Mapping[str, bytes]) -> None:
        """Store on disk, before acting on it, what the accepted job asks for (keep.py); refuse the rest."""
        controller = self.controller
        verdict = self.disk.judge(controller.participant if controller is not None else None, peer, message, blobs)
        for refusal in verdict.refused:
            if refusal.first:
                self._refused(refusal)
        for ref in verdict.keep:
            try:
                await self.storage.put("artifacts", ref.sha256, blobs[ref.sha256])
            except StorageError:
                self.disk.released(ref.sha256)
                raise
        for sha in verdict.stale:
            await self.storage.delete("artifacts", sha)
        if verdict.stale:
            await self.storage.collect_garbage()

    def _refused(self, refusal: KeepRefusal) -> None:
        """Said once per peer and reason: a peer sending junk must not flood the output or the debug log."""
        self.say(f"not storing files from peer {refusal.peer}: {refusal.reason}: {refusal.detail}")
        if self.controller is not None:
            self.controller.session.record("disk.refused", {
                "from": refusal.peer, "reason": str(refusal.reason), "kind": refusal.ref.kind,
                "sha256": refusal.ref.sha256, "bytes": refusal.ref.bytes, "detail": refusal.detail[:200]})

    async def collect_garbage(self) -> int:
        """Delete the files on disk that the current participation does not claim (those of a job that ended,
        another job's, an older version's) and that no saved job names; returns how many files went."""
        controller = self.controller
        claimed = self.disk.claimed(controller.participant if controller is not None else None)
        named = {sha for record in controller.store.saved_jobs.values()
                 for sha in record_artifacts(record)} if controller is not None else set()
        removed = 0
        for sha in await self.storage.keys("artifacts"):
            if sha not in claimed and sha not in named:
                await self.storage.delete("artifacts", sha)
                self.disk.released(sha)
                removed += 1
        return removed + await self.storage.collect_garbage()

    async def peer_disconnected(self, peer: str) -> None:
        if self.controller is not None:
            await self.controller.peer_disconnected(peer)

    async def peer_connected(self, peer: str) -> None:
        if self.controller is not None:
            await self.controller.peer_connected(peer)

    async def transfer_failed(self, peer: str, reason: str, artifact: str = "") -> None:
        if self.controller is not None:
            await self.controller.transfer_failed(peer, reason, artifact)

    async def _decide(self, job_id: str) -> None:
        controller = self.controller
        assert controller is not None
        invitation = controller.invitations[job_id]["invitation"]
        decision = await self.policy.decide(job_id, invitation, self._senders.get(job_id, ""))
        if job_id in controller.invitations:
            try:  # accepting first asks the coordinator to prove the room key (api/room_check.py)
                # A refusal says why to the coordinator too: its window shows "declined: <rule>".
                await controller.decide_invitation(job_id, decision.accepted,
                                                   None if decision.accepted else decision.reason)
            except UsageError as exc:  # room-proof-*: declined, nothing downloaded
                decision = Decision(False, f"{exc.reason}: {exc.message}")
        self.decisions.pop(job_id, None)
        self.decisions[job_id] = decision  # the newest last
        while len(self.decisions) > MAX_DECISIONS_KEPT:
            del self.decisions[next(iter(self.decisions))]
        if job_id not in controller.invitations:
            self._deciding.pop(job_id, None)
            self._senders.pop(job_id, None)
        self.say(f"{'accepted' if decision.accepted else 'refused'} job {job_id} from "
                 f"{invitation.get('coordinator')}: {decision.reason}")

    def _on_room_proof(self, verdict: ProofVerdict) -> None:
        reason = f"{verdict.reason}: " if verdict.reason is not None else ""
        self.say(f"job {verdict.job_id}: {reason}{verdict.message}")

    # ---------------------------------------------------------------- reporting

    def _on_transport_change(self) -> None:
        if self.transport is None:
            return
        peers = tuple(self.transport.peers())
        if peers != self._peers:
            for peer in sorted(set(peers) - set(self._peers)):
                self.say(f"connected to peer {peer}")
            for peer in sorted(set(self._peers) - set(peers)):
                self.say(f"disconnected from peer {peer}")
            self._peers = peers

    def _on_state(self, state: dict[str, Any]) -> None:
        controller = self.controller
        participant = controller.participant if controller is not None else None
        if participant is None or participant.job_id is None:
            return
        key = (participant.job_id, participant.state)
        if key != self._last_state:
            self._last_state = key
            if participant.state not in _QUIET_STATES:
                waits = _WAITS_FOR.get(participant.state)
                self.say(f"job {participant.job_id}: {participant.state}" + (f"; {waits}" if waits else ""))
        trained = controller.session.last_trained if controller is not None else None
        if trained is not None and trained["attemptId"] != self._said_trained:
            self._said_trained = trained["attemptId"]
            self.say(f"job {participant.job_id}: {assignment_line(trained)}")
        error = state.get("error")
        if error and error != self._last_error:
            self.say(f"error: {error}")
        self._last_error = error

    # ------------------------------------------------------------------ closing

    async def close(self) -> None:
        """Leave the current job (telling the coordinator), close every connection."""
        controller, transport = self.controller, self.transport
        for task in list(self._tasks):
            task.cancel()
        if controller is not None and controller.participant is not None and \
                controller.participant.state not in ("stopped", "declined", "unknown", "invited"):
            try:
                await controller.leave()
                self.say("left the job")
            except WeeiError as exc:
                self.say(f"could not leave the job cleanly: {exc}")
            if transport is not None:
                await transport.flush(2.0)
        if transport is not None:
            await transport.close()
        self.say("closed")

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task


# -------------------------------------------------------------------- command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``weei agent`` options."""
    parser.add_argument("--server", default=None,
                        help="signaling WebSocket URL, e.g. ws://host:8000/signal (default: the invite link's server)")
    parser.add_argument("--room", required=True, metavar="INVITE",
                        help="the invite link (http://host:port/#room=KEY, as weei serve prints it) or the room key")
    parser.add_argument("--accept-model", action="append", default=[], metavar="SHA256",
                        help="accept invitations whose model module has this SHA-256, and run a job's WGSL "
                             "archive on the GPU only if its SHA-256 is listed too (repeatable)")
    parser.add_argument("--trust-room", action="store_true",
                        help="--accept-model accepts invitations from any coordinator in the room (every member "
                             "entered with the invite link's key; a coordinator proves the key before the agent "
                             "accepts)")
    parser.add_argument("--accept-coordinator", action="append", default=[], metavar="PEER_ID",
                        help="--accept-model accepts invitations from this coordinator (repeatable)")
    parser.add_argument("--interactive", action="store_true",
                        help="show each other invitation and ask y/N on the terminal")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help=f"where records and artifacts are kept (default {default_data_dir()})")
    parser.add_argument("--workers", type=int, default=None, help="local training Workers (default: every core)")
    parser.add_argument("--backend", choices=("auto", "cpu", "gpu"), default="auto",
                        help="train jobs that have a WGSL archive on this machine's GPU (wgpu: Vulkan, Metal, D3D12): "
                             "auto uses a hardware adapter only, gpu any adapter (lavapipe too), cpu never "
                             "(default: auto)")
    parser.add_argument("--name", default=None, help="the name the room's peers see this agent by "
                        "(default: 'Weei agent on <OS>'; shown with an agent marker)")
    parser.add_argument("--memory-limit-mib", type=int, default=None, metavar="MIB",
                        help="the most linear memory a model module may use on this machine; each task gets "
                             "its package's estimatedWorkingBytes plus inputs and headroom, up to this "
                             "(default: 1024)")
    parser.add_argument("--disk-budget-mib", type=int, default=DEFAULT_DISK_BUDGET_MIB, metavar="MIB",
                        help="the most the files of the job the agent takes part in may take on its disk; files "
                             "past it are not stored (training goes on from memory), and nothing from another peer "
                             f"is ever stored (default: {DEFAULT_DISK_BUDGET_MIB})")
    parser.add_argument("--ice-host", action="append", default=[], metavar="ADDRESS",
                        help="offer WebRTC host candidates on these local addresses only (repeatable; "
                             "default: every interface)")


def run_cli(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Run ``weei agent`` until SIGINT/SIGTERM: 0 on a clean stop, 1 when it cannot start, 2 for bad options."""
    import logging

    from ..server.invite import parse_invite
    from .policy import parse_peer_id, parse_sha256

    out = out or sys.stdout
    try:
        models = tuple(parse_sha256(s) for s in args.accept_model)
        trust = CoordinatorTrust(frozenset(parse_peer_id(p) for p in args.accept_coordinator), args.trust_room)
        invite = parse_invite(args.room)
    except WeeiError as exc:
        print(f"weei agent: {exc.message}", file=sys.stderr)
        return 2
    server = args.server or invite.signal_url
    if server is None:
        print("weei agent: --server is needed with a bare room key (or give the invite link)", file=sys.stderr)
        return 2
    if args.workers is not None and not 1 <= args.workers <= 64:
        print("weei agent: --workers must be 1 to 64", file=sys.stderr)
        return 2
    if args.memory_limit_mib is not None and not 16 <= args.memory_limit_mib <= 4096:
        print("weei agent: --memory-limit-mib must be 16 to 4096", file=sys.stderr)
        return 2
    if not 0 <= args.disk_budget_mib <= 1 << 30:
        print("weei agent: --disk-budget-mib must be 0 to 2**30", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.ice_host:
        restrict_host_addresses(tuple(args.ice_host))
    options = AgentOptions(server=server, room=invite.key, data_dir=args.data_dir or default_data_dir(),
                           accept_models=models, trust=trust, interactive=args.interactive, workers=args.workers,
                           backend=args.backend, memory_limit_mib=args.memory_limit_mib,
                           disk_budget_mib=args.disk_budget_mib, name=args.name)
    return asyncio.run(_run(options, out))


async def _run(options: AgentOptions, out: TextIO) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    agent = Agent(options, out=out)
    start = asyncio.ensure_future(agent.start())
    stopping = asyncio.ensure_future(stop.wait())
    code = 0
    try:
        await asyncio.wait({start, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if start.done():
            start.result()  # raises if the agent could not start
            await stopping
        else:
            start.cancel()
            with _suppress_all():
                await start
        agent.say("stopping (signal received)")
    except Exception as exc:
        print(f"weei agent: cannot start: {exc}", file=sys.stderr)
        code = 1
    finally:
        stopping.cancel()
        await agent.close()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
    return code


class _suppress_all:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, value: Any, tb: Any) -> bool:
        return kind is not None and issubclass(kind, BaseException) and not issubclass(kind, KeyboardInterrupt)


def _wgpu(data_dir: Path) -> Any:
    """wgpu-py's ``gpu`` object, or None where wgpu (or its native library) is missing."""
    if not os.environ.get("XDG_RUNTIME_DIR"):
        # The Vulkan loader's Wayland surface support prints "error: XDG_RUNTIME_DIR is invalid or not set"
        # on every adapter request of a headless machine; a private empty directory makes it find no
        # display quietly (the agent draws nothing).
        runtime = data_dir / "runtime"
        runtime.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.environ["XDG_RUNTIME_DIR"] = str(runtime)
    try:
        import wgpu
    except Exception:  # not installed, or no wgpu-native for this platform
        return None
    return wgpu.gpu
