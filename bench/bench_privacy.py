"""What client-level differential privacy costs: digits-mlp and the byte-transformer at ε ∈ {8, 4, 1}
(δ = 1e-5) against no DP, same seeds, side by side in one run.

Each run is one job of ``weei demo``'s kind (the real coordinator and
TrainingControllers over the in-memory transport, wasmtime Workers, the native
aggregation kernel), so DP goes through the product's own path: settings
``privacy.dp``, the participants' clip, the coordinator's clip and seeded
noise, the accountant's ε in every checkpoint. For every seed all runs start
from the same weights and train the same chunks in the same order (the
coordinator's random source is a function of the seed; the noise seed is drawn
after everything else, so it changes nothing else).

The plan per model: the no-DP run first; its rounds R fix ``maxRounds`` and its
deltas fix the clip C (the median L2 norm of a round's averaged delta
‖w_r − w_{r−1}‖ over the run: a typical update is at least that long, so the clip
bites); then a clip-only run (σ = 0: what clipping and the unweighted mean cost
alone) and, for each target ε, the σ that spends exactly ε after R rounds
(``dp_accountant.noise_multiplier_for``). Printed and written to
``out/bench/privacy.{json,md}``: final validation loss and metric, their
ratios to no DP, the ε each job's last checkpoint reports, and ‖noise‖/C =
σ·√d/n, the noise added to the average against the largest clipped delta
(d weights, n participants a round): above 1 the noise drowns every update.

    python bench/bench_privacy.py                          # both models, 1 epoch each, seed 1
    python bench/bench_privacy.py --quick                  # digits-mlp only
    python bench/bench_privacy.py --epochs 3 --seeds 1 2   # longer

``--secagg`` measures secure aggregation instead: the same job (5 peers, the
coordinator one of them; clip 1000, so nothing is clipped and the two jobs'
validation must agree to the fixed-point grid) plain and with
``privacy.secureAggregation``, side by side, same seed: the median round time
(checkpoint to checkpoint, round 1 left out: it loads the module), their
ratio, and the secure-aggregation messages and bytes per remote participant
per round against the plain update's: messages sent and received apiece,
bytes split into the masked vector's (O(d)) and the keys' and shares' (O(n)),
and the coordinator's messages a round. ``--peers 3 5 8 12`` measures the
same at each count of peers (every round has all of them: see ``_job``), and
ends with a MET / not met line per goal: at most 2 × plain's round time at
n = 5, by the wall clock and by CPU; the messages per participant a round
the same at every n (a least-squares slope over n beside them), and how
many bytes each added peer costs a participant. Every peer runs in this one process,
so each participant's masking work, like its training, is serialized with the
others': in a browser each does its own in parallel. Written to
``out/bench/secagg.{json,md}``. ``--repeat N`` runs the pair N times, plain
and secure in turn, and takes each side's median over all its rounds: on a
shared machine one run's median of a few rounds moves with the load.

``--noise-at`` measures where the noise is added instead: the same plan with
secure aggregation on, each target ε run twice, ``privacy.dp.noiseAt``
"coordinator" (σ·C on the unmasked sum) and "participants" (each adds
σ·C/√t before masking, so the sum of k >= t carries σ·C·√(k/t)), same
seed; written to ``out/bench/privacy-noise-at.{json,md}``. The participants'
noise comes from their own random sources: unlike the coordinator's rows,
those rows differ from run to run.

    python bench/bench_privacy.py --noise-at --model digits-mlp --seeds 1 2

    python bench/bench_privacy.py --secagg --quick         # digits-mlp
    python bench/bench_privacy.py --secagg                 # digits-mlp and the byte-transformer
    python bench/bench_privacy.py --secagg --model digits-mlp --epochs 5 --repeat 5
    python bench/bench_privacy.py --secagg --model digits-mlp --epochs 5 --seeds 1 2 3 --repeat 3 --peers 3 5 8 12
"""

from __future__ import annotations

import argparse
import io
import json
import math
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, TextIO

import numpy as np

from weei.core.formats.checkpoint import read_checkpoint
from weei.core.formats.jsonfmt import descriptor
from weei.core.formats.settings import DEFAULT_SECAGG_THRESHOLD
from weei.core.privacy.dp_accountant import noise_multiplier_for
from weei.demo.run import DemoJob, models_dir, run_job

