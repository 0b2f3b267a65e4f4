"""Commands the state machines emit for their host to carry out.

The host (browser page, agent, in-memory demo) drains them in order. None
of them carries a decision: the state machines decided already; the host
only moves bytes, persists and runs the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Iterable

from ..formats.checkpoint import CheckpointFile
from .messages import ArtifactRef, Assign, Message

__all__ = [
    "Send",
    "SaveCheckpoint",
    "RunValidation",
    "Log",
    "RoundPhase",
    "LoadModule",
    "Train",
    "Command",
    "Outbox",
]


@dataclass(frozen=True)
class Send:
    """Send ``message`` to ``peer``; first deliver the ``attachments`` it names.

    The host resolves each attachment's bytes from its artifact store by
    SHA-256 (module, chunks, checkpoint weights, updates).
    """

    peer: str
    message: Message
    attachments: tuple[ArtifactRef, ...] = ()
    # Bytes this machine produced (an update's weights; a relayed checkpoint's
    # pieces, read-only views into it): the host stores them under their
    # SHA-256 before it resolves the attachments.
    blobs: dict[str, bytes | memoryview] = field(default_factory=dict)


@dataclass(frozen=True)
class SaveCheckpoint:
    """Persist a new checkpoint. ``file`` is the complete .weei-checkpoint.

    The coordinator emits it after the next round's work, and the file is
    joined (its state hashed) only when the host first reads ``file``: its
    checks have passed already, and the participants train meanwhile. The
    host holds ``weights`` in memory from the moment it takes the command,
    for the Assigns sent before the file is written.
    """

    round: int
    checked: CheckpointFile = field(repr=False)
    weights_sha256: str
    summary: dict[str, Any]  # spec CheckpointSummary

    @property
    def weights(self) -> bytes:
        return self.checked.weights

    @property
    def state(self) -> bytes | None:
        return self.checked.state

    @cached_property
    def file(self) -> bytes:
        return self.checked.join()


@dataclass(frozen=True)
class RunValidation:
    """Evaluate the checkpoint of ``round`` on the validation file or evaluation episodes."""

    round: int
    weights_sha256: str
    experience: tuple[int, int, int] | None = None  # unit_start, unit_count, seed
    auxiliary: dict[str, ArtifactRef] = field(default_factory=dict)


@dataclass(frozen=True)
class Log:
    """A debug-log event (spec TrainingDebugLogFile.events)."""

    event: str
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RoundPhase:
    """A finished phase of a round for the debug log's baseline (``DebugLog.round_phase``).

    ``started`` and ``finished`` are readings of the host's monotonic clock
    (ms), which the coordinator reads through its ``stopwatch`` port.
    """

    round: int
    name: str  # 'round.training', the aggregation method ('fedavg', 'fedavgm', 'fedadam'), or 'secagg'
    started: float
    finished: float


@dataclass(frozen=True)
class LoadModule:
    """Participant: load the module and auxiliary files that arrived with Deliver."""

    module: ArtifactRef
    auxiliary: dict[str, ArtifactRef]


@dataclass(frozen=True)
class Train:
    """Participant: train ``assign`` (its artifacts are in the store) and report back."""

    assign: Assign


Command = Send | SaveCheckpoint | RunValidation | Log | RoundPhase | LoadModule | Train


class Outbox:
    """Commands emitted and not yet taken, in order: append only.

    What a state machine emitted is decided; it plans (relays, the order of
    a checkpoint's save) before it emits, never by rewriting what is here.
    """

    __slots__ = ("_commands",)

    def __init__(self) -> None:
        self._commands: list[Command] = []

    def append(self, command: Command) -> None:
        self._commands.append(command)

    def extend(self, commands: Iterable[Command]) -> None:
        self._commands.extend(commands)

    def take(self) -> list[Command]:
        """Everything emitted since the last take, in order."""
        out, self._commands = self._commands, []
        return out

    def __len__(self) -> int:
        return len(self._commands)
