"""Which invitations the agent accepts: explicit, never implicit.

* ``--accept-model SHA256`` (repeatable): accept an invitation whose model
  module has exactly this SHA-256, without asking.
* ``--interactive``: show what a browser shows before it accepts and ask
  y/N on the terminal (for a module not listed by ``--accept-model``).
* Neither: refuse everything, and say why.

Nothing is downloaded before acceptance: the invitation carries only the
description; the module and data follow only after an accepting decision.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, TextIO

from ..core.errors import UsageError

__all__ = ["AcceptancePolicy", "Decision", "describe_invitation", "parse_sha256"]

_SHA = re.compile(r"[0-9a-f]{64}")


def parse_sha256(text: str) -> str:
    """A module hash from the command line (64 hex digits, any case); raises UsageError."""
    value = text.strip().lower()
    if not _SHA.fullmatch(value):
        raise UsageError("bad-sha256", f"--accept-model needs a SHA-256 of 64 hex digits, not {text!r}")
    return value


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

    def __init__(self, accept_models: Iterable[str] = (), *, interactive: bool = False,
                 ask: Callable[[str], str] | None = None, out: TextIO | None = None) -> None:
        self.accept_models = frozenset(parse_sha256(s) for s in accept_models)
        self.interactive = interactive
        self.ask = ask or _ask_terminal
        self.out = out or sys.stdout

    async def decide(self, job_id: str, invitation: Mapping[str, Any]) -> Decision:
        module = invitation.get("module") or {}
        sha = str(module.get("sha256", "")).lower()
        if sha in self.accept_models:
            return Decision(True, f"module sha256 {sha} is allowed by --accept-model")
        if self.interactive:
            print(describe_invitation(job_id, invitation), file=self.out, flush=True)
            answer = await _in_thread(self.ask, "Accept and download the module and data? [y/N] ")
            if answer is not None and answer.strip().lower() in ("y", "yes"):
                return Decision(True, "accepted on the terminal")
            return Decision(False, "refused on the terminal")
        if self.accept_models:
            listed = ", ".join(sorted(s[:12] + "…" for s in self.accept_models))
            return Decision(False, f"module sha256 {sha or 'unknown'} is not one of --accept-model ({listed})")
        return Decision(False, "the agent refuses every invitation unless --accept-model SHA256 or --interactive "
                               "is given")


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
