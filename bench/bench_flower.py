"""Benchmark: what Flower costs a Weei job, against the same job on Weei's in-process transport.

Side by side in one run, same settings and seeds:

* per-round time at N simulated clients (10, 100, 1,000): ``weei flower sim``'s ``run_simulation`` (Ray)
  against ``weei demo``'s in-process run (N participant controllers on one ``MemoryNetwork``), on a copy of
  digits-mlp whose data is re-cut into N x ROUNDS one-example chunks, so that every client trains one chunk
  a round; the engine cost per client message is (Flower's round - in-process round) / messages a round.
  Goal: <= 3 ms at 1,000 (the prototype: 8 ms).
* Weei's own engine cost per client message, in CPU time (the machine is shared: wall clock is not Weei's):
  the same job through an in-process Flower ``Grid`` (:class:`MemoryGrid`: no Ray, no gRPC; Weei's
  ``drive`` loop, codec and resident participants, all in this process) against ``weei demo``'s in-process
  run, CPU seconds of the rounds (from the job's start() to the run's end) / client messages (one assignment
  and its reply per client a round). What ``run_simulation`` adds on top (Ray's actors) is the first line's.
  Goal: <= 3 ms at 1,000.
* a deployment round: a SuperLink with TLS and node authentication, 4 SuperNodes on loopback, ``flwr run``
  on the app ``weei flower app`` writes (weei.flower.local), digits-mlp (15 chunks, 4 rounds an epoch),
  against the simulation's round of the same job on 4 nodes. Goal: <= 2 x (simulation round + training).

Run: ``.venv/bin/python bench/bench_flower.py [--quick] [--clients 10 100 1000] [--grid 10 100 1000]
[--no-sim] [--no-deploy]``. ``--quick``: 10 clients (simulation and grid) and the deployment. At 1,000 clients
the data (1,500 records) allows one round.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import io
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Iterable

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


_COMPUTE = [0.0]  # CPU seconds spent running the model (training, evaluation) in Worker threads, all told
_COMPUTE_LOCK = threading.Lock()


def count_compute() -> None:
    """Time each Worker task's run in its own thread (thread CPU time): the model's compute, not the engine's."""
    from weei.host.worker_pool import ThreadWorkerPool

    run = ThreadWorkerPool._run

    def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = time.thread_time()
        try:
            return run(self, *args, **kwargs)
        finally:
            with _COMPUTE_LOCK:
                _COMPUTE[0] += time.thread_time() - t0

    ThreadWorkerPool._run = timed  # type: ignore[method-assign]


class CpuWindow:
    """The process's CPU time, and the model's share of it, from the job's ``start()`` (the rounds begin) to the
    end of the ``with`` block (the run returned): the rounds' cost, not the job's preparation."""

    def __enter__(self) -> CpuWindow:
        from weei.api.controller import TrainingController

        self.start: tuple[float, float] | None = None
        self.original = TrainingController.start
        window, original = self, self.original

        async def start(controller: Any, *args: Any, **kwargs: Any) -> Any:
            window.start = (time.process_time(), _COMPUTE[0])
            return await original(controller, *args, **kwargs)

        TrainingController.start = start  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        from weei.api.controller import TrainingController

        self.end = (time.process_time(), _COMPUTE[0])
        TrainingController.start = self.original  # type: ignore[method-assign]

    def per_message(self, messages: int) -> tuple[float, float]:
        """CPU ms a message: all of it, and the model's compute."""
        assert self.start is not None
        return (1000 * (self.end[0] - self.start[0]) / messages, 1000 * (self.end[1] - self.start[1]) / messages)


def memory_grid(node_ids: Iterable[int]) -> Any:
    """Flower's ``Grid`` in this process: a pull answers each pending message with the ClientApp's handler
    (Weei's resident participants, :class:`weei.flower.client.NodeHosts`), as a node would."""
    from flwr.app import Message
    from flwr.serverapp import Grid
    from flwr.supercore.task_identity import TaskIdentity

    from weei.flower.client import NodeHosts

    class MemoryGrid(Grid):  # type: ignore[misc]
        def __init__(self) -> None:
            self.nodes, self.hosts, self.pending = list(node_ids), NodeHosts(frozenset()), {}
            TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1  # what Message() reads

        run = property(lambda self: None)

        def set_run(self, run: Any) -> None:
            pass

        def create_message(self, content: Any, message_type: str, dst_node_id: int, group_id: str,
                           ttl: float | None = None) -> Any:
            return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

        def get_node_ids(self) -> list[int]:
            return self.nodes

        def push_messages(self, messages: Iterable[Any]) -> list[str]:
            ids = []
            for m in messages:
                ids.append(str(uuid.uuid4()))
                m.metadata.__dict__["_message_id"] = ids[-1]
                self.pending[ids[-1]] = m
            return ids

        def pull_messages(self, message_ids: Iterable[str]) -> list[Any]:
            wanted = [self.pending.pop(mid) for mid in list(message_ids) if mid in self.pending]
            return [Message(self.hosts.handle(m.metadata.dst_node_id, {"weei-accept": "*"}, m.content), reply_to=m)
                    for m in wanted]

        def send_and_receive(self, messages: Iterable[Any], *, timeout: float | None = None) -> list[Any]:
            return self.pull_messages(self.push_messages(messages))

    return MemoryGrid()


