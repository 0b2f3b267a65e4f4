"""What ``weei model build`` compiles from a model folder, and what it refuses.

Theory of operation
-------------------
A model folder may come from someone else, and the module built from it is
shared with every participant of a job. Whatever the compiler reads ends up
able to reach that module, so a folder must not make it read a file of the
machine that builds it (a private key through ``.incbin "/home/u/.ssh/id_ed25519"``
or ``#include "/etc/..."``). So:

* only the sources the folder declares are compiled: ``sources`` in
  ``weei-model.toml`` (relative ``.c`` paths inside the folder), plus the
  SDK's own ``.c`` files by the names this Weei ships (``sdk/weei_sdk.c``
  ...); another ``.c`` lying in the folder is never compiled;
* every compiled source is first preprocessed alone (``clang -E``, bounded
  in time): every file it includes, whatever macro names it, must resolve
  inside the folder or clang's own headers (``-print-resource-dir``), and
  the preprocessed text -- macros expanded, so token pasting hides nothing
  -- may hold no ``.incbin`` and no inline assembly (``asm``/``__asm__``:
  the only way to reach the assembler's file directives from C).

Each refusal is a BuildError naming the source and what it asked for.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
import tomllib
from pathlib import Path, PurePosixPath

from .compile import WASM_FLAGS, BuildError, sdk_dir

__all__ = ["DECLARATION", "PREPROCESS_TIMEOUT_S", "check_source", "model_sources"]

#: The file of a model folder that lists its C sources.
DECLARATION = "weei-model.toml"
#: One source's preprocessing; a source including /dev/zero or a FIFO stops here.
PREPROCESS_TIMEOUT_S = 60.0
_MAX_SOURCES = 256

# String and character literals are dropped before looking for asm, so text
# that merely mentions it is no assembly (the .incbin check reads them too).
_LITERAL = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'')
_ASM = re.compile(r"\b(?:asm|__asm|__asm__)\b")
_INCBIN = re.compile(r"incbin", re.IGNORECASE)


def _declared(folder: Path) -> list[str]:
    path = folder / DECLARATION
    if not path.is_file():
        raise BuildError(f"{path} is missing: list the model's C files in it, for example "
                         f'sources = ["model.c"] (weei model new writes one)')
    try:
        sources = tomllib.loads(path.read_text(encoding="utf-8")).get("sources")
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise BuildError(f"{path}: not TOML ({exc})") from None
    if (not isinstance(sources, list) or not sources or len(sources) > _MAX_SOURCES
            or not all(isinstance(s, str) for s in sources)):
        raise BuildError(f"{path}: sources must be a list of 1 to {_MAX_SOURCES} file names, "
                         f'for example sources = ["model.c"]')
    return sources


def _inside(folder: Path, name: str) -> Path:
    """``name`` (a declared source, POSIX relative) as a path relative to ``folder``."""
    pure = PurePosixPath(name)
    if (pure.is_absolute() or ".." in pure.parts or pure.suffix != ".c" or "\\" in name
            or not (folder / pure).resolve().is_relative_to(folder) or not (folder / pure).is_file()):
        raise BuildError(f"{folder / DECLARATION}: source {name!r} is not a .c file inside the folder")
    return Path(pure)


def model_sources(folder: Path) -> list[Path]:
    """The sources to compile for the model folder ``folder`` (absolute), relative
    to it: the declared ones, then the SDK's. Raises BuildError (no or a bad
    declaration, a missing SDK file)."""
    declared = [_inside(folder, name) for name in _declared(folder)]
    sdk = [Path("sdk") / p.name for p in sorted(sdk_dir().glob("*.c"))]
    missing = [str(p) for p in sdk if not (folder / p).is_file()]
    if missing:
        raise BuildError(f"{folder}: the SDK's {', '.join(missing)} missing (weei model new copies them)")
    return list(dict.fromkeys(declared + sdk))


def _dependencies(text: str) -> list[str]:
    """The prerequisites of a ``-MD`` file (one rule); a name with a backslash
    (an escaped space, a Windows path) is refused rather than unescaped."""
    body = text.replace("\\\n", " ").split(":", 1)
    if len(body) != 2:
        raise BuildError(f"clang wrote an unreadable dependency list: {text[:200]!r}")
    names = body[1].split()
    odd = [n for n in names if "\\" in n or "$" in n]
    if odd:
        raise BuildError(f"refused: an included file with an unusual name ({odd[0]!r})")
    return names


def check_source(folder: Path, source: Path) -> None:
    """Preprocess ``source`` (relative to ``folder``) and refuse it when it
    includes a file outside the folder and clang's headers, or holds
    ``.incbin`` or inline assembly. Raises BuildError naming what it found."""
    try:
        resource = Path(subprocess.run(["clang", "-print-resource-dir"], capture_output=True, text=True,
                                       timeout=PREPROCESS_TIMEOUT_S, check=True).stdout.strip()).resolve()
    except FileNotFoundError:
        raise BuildError("clang is not installed (make setup installs clang and lld)") from None
    except (subprocess.SubprocessError, OSError) as exc:
        raise BuildError(f"clang -print-resource-dir failed: {exc}") from None
    flags = [f for f in WASM_FLAGS if not f.startswith("-Wl,")]
    with tempfile.TemporaryDirectory(prefix="weei-cpp-") as tmp:
        pre, deps = Path(tmp) / "source.i", Path(tmp) / "source.d"
        try:
            proc = subprocess.run(["clang", *flags, "-E", "-MD", "-MF", str(deps), "-o", str(pre), str(source)],
                                  cwd=folder, capture_output=True, text=True, timeout=PREPROCESS_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise BuildError(f"refused: preprocessing {source} took over {PREPROCESS_TIMEOUT_S:g} s "
                             "(does it include a device or a pipe?)") from None
        if proc.returncode != 0:
            raise BuildError(f"clang -E {source}\n{proc.stdout}{proc.stderr}")
        for name in _dependencies(deps.read_text(encoding="utf-8", errors="replace")):
            path = (folder / name).resolve()
            if not (path.is_relative_to(folder) or path.is_relative_to(resource)):
                raise BuildError(f"refused: {source} includes {name}, outside the model folder and clang's headers")
        text = pre.read_text(encoding="utf-8", errors="replace")
    if _INCBIN.search(text):
        raise BuildError(f"refused: {source} uses .incbin (it would embed a file of this machine in the module)")
    found = _ASM.search(_LITERAL.sub('""', text))
    if found:
        raise BuildError(f"refused: {source} uses inline assembly ({found.group(0)}), which could embed files "
                         "of this machine in the module")
