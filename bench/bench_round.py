"""Round overhead at the coordinator against the aggregation itself.

Round overhead: from the moment the round's last update is handed to the
coordinator state machine until the next round's work is out (checks of
that update, the aggregation, the new weights' SHA-256, the checkpoint's
checks, the next Assign commands; with 4 peers and >= 2 MiB of weights the
relay plans and pieces, each piece hashed: with the new weights, in one call
of the kernel's ``sha256_many``, on two threads here) — transfers excluded. The
checkpoint file's join (and its state's SHA-256) happens in the host's
save, which comes after those commands. Measured side by side with
``aggregate_round`` alone on the same updates, in one run, best of 3 each,
on the wall clock and on this process's CPU clock (everything measured
runs on one thread, so a loaded machine stretches the first, not the second).

The update arrives as the transport hands it over: as ``VerifiedBlobs``,
hashed while its fragments arrived (``core/wire/framing/reader.py``), so that
hash belongs to the transfer, not to the overhead. Fixed seeds.

Prints one ``P4`` line per weight count and method; the goal (issue 11):
overhead <= 1.5 x aggregation + 20 ms.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time

import numpy as np

from weei.core.aggregation.aggregate import aggregate_round
from weei.core.wire.commands import Send
from weei.core.job.coordinator import Coordinator
from weei.core.job.spec import ChunkInfo, JobSpec, ModuleInfo
from weei.core.wire.messages import ArtifactRef, Assign, InvitationDecision, ModuleStatus, Update
from weei.core.formats.modelinfo import ModelInfo
from weei.core.links.relay import piece_size, sequential_sha256, views
from weei.core.wire.messages import RelayDone, RelayPlan
from weei.core.formats.settings import TrainingSettings
from weei.core.verified import VerifiedBlobs
from weei.kernel.digests import sha256_many
from weei.kernel.native import NativeKernel

INFO = {"id": "bench", "version": "1", "name": "bench", "abiVersion": 1, "weightFormat": "float32-le",
        "maxWorkers": 1, "maxChunkBytes": 1 << 20, "maxExamplesPerChunk": 1000,
        "dataFormats": [{"id": "raw", "label": "raw", "acceptedMimeTypes": []}],
        "metrics": [{"id": "loss", "label": "Loss", "direction": "minimize"}]}


def one_round(weight_count: int, peers: int, method: str) -> tuple[float, float, float, float]:
    """Seconds of one round: (overhead, aggregation) on the wall clock, then the same on this process's CPU
    clock (which a loaded machine does not stretch: everything measured runs on this one thread)."""
    rng = np.random.default_rng(0)
    start = rng.standard_normal(weight_count, dtype=np.float32).tobytes()
    chunks = tuple(ChunkInfo(f"c{i}", f"c{i}.bin", 64, hashlib.sha256(bytes([i])).hexdigest(), "raw", 10)
                   for i in range(peers * 2))
    settings = TrainingSettings.from_json({"epochs": 1, "localEpochs": 1, "batchSize": 8,
                                           "coordinatorParticipates": False, "aggregation": {"method": method}})
    spec = JobSpec("job", ModelInfo.from_json(INFO), ModuleInfo("m.wasm", 8, "0" * 64), settings,
                   len(start), chunks)
    kernel = NativeKernel()
    coordinator = Coordinator.create(spec, start, my_peer_id="coord", kernel=kernel, now=0.0)
    names = [f"p{i}" for i in range(peers)]
    for peer in names:
        coordinator.invite(peer, 0.0)
        coordinator.receive(peer, InvitationDecision("job", True), {}, 0.0)
        coordinator.receive(peer, ModuleStatus("job", True, None, ()), {}, 0.0)
    coordinator.start(0.0)
    assigns = _assigns(coordinator, coordinator.take_commands())
    updates = []
    for assign in assigns:
        weights = (np.frombuffer(start, dtype=np.float32) + rng.standard_normal(weight_count, dtype=np.float32)
                   * np.float32(0.01)).tobytes()
        digest = hashlib.sha256(weights).hexdigest()
        update = Update("job", assign.round, assign.assignment_id, assign.attempt_id, assign.checkpoint.sha256,
                        ArtifactRef("update", digest, len(weights)), {"loss": 1.0}, 10)
        updates.append((assign, update, weights))
    for assign, update, weights in updates[:-1]:
        coordinator.receive(_peer(assign, coordinator), update, VerifiedBlobs.check({update.weights.sha256: weights}),
                            1.0)
    coordinator.take_commands()
    assign, update, weights = updates[-1]
    blobs = VerifiedBlobs.check({update.weights.sha256: weights})  # on arrival, during the transfer
    c0, t0 = time.process_time(), time.perf_counter()
    coordinator.receive(_peer(assign, coordinator), update, blobs, 2.0)
    out = coordinator.take_commands()
    overhead, overhead_cpu = time.perf_counter() - t0, time.process_time() - c0
    # The next round's work is out: its Assigns, or (a checkpoint of >= 2 MiB to >= 2 peers) the relay
    # plans and the pieces the coordinator sends itself, the Assigns following each peer's relayDone.
    assert coordinator.checkpoint_round == 1 and any(isinstance(c, Send) and isinstance(c.message, (Assign, RelayPlan))
                                                     for c in out)
    contributions = [(a.assignment_id, u.count, w) for a, u, w in updates]
    c0, t0 = time.process_time(), time.perf_counter()
    aggregate_round(kernel, start, contributions, settings.aggregation, None, None)
    aggregation, aggregation_cpu = time.perf_counter() - t0, time.process_time() - c0
    return overhead, aggregation, overhead_cpu, aggregation_cpu


def _assigns(coordinator: Coordinator, commands: list) -> list[Assign]:
    """The round's Assigns; a relayed checkpoint's targets report they hold it, which releases theirs."""
    cast = coordinator.broadcast
    if cast is not None:
        for peer in list(cast.waiting):
            coordinator.receive(peer, RelayDone("job", cast.round, cast.artifact, "coord", True), {}, 0.0)
        commands = commands + coordinator.take_commands()
    return [c.message for c in commands if isinstance(c, Send) and isinstance(c.message, Assign)]


def _peer(assign: Assign, coordinator: Coordinator) -> str:
    return next(a.peer for a in coordinator.attempts.current if a.attempt_id == assign.attempt_id)


def main() -> int:
    print(f"{'weights':>10} {'peers':>5} {'method':>8} {'overhead ms':>12} {'aggregation ms':>15} {'ratio':>6} "
          f"{'cpu: overhead':>14} {'aggregation':>12} {'ratio':>6}")
    load = os.getloadavg()[0]
    lines = []
    for weight_count in (1 << 20, 1 << 24):
        for method in ("fedavg", "fedadam"):
            runs = [one_round(weight_count, 4, method) for _ in range(3)]
            # Each figure's best of 3 (the machine is shared: the least disturbed run of each).
            overhead, aggregation, overhead_cpu, aggregation_cpu = (min(r[i] for r in runs) for i in range(4))
            print(f"{weight_count:>10} {4:>5} {method:>8} {overhead * 1e3:>12.1f} {aggregation * 1e3:>15.1f} "
                  f"{overhead / aggregation:>6.2f} {overhead_cpu * 1e3:>14.1f} {aggregation_cpu * 1e3:>12.1f} "
                  f"{overhead_cpu / aggregation_cpu:>6.2f}")
            goal = 1.5 * aggregation + 0.020
            name = {"fedavg": "FedAvg", "fedadam": "FedAdam"}[method]
            lines.append(f"P4 round overhead {weight_count >> 20}M {name}: {overhead / aggregation:.2f} x aggregation "
                         f"({overhead * 1e3:.1f} ms, aggregation {aggregation * 1e3:.1f} ms; goal <= 1.5 x + 20 ms "
                         f"= {goal * 1e3:.1f} ms; on the CPU clock {overhead_cpu * 1e3:.1f} ms vs "
                         f"{(1.5 * aggregation_cpu + 0.020) * 1e3:.1f} ms) {'MET' if overhead <= goal else 'not met'}")
    print("overhead = last update in -> next round's work out (update checks, aggregation, the new weights' "
          "SHA-256, the checkpoint file's checks, assignments or relay plans with the pieces' SHA-256; the file "
          "itself is joined by the host's save, after them); ratio = overhead / aggregation alone; best of 3 "
          "each; the verdict is on the wall clock, the CPU clock beside it is what a loaded machine leaves intact")
    print(f"load average (1 min): {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end; "
          f"{os.cpu_count()} CPUs")
    for weight_count in (1 << 20, 1 << 24):
        weights = np.random.default_rng(1).standard_normal(weight_count, dtype=np.float32).tobytes()
        pieces = views(weights, piece_size(len(weights)))
        c0, t0 = time.process_time(), time.perf_counter()
        sequential_sha256([weights, *pieces])
        one_cpu, one_wall = time.process_time() - c0, time.perf_counter() - t0
        t0 = time.perf_counter()
        sha256_many([weights, *pieces])
        many_wall = time.perf_counter() - t0
        print(f"in the overhead, {weight_count >> 20}M weights: SHA-256 of the new weights and of the relay pieces "
              f"(the plans list every piece's under the checkpoint's): {one_cpu * 1e3:.1f} ms of CPU, "
              f"{one_wall * 1e3:.1f} ms on one thread, {many_wall * 1e3:.1f} ms on the kernel's threads")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
