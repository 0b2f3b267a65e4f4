"""Runs a coordinator state machine in CPython: checkpoints to disk, validation, log.

Carries out ``SaveCheckpoint`` (the .weei-checkpoint file into ``out_dir``,
the weights into the artifact store so assignments can reference them),
``RunValidation`` (its own model runtime, with auxiliary weights loaded
after every loadModel as the spec asks) and ``Log`` (the debug log).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from ..core.commands import Command, Log, RunValidation, SaveCheckpoint, Send
from ..core.coordinator import Coordinator
from ..core.debuglog import DebugLog
from ..core.errors import WeeiError
from ..runtime import ModelRuntime
from .store import ArtifactStore

__all__ = ["CoordinatorHost"]


class CoordinatorHost:
    """The coordinator's machine: state machine, store, validation runtime, files."""

    def __init__(self, coordinator: Coordinator, runtime: ModelRuntime, store: ArtifactStore,
                 clock: Callable[[], float], *, validation: bytes | None = None,
                 out_dir: Path | None = None, on_checkpoint: Callable[[SaveCheckpoint], None] | None = None) -> None:
        self.coordinator = coordinator
        self.runtime = runtime
        self.store = store
        self.clock = clock
        self.validation = validation
        self.out_dir = out_dir
        self.on_checkpoint = on_checkpoint
        self.debug_log = DebugLog()
        self.files: list[Path] = []
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)

    def run(self, commands: list[Command]) -> list[Send]:
        """Carry out ``commands`` (and what they lead to); return what must be sent."""
        out: list[Send] = []
        queue = list(commands)
        while queue:
            command = queue.pop(0)
            if isinstance(command, Send):
                out.append(command)
            elif isinstance(command, SaveCheckpoint):
                self._save(command)
            elif isinstance(command, RunValidation):
                self._validate(command)
            elif isinstance(command, Log):
                self.debug_log.record(self.clock(), command.event, command.details or None)
            queue.extend(self.coordinator.take_commands())
        return out

    def _save(self, command: SaveCheckpoint) -> None:
        self.store.put(command.weights, command.weights_sha256)
        if self.out_dir is not None:
            # Written to a temporary name first so a crash never leaves a torn checkpoint.
            path = self.out_dir / command.summary["artifact"]["fileName"]
            tmp = path.with_suffix(".partial")
            tmp.write_bytes(command.file)
            tmp.replace(path)
            self.files.append(path)
        if self.on_checkpoint is not None:
            self.on_checkpoint(command)

    def _validate(self, command: RunValidation) -> None:
        now = self.clock()
        try:
            self.runtime.load_model(self.store.get(command.weights_sha256))
            if command.auxiliary:
                self.runtime.load_auxiliary({k: self.store.get(r.sha256) for k, r in command.auxiliary.items()})
            if command.experience is not None:
                result = self.runtime.evaluate(experience=command.experience)
            else:
                assert self.validation is not None
                fmt: Any = self.coordinator.spec.validation_format
                result = self.runtime.evaluate(data=self.validation, format=fmt)
        except WeeiError as exc:
            self.coordinator.validation_finished(command.round, None, str(exc), now)
            return
        self.coordinator.validation_finished(command.round, result.metrics, None, now)
