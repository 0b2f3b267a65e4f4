"""The ``weei model`` and ``weei data`` command groups (docs/models.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TextIO

from .chunk import ChunkReport
from .template import SAMPLE

__all__ = ["GROUPS", "add_commands", "invoked_as", "print_chunks", "run"]

GROUPS = ("model", "data")


def add_commands(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``model new|build`` and ``data chunk`` on the weei parser."""
    model = commands.add_parser("model", help="make and package a model of your own (docs/models.md)")
    model_cmds = model.add_subparsers(dest="model_command", required=True)
    new = model_cmds.add_parser("new", help="write a model template that compiles (and a sample dataset) into a "
                                            "new folder, as `cargo new PATH` does")
    new.add_argument("path", type=Path, help="the folder to create; its name is the model ID unless --name")
    new.add_argument("--name", default=None, help="the model ID (lowercase letters, digits and '-'; default: the "
                                                  "folder's name)")
    new.add_argument("--kind", choices=["dataset", "experience"], default="dataset",
                     help="a model that reads dataset chunks (default) or plays its own episodes")
    new.add_argument("--features", type=int, default=4, metavar="N", help="numbers per record (default 4)")
    new.add_argument("--classes", type=int, default=3, metavar="K", help="classes, labels 0..K-1 (default 3)")
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
                       help="put the last K records (after the shuffle) into validation.bin")
    chunk.add_argument("--seed", type=int, default=None,
                       help="the seed of the shuffle (default: a random one, printed, to repeat the run)")


def invoked_as() -> str:
    """How the user ran weei (``.venv/bin/weei`` when typed so), for the commands we print."""
    typed = sys.argv[0] if sys.argv else ""
    return typed if Path(typed).name == "weei" else "weei"


def _labels(counts: dict[int, int]) -> str:
    return " ".join(f"{label}:{n}" for label, n in counts.items())


def print_chunks(report: ChunkReport, out: Path, stdout: TextIO, stderr: TextIO) -> None:
    """The seed, each file's label histogram, and a warning for a one-class validation file."""
    examples = sum(e["exampleCount"] for e in report.manifest)
    print(f"shuffled with --seed {report.seed}", file=stdout)
    for entry, counts in zip(report.manifest, report.chunk_labels, strict=True):
        print(f"  {entry['fileName']}: {entry['exampleCount']} records, labels {_labels(counts)}", file=stdout)
    held = sum(report.validation_labels.values())
    if held:
        print(f"  validation.bin: {held} records, labels {_labels(report.validation_labels)}", file=stdout)
    print(f"wrote {len(report.manifest)} chunks ({examples} records) and dataset-manifest.json"
          + (f", validation.bin ({held} records)" if held else "") + f" into {out}", file=stdout)
    if len(report.validation_labels) == 1:
        (label,) = report.validation_labels
        print(f"warning: every validation record has label {label}: its accuracy says nothing about the other "
              "classes (more --validation records, or check the CSV's labels)", file=stderr)


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

            folder = args.path
            name = args.name if args.name is not None else folder.resolve().name
            files = new_model(name, args.kind, folder, features=args.features, classes=args.classes)
            weei = invoked_as()
            if args.kind == "experience":
                print(f"wrote {len(files)} files into {folder}: model.c, README.md, sdk/")
            else:
                records, chunks, validation = SAMPLE
                print(f"wrote {len(files)} files into {folder}: model.c ({args.features} features, {args.classes} "
                      f"classes), README.md, sdk/, sample.csv ({records} records) chunked into data/ "
                      f"({chunks} chunks, validation.bin of {validation})")
                print(f"your data instead: {weei} data chunk records.csv --chunks 8 --validation 200 "
                      f"--out {folder / 'data'} (after removing the sample's data/)")
            print(f"next: {weei} model build {folder} && {weei} train {folder} --out {folder / 'run'}")
            return 0
        from .chunk import chunk_file

        report = chunk_file(args.file, args.chunks, args.out, validation=args.validation, seed=args.seed)
        print_chunks(report, args.out, sys.stdout, sys.stderr)
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
