"""Compressed updates (issue 25, P8): bytes uploaded against final validation loss, and the coordinator's cost.

Quality: each model trains as ``weei demo``'s jobs do (the real coordinator
and TrainingControllers over the in-memory transport, wasmtime Workers, the
native kernel), once with float32 updates and once with each compression
kind, on the same seeds: the same initial weights, chunk order and
assignment seeds, so the runs differ only in what the updates carry.
"Bytes uploaded" are what the participants' ``update`` messages took on the
network (the frames of the message's JSON and its artifact, headers included,
as a data channel carries them; the coordinator's own participant sends
nothing over it), per update and per round. ``+deflate`` runs deflate the
codes (``compression.deflate``, lossless: the same checkpoints to the bit).

Coordinator cost: one round of the real ``Coordinator`` (its update checks,
decoding, aggregation, the next round's work), float32 against compressed
updates of the same trained weights, side by side in one run (the kinds in
turn within each repeat), best of ``--repeats`` (5) on
this process's CPU clock (a shared machine stretches the wall clock, not
that). Updates arrive as the transport hands them over, hashed on arrival
(``VerifiedBlobs``), so the hash is the transfer's, as in bench_round.

Prints ``P8`` goal lines with MET or not met.

    python bench/bench_compression.py --quick                 # digits-mlp, 1 epoch, seed 1; a 1M-weight round
    python bench/bench_compression.py                         # digits-mlp 3 epochs, byte-transformer 1, seeds 1-3
    python bench/bench_compression.py --model digits-mlp --seeds 1 2 3 --epochs 3
    python bench/bench_compression.py --model byte-transformer --seeds 1 --no-cost --kinds int8+deflate int4+deflate
    python bench/bench_compression.py --cost-only --repeats 7
"""

from __future__ import annotations

import argparse
import hashlib
import io
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench_methods import MODELS
from bench_round import INFO, _assigns, _peer
from weei.core.aggregation.compression import compress_update, layout
from weei.core.formats.checkpoint import read_checkpoint
from weei.core.formats.modelinfo import ModelInfo
from weei.core.formats.settings import CompressionSettings, TrainingSettings
from weei.core.job.coordinator import Coordinator
from weei.core.job.spec import ChunkInfo, JobSpec, ModuleInfo
from weei.core.verified import VerifiedBlobs
from weei.core.wire.messages import ArtifactRef, Update
from weei.demo.run import DemoJob, run_job
from weei.kernel.native import NativeKernel

KINDS: dict[str, dict[str, Any] | None] = {
    "float32": None,
    "int8": {"kind": "int8", "block": 256},
    "int4": {"kind": "int4", "block": 256},
    "int8+deflate": {"kind": "int8", "block": 256, "deflate": True},
    "int4+deflate": {"kind": "int4", "block": 256, "deflate": True},
}
GOALS = {"int8": 4.0, "int4": 7.0}  # times fewer bytes than float32, by code width
MAX_LOSS = 0.01  # relative final validation loss above float32's


def train(model: str, kind: str, seed: int, epochs: int) -> dict[str, Any]:
    """One job to completion: final validation loss, bytes of the participants' updates, rounds."""
    setup = MODELS[model]
    # Validated once per epoch, not every round: only the final loss is compared, and on this shared machine
    # eleven validations of the byte-transformer cost more than its training.
    settings = dict(setup.settings, epochs=epochs, aggregation={"method": "fedavg"},
                    validationSchedule={"enabled": True, "unit": "epoch", "every": 1})
    if KINDS[kind] is not None:
        settings["compression"] = KINDS[kind]
    job = DemoJob(f"compression-{model}", model, {}, peers=setup.peers, validation="validation.bin")
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        report = run_job(job, Path(tmp), stream=io.StringIO(), settings=settings, seed=seed)
        weight_bytes = len(read_checkpoint(sorted(Path(tmp).rglob("*.weei-checkpoint"))[-1].read_bytes()).weights)
    sent, updates = report.updates_sent
    rounds = max(r["round"] for r in report.rounds)
    return {"loss": report.values()[-1], "bytes": sent, "updates": updates, "rounds": rounds,
            "rejected": report.rejected, "seconds": time.monotonic() - started, "weight_bytes": weight_bytes}


