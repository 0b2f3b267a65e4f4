"""make fuzz: every parser of outside input, a million seeded inputs each, over all cores.

    python tests/fuzz/run.py                         # 1,000,000 inputs per target, seed 0
    python tests/fuzz/run.py --inputs 20000 --targets checkpoint wire
    python tests/fuzz/run.py --minutes 30            # stop starting new work after 30 minutes
    python tests/fuzz/run.py --first-chunk 40        # go on where a run cut short by --minutes stopped
    python tests/fuzz/run.py --replay out/fuzz/checkpoint/0-3-1234.bin

Inputs come from targets.py (the same samples, mutations and oracle as
tests/unit/test_parser_fuzz.py). Work is cut into chunks of ``--chunk``
inputs; chunk k of a target draws from ``Random(f"{seed}:{target}:{k}")``,
so a run is the same on any machine and any number of processes, and one
cut short by ``--minutes`` (it reports the first chunk it did not finish) is
completed by another run from that chunk on the same code. An input
that escapes with an error other than the target's named one, or takes
more than ``--slow`` seconds of CPU time, is a failure: it is saved as
``out/fuzz/<target>/<seed>-<chunk>-<index>.bin`` with the traceback next to
it (``.txt``), and the run exits 1.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from targets import TARGETS, Target, check, from_file, generate, to_file  # noqa: E402

_BUILT: dict[str, Target] = {}


def _target(name: str) -> Target:
    if name not in _BUILT:
        _BUILT[name] = TARGETS[name]()
    return _BUILT[name]


def run_chunk(job: tuple[str, int, int, int, str, float]) -> dict[str, Any]:
    """Run one chunk of a target's inputs; returns its counts and the failures it saved."""
    name, seed, chunk, count, out, slow = job
    target = _target(name)
    rng = random.Random(f"{seed}:{name}:{chunk}")
    failures: list[str] = []
    slowest = 0.0
    started = time.process_time()
    for index in range(count):
        try:
            data = generate(target, rng)
        except Exception as error:  # noqa: BLE001 - the harness's own bug: counted and shown, the run goes on
            failures.append(f"harness: {type(error).__name__}: {error}"[:300])
            continue
        t0 = time.process_time()  # CPU time: another process's load does not make an input slow
        error = check(target, data)
        took = time.process_time() - t0
        slowest = max(slowest, took)
        if error is not None or took > slow:
            what = (f"{type(error).__name__}: {error}" if error is not None else f"slow: {took:.2f} s")[:300]
            failures.append(what)
            folder = Path(out) / name
            folder.mkdir(parents=True, exist_ok=True)
            stem = folder / f"{seed}-{chunk}-{index}"
            stem.with_suffix(".bin").write_bytes(to_file(target, data))
            text = "".join(traceback.format_exception(error)) if error is not None else what + "\n"
            stem.with_suffix(".txt").write_text(text)
    return {"target": name, "chunk": chunk, "inputs": count, "failures": failures, "seconds": time.process_time() - started,
            "slowest": slowest}


