"""A coordinator and its participants in memory, under simulated time.

``Sim`` is this project's ``ConnectionPair`` (CONVENTIONS item 8): one
:class:`~weei.core.job.coordinator.Coordinator`, N
:class:`~weei.core.job.participant.Participant` machines, and a transport that
encodes every message to JSON text and decodes it again, resolves
attachments by SHA-256 from the sender's store into the receiver's (checking
hash and size), and loses messages to or from a disconnected peer. ``now`` is
a number the test advances; nothing reads a clock.

A fake trainer answers ``Train`` commands with deterministic synthetic
weights: the assignment's start weights plus a small delta derived from the
assignment seed. Hooks make a peer misbehave:

* ``behaviour[peer](assign, start_weights, default)`` returns a
  ``TrainOutcome`` (sent through the participant), an error string
  (``training_failed``) or ``HANG`` (never answers);
* a message to a participant that names an artifact neither attached nor in
  the participant's store is refused, as the frame reader refuses it
  (``missing-attachment``), and kept in ``refused``; the participant hears of
  it as its host tells it (``Participant.artifact_missing``);
* ``tamper[peer](message, blobs)`` rewrites what the peer puts on the wire
  to the coordinator and returns a list of ``(message, blobs)`` (empty: the
  message is lost; two items: duplicated).

With ``auto_train = False`` Train commands wait in ``pending`` until the
test finishes them (``finish``), in any order.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np

from weei.core.formats.checkpoint import Checkpoint, read_checkpoint
from weei.core.wire.framing.frames import referenced_artifacts
from weei.core.wire.commands import LoadModule, Log, RoundPhase, RunValidation, SaveCheckpoint, Send, Train
from weei.core.job.coordinator import Coordinator
from weei.core.job.spec import ChunkInfo, JobSpec, ModuleInfo
from weei.core.wire.messages import (
    ArtifactRef, Assign, Direction, Message, Update, decode_message, encode_message,
)
from weei.core.formats.modelinfo import ModelInfo
from weei.core.job.participant import Participant, TrainOutcome
from weei.core.job.round_rules import Kernel
from weei.core.formats.settings import TrainingSettings
from weei.kernel.numpy_kernel import NumpyKernel

__all__ = [
    "HANG", "JOB_ID", "COORD", "WASM", "Sim", "Delivery", "sha", "floats", "to_floats",
    "dataset_info", "experience_info", "dataset_spec", "experience_spec", "initial_weights", "roundtrip",
    "default_outcome", "rewrite_update", "replace_weights", "nan_at",
]

JOB_ID = "job-1"
COORD = "coord"
WASM = b"\x00asm\x01\x00\x00\x00" + b"synthetic model" * 8
HANG = object()
T0 = 1_700_000_000_000.0


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def floats(values: Any) -> bytes:
    return np.asarray(values, dtype="<f4").tobytes()


def to_floats(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype="<f4")


def roundtrip(message: Message) -> Message:
    """What the other side decodes: the message through JSON text."""
    return decode_message(json.loads(json.dumps(encode_message(message))))


# ------------------------------------------------------------------ specs


def dataset_info(**extra: Any) -> dict[str, Any]:
    info = {
        "id": "synthetic",
        "version": "1.0.0",
        "name": "Synthetic model",
        "abiVersion": 1,
        "weightFormat": "float32-le",
        "maxWorkers": 1,
        "maxChunkBytes": 1 << 20,
        "maxExamplesPerChunk": 10_000,
        "dataFormats": [{"id": "syn", "label": "Synthetic"}],
        "metrics": [{"id": "loss", "label": "Loss", "direction": "minimize"}],
    }
    info.update(extra)
    return info


def experience_info(aux: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    info = {
        "id": "synthetic-rl",
        "version": "1.0.0",
        "name": "Synthetic policy",
        "abiVersion": 1,
        "weightFormat": "float32-le",
        "maxWorkers": 1,
        "dataFormats": [],
        "metrics": [{"id": "episodeReturn", "label": "Episode return", "direction": "maximize"}],
        "capabilities": {"evaluation": True},
        "workSource": {
            "kind": "experience", "inputs": "none", "unit": {"id": "episode", "label": "Episodes"},
            "unitsPerAssignment": {"default": 8, "minimum": 1, "maximum": 64}, "evaluationUnits": 5,
        },
        "auxiliaryWeights": list(aux or []),
    }
    info.update(extra)
    return info


def initial_weights(n: int = 16) -> bytes:
    return floats(np.linspace(-1.0, 1.0, n))


def _settings(settings: dict[str, Any] | TrainingSettings | None, default: dict[str, Any]) -> TrainingSettings:
    if isinstance(settings, TrainingSettings):
        return settings
    return TrainingSettings.from_json({**default, **(settings or {})})


def dataset_spec(n_chunks: int = 8, *, settings: dict[str, Any] | None = None, weight_count: int = 16,
                 examples: Callable[[int], int] = lambda i: 10 + i, info: dict[str, Any] | None = None,
                 has_validation: bool = False) -> tuple[JobSpec, dict[str, bytes]]:
    """A dataset job and the coordinator's artifact store (module and chunk bytes)."""
    store = {sha(WASM): WASM}
    chunks = []
    for i in range(n_chunks):
        data = f"chunk {i:03d} ".encode() * 4
        store[sha(data)] = data
        chunks.append(ChunkInfo(f"c{i:03d}", f"train-{i:03d}.bin", len(data), sha(data), "syn", examples(i)))
    spec = JobSpec(JOB_ID, ModelInfo.from_json(info or dataset_info()), ModuleInfo("model.wasm", len(WASM), sha(WASM)),
                   _settings(settings, {"epochs": 1, "localEpochs": 1, "batchSize": 4,
                                        "coordinatorParticipates": False}),
                   weight_count * 4, tuple(chunks), has_validation=has_validation, validation_format="syn")
    return spec, store


