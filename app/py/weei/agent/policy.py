"""Which invitations the agent accepts: explicit, never implicit.

An invitation is accepted without asking only when both *what* and *who*
are allowed (a module hash alone is not enough: anyone who can reach the
agent could otherwise spend its compute on that module):

* what: ``--accept-model SHA256`` (repeatable), the model module's exact
  SHA-256;
* who (:class:`CoordinatorTrust`): ``--accept-coordinator PEER_ID``
  (repeatable), the coordinator's key -- its peer ID, which the signaling
  server assigned and only its holder can resume (the resume token is bound
  to the room and expires, docs/signaling.md) -- or ``--trust-room``: any
  coordinator in the agent's room, where every member entered with the
  room key of the invite link (the server checked it at each join).

Whatever accepts, the controller then asks the coordinator to prove the
room key before the acceptance goes out (``api/room_check.py``): the
server's gatekeeping alone is not trusted with the agent's compute, and a
coordinator that cannot prove the key is declined with a ``room-proof-*``
reason.

The coordinator is the peer the invitation came from; an invitation that
names another coordinator than its sender is refused. ``--interactive``
shows what a browser shows before it accepts and asks y/N on the terminal
for anything the rules do not accept. Otherwise everything is refused, and
the reason says which rule is missing.

Nothing is downloaded before acceptance: the invitation carries only the
description; the module and data follow only after an accepting decision.

A job with a WGSL archive announces it only after the acceptance (in
Deliver), and the archive is code too, run on the GPU: it is fetched and run
only when its SHA-256 is listed in ``--accept-model`` as well
(:meth:`AcceptancePolicy.archive_decision`); otherwise the accepted job
trains on the CPU (``archive-not-accepted``), however the invitation was
accepted.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, TextIO

from ..core.errors import UsageError, UsageReason

__all__ = ["AcceptancePolicy", "CoordinatorTrust", "Decision", "describe_invitation", "parse_peer_id", "parse_sha256"]

_SHA = re.compile(r"[0-9a-f]{64}")
_PEER_ID = re.compile(r"[a-z2-7]{26}")


def parse_sha256(text: str) -> str:
    """A module hash from the command line (64 hex digits, any case); raises UsageError."""
    value = text.strip().lower()
    if not _SHA.fullmatch(value):
        raise UsageError(UsageReason.BAD_SHA256, f"--accept-model needs a SHA-256 of 64 hex digits, not {text!r}")
    return value


def parse_peer_id(text: str) -> str:
    """A coordinator's peer ID from the command line (26 base32 characters); raises UsageError."""
    value = text.strip().lower()
    if not _PEER_ID.fullmatch(value):
        raise UsageError(UsageReason.BAD_PEER_ID, f"--accept-coordinator needs a peer ID of 26 base32 characters, not {text!r}")
    return value


@dataclass(frozen=True)
class CoordinatorTrust:
    """Whose invitations may be accepted without asking: these peer IDs, and/or anyone in the room."""

    peers: frozenset[str] = frozenset()
    room: bool = False

    def allows(self, coordinator: str) -> bool:
        return self.room or coordinator in self.peers

    @property
    def anyone(self) -> bool:
        """Whether some coordinator can be trusted at all."""
        return self.room or bool(self.peers)


@dataclass(frozen=True)
class Decision:
    accepted: bool
    reason: str


def _size(n: Any) -> str:
    if not isinstance(n, int):
        return "unknown size"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit} ({n:,} bytes)"
    return f"{n} bytes"


def describe_invitation(job_id: str, invitation: Mapping[str, Any]) -> str:
    """What the browser's invitation card shows, as terminal text."""
    info = invitation.get("modelInfo") or {}
    module = invitation.get("module") or {}
    settings = invitation.get("settings") or {}
    lines = [
        f"Invitation to job {job_id}",
        f"  from coordinator  {invitation.get('coordinator', 'unknown')}",
        f"  model             {info.get('name', 'unnamed')} (id {info.get('id', 'unknown')}, "
        f"version {info.get('version', 'unknown')})",
        f"  module            {module.get('fileName', 'model.wasm')}, {_size(module.get('bytes'))}",
        f"  module sha256     {module.get('sha256', 'unknown')}",
        f"  data              {_size(invitation.get('dataBytes'))} in total",
        "  settings          " + json.dumps(settings, sort_keys=True, separators=(", ", ": ")),
    ]
    return "\n".join(lines)


class AcceptancePolicy:
    """Decides one invitation at a time (``decide``)."""

    def __init__(self, accept_models: Iterable[str] = (), *, trust: CoordinatorTrust = CoordinatorTrust(),
                 interactive: bool = False, ask: Callable[[str], str] | None = None,
                 out: TextIO | None = None) -> None:
        self.accept_models = frozenset(parse_sha256(s) for s in accept_models)
        self.trust = trust
        self.interactive = interactive
        self.ask = ask or _ask_terminal
        self.out = out or sys.stdout

    def archive_decision(self, sha256: str) -> Decision:
        """Whether an accepted job's WGSL archive may run on this machine's GPU."""
        sha = sha256.lower()
        if sha in self.accept_models:
            return Decision(True, f"WGSL archive sha256 {sha} is allowed by --accept-model")
        return Decision(False, f"WGSL archive sha256 {sha} is not one of --accept-model: the job trains on the CPU "
                               f"(--accept-model {sha} lets it use the GPU)")

    async def decide(self, job_id: str, invitation: Mapping[str, Any], sender: str) -> Decision:
        """Accept or refuse ``invitation``, which came from peer ``sender``."""
        module = invitation.get("module") or {}
        sha = str(module.get("sha256", "")).lower()
        if invitation.get("coordinator") != sender:
            return Decision(False, f"the invitation names coordinator {str(invitation.get('coordinator'))[:40]!r} "
                                   f"but came from {sender}")
        model_ok = sha in self.accept_models
        if model_ok and self.trust.allows(sender):
            who = "--trust-room" if self.trust.room else "--accept-coordinator"
            return Decision(True, f"module sha256 {sha} is allowed by --accept-model, coordinator {sender} by {who}")
        if self.interactive:
            print(describe_invitation(job_id, invitation), file=self.out, flush=True)
            answer = await _in_thread(self.ask, "Accept and download the module and data? [y/N] ")
            if answer is not None and answer.strip().lower() in ("y", "yes"):
                return Decision(True, "accepted on the terminal")
            return Decision(False, "refused on the terminal")
        if model_ok:
            return Decision(False, f"coordinator {sender} is not trusted: --accept-model needs --trust-room or "
                                   "--accept-coordinator PEER_ID too")
        if self.accept_models:
            listed = ", ".join(sorted(s[:12] + "…" for s in self.accept_models))
            return Decision(False, f"module sha256 {sha or 'unknown'} is not one of --accept-model ({listed})")
        return Decision(False, "the agent refuses every invitation unless --accept-model SHA256 (with --trust-room "
                               "or --accept-coordinator PEER_ID) or --interactive is given")


def _ask_terminal(prompt: str) -> str:
    try:
        return input(prompt)
    except EOFError:
        return ""


async def _in_thread(fn: Callable[[str], str], prompt: str) -> str | None:
    """Run a blocking prompt in a daemon thread: a Ctrl-C at the prompt must not hang the exit."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[str | None] = loop.create_future()

    def run() -> None:
        try:
            result: str | None = fn(prompt)
        except Exception:
            result = None
        loop.call_soon_threadsafe(lambda: future.done() or future.set_result(result))

    threading.Thread(target=run, name="weei-agent-prompt", daemon=True).start()
    return await future