def quality(model: str, seeds: list[int], epochs: int, kinds: list[str]) -> list[str]:
    print(f"\n== {model}: {MODELS[model].peers} peers, {epochs} epoch(s), FedAvg, seeds {seeds}")
    print(f"{'seed':>4} {'kind':>12} {'final loss':>11} {'vs f32':>8} {'B/update':>10} {'B/round':>11} "
          f"{'x fewer':>8} {'rejected':>8} {'s':>6}")
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in ["float32", *kinds]}
    for seed in seeds:
        for kind in runs:
            r = train(model, kind, seed, epochs)
            runs[kind].append(r)
            base = runs["float32"][-1]
            rel = r["loss"] / base["loss"] - 1
            per_update = r["bytes"] / r["updates"]
            fewer = (base["bytes"] / base["updates"]) / per_update
            print(f"{seed:>4} {kind:>12} {r['loss']:>11.5f} {rel:>+8.2%} {per_update:>10.0f} "
                  f"{r['bytes'] / r['rounds']:>11.0f} {fewer:>8.2f} {r['rejected']:>8} {r['seconds']:>6.1f}")
    f32_update = sum(r["bytes"] for r in runs["float32"]) / sum(r["updates"] for r in runs["float32"])
    overhead = f32_update - runs["float32"][0]["weight_bytes"]
    print(f"per update besides its artifact (the update message's JSON, the frame headers): {overhead:.0f} bytes, "
          f"{overhead / f32_update:.1%} of a float32 update")
    lines = []
    for kind in kinds:
        config = KINDS[kind]
        assert config is not None
        goal = GOALS[config["kind"]]
        per_update = sum(r["bytes"] for r in runs[kind]) / sum(r["updates"] for r in runs[kind])
        fewer = f32_update / per_update
        worst = max(r["loss"] / b["loss"] - 1 for r, b in zip(runs[kind], runs["float32"], strict=True))
        met = fewer >= goal and worst <= MAX_LOSS
        block = config["block"]
        ceiling = 4 / ((8 if config["kind"] == "int8" else 4) / 8 + 4 / block)  # float32 over code + scale bytes a weight
        bound = ("deflated codes: no fixed ceiling" if config.get("deflate") else
                 f"the format's ceiling at this block is {ceiling:.2f} x")
        lines.append(f"P8 {model} {kind} (block {block}): {fewer:.2f} x fewer bytes per update than float32 "
                     f"(goal >= {goal:g} x; {bound}), final validation "
                     f"loss at most {worst:+.2%} from float32's over seeds {seeds} (goal <= +{MAX_LOSS:.0%}) "
                     f"{'MET' if met else 'not met'}")
    return lines


def coordinator_round(weight_count: int, peers: int, compression: CompressionSettings | None,
                      rng_seed: int = 0) -> float:
    """CPU seconds of one round at the coordinator: every update received and checked, the round closed."""
    rng = np.random.default_rng(rng_seed)
    start = rng.standard_normal(weight_count, dtype=np.float32).tobytes()
    chunks = tuple(ChunkInfo(f"c{i}", f"c{i}.bin", 64, hashlib.sha256(bytes([i])).hexdigest(), "raw", 10)
                   for i in range(peers * 2))
    raw: dict[str, Any] = {"epochs": 1, "localEpochs": 1, "batchSize": 8, "coordinatorParticipates": False}
    if compression is not None:
        raw["compression"] = compression.to_json()
    settings = TrainingSettings.from_json(raw)
    spec = JobSpec("job", ModelInfo.from_json(INFO), ModuleInfo("m.wasm", 8, "0" * 64), settings, len(start), chunks)
    kernel = NativeKernel()
    coordinator = Coordinator.create(spec, start, my_peer_id="coord", kernel=kernel, now=0.0)
    from weei.core.wire.messages import InvitationDecision, ModuleStatus
    for i in range(peers):
        coordinator.invite(f"p{i}", 0.0)
        coordinator.receive(f"p{i}", InvitationDecision("job", True), {}, 0.0)
        coordinator.receive(f"p{i}", ModuleStatus("job", True, None, ()), {}, 0.0)
    coordinator.start(0.0)
    shape = layout(len(start), [])
    arriving = []
    for assign in _assigns(coordinator, coordinator.take_commands()):
        # Heavy-tailed, as trained deltas are (Student's t, 2 degrees of freedom), so that deflating the codes
        # makes them smaller (to 0.70 of int8's, 0.40 of int4's; digits-mlp's: 0.75, 0.73) and the deflated
        # runs pay for inflating them: a cost by the bytes it writes, the plain codes' size either way.
        trained = (np.frombuffer(start, np.float32) + rng.standard_t(2, weight_count).astype(np.float32)
                   * np.float32(0.01)).tobytes()
        data = trained if compression is None else compress_update(kernel, start, trained, compression, shape, None)[0]
        digest = hashlib.sha256(data).hexdigest()
        update = Update("job", assign.round, assign.assignment_id, assign.attempt_id, assign.checkpoint.sha256,
                        ArtifactRef("update" if compression is None else "qdelta", digest, len(data)), {"loss": 1.0}, 10)
        arriving.append((_peer(assign, coordinator), update, VerifiedBlobs.check({digest: data})))
    c0 = time.process_time()
    for peer, update, blobs in arriving:
        coordinator.receive(peer, update, blobs, 1.0)
    coordinator.take_commands()
    spent = time.process_time() - c0
    assert coordinator.checkpoint_round == 1 and not coordinator.rejected, coordinator.rejected
    return spent


