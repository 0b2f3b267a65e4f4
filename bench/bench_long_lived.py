"""Whether a process that runs job after job keeps anything of the finished ones.

Runs one demo job (``weei.demo.run.run_job``: four real controllers over the
in-memory transport, wasmtime Workers, the native kernel) again and again in
this process, after two warm-up jobs, and prints at each mark the live
Python objects (``gc.get_objects()`` after a collection), the types that grew
since the last mark, and the resident set size. Nothing is kept between jobs
here (each report is dropped), so what grows is the product's. Fails (exit 1)
when the objects after the last mark exceed those after the first by more
than one per job in between.

    python bench/bench_long_lived.py                      # digits-mlp, 1 epoch, marks 1 5 20
    python bench/bench_long_lived.py --marks 5 20 50 --epochs 3 --secure
"""

from __future__ import annotations

import argparse
import collections
import gc
import io
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "app" / "py"))

from weei.demo.run import DemoJob, run_job  # noqa: E402


def live_by_type() -> collections.Counter[str]:
    gc.collect()
    return collections.Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.get_objects())


def rss_mib() -> float | None:
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 1024
    except (OSError, StopIteration):
        return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--marks", type=int, nargs="+", default=[1, 5, 20], help="job counts to measure at")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--secure", action="store_true", help="with secure aggregation")
    args = parser.parse_args()
    job = DemoJob("long-lived", "digits-mlp", {}, peers=4, validation="validation.bin")
    settings = {"epochs": args.epochs, "localEpochs": 1, "batchSize": 16, "coordinatorParticipates": True,
                "validationSchedule": {"enabled": True, "unit": "round", "every": 1}}
    if args.secure:
        settings["privacy"] = {"secureAggregation": True, "clip": 1000}

    def one(seed: int) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            run_job(job, Path(tmp), stream=io.StringIO(), settings=settings, seed=seed, flat=True)

    one(0)
    one(0)
    before = previous = live_by_type()
    done, first = 0, None
    for mark in sorted(args.marks):
        while done < mark:
            one(done)
            done += 1
        now = live_by_type()
        total, grown = sum(now.values()), sum(now.values()) - sum(before.values())
        first = first or (done, total)
        rss = rss_mib()
        print(f"after {done} jobs: {total} objects ({grown:+d} since the warm-up, {grown / done:+.0f} a job)"
              + (f", RSS {rss:.0f} MiB" if rss is not None else ""))
        for kind, count in (now - previous).most_common(8):
            print(f"    +{count:6d} {kind}")
        previous = now
    jobs = done - first[0]
    if jobs and sum(previous.values()) - first[1] > jobs:
        print(f"FAILED: the live objects grew by {sum(previous.values()) - first[1]} over the last {jobs} jobs")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