def experience_spec(*, settings: dict[str, Any] | None = None, weight_count: int = 16,
                    aux: list[dict[str, Any]] | None = None, aux_files: dict[str, bytes] | None = None,
                    info: dict[str, Any] | None = None) -> tuple[JobSpec, dict[str, bytes]]:
    store = {sha(WASM): WASM}
    files = {}
    for slot_id, data in (aux_files or {}).items():
        store[sha(data)] = data
        files[slot_id] = ArtifactRef("auxiliary", sha(data), len(data))
    spec = JobSpec(JOB_ID, ModelInfo.from_json(info or experience_info(aux)),
                   ModuleInfo("model.wasm", len(WASM), sha(WASM)),
                   _settings(settings, {"epochs": 4, "localEpochs": 1, "batchSize": 4,
                                        "coordinatorParticipates": False}),
                   weight_count * 4, (), auxiliary_files=files)
    return spec, store


# -------------------------------------------------------------- the pair


@dataclass
class Delivery:
    """One message that reached its destination, as decoded there."""

    src: str
    dst: str
    message: Message
    attachments: tuple[ArtifactRef, ...]
    at: float


def default_outcome(assign: Assign, start: bytes) -> TrainOutcome:
    """Start weights plus a small delta that depends only on the assignment's seed."""
    w = to_floats(start).astype(np.float32)
    rng = np.random.default_rng(assign.seed)
    delta = (rng.standard_normal(w.size) * 1e-2).astype(np.float32)
    count = assign.chunk.example_count if assign.chunk is not None else assign.experience.unit_count  # type: ignore[union-attr]
    metric = "loss" if assign.chunk is not None else "episodeReturn"
    # A value whose float sum depends on the order of the terms.
    value = (assign.seed % 1_000_003) / 997.0 + 0.1
    return TrainOutcome((w + delta).astype("<f4").tobytes(), {metric: value}, count)


def trained_updates(coordinator: Coordinator, commands: list[Any]) -> list[tuple[str, Update, bytes]]:
    """Each Assign among ``commands``, trained as ``default_outcome``: (peer, its Update, the new weights)."""
    out = []
    for command in commands:
        if isinstance(command, Send) and isinstance(command.message, Assign):
            assign = command.message
            outcome = default_outcome(assign, coordinator.weights)
            ref = ArtifactRef("update", sha(outcome.weights), len(outcome.weights))
            out.append((command.peer, Update(assign.job_id, assign.round, assign.assignment_id, assign.attempt_id,
                                             assign.checkpoint.sha256, ref, dict(outcome.metrics), outcome.count),
                        outcome.weights))
    return out