def replay(path: Path, name: str | None) -> int:
    """Run one saved input again and print what it does."""
    name = name or path.parent.name
    target = _target(name)
    data = from_file(target, path.read_bytes())
    t0 = time.perf_counter()
    error = check(target, data)
    took = time.perf_counter() - t0
    if error is None:
        print(f"{name}: {path} is parsed or refused by name ({took * 1000:.1f} ms)")
        return 0
    traceback.print_exception(error)
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inputs", type=int, default=1_000_000, help="inputs per target (default 1,000,000)")
    parser.add_argument("--targets", nargs="*", default=list(TARGETS), choices=list(TARGETS), metavar="TARGET",
                        help=f"targets to run (default all: {', '.join(TARGETS)})")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes (default: every core)")
    parser.add_argument("--chunk", type=int, default=10_000, help="inputs per unit of work")
    parser.add_argument("--first-chunk", type=int, default=0,
                        help="skip the chunks before this one (their inputs count toward --inputs as done elsewhere)")
    parser.add_argument("--slow", type=float, default=5.0, help="CPU seconds after which one input is a failure")
    parser.add_argument("--minutes", type=float, default=None, help="start no new chunk after this long")
    parser.add_argument("--out", default="out/fuzz")
    parser.add_argument("--replay", type=Path, help="run one saved input again")
    parser.add_argument("--target", help="the target of --replay (default: the input's folder name)")
    args = parser.parse_args(argv)
    if args.replay is not None:
        return replay(args.replay, args.target)

    # Chunks of all targets interleaved, so a run cut short by --minutes has covered each alike.
    per_target = {name: [(name, args.seed, k, min(args.chunk, args.inputs - k * args.chunk), args.out, args.slow)
                         for k in range(args.first_chunk, -(-args.inputs // args.chunk))] for name in args.targets}
    jobs = [job for row in zip(*per_target.values()) for job in row]
    deadline = time.monotonic() + args.minutes * 60 if args.minutes else None
    totals = {name: {"inputs": 0, "failures": [], "seconds": 0.0, "slowest": 0.0, "chunks": set()}
              for name in args.targets}
    started = time.monotonic()
    scratch = tempfile.mkdtemp(prefix="weei-fuzz-")
    os.environ["WEEI_FUZZ_TMP"] = scratch  # the agent-storage target's files, deleted below
    print(f"fuzzing {len(args.targets)} targets, {args.inputs:,} inputs each, seed {args.seed}, {args.jobs} processes",
          flush=True)
    with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
        pending = iter(jobs)
        running = []
        for job in pending:  # keep two chunks per process in flight; stop feeding at the deadline
            running.append(pool.apply_async(run_chunk, (job,)))
            while len([r for r in running if not r.ready()]) >= 2 * args.jobs:
                time.sleep(0.05)
            if deadline is not None and time.monotonic() > deadline:
                break
            running = _collect(running, totals, started)
        for result in running:
            result.wait()
        _collect(running, totals, started)
    shutil.rmtree(scratch, ignore_errors=True)
    return _report(totals, args, time.monotonic() - started)


def _collect(running: list[Any], totals: dict[str, dict[str, Any]], started: float) -> list[Any]:
    left = []
    for result in running:
        if not result.ready():
            left.append(result)
            continue
        r = result.get()
        total = totals[r["target"]]
        total["inputs"] += r["inputs"]
        total["failures"] += r["failures"]
        total["seconds"] += r["seconds"]
        total["slowest"] = max(total["slowest"], r["slowest"])
        total["chunks"].add(r["chunk"])
        done = sum(t["inputs"] for t in totals.values())
        print(f"  [{time.monotonic() - started:7.0f} s] {r['target']:<18} +{r['inputs']:,} "
              f"({total['inputs']:,}; {len(total['failures'])} failures); {done:,} in all", flush=True)
    return left


def _report(totals: dict[str, dict[str, Any]], args: argparse.Namespace, wall: float) -> int:
    print(f"\n{'target':<18} {'inputs':>11} {'failures':>8} {'cpu s':>8} {'inputs/s':>9} {'slowest cpu ms':>14}")
    failed = 0
    for name, t in totals.items():
        rate = t["inputs"] / t["seconds"] if t["seconds"] else 0.0
        print(f"{name:<18} {t['inputs']:>11,} {len(t['failures']):>8} {t['seconds']:>8.0f} {rate:>9.0f} "
              f"{t['slowest'] * 1000:>14.1f}")
        failed += len(t["failures"])
        for what in sorted(set(t["failures"]))[:5]:
            print(f"    {what}")
    inputs = sum(t["inputs"] for t in totals.values())
    print(f"{'all':<18} {inputs:>11,} {failed:>8}   wall {wall:.0f} s on {args.jobs} processes (seed {args.seed})")
    done = args.first_chunk * args.chunk
    short = [name for name, t in totals.items() if done + t["inputs"] < args.inputs]
    if short:
        # Chunks finish out of order: the first one missing from any target is where a next run resumes.
        resume = min(_first_missing(t["chunks"], args.first_chunk) for t in totals.values())
        print(f"stopped by --minutes before {args.inputs:,} inputs for: {', '.join(short)}; "
              f"every chunk before {resume} is done: go on with --first-chunk {resume} (same seed and code)")
    if failed:
        print(f"failing inputs are in {args.out}/<target>/; replay one with --replay <file>")
    return 1 if failed else 0


def _first_missing(chunks: set[int], first: int) -> int:
    k = first
    while k in chunks:
        k += 1
    return k


if __name__ == "__main__":
    sys.exit(main())
