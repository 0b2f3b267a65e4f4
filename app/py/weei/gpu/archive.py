"""The WGSL shader archive (``weei-wgsl-archive-v1``), sans-I/O.

An archive is one UTF-8 JSON file::

    {"format": "weei-wgsl-archive-v1",
     "modules": [{"name": "matmul.wgsl", "sha256": "<hex of the UTF-8 source>",
                  "entryPoints": ["forward", ...], "source": "..."}]}

Parsing checks everything that needs no device (docs/gpu.md, "Checked
module by module"): the file's size and SHA-256 against the package's
``shaderArchive``, the shape, each module's SHA-256 and declared entry
points. Compiling each module on the device is the executor's half.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from ..core._check import parse_json
from ..core.limits import MAX_SHADER_ARCHIVE_BYTES
from .errors import GpuError, GpuReason

__all__ = [
    "ARCHIVE_FORMAT",
    "MAX_ARCHIVE_BYTES",
    "ShaderModule",
    "ShaderArchive",
    "check_descriptor",
    "parse_archive",
    "require_modules",
    "entry_points_of",
    "pack_archive",
    "dump_archive",
]

ARCHIVE_FORMAT = "weei-wgsl-archive-v1"
MAX_ARCHIVE_BYTES = MAX_SHADER_ARCHIVE_BYTES  # weei.core.limits: the same limit on the wire
MAX_MODULES = 64
MAX_ENTRY_POINTS = 32
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}\.wgsl")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_HEX64 = re.compile(r"[0-9a-f]{64}")
# The tokens entry_points_of reads: an attribute (@compute, @workgroup_size(64)),
# fn NAME, and the text between them in long runs (no @ and no f: one token for
# most of a line). Each alternative is linear and the arguments are bounded, so
# a scan is linear: the one regex this replaced, an attribute list with nested
# quantifiers, backtracked exponentially on a run of attributes with spaces
# (12 of them took 0.3 s, and each one more three times as long).
_TOKEN = re.compile(r"@(\w+)\s*(?:\([^)]{0,128}\))?|\bfn\s+([A-Za-z_]\w*)|[^@f]+|[@f]")


@dataclass(frozen=True)
class ShaderModule:
    name: str
    sha256: str
    entry_points: tuple[str, ...]
    source: str


@dataclass(frozen=True)
class ShaderArchive:
    sha256: str  # of the whole file
    bytes: int
    modules: tuple[ShaderModule, ...]

    def module(self, name: str) -> ShaderModule | None:
        return next((m for m in self.modules if m.name == name), None)

    @property
    def module_sha256s(self) -> list[str]:
        """The modules' SHA-256s, for diagnostics.gpu / model.wgsl.sha256."""
        return [m.sha256 for m in self.modules]


def entry_points_of(source: str) -> tuple[str, ...]:
    """The ``@compute`` functions of a WGSL source, in source order."""
    found: list[str] = []
    compute = False  # the attributes right before this point include @compute
    for token in _TOKEN.finditer(source):
        attribute, name = token.group(1), token.group(2)
        if attribute is not None:
            compute = compute or attribute == "compute"
        elif name is not None:
            if compute:
                found.append(name)
            compute = False
        elif not token.group().isspace():
            compute = False
    return tuple(found)


def check_descriptor(data: bytes, size: int, sha256: str) -> None:
    """The selected file is the package's own ``shaderArchive``."""
    if len(data) != size:
        raise GpuError(GpuReason.ARCHIVE_SIZE_MISMATCH, f"the WGSL archive is {len(data)} bytes, the package says {size}")
    if hashlib.sha256(data).hexdigest() != sha256:
        raise GpuError(GpuReason.ARCHIVE_HASH_MISMATCH, "the WGSL archive's SHA-256 differs from the package's shaderArchive")


def _malformed(message: str) -> GpuError:
    return GpuError(GpuReason.ARCHIVE_MALFORMED, f"WGSL archive: {message}")


def _refuse(message: str) -> NoReturn:
    # parse_json's fail: not UTF-8 JSON, or nested past MAX_JSON_DEPTH.
    raise _malformed(message)


