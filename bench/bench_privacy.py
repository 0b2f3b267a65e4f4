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
per round against the plain update's. Every peer runs in this one process,
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
"""

from __future__ import annotations

import argparse
import io
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from weei.core.formats.checkpoint import read_checkpoint
from weei.core.privacy.dp_accountant import noise_multiplier_for
from weei.demo.run import DemoJob, run_job

ROOT = Path(__file__).resolve().parents[1]
DELTA = 1e-5
EPSILONS = (8.0, 4.0, 1.0)
_VALIDATE = {"validationSchedule": {"enabled": True, "unit": "round", "every": 1}, "coordinatorParticipates": True}
#: (participants per round, settings): bench_methods.py's setups
MODELS: dict[str, tuple[int, dict[str, Any]]] = {
    "digits-mlp": (4, {"localEpochs": 1, "batchSize": 16, **_VALIDATE}),
    "byte-transformer": (5, {"localEpochs": 1, "batchSize": 8, **_VALIDATE}),
}


def _run(model: str, settings: dict[str, Any], seed: int, log: io.TextIOBase) -> dict[str, Any]:
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


def compare(model: str, seed: int, epochs: int, log: io.TextIOBase) -> dict[str, Any]:
    _, settings = MODELS[model]
    settings = dict(settings, epochs=epochs)
    plain = _run(model, settings, seed, log)
    rounds, clip = plain["rounds"], statistics.median(plain["deltaNorms"])
    runs = [{"name": "no DP", "sigma": None, "target": None, **plain}]
    plans = [("clip only", 0.0, None)] + [(f"ε={e:g}", noise_multiplier_for(e, rounds, DELTA), e) for e in EPSILONS]
    for name, sigma, target in plans:
        dp = {"clip": clip, "noiseMultiplier": sigma, "delta": DELTA, "maxRounds": rounds}
        result = _run(model, dict(settings, privacy={"dp": dp}), seed, log)
        runs.append({"name": name, "sigma": sigma, "target": target, **result})
    return {"model": model, "seed": seed, "epochs": epochs, "clip": clip, "rounds": rounds, "runs": runs,
            "participants": MODELS[model][0], "weights": plain["weights"]}


def compare_noise_at(model: str, seed: int, epochs: int, log: io.TextIOBase) -> dict[str, Any]:
    """``compare``'s plan under secure aggregation, each ε with the noise at the coordinator and at the participants."""
    _, settings = MODELS[model]
    settings = dict(settings, epochs=epochs)
    plain = _run(model, settings, seed, log)
    rounds, clip = plain["rounds"], statistics.median(plain["deltaNorms"])
    runs = [{"name": "no DP", "sigma": None, "target": None, **plain}]
    for target in EPSILONS:
        sigma = noise_multiplier_for(target, rounds, DELTA)
        for where in ("coordinator", "participants"):
            dp = {"clip": clip, "noiseMultiplier": sigma, "delta": DELTA, "maxRounds": rounds, "noiseAt": where}
            result = _run(model, dict(settings, privacy={"secureAggregation": True, "dp": dp}), seed, log)
            runs.append({"name": f"ε={target:g}, {where}", "sigma": sigma, "target": target, "noiseAt": where, **result})
    return {"model": model, "seed": seed, "epochs": epochs, "clip": clip, "rounds": rounds, "runs": runs,
            "participants": MODELS[model][0], "weights": plain["weights"]}


def _noise_scale(run: dict[str, Any], participants: int) -> float:
    """The sum's noise in units of σ·C: 1 from the coordinator, √(n/t) from n participants at threshold t."""
    if run.get("noiseAt") != "participants":
        return 1.0
    return math.sqrt(participants / max(2, math.ceil(0.6 * participants)))


SECAGG_TYPES = ("secaggKeys", "secaggRoster", "secaggShares", "secaggSharesFor", "secaggMasked", "secaggUnmask",
                "secaggReveal")
SECAGG_PEERS = 5


def _timed(model: str, settings: dict[str, Any], seed: int, log: io.TextIOBase) -> dict[str, Any]:
    job = DemoJob(f"secagg-{model}", model, {}, peers=SECAGG_PEERS, validation="validation.bin")
    cpu = time.process_time()
    with tempfile.TemporaryDirectory() as tmp:
        report = run_job(job, Path(tmp), stream=log, settings=settings, seed=seed, flat=True)
    cpu = time.process_time() - cpu
    rounds = sorted(report.rounds, key=lambda r: r["round"])
    return {"rounds": len(rounds) - 1, "seconds": [r["seconds"] for r in rounds[2:] or rounds[1:]],
            "cpuSeconds": cpu, "validation": rounds[-1]["validation"], "traffic": report.traffic}