ROOT = Path(__file__).resolve().parents[1]
DELTA = 1e-5
EPSILONS = (8.0, 4.0, 1.0)
_VALIDATE = {"validationSchedule": {"enabled": True, "unit": "round", "every": 1}, "coordinatorParticipates": True}
#: (participants per round, settings): bench_methods.py's setups
MODELS: dict[str, tuple[int, dict[str, Any]]] = {
    "digits-mlp": (4, {"localEpochs": 1, "batchSize": 16, **_VALIDATE}),
    "byte-transformer": (5, {"localEpochs": 1, "batchSize": 8, **_VALIDATE}),
}


def _run(model: str, settings: dict[str, Any], seed: int, log: TextIO) -> dict[str, Any]:
    peers, _ = MODELS[model]
    job = DemoJob(f"privacy-{model}", model, {}, peers=peers, validation="validation.bin")
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        report = run_job(job, Path(tmp), stream=log, settings=settings, seed=seed, flat=True)
        checkpoints = sorted((read_checkpoint(p.read_bytes()) for p in Path(tmp).glob("*.weei-checkpoint")),
                             key=lambda c: c.metadata.round)
    rounds = sorted(report.rounds, key=lambda r: r["round"])
    weights = [np.frombuffer(c.weights, "<f4").astype(np.float64) for c in checkpoints]
    last = checkpoints[-1].metadata.to_json()
    return {
        "rounds": len(rounds) - 1,
        "validation": rounds[-1]["validation"],
        "firstValidation": rounds[0]["validation"],
        "deltaNorms": [float(np.linalg.norm(b - a)) for a, b in zip(weights, weights[1:])],
        "epsilon": last.get("privacy", {}).get("dp", {}).get("epsilon"),
        "recordedNoiseAt": last.get("privacy", {}).get("dp", {}).get("noiseAt"),  # where the checkpoint says
        "weights": len(checkpoints[-1].weights) // 4,
        "seconds": round(time.monotonic() - started, 1),
    }


#: One DP run of a comparison: its name, σ, the ε it targets (None: clip only), and where the noise is added
#: under secure aggregation (None: no secure aggregation, the noise at the coordinator).
Plan = tuple[str, float, "float | None", "str | None"]


def _dp_plans(rounds: int) -> list[Plan]:
    return [("clip only", 0.0, None, None)] + [(f"ε={e:g}", noise_multiplier_for(e, rounds, DELTA), e, None)
                                               for e in EPSILONS]


def _noise_at_plans(rounds: int) -> list[Plan]:
    return [(f"ε={e:g}, {where}", noise_multiplier_for(e, rounds, DELTA), e, where)
            for e in EPSILONS for where in ("coordinator", "participants")]


def compare(model: str, seed: int, epochs: int, log: TextIO,
            plans: Callable[[int], list[Plan]] = _dp_plans) -> dict[str, Any]:
    """The model's job without DP, then each of ``plans(rounds)``, the clip C the median delta norm without DP."""
    _, settings = MODELS[model]
    settings = dict(settings, epochs=epochs)
    plain = _run(model, settings, seed, log)
    rounds, clip = plain["rounds"], statistics.median(plain["deltaNorms"])
    runs = [{"name": "no DP", "sigma": None, "target": None, **plain}]
    for name, sigma, target, where in plans(rounds):
        dp: dict[str, Any] = {"clip": clip, "noiseMultiplier": sigma, "delta": DELTA, "maxRounds": rounds}
        privacy: dict[str, Any] = {"dp": dp}
        run: dict[str, Any] = {"name": name, "sigma": sigma, "target": target}
        if where is not None:
            dp["noiseAt"] = run["noiseAt"] = where
            privacy["secureAggregation"] = True
        runs.append({**run, **_run(model, dict(settings, privacy=privacy), seed, log)})
    return {"model": model, "seed": seed, "epochs": epochs, "clip": clip, "rounds": rounds, "runs": runs,
            "participants": MODELS[model][0], "weights": plain["weights"]}


def _noise_scale(run: dict[str, Any], participants: int) -> float:
    """The sum's noise in units of σ·C: 1 from the coordinator, √(n/t) from n participants at threshold t."""
    if run.get("noiseAt") != "participants":
        return 1.0
    return math.sqrt(participants / max(2, math.ceil(DEFAULT_SECAGG_THRESHOLD * participants)))


SECAGG_TYPES = ("secaggKeys", "secaggRoster", "secaggShares", "secaggSharesFor", "secaggMasked", "secaggUnmask",
                "secaggReveal")
