"""Benchmark: what Flower costs a Weei job, against the same job on Weei's in-process transport.

Side by side in one run, same settings and seeds:

* per-round time at N simulated clients (10, 100, 1,000): ``weei flower sim``'s ``run_simulation`` (Ray)
  against ``weei demo``'s in-process run (N participant controllers on one ``MemoryNetwork``), on a copy of
  digits-mlp whose data is re-cut into N x ROUNDS one-example chunks, so that every client trains one chunk
  a round; the engine cost per client message is (Flower's round - in-process round) / messages a round.
  Goal: <= 3 ms at 1,000 (the prototype: 8 ms).
* a deployment round: a SuperLink with TLS and node authentication, 4 SuperNodes on loopback, ``flwr run``
  on the app ``weei flower app`` writes (weei.flower.local), digits-mlp (15 chunks, 4 rounds an epoch),
  against the simulation's round of the same job on 4 nodes. Goal: <= 2 x (simulation round + training).

Run: ``.venv/bin/python bench/bench_flower.py [--quick] [--clients 10 100 1000] [--no-deploy]``.
``--quick``: 10 clients and the deployment. At 1,000 clients the data (1,500 records) allows one round.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from weei.demo.run import DEMO_JOBS, DemoJob, models_dir, run_job
from weei.flower.apps import module_sha256, simulate, write_app
from weei.flower.local import LocalDeployment, make_node_key
from weei.core.formats.jsonfmt import descriptor

__all__ = ["main"]

SEED = 7
ROUNDS = 2
_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\d+)\s+.*\s(\d+\.\d+)\s*$")


def round_seconds(text: str) -> list[float]:
    """The seconds column of the checkpoint rows ``weei demo``'s table printed (round 0 has none)."""
    rows = [_ROW.match(line) for line in text.splitlines()]
    return [float(m.group(4)) for m in rows if m is not None and int(m.group(1)) > 0]


