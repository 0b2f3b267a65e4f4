"""``weei train``: a federated job of any package, in one process, before inviting anyone.

The package is a folder with ``model.wasm`` and ``manifest.json`` (``weei
model import`` of an ONNX file, ``weei model build`` of the C kit, or a
built-in one under app/static/models). The job runs as ``weei demo`` runs
its own (:mod:`weei.demo.run`): N full controllers over the in-memory
transport, a row per checkpoint, the ``.weei-checkpoint`` files written
into the output folder.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TextIO

from ..core.errors import UsageError, UsageReason
from .run import DemoJob, JobReport, run_job

__all__ = ["DEFAULT_SETTINGS", "read_settings", "train_package"]

#: A short job: every chunk once, a validation after each round (a settings file overrides any of them).
DEFAULT_SETTINGS: dict[str, Any] = {
    "epochs": 1, "localEpochs": 1, "batchSize": 32, "coordinatorParticipates": True,
    "validationSchedule": {"enabled": True, "unit": "round", "every": 1},
}
_MAX_SETTINGS_BYTES = 1 << 20


def read_settings(path: Path | None) -> dict[str, Any]:
    """DEFAULT_SETTINGS updated with the JSON object in ``path``; the controller checks each setting.
    Raises: UsageError (bad-settings-file)."""
    settings = dict(DEFAULT_SETTINGS)
    if path is None:
        return settings
    try:
        with path.open("rb") as f:
            data = f.read(_MAX_SETTINGS_BYTES + 1)
    except OSError as exc:
        raise UsageError(UsageReason.BAD_SETTINGS_FILE, f"cannot read {path}: {exc}") from None
    if len(data) > _MAX_SETTINGS_BYTES:
        raise UsageError(UsageReason.BAD_SETTINGS_FILE, f"{path} is over {_MAX_SETTINGS_BYTES} bytes")
    from ..core._check import parse_json

    def bad(message: str) -> Any:
        raise UsageError(UsageReason.BAD_SETTINGS_FILE, f"{path} {message}")

    value = parse_json(data, bad)
    if not isinstance(value, dict):
        bad("is not a JSON object of job settings")
    settings.update(value)
    return settings


def train_package(package: Path, out: Path, *, stream: TextIO, data: Path | None = None, peers: int = 2,
                  settings: dict[str, Any] | None = None, seed: int | None = None) -> JobReport:
    """Train ``package`` in a job of ``peers`` peers (the coordinator included); checkpoints into ``out``.
    Raises: UsageError (no-manifest, bad-manifest, missing-data-file, invalid-argument); the controller's
    errors for a package or settings it refuses; RuntimeError when the job pauses."""
    if not 1 <= peers <= 64:
        raise UsageError(UsageReason.INVALID_ARGUMENT, f"--peers must be 1..64, not {peers}")
    data_dir = data if data is not None else package / "data"
    validation = "validation.bin" if (data_dir / "validation.bin").is_file() else None
    try:
        name = json.loads((package / "manifest.json").read_bytes())["execution"]["modelId"]
    except (OSError, ValueError, KeyError, TypeError):
        name = package.name  # package_inputs names what is wrong with the folder
    job = DemoJob(str(name), str(name), settings if settings is not None else dict(DEFAULT_SETTINGS), peers,
                  validation, package=package, data=data_dir)
    return run_job(job, out, stream=stream, settings=job.settings, seed=seed, flat=True)
