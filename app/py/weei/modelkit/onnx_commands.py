"""``weei model import`` and ``weei model export`` on the command line (docs/onnx.md)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..onnx.compiler import FORMATS, LOSSES, OPTIMIZERS, Settings

__all__ = ["add_onnx_commands", "run_onnx_command"]


def add_onnx_commands(model_cmds: Any) -> None:
    imp = model_cmds.add_parser("import", help="turn an ONNX file into a package (model.wasm + manifest.json); no compiler needed")
    imp.add_argument("file", type=Path, help="the .onnx file (torch.onnx.export, tf2onnx, jax2onnx)")
    imp.add_argument("--loss", choices=sorted(LOSSES), required=True)
    imp.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="adam")
    imp.add_argument("--lr", type=float, default=0.01, help="the default learning rate (a job may set its own)")
    imp.add_argument("--batch-size", type=int, default=32, help="the default batch size")
    imp.add_argument("--data-format", choices=sorted(FORMATS), default="records",
                     help="records: weei data chunk's weei-records-v1 (features + label, any input shape); "
                          "digits: weei-digits-v1")
    imp.add_argument("--data", type=Path, default=None, help="folder of training-*.bin chunks (default OUT/data)")
    imp.add_argument("--id", default=None, help="the model ID (default: the file's name)")
    imp.add_argument("--out", type=Path, required=True, help="the package folder to write")
    exp = model_cmds.add_parser("export", help="write an imported model's ONNX file with a checkpoint's weights")
    exp.add_argument("checkpoint", type=Path, help="a .weei-checkpoint of the package's model")
    exp.add_argument("--package", type=Path, required=True, help="the package folder weei model import wrote")
    exp.add_argument("--onnx", type=Path, required=True, help="the .onnx file to write")


def _model_id(args: argparse.Namespace) -> str:
    from .onnx_package import default_model_id

    return str(args.id) if args.id else default_model_id(args.file.name)


def run_onnx_command(args: argparse.Namespace, stream: Any, errors: Any) -> int:
    from ..core.errors import WeeiError
    from .onnx_package import export_checkpoint, import_package

    try:
        if args.model_command == "import":
            settings = Settings(loss=args.loss, optimizer=args.optimizer, lr=args.lr, batch_size=args.batch_size,
                                data=args.data_format, model_id=_model_id(args), name=f"{args.file.name} (ONNX)")
            done = import_package(args.file, settings, args.out, args.data)
            print(f"model {done['info']['id']}: {done['weights']} float32 weights, {done['chunks']} chunks", file=stream)
            print("checks before sharing passed (weei.prepare.prepare_job); one train and one evaluate: "
                  + ", ".join(f"train {k} {v:.4g}" for k, v in done["train"].items()) + "; "
                  + ", ".join(f"eval {k} {v:.4g}" for k, v in done["evaluate"].items()), file=stream)
            gpu = done["gpu"]
            print(f"GPU: model.wgsl.json ({', '.join(gpu)}), the gpu-webgpu backend" if isinstance(gpu, list)
                  else f"GPU: none, the package trains on the CPU ({gpu})", file=stream)
            print(f"OK: wrote {args.out / 'model.wasm'}, manifest.json, model.onnx and data/", file=stream)
            return 0
        count = export_checkpoint(args.checkpoint, args.package, args.onnx)
        print(f"OK: wrote {args.onnx} ({count} trained weights)", file=stream)
        return 0
    except WeeiError as exc:
        print(f"weei model {args.model_command}: FAILED [{exc.reason}]: {exc.message}", file=errors)
        return 1
    except OSError as exc:
        print(f"weei model {args.model_command}: FAILED [io-error]: {exc}", file=errors)
        return 1
