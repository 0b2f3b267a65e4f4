"""``weei model new NAME``: a model folder that compiles, outside the repository.

The folder gets ``model.c`` (a dataset or an experience model written
against the SDK), ``weei-model.toml`` naming it as the one source to
compile (:mod:`.sources`), a copy of the SDK in ``sdk/`` (so the folder builds on its
own, wherever it lives) and a README with the next commands.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from .compile import BuildError, sdk_dir
from .sources import DECLARATION

__all__ = ["KINDS", "NAME_PATTERN", "new_model"]

KINDS = ("dataset", "experience")
#: A model ID that is also a folder name and a C string without escapes.
NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
_TEMPLATES = Path(__file__).resolve().parent / "templates"
_DECLARATION_TEXT = """\
# The C files `weei model build` compiles, besides the SDK's (sdk/*.c by the
# names Weei ships). Another .c in this folder is not compiled: add it here.
sources = ["model.c"]
"""


def new_model(name: str, kind: str, folder: Path) -> list[Path]:
    """Write the template for model ``name`` into ``folder``; return the files written.

    Raises: BuildError for a name that is not a model ID (lowercase letters,
    digits and '-', at most 63), an unknown kind, or a folder that exists
    and is not empty (nothing is overwritten).
    """
    if not NAME_PATTERN.fullmatch(name):
        raise BuildError(f"{name!r} is not a model ID: use lowercase letters, digits and '-' (at most 63)")
    if kind not in KINDS:
        raise BuildError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise BuildError(f"{folder} exists and is not an empty directory; choose another --dir")
    sdk = sdk_dir()
    (folder / "sdk").mkdir(parents=True, exist_ok=True)
    written = []
    for src in sorted(sdk.iterdir()):
        if src.suffix in (".c", ".h"):
            shutil.copyfile(src, folder / "sdk" / src.name)
            written.append(folder / "sdk" / src.name)
    for template, target in ((_TEMPLATES / kind / "model.c", "model.c"), (_TEMPLATES / f"README.{kind}.md", "README.md")):
        (folder / target).write_text(template.read_text(encoding="utf-8").replace("@NAME@", name), encoding="utf-8")
        written.append(folder / target)
    (folder / DECLARATION).write_text(_DECLARATION_TEXT, encoding="utf-8")
    written.append(folder / DECLARATION)
    return written
