"""The ``weei`` command line."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="weei", description="Distributed neural training in the browser.")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="train the built-in demo jobs (digits-mlp, CartPole)")
    demo.add_argument("--out", type=Path, default=Path("out/demo"), help="where to write the checkpoints")
    demo.add_argument("--browsers", action="store_true",
                      help="run them across headless Chromium pages and an agent over WebRTC (needs dist/: "
                           "`python build.py site`), instead of in this process")
    demo.add_argument("--job", choices=["digits", "cartpole"], action="append",
                      help="run only this job (repeatable); default: both")
    train = commands.add_parser("train", help="train a model package in a federated job in this process "
                                              "(imported from ONNX, built with the C kit, or built in)")
    train.add_argument("package", type=Path, help="the package folder (model.wasm, manifest.json, data/)")
    train.add_argument("--data", type=Path, default=None, help="the folder of the data files (default PACKAGE/data)")
    train.add_argument("--peers", type=int, default=2, help="training peers, the coordinator included (default 2)")
    train.add_argument("--settings", type=Path, default=None,
                       help="a JSON file of job settings over the defaults (1 epoch, batches of 32, validation every round)")
    train.add_argument("--seed", type=int, default=None, help="fix the job id and so every training seed")
    train.add_argument("--out", type=Path, required=True, help="where to write the .weei-checkpoint files")
    flower = commands.add_parser("flower", help="run a package's job on Flower (docs/flower.md; the flower extra)")
    flower_commands = flower.add_subparsers(dest="flower_command", required=True)
    sim = flower_commands.add_parser("sim", help="simulate the package's demo job on N SuperNodes (Ray)")
    sim.add_argument("package", type=Path, help="the package folder (model.wasm, manifest.json, data/)")
    sim.add_argument("--nodes", type=int, default=4, help="simulated SuperNodes (default 4)")
    sim.add_argument("--settings", type=Path, default=None, help="a JSON file of job settings (default: the demo's)")
    sim.add_argument("--seed", type=int, default=None, help="fix the job id and so every training seed")
    sim.add_argument("--out", type=Path, required=True, help="where to write the .weei-checkpoint files")
    sim.add_argument("--resume", type=Path, default=None, metavar="CHECKPOINT",
                     help="continue from a .weei-checkpoint (its weights, queue and seed)")
    flower_app = flower_commands.add_parser("app", help="write a Flower App folder that `flwr run DIR` runs")
    flower_app.add_argument("package", type=Path, help="the package folder")
    flower_app.add_argument("--out", type=Path, required=True, help="the app folder to write")
    serve = commands.add_parser("serve", help="serve the built site (dist/) for browsers; Ctrl-C stops")
    serve.add_argument("--port", type=int, default=8000, help="TCP port (0: any free port; default 8000)")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--dir", type=Path, default=None,
                       help="site directory (default ./dist, else the repository's dist/)")
    serve.add_argument("--test-hooks", action="store_true",
                       help="expose the test hooks (window.__weeiTestHooks) on the landing page: for tests and "
                            "benchmarks only, never in production")
    from .server.signaling import add_arguments as add_server_arguments

    add_server_arguments(serve)
    agent = commands.add_parser("agent", help="take part in jobs from a server, without a browser (Ctrl-C stops)")
    from .agent.main import add_arguments as add_agent_arguments

    add_agent_arguments(agent)
    from .modelkit.commands import GROUPS as MODEL_GROUPS, add_commands as add_model_commands

    add_model_commands(commands)
    args = parser.parse_args(argv)
    if args.command in MODEL_GROUPS:
        from .modelkit.commands import run as run_model_command

        return run_model_command(args)
    if args.command == "agent":
        from .agent.main import run_cli

        return run_cli(args)
    if args.command == "serve":
        return _serve(args)
    if args.command == "train":
        return _train(args)
    if args.command == "flower":
        return _flower(args)
    if args.command == "demo":
        from .demo.run import DEMO_JOBS, run_demo

        jobs = tuple(j for j in DEMO_JOBS if not args.job or j.name in args.job)
        if args.browsers:
            from .demo.browsers import run_browser_demo

            return run_browser_demo(args.out, stream=sys.stdout, jobs=jobs)
        return run_demo(args.out, stream=sys.stdout, jobs=jobs)
    return 2


def _train(args: argparse.Namespace) -> int:
    from .core.errors import WeeiError
    from .demo.train import read_settings, train_package

    try:
        report = train_package(args.package, args.out, stream=sys.stdout, data=args.data, peers=args.peers,
                               settings=read_settings(args.settings), seed=args.seed)
    except WeeiError as exc:
        print(f"weei train: FAILED [{exc.reason}]: {exc.message}", file=sys.stderr)
        return 1
    except (OSError, RuntimeError) as exc:
        print(f"weei train: FAILED: {exc}", file=sys.stderr)
        return 1
    print("OK: the validation improved" if report.improved else "done (the validation did not improve)")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from .core.errors import UsageError
    from .server import default_site_dir, run
    from .server.signaling import configs_from

    site_dir = args.dir or default_site_dir()
    if not (site_dir / "weei.js").is_file():
        print(f"weei serve: {site_dir} holds no built site; run: python build.py site", file=sys.stderr)
        return 2

    try:
        signaling, limits = configs_from(args)
    except (UsageError, OSError) as exc:
        print(f"weei serve: {exc}", file=sys.stderr)
        return 2

    def ready(url: str) -> None:
        from .server.invite import embed_snippet, fresh_key, invite_url

        print(f"Weei is serving {site_dir} at {url}", flush=True)
        # The server keeps no room list: any fresh key makes a room. The key is in the fragment.
        key = fresh_key()
        print(f"Invite link of a new room (open it, share it): {invite_url(url, key)}", flush=True)
        print("  Open it here, and in another tab, browser or machine, to train together "
              "(the Weei window shows the room and copies the link).", flush=True)
        print("Embed the window in a page of yours, in the same room (a page of another origin needs "
              "--allow-origin ORIGIN):", flush=True)
        for line in embed_snippet(url, key).splitlines():
            print(f"  {line}", flush=True)

    try:
        return run(site_dir, args.host, args.port, on_ready=ready, signaling=signaling, limits=limits,
                   test_hooks=args.test_hooks)
    except OSError as exc:
        print(f"weei serve: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1

def _flower(args: argparse.Namespace) -> int:
    from .flower.apps import simulate, write_app

    if args.flower_command == "app":
        out = write_app(args.package, args.out)
        print(f"wrote a Flower App in {out}: `flwr run {out}` runs it (telemetry off; Weei must be installed "
              f"where it runs, see docs/flower.md)")
        return 0
    settings = json.loads(args.settings.read_text()) if args.settings else None
    simulate(args.package, nodes=args.nodes, out=args.out, stream=sys.stdout, settings=settings, seed=args.seed,
             resume=args.resume.read_bytes() if args.resume else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
