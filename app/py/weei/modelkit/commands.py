"""The ``weei model`` and ``weei data`` command groups (docs/models.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["GROUPS", "add_commands", "run"]

GROUPS = ("model", "data")


def add_commands(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``model new|build`` and ``data chunk`` on the weei parser."""
    model = commands.add_parser("model", help="make and package a model of your own (docs/models.md)")
    model_cmds = model.add_subparsers(dest="model_command", required=True)
    new = model_cmds.add_parser("new", help="write a model template that compiles, in a folder of your choice")
    new.add_argument("name", help="the model ID (lowercase letters, digits and '-')")
    new.add_argument("--kind", choices=["dataset", "experience"], default="dataset",
                     help="a model that reads dataset chunks (default) or plays its own episodes")
    new.add_argument("--dir", type=Path, default=None, help="the folder to create (default ./NAME)")
    build = model_cmds.add_parser("build", help="compile a model folder into model.wasm + manifest.json and "
                                                "run every check the page runs before sharing")
    build.add_argument("dir", type=Path, help="the model folder (weei model new made it)")
    from .onnx_commands import add_onnx_commands

    add_onnx_commands(model_cmds)
    data = commands.add_parser("data", help="prepare dataset files for a model")
    data_cmds = data.add_subparsers(dest="data_command", required=True)
    chunk = data_cmds.add_parser("chunk", help="turn a CSV of records (features..., label) into weei-records-v1 "
                                               "chunks and their dataset manifest")
    chunk.add_argument("file", type=Path, help="CSV: numeric features, integer label in the last column")
    chunk.add_argument("--chunks", type=int, required=True, help="how many training chunks to write")
    chunk.add_argument("--out", type=Path, default=Path("data"), help="output folder (default ./data)")
    chunk.add_argument("--validation", type=int, default=0, metavar="K",
                       help="put the last K records (after --seed's shuffle) into validation.bin")
    chunk.add_argument("--seed", type=int, default=None, help="shuffle the records with this seed first")


def run(args: argparse.Namespace) -> int:
    """Run the parsed command; 0 on success, 1 with a named error on stderr."""
    from ..core.errors import WeeiError
    from .compile import BuildError

    if args.command == "model" and args.model_command in ("import", "export"):
        from .onnx_commands import run_onnx_command

        return run_onnx_command(args, sys.stdout, sys.stderr)
    if args.command == "model" and args.model_command == "build":
        from .builder import run_build

        return run_build(args.dir, sys.stdout, sys.stderr)
    try:
        if args.command == "model":
            from .template import new_model

            folder = args.dir if args.dir is not None else Path(args.name)
            files = new_model(args.name, args.kind, folder)
            print(f"wrote {len(files)} files into {folder}: model.c, README.md, sdk/")
            print("next: " + (f"weei model build {folder}" if args.kind == "experience" else
                              f"weei data chunk records.csv --chunks 8 --validation 200 --out {folder / 'data'}; "
                              f"weei model build {folder}"))
            return 0
        from .chunk import chunk_file

        manifest = chunk_file(args.file, args.chunks, args.out, validation=args.validation, seed=args.seed)
        examples = sum(e["exampleCount"] for e in manifest)
        print(f"wrote {len(manifest)} chunks ({examples} records) and dataset-manifest.json"
              + (f", validation.bin ({args.validation} records)" if args.validation else "") + f" into {args.out}")
        return 0
    except BuildError as exc:
        print(f"weei {args.command}: FAILED [build-error]: {exc}", file=sys.stderr)
        return 1
    except WeeiError as exc:
        print(f"weei {args.command}: FAILED [{exc.reason}]: {exc.message}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"weei {args.command}: FAILED [io-error]: {exc}", file=sys.stderr)
        return 1