def coordinator_cost(weight_counts: list[int], peers: int, repeats: int) -> list[str]:
    print(f"\n== coordinator: one round of {peers} updates, CPU ms (best of {repeats}, every kind once a repeat, "
          f"in turn), native kernel")
    compressed = [kind for kind, c in KINDS.items() if c is not None]
    print(f"{'weights':>10} {'float32':>9} " + " ".join(f"{kind:>13}" for kind in compressed) + "   (ms, x float32)")
    lines = []
    for n in weight_counts:
        # Interleaved, not one kind's repeats after another's: a load that comes and goes on a shared
        # machine then stretches every kind alike instead of whichever ran during it.
        best = dict.fromkeys(KINDS, float("inf"))
        for _ in range(repeats):
            for kind, c in KINDS.items():
                best[kind] = min(best[kind], coordinator_round(n, peers, None if c is None else CompressionSettings(**c)))
        print(f"{n:>10} {best['float32'] * 1e3:>9.1f} " + " ".join(
            f"{best[kind] * 1e3:>6.1f} {best[kind] / best['float32']:>5.2f}x" for kind in compressed))
        for kind in compressed:
            ratio = best[kind] / best["float32"]
            lines.append(f"P8 coordinator cost per {kind} update, {n} weights: {ratio:.2f} x the float32 path "
                         f"({best[kind] / peers * 1e3:.1f} vs {best['float32'] / peers * 1e3:.1f} ms of CPU per update, "
                         f"aggregation included, best of {repeats}; goal <= 1.5 x) {'MET' if ratio <= 1.5 else 'not met'}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", choices=sorted(MODELS), help="default: both")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--epochs", type=int, help="default: 3 for digits-mlp, 1 for byte-transformer")
    parser.add_argument("--quick", action="store_true", help="digits-mlp, 1 epoch, seed 1; a 1M-weight round")
    parser.add_argument("--no-cost", action="store_true", help="skip the coordinator's cost")
    parser.add_argument("--cost-only", action="store_true", help="only the coordinator's cost")
    parser.add_argument("--repeats", type=int, default=5, help="rounds of each kind for the cost (best of them)")
    parser.add_argument("--kinds", nargs="+", choices=[k for k in KINDS if k != "float32"],
                        default=[k for k in KINDS if k != "float32"], help="compressed kinds beside float32; default: all")
    args = parser.parse_args(argv)
    models = ["digits-mlp"] if args.quick else (args.model or ["digits-mlp", "byte-transformer"])
    seeds = [1] if args.quick else args.seeds
    lines = []
    for model in [] if args.cost_only else models:
        epochs = args.epochs or (1 if args.quick or model == "byte-transformer" else 3)
        lines += quality(model, seeds, epochs, args.kinds)
    if not args.no_cost:
        lines += coordinator_cost([1 << 20] if args.quick else [586_944, 1 << 22], 4, args.repeats)
    print()
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
