"""How large each kind of file may be, and the other limits more than one parser checks: one place each.

The spec gives two limits. "Weei accepts checkpoint and module files of up
to 256 MB" (decimal MB: the spec writes MiB and GiB where it means binary
units), and an auxiliary weights slot is "up to 2 GiB". Everything else a
job shares (dataset chunks, the validation file, updates, snapshots, which
are checkpoint weights) keeps the checkpoint and module limit, as before.
Each check runs on sizes alone, before a byte is read or shared.

A model's metrics have limits of their own (``MAX_METRICS``,
``MAX_METRIC_ID_CHARS``): the model-info parser and the message parser
(updates, progress reports, checkpoint notes) read the same constants, so
model info that passes never declares a metric every update would be
refused for.
"""

from __future__ import annotations

from typing import Iterable, Mapping

from .errors import ManifestError, ManifestReason

__all__ = ["DEFAULT_MEMORY_CAP", "MAX_FILE_BYTES", "MAX_AUXILIARY_BYTES", "MAX_QDELTA_BYTES", "MAX_SHADER_ARCHIVE_BYTES", "MAX_METRICS", "MAX_METRIC_ID_CHARS",
           "max_bytes", "check_file_size", "check_selection_sizes"]

#: Checkpoints and modules (and every kind without its own limit).
MAX_FILE_BYTES = 256_000_000
#: One auxiliary weights file: "up to 2 GiB".
MAX_AUXILIARY_BYTES = 2 * 1024**3

#: One compressed update (weei.core.formats.qdelta): its 24-byte header and at most the float32 weights it
#: stands for (a scale per 8 weights or fewer makes int8 and its scales 1.5 bytes a weight, raw values 4).
MAX_QDELTA_BYTES = MAX_FILE_BYTES + 24

#: One WGSL shader archive (docs/gpu.md): 4 MiB, checked before it is parsed or shared.
MAX_SHADER_ARCHIVE_BYTES = 4 << 20

#: Metrics a model declares (and a message reports), and the characters of each metric id.
MAX_METRICS = 64
MAX_METRIC_ID_CHARS = 64
#: A module's memory when the device sets no cap (``weei agent --memory-limit-mib``), and always in a
#: browser Worker: 1 GiB. createJob refuses weights and slots that cannot fit in it.
DEFAULT_MEMORY_CAP = 1 << 30

_BY_KIND = {"auxiliary": MAX_AUXILIARY_BYTES, "wgsl": MAX_SHADER_ARCHIVE_BYTES, "qdelta": MAX_QDELTA_BYTES}


def max_bytes(kind: str) -> int:
    """The most bytes a file of ``kind`` (an ArtifactRef kind: module, checkpoint, auxiliary, ...) may have."""
    return _BY_KIND.get(kind, MAX_FILE_BYTES)


def check_file_size(kind: str, name: str, size: int) -> None:
    """Raises ManifestError ``file-too-large`` when a ``kind`` file of ``size`` bytes is over its limit."""
    limit = max_bytes(kind)
    if size > limit:
        raise ManifestError(ManifestReason.FILE_TOO_LARGE, f"{name}: {size} bytes is over the {_label(limit)} limit of a {kind} file")


def check_selection_sizes(files: Mapping[str, int], auxiliary_names: Iterable[str]) -> None:
    """The size check of a job's selected files (the module is checked on its own, first).

    Takes: every selected file's size by name, and the file names the
    package lists as auxiliary weights slots; the others are dataset chunks.
    Raises: ManifestError ``file-too-large`` naming the first file over its limit.
    """
    auxiliary = set(auxiliary_names)
    for name, size in files.items():
        check_file_size("auxiliary" if name in auxiliary else "chunk", name, size)


def _label(limit: int) -> str:
    if limit == MAX_SHADER_ARCHIVE_BYTES:
        return "4 MiB"
    if limit == MAX_QDELTA_BYTES:
        return f"{MAX_FILE_BYTES // 1_000_000} MB + 24 bytes"
    return "2 GiB" if limit == MAX_AUXILIARY_BYTES else f"{limit // 1_000_000} MB"