def _pooled(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The first run, with the median round time over every run's rounds and the median CPU time of a job."""
    return dict(runs[0], roundSeconds=statistics.median(s for run in runs for s in run["seconds"]),
                cpuSeconds=statistics.median(run["cpuSeconds"] for run in runs))


def compare_secagg(model: str, seed: int, epochs: int, log: io.TextIOBase, repeat: int = 1) -> dict[str, Any]:
    """One model's round time and traffic, plain FedAvg against secure aggregation, same seed, ``repeat`` times."""
    _, settings = MODELS[model]
    settings = dict(settings, epochs=epochs, coordinatorParticipates=True)
    plains, secures = [], []
    for _ in range(repeat):
        plains.append(_timed(model, settings, seed, log))
        secures.append(_timed(model, dict(settings, privacy={"secureAggregation": True, "clip": 1000}), seed, log))
    plain, secure = _pooled(plains), _pooled(secures)
    per = (SECAGG_PEERS - 1) * secure["rounds"]  # remote participants' rounds (the coordinator's own stay local)
    messages = sum(secure["traffic"].get(k, (0, 0))[1] for k in SECAGG_TYPES) / per
    secagg_bytes = sum(secure["traffic"].get(k, (0, 0))[0] for k in SECAGG_TYPES) / per
    update_bytes = plain["traffic"].get("update", (0, 0))[0] / ((SECAGG_PEERS - 1) * plain["rounds"])
    return {"model": model, "seed": seed, "rounds": secure["rounds"], "repeat": repeat,
            "plainRoundSeconds": plain["roundSeconds"],
            "secaggRoundSeconds": secure["roundSeconds"], "ratio": secure["roundSeconds"] / plain["roundSeconds"],
            # The process's CPU time (every peer, the training threads too): unlike the wall clock it does not count
            # the time other processes hold the cores. Its difference per round is what secure aggregation adds.
            "plainCpuSeconds": plain["cpuSeconds"], "secaggCpuSeconds": secure["cpuSeconds"],
            "secaggCpuPerRound": (secure["cpuSeconds"] - plain["cpuSeconds"]) / secure["rounds"],
            "messagesPerParticipantRound": messages, "secaggBytesPerParticipantRound": secagg_bytes,
            "updateBytesPerParticipantRound": update_bytes,
            "plainValidation": plain["validation"], "secaggValidation": secure["validation"]}


def markdown_secagg(results: list[dict[str, Any]]) -> str:
    lines = [f"| model | rounds × runs | plain s/round | secure s/round | ratio | CPU s/job plain / secure "
             f"| added CPU s/round | secagg messages / participant / round "
             f"| secagg bytes / participant / round | plain update bytes | val loss plain / secure |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['model']} (seed {r['seed']}) | {r['rounds']} × {r['repeat']} | {r['plainRoundSeconds']:.3f} "
                     f"| {r['secaggRoundSeconds']:.3f} | {r['ratio']:.2f} "
                     f"| {r['plainCpuSeconds']:.2f} / {r['secaggCpuSeconds']:.2f} | {r['secaggCpuPerRound']:.3f} "
                     f"| {r['messagesPerParticipantRound']:.1f} "
                     f"| {r['secaggBytesPerParticipantRound']:,.0f} | {r['updateBytesPerParticipantRound']:,.0f} "
                     f"| {r['plainValidation']['loss']:.6f} / {r['secaggValidation']['loss']:.6f} |")
    return "\n".join(lines) + "\n"


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
    parser.add_argument("--noise-at", action="store_true",
                        help="the DP table under secure aggregation, noise at the coordinator against at the participants")
    args = parser.parse_args(argv)
    models = args.model or (["digits-mlp"] if args.quick else ["digits-mlp", "byte-transformer"])
    log = io.StringIO()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.secagg:
        measured = [compare_secagg(model, seed, 1 if args.quick else args.epochs, log, args.repeat)
                    for model in models for seed in args.seeds]
        print(markdown_secagg(measured))
        (args.out / "secagg.json").write_text(json.dumps({"version": 1, "results": measured}, indent=1))
        (args.out / "secagg.md").write_text(markdown_secagg(measured))
        return 0
    measure, name = (compare_noise_at, "privacy-noise-at") if args.noise_at else (compare, "privacy")
    results = [measure(model, seed, 1 if args.quick else args.epochs, log) for model in models for seed in args.seeds]
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
