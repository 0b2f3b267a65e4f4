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
            # the noise vector's expected norm against the largest clipped delta: σ·C·√d/n over C
            ratio = "–" if run["sigma"] is None else f"{run['sigma'] * math.sqrt(r['weights']) / r['participants']:.3g}"
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
    args = parser.parse_args(argv)
    models = args.model or (["digits-mlp"] if args.quick else ["digits-mlp", "byte-transformer"])
    log = io.StringIO()
    results = [compare(model, seed, 1 if args.quick else args.epochs, log) for model in models for seed in args.seeds]
    table = markdown(results)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "privacy.json").write_text(json.dumps({"version": 1, "delta": DELTA, "results": results}, indent=1))
    (args.out / "privacy.md").write_text(table)
    bad = [f"{r['model']} {run['name']}: reported ε {run['epsilon']} above its target {run['target']}"
           for r in results for run in r["runs"] if run["target"] is not None
           and (run["epsilon"] is None or run["epsilon"] > run["target"] * (1 + 1e-9))]
    for line in bad:
        print("FAILED:", line, file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