@dataclass
class Sim:
    """Coordinator + participants + transport + clock. Build with ``Sim.start_job``."""

    coordinator: Coordinator
    coord_store: dict[str, bytes]
    now: float = T0
    participants: dict[str, Participant] = field(default_factory=dict)
    stores: dict[str, dict[str, bytes]] = field(default_factory=dict)
    connected: set[str] = field(default_factory=set)
    behaviour: dict[str, Callable[[Assign, bytes, TrainOutcome], Any]] = field(default_factory=dict)
    tamper: dict[str, Callable[[Message, dict[str, bytes]], list[tuple[Message, dict[str, bytes]]]]] = \
        field(default_factory=dict)
    module_fails: set[str] = field(default_factory=set)
    slow_load: set[str] = field(default_factory=set)  # their LoadModule waits in held_loads
    held_loads: list[tuple[str, LoadModule]] = field(default_factory=list)
    auto_train: bool = True
    pending: list[tuple[str, Assign]] = field(default_factory=list)
    hung: list[tuple[str, Assign]] = field(default_factory=list)
    deliveries: list[Delivery] = field(default_factory=list)
    lost: list[tuple[str, str, Message]] = field(default_factory=list)
    refused: list[tuple[str, str, Message, str]] = field(default_factory=list)  # (src, dst, message, missing sha)
    saved: list[SaveCheckpoint] = field(default_factory=list)
    validations: list[RunValidation] = field(default_factory=list)
    logs: list[tuple[str, Log]] = field(default_factory=list)
    phases: list[RoundPhase] = field(default_factory=list)
    trained: list[tuple[str, Assign]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._queue: deque[tuple[str, Send]] = deque()
        self.connected.add(self.coordinator.my_peer_id)
        if self.coordinator.spec.settings.coordinator_participates:
            self._add_local()

    # ------------------------------------------------------------ building

    @classmethod
    def create(cls, spec: JobSpec, store: dict[str, bytes], *, weights: bytes | None = None,
               job_seed: int | None = None, round_timeout_ms: float = 60_000, now: float = T0,
               dp_noise_seed: bytes | None = None, kernel: Kernel | None = None) -> Sim:
        """``kernel``: the coordinator's (default NumpyKernel); the participants compute X25519 with it too."""
        weights = weights if weights is not None else initial_weights(spec.weight_bytes // 4)
        coordinator = Coordinator.create(spec, weights, my_peer_id=COORD, kernel=kernel or NumpyKernel(), now=now,
                                         job_seed=job_seed, round_timeout_ms=round_timeout_ms,
                                         dp_noise_seed=dp_noise_seed)
        sim = cls(coordinator, dict(store), now=now)
        sim.pump()
        return sim

    @classmethod
    def start_job(cls, spec: JobSpec, store: dict[str, bytes], peers: list[str] | tuple[str, ...] = ("p1", "p2"),
                  *, start: bool = True, **kwargs: Any) -> Sim:
        """Create the job, invite and accept ``peers``, start it: round 1 is out (and trained, if auto)."""
        sim = cls.create(spec, store, **kwargs)
        for peer in peers:
            sim.join(peer)
        if start:
            sim.coordinator.start(sim.now)
            sim.pump()
        return sim

    @classmethod
    def resume(cls, spec: JobSpec, store: dict[str, bytes], checkpoint: Checkpoint, *, mode: str,
               peers: list[str] | tuple[str, ...] = ("p1", "p2"), new_job_seed: int | None = None,
               start: bool = True, now: float = T0, round_timeout_ms: float = 60_000,
               dp_noise_seed: bytes | None = None) -> Sim:
        coordinator = Coordinator.continue_from(spec, checkpoint, mode=mode, my_peer_id=COORD, kernel=NumpyKernel(),
                                         now=now, new_job_seed=new_job_seed, round_timeout_ms=round_timeout_ms,
                                         dp_noise_seed=dp_noise_seed)
        store = dict(store)
        store[sha(checkpoint.weights)] = checkpoint.weights
        sim = cls(coordinator, store, now=now)
        sim.pump()
        for peer in peers:
            sim.join(peer)
        if start:
            coordinator.start(now)
            sim.pump()
        return sim

    def _add_local(self) -> None:
        me = self.coordinator.my_peer_id
        self.participants[me] = Participant.local(me, self.coordinator.spec.job_id)
        self.stores[me] = self.coord_store  # one browser, one artifact store

    def add_peer(self, peer: str, **participant: Any) -> Participant:
        """A participant ``peer``, connected (``participant``: its constructor's keywords, a random source)."""
        self.participants[peer] = Participant(peer, **participant)
        self.stores[peer] = {}
        self.connected.add(peer)
        return self.participants[peer]

    def join(self, peer: str) -> None:
        """Invite ``peer`` and accept: it loads the module."""
        if peer not in self.participants:
            self.add_peer(peer)
        self.coordinator.invite(peer, self.now)
        self.pump()
        self.participants[peer].decide(True, self.now)
        self.pump()

    # -------------------------------------------------------------- clock

    def advance(self, ms: float) -> None:
        """``now += ms``, firing every coordinator timer that falls due on the way."""
        target = self.now + ms
        while True:
            timer = self.coordinator.next_timer()
            if timer is None or timer > target:
                break
            self.now = max(self.now, timer)
            self.coordinator.handle_timer(self.now)
            self.pump()
        self.now = target

    # ----------------------------------------------------------- network

    def disconnect(self, peer: str) -> None:
        self.connected.discard(peer)
        self.coordinator.peer_disconnected(peer, self.now)
        self.participants[peer].disconnected(self.now)
        self.pump()

    def reconnect(self, peer: str) -> None:
        self.connected.add(peer)
        self.participants[peer].reconnected(self.now)
        self.coordinator.peer_connected(peer, self.now)
        self.pump()

    def pump(self) -> None:
        """Carry out every command until nothing moves."""
        while True:
            self._drain_coordinator()
            for peer in list(self.participants):
                self._drain_participant(peer)
            if not self._queue:
                return
            while self._queue:
                src, send = self._queue.popleft()
                self._deliver(src, send)

    def _drain_coordinator(self) -> None:
        for command in self.coordinator.take_commands():
            if isinstance(command, Send):
                self._queue.append((self.coordinator.my_peer_id, command))
            elif isinstance(command, SaveCheckpoint):
                self.coord_store[command.weights_sha256] = command.weights
                self.saved.append(command)
            elif isinstance(command, RunValidation):
                self.validations.append(command)
            elif isinstance(command, Log):
                self.logs.append((self.coordinator.my_peer_id, command))
            elif isinstance(command, RoundPhase):
                self.phases.append(command)
            else:  # pragma: no cover
                raise AssertionError(f"unexpected coordinator command {command!r}")

    def _drain_participant(self, peer: str) -> None:
        participant = self.participants[peer]
        while commands := participant.take_commands():
            for command in commands:
                self._participant_command(peer, participant, command)

    def _participant_command(self, peer: str, participant: Participant, command: Any) -> None:
        if isinstance(command, Send):
            self.stores[peer].update(command.blobs)
            self._queue.append((peer, command))
        elif isinstance(command, LoadModule):
            if peer in self.slow_load:
                self.held_loads.append((peer, command))
            else:
                self._load(peer, command)
        elif isinstance(command, Train):
            participant.training_started(command.assign.attempt_id, self.now)
            if self.auto_train:
                self._train(peer, command.assign)
            else:
                self.pending.append((peer, command.assign))
        elif isinstance(command, Log):
            self.logs.append((peer, command))
        else:  # pragma: no cover
            raise AssertionError(f"unexpected participant command {command!r}")

    def _load(self, peer: str, command: LoadModule) -> None:
        store = self.stores[peer]
        assert command.module.sha256 in store, "the module must arrive before LoadModule"
        for ref in command.auxiliary.values():
            assert ref.sha256 in store, "auxiliary files arrive with the module"
        if peer in self.module_fails:
            self.participants[peer].module_failed("the module did not load", self.now)
        else:
            held = tuple(sorted(h for h in store if len(h) == 64))
            self.participants[peer].module_loaded(self.coordinator.spec.weight_bytes, held, self.now)

    def release_loads(self) -> None:
        loads, self.held_loads = self.held_loads, []
        for peer, command in loads:
            self.slow_load.discard(peer)
            self._load(peer, command)
        self.pump()

    def _train(self, peer: str, assign: Assign) -> None:
        store = self.stores[peer]
        start = store[assign.checkpoint.sha256]  # KeyError: the coordinator thought we held it
        for ref in assign.auxiliary.values():
            assert ref.sha256 in store, f"{peer} lacks auxiliary {ref}"
        if assign.chunk is not None:
            assert assign.chunk.data.sha256 in store
        self.trained.append((peer, assign))
        default = default_outcome(assign, start)
        hook = self.behaviour.get(peer)
        result = hook(assign, start, default) if hook is not None else default
        participant = self.participants[peer]
        if result is HANG:
            self.hung.append((peer, assign))
        elif isinstance(result, str):
            participant.training_failed(assign.attempt_id, result, self.now)
        else:
            participant.training_finished(assign.attempt_id, result, self.now, start=start,
                                          x25519=self.coordinator.kernel.x25519)

    def finish(self, order: list[int] | None = None) -> None:
        """Train the pending assignments (those of index ``order``, in that order; default all), pumping after each."""
        pending = self.pending
        chosen = order if order is not None else list(range(len(pending)))
        self.pending = [item for i, item in enumerate(pending) if i not in chosen]
        for i in chosen:
            peer, assign = pending[i]
            self._train(peer, assign)
            self.pump()

    def _deliver(self, src: str, send: Send) -> None:
        dst = send.peer
        if src not in self.connected or dst not in self.connected:
            self.lost.append((src, dst, send.message))
            return
        message = roundtrip(send.message)
        assert message == send.message, "encode/decode must round-trip"
        to_participant = message.DIRECTION is Direction.TO_PARTICIPANT
        sender_store = self.coord_store if to_participant else self.stores[src]
        blobs = {}
        for ref in send.attachments:
            data = sender_store[ref.sha256]
            assert sha(data) == ref.sha256 and len(data) == ref.bytes, f"attachment {ref} does not match its bytes"
            blobs[ref.sha256] = data
        if to_participant:
            missing = [ref.sha256 for ref in referenced_artifacts(message)
                       if ref.sha256 not in blobs and ref.sha256 not in self.stores[dst]]
            if missing:
                self.refused.append((src, dst, message, missing[0]))
                self.participants[dst].artifact_missing(src, missing[0], self.now)
                return
            self.stores[dst].update(blobs)
            self.deliveries.append(Delivery(src, dst, message, send.attachments, self.now))
            self.participants[dst].on_message(src, message, self.now)
            return
        assert dst == self.coordinator.my_peer_id
        outgoing = [(message, blobs)]
        hook = self.tamper.get(src)
        if hook is not None:
            outgoing = hook(message, blobs)
        for msg, bl in outgoing:
            self.deliveries.append(Delivery(src, dst, msg, tuple(send.attachments), self.now))
            self.coordinator.receive(src, roundtrip(msg), bl, self.now)
            self._drain_coordinator()

    # ------------------------------------------------------------ queries

    def messages(self, kind: type, *, dst: str | None = None, src: str | None = None) -> list[Any]:
        return [d.message for d in self.deliveries
                if isinstance(d.message, kind) and (dst is None or d.dst == dst) and (src is None or d.src == src)]

    def delivered(self, kind: type, *, dst: str | None = None) -> list[Delivery]:
        return [d for d in self.deliveries if isinstance(d.message, kind) and (dst is None or d.dst == dst)]

    def checkpoint(self, round_: int) -> Checkpoint:
        """The last saved checkpoint of ``round_``, read back from its file."""
        files = [s.file for s in self.saved if s.round == round_]
        assert files, f"no checkpoint of round {round_}"
        return read_checkpoint(files[-1])

    @property
    def rounds(self) -> list[int]:
        return [s.round for s in self.saved]

    def reasons(self) -> list[str]:
        return [r.reason.split(":")[0] for r in self.coordinator.rejected]

    def run_to_end(self, limit: int = 1000) -> None:
        """Keep finishing pending work until the job completes (or nothing moves)."""
        for _ in range(limit):
            if self.coordinator.status == "completed" or not self.pending:
                return
            self.finish()


def rewrite_update(**changes: Any) -> Callable[[Message, dict[str, bytes]], list[tuple[Message, dict[str, bytes]]]]:
    """A tamper hook that edits fields of the peer's Update messages."""

    def hook(message: Message, blobs: dict[str, bytes]) -> list[tuple[Message, dict[str, bytes]]]:
        from weei.core.wire.messages import Update
        if isinstance(message, Update):
            return [(replace(message, **changes), blobs)]
        return [(message, blobs)]

    return hook


def replace_weights(make: Callable[[bytes], bytes], *, rehash: bool = True, claim_bytes: int | None = None):
    """A tamper hook that swaps the Update's weights for ``make(weights)``."""

    def hook(message: Message, blobs: dict[str, bytes]) -> list[tuple[Message, dict[str, bytes]]]:
        from weei.core.wire.messages import Update
        if not isinstance(message, Update):
            return [(message, blobs)]
        original = blobs[message.weights.sha256]
        data = make(original)
        key = sha(data) if rehash else message.weights.sha256
        ref = ArtifactRef("update", key, claim_bytes if claim_bytes is not None else len(data))
        return [(replace(message, weights=ref), {key: data})]

    return hook


def nan_at(index: int) -> Callable[[bytes], bytes]:
    def make(data: bytes) -> bytes:
        return data[: 4 * index] + struct.pack("<f", float("nan")) + data[4 * index + 4:]

    return make
