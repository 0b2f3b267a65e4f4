"""Runs a participant state machine against a real model runtime (CPython).

Carries out ``LoadModule`` and ``Train``: load the checkpoint and auxiliary
weights into the runtime, train the chunk or unit range, hand the outcome
back to the state machine. Model failures become ``AssignmentFailed``
messages through the state machine; they never escape as exceptions.
"""

from __future__ import annotations

from typing import Any, Callable

from ..core.commands import Command, LoadModule, Log, Send, Train
from ..core.errors import WeeiError
from ..core.participant import Participant, TrainOutcome
from ..runtime import ModelRuntime
from .store import ArtifactStore

__all__ = ["ParticipantHost"]

Clock = Callable[[], float]


class ParticipantHost:
    """One participant: its state machine, artifact store and model runtime."""

    def __init__(self, peer_id: str, engine: Any, clock: Clock, store: ArtifactStore | None = None,
                 log: Callable[[str, Log], None] | None = None) -> None:
        self.peer_id = peer_id
        self.engine = engine
        self.clock = clock
        self.store = store if store is not None else ArtifactStore()
        self.participant = Participant(peer_id)
        self.runtime: ModelRuntime | None = None
        self.auxiliary: dict[str, str] = {}
        self.trained = 0
        self._log = log

    def run(self, commands: list[Command]) -> list[Send]:
        """Carry out ``commands`` (and whatever they lead to); return what must be sent."""
        out: list[Send] = []
        queue = list(commands)
        while queue:
            command = queue.pop(0)
            if isinstance(command, Send):
                for sha, data in command.blobs.items():
                    self.store.put(data, sha)
                out.append(command)
            elif isinstance(command, LoadModule):
                self._load(command)
            elif isinstance(command, Train):
                self._train(command)
            elif isinstance(command, Log):
                if self._log is not None:
                    self._log(self.peer_id, command)
            queue.extend(self.participant.take_commands())
        return out

    def _load(self, command: LoadModule) -> None:
        now = self.clock()
        try:
            wasm = self.store.get(command.module.sha256)
            self.runtime = ModelRuntime.load(wasm, self.engine)
            self.runtime.model_info()
            weight_bytes = len(self.runtime.create_initial_weights(0))
            for slot, ref in command.auxiliary.items():
                self.store.get(ref.sha256)
            self.auxiliary = {slot: ref.sha256 for slot, ref in command.auxiliary.items()}
        except WeeiError as exc:
            self.participant.module_failed(str(exc), now)
            return
        self.participant.module_loaded(weight_bytes, self.store.hashes(), now)

    def _train(self, command: Train) -> None:
        assign = command.assign
        runtime = self.runtime
        try:
            if runtime is None:
                raise WeeiError("no-module", "no model module is loaded")
            runtime.load_model(self.store.get(assign.checkpoint.sha256))
            if assign.auxiliary:
                runtime.load_auxiliary({slot: self.store.get(ref.sha256) for slot, ref in assign.auxiliary.items()})
            self.participant.training_started(assign.attempt_id, self.clock())
            if assign.chunk is not None:
                result = runtime.train(data=self.store.get(assign.chunk.data.sha256), format=assign.chunk.format,
                                       seed=assign.seed, settings=assign.settings)
            else:
                assert assign.experience is not None
                exp = assign.experience
                result = runtime.train(experience=(exp.unit_start, exp.unit_count, exp.seed),
                                       settings=assign.settings)
        except WeeiError as exc:
            self.participant.training_failed(assign.attempt_id, str(exc), self.clock())
            return
        self.trained += 1
        self.participant.training_finished(
            assign.attempt_id,
            TrainOutcome(result.weights, result.metrics, result.examples, result.optimizer_steps),
            self.clock())
