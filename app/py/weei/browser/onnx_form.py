"""The widget's ONNX form, in the page's Pyodide: an .onnx file to a package, a checkpoint back to ONNX.

``importOnnx`` runs ``weei model import`` (weei.modelkit.onnx_package) on
the files the page chose, in Pyodide's in-memory file system, with the
page's engine for the checks and the graph runtime the page fetched from
the site (weei-py.zip holds only Python). It answers the package's
``model.wasm`` and ``manifest.json``, with which the page creates a job as
with any chosen package. ``exportOnnx`` writes the user's ONNX file with
the weights of one of this job's stored checkpoints (docs/onnx.md).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from weei.api.controller import TrainingController
from weei.api.job_store import checkpoint_key
from weei.api.stored import stored_checkpoint
from weei.core.errors import UsageError, UsageReason
from weei.core.formats.checkpoint import read_checkpoint
from weei.modelkit.onnx_package import default_model_id, import_package
from weei.modelkit.package import ARCHIVE_NAME
from weei.onnx import OnnxError, Settings, export_onnx, OnnxReason

__all__ = ["import_in_page", "export_in_page"]

#: The chunk names import_package reads (what weei data chunk writes).
_DATA_NAMES = ("training-", "validation.bin")


def _settings(args: dict[str, Any], onnx_name: str) -> Settings:
    def number(key: str, kind: type) -> Any:
        value = args.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)):
            raise OnnxError(OnnxReason.BAD_SETTING, f"{key} must be a number")
        return kind(value)

    words = {k: args.get(k) for k in ("loss", "optimizer", "dataFormat")}
    if not all(isinstance(v, str) for v in words.values()):
        raise OnnxError(OnnxReason.BAD_SETTING, "loss, optimizer and dataFormat must be strings")
    model_id = args.get("modelId") or default_model_id(onnx_name)
    if not isinstance(model_id, str):
        raise OnnxError(OnnxReason.BAD_SETTING, "modelId must be a string")
    return Settings(loss=words["loss"], optimizer=words["optimizer"], lr=number("learningRate", float),
                    batch_size=number("batchSize", int), data=words["dataFormat"], model_id=model_id,
                    name=f"{onnx_name} (ONNX)")


def import_in_page(engine: Any, args: dict[str, Any], onnx: bytes, runtime: bytes,
                   files: dict[str, bytes], kernels: bytes | None = None) -> list[tuple[str, bytes]]:
    """[("model.wasm", …), ("manifest.json", …), ("model.wgsl.json", …)?] of the package made from
    ``onnx`` and the data ``files``; the archive is there when ``kernels`` (the site's
    kernels.wgsl.json) is given and the graph's device program runs, as with ``weei model import``.
    Raises: OnnxError; the checker's ManifestError/SettingsError/ModelError."""
    onnx_name = str(args.get("onnxName") or "model.onnx")
    settings = _settings(args, onnx_name)
    with tempfile.TemporaryDirectory(prefix="weei-onnx-") as tmp:
        root = Path(tmp)
        (root / "data").mkdir()
        for name, data in files.items():
            base = name.rsplit("/", 1)[-1]
            if base.startswith(_DATA_NAMES) and base.endswith(".bin"):
                (root / "data" / base).write_bytes(data)
        (root / "model.onnx").write_bytes(onnx)
        out = root / "package"
        import_package(root / "model.onnx", settings, out, root / "data", engine=engine, runtime=runtime,
                       kernels=kernels)
        return [(name, (out / name).read_bytes()) for name in ("model.wasm", "manifest.json", ARCHIVE_NAME)
                if (out / name).is_file()]


async def export_in_page(controller: TrainingController, round_: Any, onnx: bytes) -> tuple[str, bytes]:
    """The ONNX file of this job's checkpoint of round ``round_``: ``onnx`` with its weights.
    Raises: UsageError (no-job, no-checkpoint); OnnxError (checkpoint-mismatch and the exporter's)."""
    job = controller.get_state().get("job")
    if not job:
        raise UsageError(UsageReason.NO_JOB, "there is no job")
    if isinstance(round_, bool) or not isinstance(round_, int):
        raise UsageError(UsageReason.INVALID_ARGUMENT, "round must be a whole number")
    key = checkpoint_key(job["id"], round_)
    stored = await controller.storage.get("checkpoints", key)
    if stored is None:
        raise UsageError(UsageReason.NO_CHECKPOINT, f"this browser keeps no checkpoint of round {round_} of this job")
    summary, file = stored_checkpoint(stored, key)
    checkpoint = read_checkpoint(file)
    if checkpoint.metadata.model_info.id != job["info"]["id"]:
        raise OnnxError(OnnxReason.CHECKPOINT_MISMATCH, "the checkpoint is of another model")
    stem = summary["artifact"]["fileName"].removesuffix(".weei-checkpoint")
    return f"{stem}.onnx", export_onnx(onnx, checkpoint.weights)
