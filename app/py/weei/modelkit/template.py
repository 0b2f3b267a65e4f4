"""``weei model new PATH``: a model folder that compiles, outside the repository.

The folder gets ``model.c`` (a dataset or an experience model written
against the SDK), ``weei-model.toml`` naming it as the one source to
compile (:mod:`.sources`), a copy of the SDK in ``sdk/`` (so the folder builds on its
own, wherever it lives) and a README with the next commands. A dataset
model also gets a sample: ``sample.csv``, Gaussian blobs of the model's
feature and class counts, already chunked into ``data/``, so that
new -> build -> train works before the user brings data of their own.
"""

from __future__ import annotations

import random
import re
import shutil
from pathlib import Path

from .chunk import chunk_file
from .compile import BuildError, sdk_dir
from .sources import DECLARATION

__all__ = ["KINDS", "NAME_PATTERN", "MAX_FEATURES", "MAX_CLASSES", "SAMPLE", "new_model", "write_sample"]

KINDS = ("dataset", "experience")
#: A model ID that is also a folder name and a C string without escapes.
NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
_TEMPLATES = Path(__file__).resolve().parent / "templates"
_DECLARATION_TEXT = """\
# The C files `weei model build` compiles, besides the SDK's (sdk/*.c by the
# names Weei ships). Another .c in this folder is not compiled: add it here.
sources = ["model.c"]
"""

# The template's weights and one record must stay far below the limits of a module and a chunk.
MAX_FEATURES = 4096
MAX_CLASSES = 1024
#: The sample's size: records, training chunks and validation records.
SAMPLE = (600, 6, 120)


def write_sample(path: Path, features: int, classes: int, *, records: int, seed: int = 0) -> None:
    """A CSV of ``records`` Gaussian blobs, one per class, in ``features`` dimensions (label last)."""
    r = random.Random(seed)
    centers = [[r.uniform(-3.0, 3.0) for _ in range(features)] for _ in range(classes)]
    lines = [",".join([f"f{i + 1}" for i in range(features)] + ["label"])]
    for k in range(records):
        c = k % classes
        lines.append(",".join(f"{x + r.gauss(0.0, 1.0):.4f}" for x in centers[c]) + f",{c}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def new_model(name: str, kind: str, folder: Path, *, features: int = 4, classes: int = 3) -> list[Path]:
    """Write the template for model ``name`` into ``folder``; return the files written.

    A dataset model reads ``features`` numbers per record and tells
    ``classes`` classes apart; it comes with ``sample.csv`` chunked into
    ``data/`` (6 chunks, 120 validation records).

    Raises: BuildError for a name that is not a model ID (lowercase letters,
    digits and '-', at most 63), an unknown kind, feature or class counts
    out of range, or a folder that exists and is not empty (nothing is
    overwritten).
    """
    if not NAME_PATTERN.fullmatch(name):
        raise BuildError(f"{name!r} is not a model ID: use lowercase letters, digits and '-' (at most 63); "
                         "name the folder so, or give --name")
    if kind not in KINDS:
        raise BuildError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")
    if not 1 <= features <= MAX_FEATURES:
        raise BuildError(f"--features must be from 1 to {MAX_FEATURES}, not {features}")
    if not 2 <= classes <= MAX_CLASSES:
        raise BuildError(f"--classes must be from 2 to {MAX_CLASSES}, not {classes}")
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise BuildError(f"{folder} exists and is not an empty directory; choose another path")
    sdk = sdk_dir()
    (folder / "sdk").mkdir(parents=True, exist_ok=True)
    written = []
    for src in sorted(sdk.iterdir()):
        if src.suffix in (".c", ".h"):
            shutil.copyfile(src, folder / "sdk" / src.name)
            written.append(folder / "sdk" / src.name)
    for template, target in ((_TEMPLATES / kind / "model.c", "model.c"), (_TEMPLATES / f"README.{kind}.md", "README.md")):
        text = template.read_text(encoding="utf-8").replace("@NAME@", name)
        text = text.replace("@FEATURES@", str(features)).replace("@CLASSES@", str(classes))
        (folder / target).write_text(text, encoding="utf-8")
        written.append(folder / target)
    (folder / DECLARATION).write_text(_DECLARATION_TEXT, encoding="utf-8")
    written.append(folder / DECLARATION)
    if kind == "dataset":
        records, chunks, validation = SAMPLE
        write_sample(folder / "sample.csv", features, classes, records=records)
        chunk_file(folder / "sample.csv", chunks, folder / "data", validation=validation, seed=0)
        written.append(folder / "sample.csv")
        written.extend(sorted((folder / "data").iterdir()))
    return written
