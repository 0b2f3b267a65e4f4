"""``weei data chunk FILE --chunks N``: records into chunks and their dataset manifest.

Input: a CSV file, one record per line: the features as numbers, then the
label as an integer 0..2^32-1 in the last column. A first line that is not
all numbers is a header and skipped; blank lines are skipped. Every record
has the same number of columns.

Output (format ``weei-records-v1``, what the ``weei model new`` dataset
template reads): ``training-001.bin`` ... ``training-NNN.bin``, each
"WRC1", u32-le record count n, u32-le feature count, then n records of
float32-le features and a u32-le label; an optional ``validation.bin`` in
the same format; ``dataset-manifest.json``, the spec's dataset manifest of
the chunks (the same entries ``weei model build`` puts inline).

The records are shuffled before they are dealt (a CSV sorted by class would
otherwise give one-class chunks and a one-class validation file); the seed
is drawn when none is given and reported, so a run can be repeated.
"""

from __future__ import annotations

import csv
import hashlib
import math
import random
import secrets
import struct
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.errors import UsageError, UsageReason
from ..core.formats.jsonfmt import stringify
from ..core.limits import check_file_size

__all__ = ["RECORDS_FORMAT", "MAGIC", "Records", "read_csv", "encode_records", "ChunkReport", "histogram", "chunk_file"]

RECORDS_FORMAT = "weei-records-v1"
MAGIC = b"WRC1"
_LABEL_MAX = 2**32 - 1
_FLOAT32_MAX = 3.4028234663852886e38


@dataclass(frozen=True)
class Records:
    """Parsed records: features (each of ``feature_count`` floats) and labels."""

    feature_count: int
    features: list[list[float]]
    labels: list[int]


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def read_csv(path: Path) -> Records:
    """Parse the CSV input. Raises: UsageError 'bad-record' naming the line."""
    features: list[list[float]] = []
    labels: list[int] = []
    width = 0
    with path.open(newline="", encoding="utf-8") as fh:
        for line_no, row in enumerate(csv.reader(fh), start=1):
            cells = [c.strip() for c in row]
            if not cells or cells == [""]:
                continue
            values = [_number(c) for c in cells]
            if line_no == 1 and any(v is None for v in values):
                continue  # a header
            where = f"{path}:{line_no}"
            if len(cells) < 2:
                raise UsageError(UsageReason.BAD_RECORD, f"{where}: a record needs at least one feature and a label")
            if width and len(cells) != width:
                raise UsageError(UsageReason.BAD_RECORD, f"{where}: {len(cells)} columns, the first record has {width}")
            width = width or len(cells)
            if any(v is None or not math.isfinite(v) for v in values):
                raise UsageError(UsageReason.BAD_RECORD, f"{where}: every column must be a finite number")
            label = values[-1]
            assert label is not None
            if label != int(label) or not 0 <= label <= _LABEL_MAX:
                raise UsageError(UsageReason.BAD_RECORD, f"{where}: the label (last column) must be a non-negative integer")
            feats = [float(v) for v in values[:-1] if v is not None]
            if any(abs(v) > _FLOAT32_MAX for v in feats):
                raise UsageError(UsageReason.BAD_RECORD, f"{where}: a feature does not fit a float32")
            features.append(feats)
            labels.append(int(label))
    if not labels:
        raise UsageError(UsageReason.NO_RECORDS, f"{path}: no records")
    return Records(width - 1, features, labels)


def encode_records(feature_count: int, features: list[list[float]], labels: list[int]) -> bytes:
    """One weei-records-v1 file."""
    record = struct.Struct(f"<{feature_count}fI")
    out = bytearray(MAGIC + struct.pack("<II", len(labels), feature_count))
    for feats, label in zip(features, labels):
        out += record.pack(*feats, label)
    return bytes(out)


@dataclass(frozen=True)
class ChunkReport:
    """What :func:`chunk_file` wrote: the manifest, the shuffle's seed and the labels of each file."""

    manifest: list[dict[str, Any]]
    seed: int
    #: label -> record count, one per chunk in manifest order
    chunk_labels: list[dict[int, int]]
    #: label -> record count of validation.bin (empty without one)
    validation_labels: dict[int, int] = field(default_factory=dict)


def histogram(labels: list[int]) -> dict[int, int]:
    """label -> count, by label."""
    return dict(sorted(Counter(labels).items()))


def chunk_file(path: Path, chunks: int, out: Path, *, validation: int = 0, seed: int | None = None) -> ChunkReport:
    """Write the chunks, validation.bin and dataset-manifest.json; return what was written.

    The records are shuffled by ``seed`` (one drawn at random when None,
    and reported); then ``validation`` records from the end go to
    validation.bin and the rest are dealt in order into ``chunks`` chunks
    of sizes differing by at most one.

    Raises: UsageError ('bad-record', 'no-records', 'bad-chunk-count',
    'output-not-empty'); ManifestError 'file-too-large' for a chunk over
    the limit of a chunk file.
    """
    records = read_csv(path)
    order = list(range(len(records.labels)))
    if seed is None:
        seed = secrets.randbelow(2**31)
    random.Random(seed).shuffle(order)
    if validation < 0 or validation >= len(order):
        raise UsageError(UsageReason.BAD_CHUNK_COUNT, f"--validation must leave training records: {validation} of {len(order)}")
    train = order[:len(order) - validation]
    if not 1 <= chunks <= len(train):
        raise UsageError(UsageReason.BAD_CHUNK_COUNT, f"--chunks must be from 1 to the {len(train)} training records, not {chunks}")
    if out.exists() and any(out.glob("training-*.bin")):
        raise UsageError(UsageReason.OUTPUT_NOT_EMPTY, f"{out} holds training chunks already; choose an empty --out")
    out.mkdir(parents=True, exist_ok=True)

    def encode(idx: list[int]) -> bytes:
        return encode_records(records.feature_count, [records.features[i] for i in idx], [records.labels[i] for i in idx])

    manifest = []
    chunk_labels = []
    base, extra = divmod(len(train), chunks)
    start = 0
    for k in range(chunks):
        size = base + (1 if k < extra else 0)
        name = f"training-{k + 1:03d}.bin"
        data = encode(train[start:start + size])
        check_file_size("chunk", name, len(data))
        (out / name).write_bytes(data)
        manifest.append({"id": f"chunk-{k + 1:03d}", "fileName": name, "bytes": len(data),
                         "sha256": hashlib.sha256(data).hexdigest(), "format": RECORDS_FORMAT, "exampleCount": size})
        chunk_labels.append(histogram([records.labels[i] for i in train[start:start + size]]))
        start += size
    held = order[len(order) - validation:] if validation else []
    if held:
        data = encode(held)
        check_file_size("validation", "validation.bin", len(data))
        (out / "validation.bin").write_bytes(data)
    (out / "dataset-manifest.json").write_text(stringify(manifest, 2) + "\n", encoding="utf-8")
    return ChunkReport(manifest, seed, chunk_labels, histogram([records.labels[i] for i in held]))
