"""The ``weei`` command line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="weei", description="Distributed neural training in the browser.")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="train the built-in demo jobs (digits-mlp, CartPole) in this process")
    demo.add_argument("--out", type=Path, default=Path("out/demo"), help="where to write the checkpoints")
    demo.add_argument("--job", choices=["digits", "cartpole"], action="append",
                      help="run only this job (repeatable); default: both")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from .demo.run import DEMO_JOBS, run_demo

        jobs = tuple(j for j in DEMO_JOBS if not args.job or j.name in args.job)
        return run_demo(args.out, stream=sys.stdout, jobs=jobs)
    return 2


if __name__ == "__main__":
    sys.exit(main())