#: The one secure-aggregation message of O(d) bytes: the masked vector. The others carry keys and shares.
SECAGG_VECTOR = "secaggMasked"
SECAGG_PEERS = 5
#: --peers: every peer runs in this process, so a few dozen is already minutes a job.
MAX_BENCH_PEERS = 64


def _job(model: str, peers: int, folder: Path) -> DemoJob:
    """The model's job on ``peers`` peers, with a chunk for each of them in every round.

    An epoch's rounds take a chunk per peer until its chunks run out, so with
    K chunks the last round of each epoch has K mod n participants. When n
    does not divide K the package is copied into ``folder`` with its chunks
    repeated, in order, up to the next multiple of n (digits-mlp's 15 chunks
    of 100 examples: 16 for 8 peers, 24 for 12): every participant still
    trains one chunk of the same size a round, and every round has n.
    """
    package = models_dir() / model
    manifest = json.loads((package / "manifest.json").read_text())
    chunks = manifest["inlineJson"]["dataset-manifest.json"]
    if len(chunks) % peers == 0:
        return DemoJob(f"secagg-{model}", model, {}, peers=peers, validation="validation.bin")
    (folder / "data").mkdir(parents=True)
    shutil.copy(package / "model.wasm", folder / "model.wasm")
    for name in {c["fileName"] for c in chunks} | {"validation.bin"}:
        shutil.copy(package / "data" / name, folder / "data" / name)
    extended = list(chunks)
    for i in range(len(chunks), -(-len(chunks) // peers) * peers):
        copy = dict(chunks[i % len(chunks)], id=f"chunk-{i + 1:03d}-copy", fileName=f"copy-{i + 1:03d}.bin")
        shutil.copy(package / "data" / chunks[i % len(chunks)]["fileName"], folder / "data" / copy["fileName"])
        extended.append(copy)
    manifest["inlineJson"]["dataset-manifest.json"] = extended
    size, sha = descriptor(extended)
    manifest["execution"]["datasetManifest"].update(bytes=size, sha256=sha)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return DemoJob(f"secagg-{model}", model, {}, peers=peers, validation="validation.bin", package=folder,
                   data=folder / "data")


def _timed(job: DemoJob, settings: dict[str, Any], seed: int, log: TextIO) -> dict[str, Any]:
    cpu = time.process_time()
    with tempfile.TemporaryDirectory() as tmp:
        report = run_job(job, Path(tmp), stream=log, settings=settings, seed=seed, flat=True)
    cpu = time.process_time() - cpu
    rounds = sorted(report.rounds, key=lambda r: r["round"])
    short = [r["round"] for r in rounds[1:] if r["peers"] != job.peers]
    if short:  # the per-participant figures below divide by rounds × (n - 1)
        raise RuntimeError(f"{job.model} on {job.peers} peers: rounds {short} had fewer participants")
    return {"rounds": len(rounds) - 1, "seconds": [r["seconds"] for r in rounds[2:] or rounds[1:]],
            "cpuSeconds": cpu, "validation": rounds[-1]["validation"], "traffic": report.traffic,
            "routes": report.routes}


def _pooled(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The first run, with the median round time over every run's rounds and the median CPU time of a job."""
    return dict(runs[0], roundSeconds=statistics.median(s for run in runs for s in run["seconds"]),
                cpuSeconds=statistics.median(run["cpuSeconds"] for run in runs))


def per_participant(routes: dict[tuple[str, str, str], tuple[int, int]], rounds: int) -> dict[str, Any]:
    """A secure job's secure-aggregation traffic per remote participant and round, as the network carried it.

    Every message counts at the peer that sent it and at the one it went to,
    whoever that is (a message from one participant to another would count at
    both). ``spread``: the largest difference between two participants' counts.
    """
    secagg = {route: v for route, v in routes.items() if route[2] in SECAGG_TYPES}
    remote = sorted({peer for src, dst, _ in secagg for peer in (src, dst)} - {"coordinator"})

    def of(peer: str, pick: Any, field: int) -> float:
        return sum(v[field] for (src, dst, kind), v in secagg.items() if pick(peer, src, dst, kind)) / rounds

    sent = [of(p, lambda p, s, d, k: s == p, 1) for p in remote]
    received = [of(p, lambda p, s, d, k: d == p, 1) for p in remote]
    vector = [of(p, lambda p, s, d, k: p in (s, d) and k == SECAGG_VECTOR, 0) for p in remote]
    keys_shares = [of(p, lambda p, s, d, k: p in (s, d) and k != SECAGG_VECTOR, 0) for p in remote]
    by_type = {kind: statistics.mean(of(p, lambda p, s, d, k, kind=kind: p in (s, d) and k == kind, 0) for p in remote)
               for kind in SECAGG_TYPES}
    coordinator = sum(c for (src, dst, _), (_, c) in secagg.items() if "coordinator" in (src, dst)) / rounds
    return {"participants": len(remote), "sent": statistics.mean(sent), "received": statistics.mean(received),
            "spread": max(max(sent) - min(sent), max(received) - min(received)),
            "vectorBytes": statistics.mean(vector), "keySharesBytes": statistics.mean(keys_shares),
            "bytesByType": by_type, "coordinatorMessages": coordinator}


def compare_secagg(model: str, seed: int, epochs: int, log: TextIO, repeat: int = 1,
                   peers: int = SECAGG_PEERS) -> dict[str, Any]:
    """One model's round time and traffic on ``peers`` peers, plain FedAvg against secure aggregation, same seed,
    ``repeat`` times."""
    _, settings = MODELS[model]
    settings = dict(settings, epochs=epochs, coordinatorParticipates=True)
    plains, secures = [], []
    with tempfile.TemporaryDirectory() as tmp:
        job = _job(model, peers, Path(tmp))
        for _ in range(repeat):
            plains.append(_timed(job, settings, seed, log))
            secures.append(_timed(job, dict(settings, privacy={"secureAggregation": True, "clip": 1000}), seed, log))
    plain, secure = _pooled(plains), _pooled(secures)
    traffic = per_participant(secure["routes"], secure["rounds"])
    if traffic["participants"] != peers - 1:
        raise RuntimeError(f"{model}: {traffic['participants']} remote participants took part, not {peers - 1}")
    update_bytes = plain["traffic"].get("update", (0, 0))[0] / ((peers - 1) * plain["rounds"])
    return {"model": model, "seed": seed, "peers": peers, "rounds": secure["rounds"], "repeat": repeat,
            "plainRoundSeconds": plain["roundSeconds"],
            "secaggRoundSeconds": secure["roundSeconds"], "ratio": secure["roundSeconds"] / plain["roundSeconds"],
            # The process's CPU time (every peer, the training threads too): unlike the wall clock it does not count
            # the time other processes hold the cores. Its difference per round is what secure aggregation adds.
            "plainCpuSeconds": plain["cpuSeconds"], "secaggCpuSeconds": secure["cpuSeconds"],
            "cpuRatio": secure["cpuSeconds"] / plain["cpuSeconds"],
            "secaggCpuPerRound": (secure["cpuSeconds"] - plain["cpuSeconds"]) / secure["rounds"],
            "messagesPerParticipantRound": traffic["sent"] + traffic["received"],
            "sentPerParticipantRound": traffic["sent"], "receivedPerParticipantRound": traffic["received"],
            "messageSpread": traffic["spread"], "coordinatorMessagesPerRound": traffic["coordinatorMessages"],
            "secaggBytesPerParticipantRound": traffic["vectorBytes"] + traffic["keySharesBytes"],
            "vectorBytesPerParticipantRound": traffic["vectorBytes"],
            "keySharesBytesPerParticipantRound": traffic["keySharesBytes"],
            "bytesByTypePerParticipantRound": traffic["bytesByType"],
            "updateBytesPerParticipantRound": update_bytes,
            "plainValidation": plain["validation"], "secaggValidation": secure["validation"]}


def _slope(points: list[tuple[float, float]]) -> float:
    """The least-squares slope of y on x."""
    mx, my = statistics.mean(x for x, _ in points), statistics.mean(y for _, y in points)
    return sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)


def secagg_goals(results: list[dict[str, Any]]) -> list[str]:
    """MET / not met, per model: the round-time goal at 5 peers and the O(1)-messages goal across --peers."""
    lines = []
    for model in dict.fromkeys(r["model"] for r in results):
        rows = [r for r in results if r["model"] == model]
        at5 = [r for r in rows if r["peers"] == 5]
        if not at5:
            lines.append(f"{model}: round time ≤ 2 × plain at n=5: not measured (no --peers 5)")
        else:
            wall = statistics.median(r["ratio"] for r in at5)
            cpu = statistics.median(r["cpuRatio"] for r in at5)
            added = statistics.median(r["secaggCpuPerRound"] for r in at5) * 1000
            plain = statistics.median((r["plainCpuSeconds"]) / r["rounds"] for r in at5) * 1000
            why = (f" (secure aggregation adds {added:.1f} ms of CPU a round to a plain job's {plain:.1f} ms a round)"
                   if max(wall, cpu) > 2 else "")
            lines.append(f"{model}: round time ≤ 2 × plain at n=5, median of {len(at5)} seed(s): "
                         f"wall clock {wall:.2f} {'MET' if wall <= 2 else 'not met'}, "
                         f"CPU per job {cpu:.2f} {'MET' if cpu <= 2 else 'not met'}{why}")
        by_n = {n: next(r for r in rows if r["peers"] == n) for n in sorted({r["peers"] for r in rows})}
        if len(by_n) < 2:
            lines.append(f"{model}: messages per participant constant in n: needs two or more --peers")
            continue
        low, high = by_n[min(by_n)], by_n[max(by_n)]
        total = [(n, r["messagesPerParticipantRound"]) for n, r in by_n.items()]
        grows = [f"n={n}: {r['sentPerParticipantRound']:g} sent, {r['receivedPerParticipantRound']:g} received"
                 for n, r in by_n.items() if r["messagesPerParticipantRound"] > low["messagesPerParticipantRound"] + 1e-9]
        uneven = [f"n={n}: participants differ by {r['messageSpread']:g}" for n, r in by_n.items() if r["messageSpread"]]
        met = not grows and not uneven
        lines.append(f"{model}: messages per participant per round constant in n: "
                     f"n={min(by_n)} {low['messagesPerParticipantRound']:g}, n={max(by_n)} "
                     f"{high['messagesPerParticipantRound']:g}, slope {_slope(total):+.3f} per peer: "
                     + ("MET" if met else "not met (" + "; ".join(grows + uneven) + ")"))
        keys = _slope([(n, r["keySharesBytesPerParticipantRound"]) for n, r in by_n.items()])
        vector = [r["vectorBytesPerParticipantRound"] for r in by_n.values()]
        kinds = {kind: _slope([(n, r["bytesByTypePerParticipantRound"][kind]) for n, r in by_n.items()])
                 for kind in SECAGG_TYPES}
        lines.append(f"{model}: bytes per participant per round: keys and shares {keys:+,.0f} bytes per added peer "
                     f"(least squares; " + ", ".join(f"{k} {round(v):+,d}" for k, v in kinds.items() if k != SECAGG_VECTOR)
                     + f"), masked vector {min(vector):,.0f} to {max(vector):,.0f} whatever n")
    return lines


def markdown_secagg(results: list[dict[str, Any]]) -> str:
    lines = ["| model | n | seed | rounds × runs | plain s/round | secure s/round | ratio "
             "| CPU s/job plain / secure | CPU ratio | added CPU s/round | val loss plain / secure |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['model']} | {r['peers']} | {r['seed']} | {r['rounds']} × {r['repeat']} "
                     f"| {r['plainRoundSeconds']:.3f} | {r['secaggRoundSeconds']:.3f} | {r['ratio']:.2f} "
                     f"| {r['plainCpuSeconds']:.2f} / {r['secaggCpuSeconds']:.2f} | {r['cpuRatio']:.2f} "
                     f"| {r['secaggCpuPerRound']:.3f} "
                     f"| {r['plainValidation']['loss']:.6f} / {r['secaggValidation']['loss']:.6f} |")
    lines += ["", "Secure-aggregation traffic per remote participant and round (the coordinator's own stays local; "
              f"vector: {SECAGG_VECTOR}; keys and shares: every other secagg message):", "",
              "| model | n | messages sent / received | coordinator's messages / round | vector bytes "
              "| keys and shares bytes | secagg bytes in all | plain update bytes |",
              "|---|---|---|---|---|---|---|---|"]
    firsts: dict[tuple[str, int], dict[str, Any]] = {}
    for r in results:  # the traffic does not depend on the seed
        firsts.setdefault((r["model"], r["peers"]), r)
    for r in firsts.values():
        lines.append(f"| {r['model']} | {r['peers']} | {r['sentPerParticipantRound']:g} / "
                     f"{r['receivedPerParticipantRound']:g} | {r['coordinatorMessagesPerRound']:g} "
                     f"| {r['vectorBytesPerParticipantRound']:,.0f} | {r['keySharesBytesPerParticipantRound']:,.0f} "
                     f"| {r['secaggBytesPerParticipantRound']:,.0f} | {r['updateBytesPerParticipantRound']:,.0f} |")
    return "\n".join(lines + [""] + secagg_goals(results)) + "\n"


def _metric(validation: dict[str, Any]) -> tuple[str, float] | None:
    return next(((k, v) for k, v in validation.items() if k != "loss"), None)


def markdown(results: list[dict[str, Any]]) -> str:
    lines = []
    for r in results:
        base = r["runs"][0]["validation"]
        metric = _metric(base)
        lines += [f"**{r['model']}**, seed {r['seed']}, {r['epochs']} epoch(s) = {r['rounds']} rounds, "
                  f"clip C = {r['clip']:.4g}, δ = {DELTA:g}, n = {r['participants']} participants a round, "
                  f"d = {r['weights']:,} weights", "",
                  f"| run | σ | ‖noise‖ / C | ε reported | val loss | loss / no DP | {metric[0] if metric else 'metric'} "
                  f"| {metric[0] if metric else 'metric'} / no DP | s |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for run in r["runs"]:
            v, m, eps = run["validation"], _metric(run["validation"]), run["epsilon"]
            sigma = "–" if run["sigma"] is None else f"{run['sigma']:.3g}"
            # the noise vector's expected norm against the largest clipped delta: σ·C·√d/n over C (times √(n/t)
            # when the participants add it)
            scale = _noise_scale(run, r["participants"])
            ratio = "–" if run["sigma"] is None else \
                f"{scale * run['sigma'] * math.sqrt(r['weights']) / r['participants']:.3g}"
            reported = "–" if run["sigma"] is None else ("∞" if eps is None else f"{eps:.3g}")
            metric_cells = f"{m[1]:.4f} | {m[1] / metric[1]:.2f}" if m and metric else "– | –"
            lines.append(f"| {run['name']} | {sigma} | {ratio} | {reported} | {v['loss']:.4f} | {v['loss'] / base['loss']:.2f} "
                         f"| {metric_cells} | {run['seconds']:.0f} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", choices=sorted(MODELS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="digits-mlp only, 1 epoch")
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "bench")
    parser.add_argument("--secagg", action="store_true", help="round time and traffic of secure aggregation instead")
    parser.add_argument("--repeat", type=int, default=1, help="--secagg: run each pair this many times, pool the rounds")
    parser.add_argument("--peers", type=int, nargs="+", help=f"--secagg: the peer counts to measure (default "
                        f"{SECAGG_PEERS}; 2 to {MAX_BENCH_PEERS}), the coordinator one of them")
    parser.add_argument("--noise-at", action="store_true",
                        help="the DP table under secure aggregation, noise at the coordinator against at the participants")
    args = parser.parse_args(argv)
    if args.peers and not args.secagg:
        parser.error("--peers is a --secagg option")
    if any(not 2 <= n <= MAX_BENCH_PEERS for n in args.peers or ()):
        parser.error(f"--peers: each count must be 2 to {MAX_BENCH_PEERS}")
    models = args.model or (["digits-mlp"] if args.quick else ["digits-mlp", "byte-transformer"])
    log = io.StringIO()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.secagg:
        measured = [compare_secagg(model, seed, 1 if args.quick else args.epochs, log, args.repeat, peers)
                    for model in models for peers in args.peers or [SECAGG_PEERS] for seed in args.seeds]
        print(markdown_secagg(measured))
        (args.out / "secagg.json").write_text(json.dumps({"version": 1, "results": measured}, indent=1))
        (args.out / "secagg.md").write_text(markdown_secagg(measured))
        return 0
    plans, name = (_noise_at_plans, "privacy-noise-at") if args.noise_at else (_dp_plans, "privacy")
    results = [compare(model, seed, 1 if args.quick else args.epochs, log, plans)
               for model in models for seed in args.seeds]
    table = markdown(results)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{name}.json").write_text(json.dumps({"version": 1, "delta": DELTA, "results": results}, indent=1))
    (args.out / f"{name}.md").write_text(table)
    bad = [f"{r['model']} {run['name']}: reported ε {run['epsilon']} above its target {run['target']}"
           for r in results for run in r["runs"] if run["target"] is not None
           and (run["epsilon"] is None or run["epsilon"] > run["target"] * (1 + 1e-9))]
    for line in bad:
        print("FAILED:", line, file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