def cut_package(target: Path, chunks: int) -> Path:
    """digits-mlp with its records re-cut into ``chunks`` chunks of one example each."""
    source = models_dir() / "digits-mlp"
    shutil.copytree(source, target)
    records = b""
    for path in sorted((source / "data").glob("training-*.bin")):
        data = path.read_bytes()
        records += data[8:8 + 65 * int.from_bytes(data[4:8], "little")]
    if chunks * 65 > len(records):
        raise SystemExit(f"digits-mlp holds {len(records) // 65} records, fewer than {chunks} chunks")
    for path in (target / "data").glob("training-*.bin"):
        path.unlink()
    entries = []
    for i in range(chunks):
        data = b"WDG1" + (1).to_bytes(4, "little") + records[65 * i:65 * (i + 1)]
        name = f"training-{i + 1:04d}.bin"
        (target / "data" / name).write_bytes(data)
        entries.append({"id": f"chunk-{i + 1:04d}", "fileName": name, "bytes": len(data),
                        "sha256": hashlib.sha256(data).hexdigest(), "format": "weei-digits-v1", "exampleCount": 1})
    manifest = json.loads((target / "manifest.json").read_text())
    manifest["inlineJson"]["dataset-manifest.json"] = entries
    size, sha = descriptor(entries)
    manifest["execution"]["datasetManifest"].update(bytes=size, sha256=sha)
    (target / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return target


def simulated(n: int, work: Path) -> dict[str, float]:
    """Per-round seconds in process and on Flower's simulation at ``n`` clients, and messages a round."""
    rounds = max(1, min(ROUNDS, 1500 // n))
    package = cut_package(work / f"digits-{n}", n * rounds)
    settings = {**DEMO_JOBS[0].settings, "epochs": 1, "localEpochs": 1, "coordinatorParticipates": False}
    job = DemoJob(f"digits-{n}", "digits-mlp", settings, validation="validation.bin", peers=n + 1, package=package)
    report = run_job(job, work / f"local-{n}", stream=io.StringIO(), settings=settings, seed=SEED, flat=True)
    local = [r["seconds"] for r in report.rounds if r["round"] > 0]
    out = io.StringIO()
    t0 = time.perf_counter()
    run = simulate(package, nodes=n, out=work / f"sim-{n}", stream=out, settings=settings, seed=SEED)
    total = time.perf_counter() - t0
    sim = round_seconds(out.getvalue())
    same = all((work / f"local-{n}" / p.name).read_bytes() == p.read_bytes() for p in (work / f"sim-{n}").iterdir())
    return {"local": statistics.median(local), "sim": statistics.median(sim), "total": total,
            "messages": run.messages / max(1, len(sim) + 2), "same": float(same)}


def deployed(work: Path, nodes: int = 4) -> dict[str, float]:
    """Per-round seconds of digits-mlp on ``nodes`` SuperNodes (TLS, node keys) and in a simulation."""
    package = models_dir() / "digits-mlp"
    settings = {**DEMO_JOBS[0].settings, "epochs": 2, "coordinatorParticipates": False}
    out = io.StringIO()
    simulate(package, nodes=nodes, out=work / "sim-deploy", stream=out, settings=settings, seed=SEED)
    sim = statistics.median(round_seconds(out.getvalue()))
    with LocalDeployment(work / "deploy") as d:
        d.start_superlink()
        ids = []
        for i in range(nodes):
            private, public = make_node_key(work / "keys", f"node{i}")
            ids.append(d.register(public))
            d.start_supernode(f"node{i}", private, {"weei-accept": module_sha256(package),
                                                   "weei-state-dir": str(work / "state")})
        d.wait_online(ids)
        app = write_app(package, work / "app")
        (work / "run.toml").write_text(f"seed = {SEED}\nnodes = {nodes}\nout = '{work / 'deployed'}'\n"
                                       f"settings = '{json.dumps(settings)}'\n")
        t0 = time.perf_counter()
        done = d.flwr("run", str(app), "--stream", "--run-config", str(work / "run.toml"), timeout_s=1800)
        total = time.perf_counter() - t0
        if done.returncode != 0:
            raise SystemExit(f"flwr run failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
        rounds = round_seconds(done.stdout)
        answered = []
        for log in (work / "state").glob("node-*/participant.log"):
            answered += [float(x) for x in re.findall(r"answered in ([\d.]+) s", log.read_text())]
        messages = len(answered)
    same = all((work / "sim-deploy" / p.name).read_bytes() == p.read_bytes() for p in (work / "deployed").iterdir())
    return {"deploy": statistics.median(rounds), "sim": sim, "total": total, "messages": messages,
            "handled": statistics.median(answered), "same": float(same), "rounds": len(rounds)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="10 clients and the deployment")
    parser.add_argument("--clients", type=int, nargs="*", default=None)
    parser.add_argument("--no-deploy", action="store_true")
    args = parser.parse_args()
    clients = args.clients if args.clients is not None else ([10] if args.quick else [10, 100, 1000])
    work = Path(tempfile.mkdtemp(prefix="weei-bench-flower-"))
    try:
        print(f"{'clients':>7} {'in-process s/round':>18} {'flower sim s/round':>18} {'msgs/round':>10} "
              f"{'ms/message':>10} {'bytes':>6} {'sim total s':>11}", flush=True)
        per_message = {}
        for n in clients:
            r = simulated(n, work)
            per_message[n] = 1000 * (r["sim"] - r["local"]) / max(1.0, r["messages"])
            print(f"{n:>7} {r['local']:>18.3f} {r['sim']:>18.3f} {r['messages']:>10.0f} {per_message[n]:>10.2f} "
                  f"{'same' if r['same'] else 'DIFF':>6} {r['total']:>11.1f}", flush=True)
        top = max(per_message)
        print(f"goal: engine cost per client message at {top} clients <= 3 ms: {per_message[top]:.2f} ms — "
              f"{'MET' if per_message[top] <= 3.0 else 'not met'}" + ("" if top == 1000 else " (not at 1,000)"))
        if not args.no_deploy:
            r = deployed(work)
            print(f"deployment, 4 SuperNodes (TLS, node keys): {r['deploy']:.2f} s/round (median of {r['rounds']:.0f}); "
                  f"simulation of the same job: {r['sim']:.3f} s/round; {r['messages']:.0f} messages handled by the "
                  f"nodes' resident participants in {r['handled']:.3f} s each (median); run {r['total']:.0f} s; "
                  f"checkpoints {'the same bytes' if r['same'] else 'DIFFERENT'}")
            print(f"goal: deployment round <= 2 x simulation round: {r['deploy']:.2f} s vs {2 * r['sim']:.3f} s — "
                  f"{'MET' if r['deploy'] <= 2 * r['sim'] else 'not met'} ({r['deploy'] / r['sim']:.0f}x)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