def parse_archive(data: bytes) -> ShaderArchive:
    """Parse and check an archive (untrusted bytes) into a :class:`ShaderArchive`."""
    if len(data) > MAX_ARCHIVE_BYTES:
        raise _malformed(f"{len(data)} bytes, more than {MAX_ARCHIVE_BYTES}")
    doc = parse_json(data, _refuse)
    if not isinstance(doc, dict):
        raise _malformed("not a JSON object")
    if doc.get("format") != ARCHIVE_FORMAT:
        raise GpuError(GpuReason.ARCHIVE_FORMAT, f"WGSL archive: format must be {ARCHIVE_FORMAT!r}, not {doc.get('format')!r}")
    items = doc.get("modules")
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_MODULES:
        raise _malformed(f"modules must be a list of 1 to {MAX_MODULES} modules")
    modules: list[ShaderModule] = []
    for k, item in enumerate(items):
        where = f"modules[{k}]"
        if not isinstance(item, dict):
            raise _malformed(f"{where} is not an object")
        name, sha, eps, source = (item.get(f) for f in ("name", "sha256", "entryPoints", "source"))
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise _malformed(f"{where}.name must be a file name ending in .wgsl")
        if any(m.name == name for m in modules):
            raise GpuError(GpuReason.MODULE_DUPLICATE, f"WGSL archive: module {name!r} appears twice")
        if not isinstance(sha, str) or not _HEX64.fullmatch(sha):
            raise _malformed(f"{name}: sha256 must be 64 lowercase hex digits")
        if not isinstance(source, str):
            raise _malformed(f"{name}: source must be a string")
        if not isinstance(eps, list) or not 1 <= len(eps) <= MAX_ENTRY_POINTS or not all(
            isinstance(e, str) and _IDENT.fullmatch(e) for e in eps
        ) or len(set(eps)) != len(eps):
            raise _malformed(f"{name}: entryPoints must list 1 to {MAX_ENTRY_POINTS} distinct identifiers")
        try:
            encoded = source.encode("utf-8")
        except UnicodeEncodeError:  # a "\ud800" escape in the JSON: no UTF-8 text, so no SHA-256 to match
            raise _malformed(f"{name}: source is not Unicode text (a lone surrogate)") from None
        if hashlib.sha256(encoded).hexdigest() != sha:
            raise GpuError(GpuReason.MODULE_HASH_MISMATCH, f"WGSL archive: module {name!r} does not match its SHA-256")
        found = entry_points_of(source)
        missing = [e for e in eps if e not in found]
        if missing:
            raise GpuError(GpuReason.MODULE_ENTRY_POINT_MISSING, f"WGSL archive: {name} has no @compute fn {missing[0]}")
        modules.append(ShaderModule(name, sha, tuple(eps), source))
    return ShaderArchive(hashlib.sha256(data).hexdigest(), len(data), tuple(modules))


def require_modules(archive: ShaderArchive, names: Iterable[str]) -> None:
    """Every module a program names is in the archive."""
    for name in names:
        if archive.module(name) is None:
            raise GpuError(GpuReason.MODULE_MISSING, f"the WGSL archive has no module {name!r}")


def dump_archive(archive: ShaderArchive) -> bytes:
    """The checked archive as an archive file again (what a training Worker gets; it parses it anew)."""
    modules = [{"name": m.name, "sha256": m.sha256, "entryPoints": list(m.entry_points), "source": m.source}
               for m in archive.modules]
    return json.dumps({"format": ARCHIVE_FORMAT, "modules": modules}, ensure_ascii=False).encode("utf-8")


def pack_archive(sources: Mapping[str, str]) -> bytes:
    """An archive of ``{name: source}`` (sorted by name); build.py writes it."""
    modules: list[dict[str, Any]] = []
    for name in sorted(sources):
        source = sources[name]
        modules.append({
            "name": name,
            "sha256": hashlib.sha256(source.encode("utf-8")).hexdigest(),
            "entryPoints": list(entry_points_of(source)),
            "source": source,
        })
    text = json.dumps({"format": ARCHIVE_FORMAT, "modules": modules}, indent=2, ensure_ascii=False)
    return (text + "\n").encode("utf-8")