def engine_cpu(n: int, work: Path, local: bool = True) -> dict[str, float]:
    """CPU ms per client message of the rounds, at ``n`` clients: through a MemoryGrid and (``local``) in process."""
    from weei.flower.server import drive

    rounds = max(1, min(ROUNDS, 1500 // n))
    package = cut_package(work / f"cpu-digits-{n}", n * rounds)
    settings = {**DEMO_JOBS[0].settings, "epochs": 1, "localEpochs": 1, "coordinatorParticipates": False}
    job = DemoJob(f"digits-{n}", "digits-mlp", settings, validation="validation.bin", peers=n + 1, package=package)
    out: dict[str, float] = {"rounds": rounds}
    t0 = time.perf_counter()
    with CpuWindow() as grid:
        asyncio.run(drive(memory_grid(range(1, n + 1)), job, settings=settings, seed=SEED, out=work / f"grid-{n}"))
    out["grid_wall_s"] = time.perf_counter() - t0
    out["grid"], out["grid_model"] = grid.per_message(n * rounds)
    if local:
        with CpuWindow() as in_process:
            run_job(job, work / f"cpu-local-{n}", stream=io.StringIO(), settings=settings, seed=SEED, flat=True)
        out["local"], out["local_model"] = in_process.per_message(n * rounds)
        out["same"] = float(all((work / f"cpu-local-{n}" / p.name).read_bytes() == p.read_bytes()
                                for p in (work / f"grid-{n}").iterdir()))
    return out


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
    parser.add_argument("--grid", type=int, nargs="*", default=None, help="clients through the in-process grid")
    parser.add_argument("--local-max", type=int, default=100,
                        help="the largest N whose in-process run is measured too (weei demo's table snapshots the "
                             "whole state at every change: its CPU a message grows with N, 8 ms at 10, 57 ms at 100)")
    parser.add_argument("--no-sim", action="store_true")
    parser.add_argument("--no-deploy", action="store_true")
    args = parser.parse_args()
    scales = [10] if args.quick else [10, 100, 1000]
    clients = [] if args.no_sim else args.clients if args.clients is not None else scales
    work = Path(tempfile.mkdtemp(prefix="weei-bench-flower-"))
    try:
        load = os.getloadavg()[0]
        print(f"Weei's engine cost per client message, CPU time (load average {load:.1f} on {os.cpu_count()} cores)")
        count_compute()
        print(f"{'clients':>7} {'in-process CPU ms/msg':>21} {'grid CPU ms/msg':>15} {'model compute':>13} "
              f"{'Weei engine ms/msg':>18} {'bytes':>6} {'grid wall s':>11}", flush=True)
        cost = {}
        for n in args.grid if args.grid is not None else scales:
            r = engine_cpu(n, work, local=n <= args.local_max)
            cost[n] = r["grid"] - r["grid_model"]
            local = f"{r['local']:>21.2f}" if "local" in r else f"{'not run':>21}"
            same = ("same" if r["same"] else "DIFF") if "same" in r else ""
            print(f"{n:>7} {local} {r['grid']:>15.2f} {r['grid_model']:>13.2f} {cost[n]:>18.2f} {same:>6} "
                  f"{r['grid_wall_s']:>11.1f}", flush=True)
        if cost:
            top = max(cost)
            print(f"goal: Weei's engine cost per client message at {top} clients <= 3 ms (the Flower path's CPU a "
                  f"message but the model's compute: coordinator, codec, participant): {cost[top]:.2f} ms — "
                  f"{'MET' if cost[top] <= 3.0 else 'not met'}" + ("" if top == 1000 else " (not at 1,000)"), flush=True)
        if clients:  # Ray's simulation: Weei's cost and Ray's together, in wall time
            print(f"{'clients':>7} {'in-process s/round':>18} {'flower sim s/round':>18} {'msgs/round':>10} "
                  f"{'ms/message':>10} {'bytes':>6} {'sim total s':>11}", flush=True)
            per_message = {}
            for n in clients:
                r = simulated(n, work)
                per_message[n] = 1000 * (r["sim"] - r["local"]) / max(1.0, r["messages"])
                print(f"{n:>7} {r['local']:>18.3f} {r['sim']:>18.3f} {r['messages']:>10.0f} {per_message[n]:>10.2f} "
                      f"{'same' if r['same'] else 'DIFF':>6} {r['total']:>11.1f}", flush=True)
            top = max(per_message)
            print(f"goal (Ray included): engine cost per client message at {top} clients <= 3 ms: {per_message[top]:.2f} ms — "
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
