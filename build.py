"""Build the committed artifacts of Weei from source.

    python build.py wasm    compile c/models/*/ into app/static/models/<id>/model.wasm
                            with its manifest.json (a weei-model-package), and
                            c/kernel/*.c into app/static/kernel/<name>.wasm
                            and, for a model that exports gpuBegin/gpuNext/gpuEnd,
                            its WGSL archive model.wgsl.json (the wgsl/*.wgsl its
                            device programs name, packed by weei.gpu.pack_archive)
                            and GPU backend
    python build.py check   rebuild into a temporary directory and fail when a
                            committed artifact differs (builds are deterministic;
                            this includes the committed WGSL archives)
    python build.py site    assemble the static site in dist/ (what `weei serve`
                            serves): Pyodide from node_modules (npm ci when it is
                            missing or not the locked version), the weei package
                            as weei-py.zip, app/static's pages and scripts, the
                            kernel (recompiled when older than its C source),
                            the model packages and weei-snapshot.bin, the Pyodide
                            memory snapshot the page and the Workers start from
                            (tools/pyodide_snapshot.mjs, run with node)

Each subcommand is one ``cmd_*`` function registered in ``COMMANDS``; a new
one (for example ``site``) adds a function and a line there.

A model directory holds one or more .c files compiled together with the SDK
(c/sdk/*.c). Compiling and the manifest live in weei.modelkit, which
`weei model build` uses for a model outside the repository (docs/models.md):
the manifest's facts come from running the built module through
weei.runtime: getModelInfo for the id, workSource and auxiliaryWeights,
createInitialWeights for the weight size, describeChunk for each dataset chunk
(app/static/models/<id>/data/training-*.bin). Inline files are described by
the size and SHA-256 of JSON.stringify(value, null, 2) + "\\n".

A model directory may also hold ``gen.py``, a deterministic generator of its
dataset: ``write_data(out_dir)`` writes the chunks and validation.bin. Then
``wasm`` regenerates app/static/models/<id>/data before describing the
chunks, and ``check`` compares the generated files with the committed ones
too. byte-transformer (a byte-level transformer on synthetic reasoning text,
c/models/byte-transformer/README.md) is built this way; digits-mlp's chunks
are committed data (tools/export_digits.py).
"""

from __future__ import annotations

import argparse
import filecmp
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "app" / "py"))

from weei.core.formats.jsonfmt import stringify  # noqa: E402
from weei.modelkit import ARCHIVE_NAME, BuildError, model_manifest, probe_model  # noqa: E402
from weei.modelkit.compile import MODEL_EXTRA_FLAGS, NATIVE_FLAGS, WASM_FLAGS, compile_wasm, run_tool  # noqa: E402
from weei.modelkit.compile import compile_kernel as _compile_kernel  # noqa: E402

__all__ = ["WASM_FLAGS", "NATIVE_FLAGS", "build_all", "model_manifest", "build_site", "make_snapshot", "pack_weei", "main"]

C_DIR = Path("c")
SDK_DIR = C_DIR / "sdk"
MODELS_DIR = C_DIR / "models"
KERNEL_DIR = C_DIR / "kernel"
ONNX_DIR = C_DIR / "onnx"
WGSL_DIR = Path("wgsl")
STATIC_DIR = Path("app") / "static"

DIST_DIR = Path("dist")
PY_PACKAGE_DIR = Path("app") / "py" / "weei"
#: What loadPyodide({indexURL}) fetches: the loader, the Emscripten module
#: and its wasm, the standard library and the package lock (read at start
#: even when no package is loaded). Nothing else is copied (no .map, no
#: console pages, no node-only files).
PYODIDE_FILES = ("pyodide.mjs", "pyodide.asm.mjs", "pyodide.asm.wasm", "python_stdlib.zip", "pyodide-lock.json")
#: app/static files and directories that make up the site.
SITE_FILES = ("index.html", "landing.css", "landing.js", "weei.js", "boot.mjs", "host.js", "worker.js", "widget.js")
SITE_DIRS = ("models", "kernel", "widget", "embed", "onnx")  # onnx: the graph runtime the page's importer appends to
#: A fixed timestamp makes weei-py.zip reproducible.
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)
#: Makes the Pyodide memory snapshot (Pyodide started in Node, weei's modules imported).
SNAPSHOT_SCRIPT = Path("tools") / "pyodide_snapshot.mjs"
SNAPSHOT_NAME = "weei-snapshot.bin"

DIGITS_FORMAT = "weei-digits-v1"
#: A model directory with this file generates its dataset chunks (write_data(out_dir)).
DATA_GENERATOR = "gen.py"


def _run(cmd: list[str]) -> None:
    # Relative paths from the repository root keep the outputs independent of
    # where the checkout lives.
    run_tool(cmd, ROOT)


def compile_model(model_dir: Path, out: Path) -> None:
    """Compile one model directory (relative to the root) and the SDK into ``out`` (absolute path)."""
    compile_wasm(sorted(model_dir.glob("*.c")) + sorted(SDK_DIR.glob("*.c")), out, ROOT)


def compile_kernel(source: Path, out: Path) -> None:
    """Compile one c/kernel/*.c on its own into ``out``."""
    _compile_kernel(source, out, ROOT)


def wgsl_archive(modules: tuple[str, ...]) -> bytes:
    """The kernels of wgsl/ that a model's device programs name, in one weei-wgsl-archive-v1
    (docs/gpu.md): a participant compiles only what its model runs."""
    from weei.gpu import pack_archive

    missing = [name for name in modules if not (ROOT / WGSL_DIR / name).is_file()]
    if missing or not modules:
        raise BuildError(f"the device program names WGSL modules that {WGSL_DIR}/ lacks: {missing or 'none named'}")
    return pack_archive({name: (ROOT / WGSL_DIR / name).read_text(encoding="utf-8") for name in modules})


def generate_data(model_dir: Path, out_dir: Path) -> list[Path]:
    """Run the model's data generator (``gen.py``: ``write_data(out_dir)``)."""
    spec = importlib.util.spec_from_file_location(f"weei_gen_{model_dir.name.replace('-', '_')}",
                                                  model_dir / DATA_GENERATOR)
    if spec is None or spec.loader is None:
        raise BuildError(f"{model_dir / DATA_GENERATOR}: cannot be loaded")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return sorted(module.write_data(out_dir))


def build_all(static_dir: Path, data_root: Path | None = None) -> list[Path]:
    """Build every model and kernel into ``static_dir``; return the written files.

    Dataset chunks are read from ``data_root``/models/<id>/data (default:
    ``static_dir``), so a check build in a temporary directory describes the
    committed chunks.
    """
    data_root = data_root or static_dir
    written: list[Path] = []
    with tempfile.TemporaryDirectory(prefix="weei-build-") as tmp:
        for model_dir in sorted(p for p in (ROOT / MODELS_DIR).iterdir() if p.is_dir()):
            if not any(model_dir.glob("*.c")):
                continue
            tmp_wasm = Path(tmp) / f"{model_dir.name}.wasm"
            compile_model(model_dir.relative_to(ROOT), tmp_wasm)
            wasm = tmp_wasm.read_bytes()
            data_dir = data_root / "models" / model_dir.name / "data"
            if (model_dir / DATA_GENERATOR).is_file():
                data_dir = static_dir / "models" / model_dir.name / "data"
                written += generate_data(model_dir, data_dir)
            facts = probe_model(wasm, data_dir)
            model_id = facts.info["id"]
            if model_id != model_dir.name:
                raise BuildError(f"{model_dir}: the module calls itself {model_id!r}; name the directory after it")
            out_dir = static_dir / "models" / model_id
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / "model.wasm").write_bytes(wasm)
            archive = wgsl_archive(facts.gpu_modules) if facts.gpu else None
            if archive is not None:
                (out_dir / ARCHIVE_NAME).write_bytes(archive)
                written.append(out_dir / ARCHIVE_NAME)
            manifest_text = stringify(model_manifest(wasm, facts, archive), 2) + "\n"
            (out_dir / "manifest.json").write_text(manifest_text, encoding="utf-8")
            written += [out_dir / "model.wasm", out_dir / "manifest.json"]
    written.extend(build_onnx_runtime(static_dir))
    kernel_sources = sorted((ROOT / KERNEL_DIR).glob("*.c")) if (ROOT / KERNEL_DIR).is_dir() else []
    if kernel_sources:
        (static_dir / "kernel").mkdir(parents=True, exist_ok=True)
    for source in kernel_sources:
        out = static_dir / "kernel" / f"{source.stem}.wasm"
        compile_kernel(source.relative_to(ROOT), out)
        written.append(out)
    return written


def build_onnx_runtime(static_dir: Path) -> list[Path]:
    """c/onnx (the ONNX graph runtime, docs/onnx.md) into static_dir/onnx/runtime.wasm: a module
    without a graph, to which `weei model import` appends one (weei.onnx.wasm); and beside it
    kernels.wgsl.json, the wgsl/ modules its device programs may name (weei.onnx.gpu), from
    which the importer packs each package's archive."""
    from weei.gpu import pack_archive
    from weei.onnx.gpu import GPU_MODULES, KERNELS_NAME

    out = static_dir / "onnx" / "runtime.wasm"
    out.parent.mkdir(parents=True, exist_ok=True)
    sources = [p.relative_to(ROOT) for p in sorted((ROOT / ONNX_DIR).glob("*.c")) + sorted((ROOT / SDK_DIR).glob("*.c"))]
    _run(["clang", *WASM_FLAGS, *MODEL_EXTRA_FLAGS, "-DWEEI_HEAP_FLOOR=onnx_heap_floor", "-o", str(out),
          *(str(s) for s in sources)])
    kernels = out.parent / KERNELS_NAME
    kernels.write_bytes(pack_archive({name: (ROOT / WGSL_DIR / name).read_text(encoding="utf-8") for name in GPU_MODULES}))
    return [out, kernels]


def cmd_wasm(args: argparse.Namespace) -> int:
    out = Path(args.out).resolve() if args.out else ROOT / STATIC_DIR
    for path in build_all(out, ROOT / STATIC_DIR):
        print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path} ({path.stat().st_size} bytes)")
    return 0


def check_against(committed: Path, built_files: list[Path], built_root: Path) -> list[str]:
    """Differences between freshly built files and their committed copies."""
    problems = []
    for path in built_files:
        rel = path.relative_to(built_root)
        mine = committed / rel
        if not mine.exists():
            problems.append(f"{STATIC_DIR / rel}: not committed (run python build.py wasm)")
        elif not filecmp.cmp(mine, path, shallow=False):
            problems.append(f"{STATIC_DIR / rel}: differs from a fresh build (run python build.py wasm)")
    built_rel = {p.relative_to(built_root) for p in built_files}
    for pattern in ("models/*/model.wasm", "models/*/manifest.json", f"models/*/{ARCHIVE_NAME}", "kernel/*.wasm", "onnx/*.wasm", "onnx/*.json"):
        for path in sorted(committed.glob(pattern)):
            if path.relative_to(committed) not in built_rel:
                problems.append(f"{STATIC_DIR / path.relative_to(committed)}: committed but no source builds it")
    return problems


def cmd_check(args: argparse.Namespace) -> int:
    del args
    with tempfile.TemporaryDirectory(prefix="weei-check-") as tmp:
        built = build_all(Path(tmp), ROOT / STATIC_DIR)
        problems = check_against(ROOT / STATIC_DIR, built, Path(tmp))
    for problem in problems:
        print(problem, file=sys.stderr)
    if not problems:
        print(f"ok: {len(built)} artifacts match a fresh build")
    return 1 if problems else 0


def _locked_pyodide_version() -> str:
    lock = json.loads((ROOT / "package-lock.json").read_text(encoding="utf-8"))
    try:
        return str(lock["packages"]["node_modules/pyodide"]["version"])
    except KeyError:
        raise BuildError("package-lock.json does not lock the npm package pyodide") from None


def ensure_pyodide() -> Path:
    """``node_modules/pyodide`` at the version package-lock.json pins,
    running ``npm ci`` when it is missing or another version."""
    want = _locked_pyodide_version()
    pkg_dir = ROOT / "node_modules" / "pyodide"

    def installed() -> str | None:
        try:
            return str(json.loads((pkg_dir / "package.json").read_text(encoding="utf-8"))["version"])
        except (OSError, ValueError, KeyError):
            return None

    if installed() != want:
        if shutil.which("npm") is None:
            raise BuildError("npm is needed to install Pyodide (apt-get install npm)")
        _run(["npm", "ci", "--no-audit", "--no-fund"])
    if installed() != want:
        raise BuildError(f"npm ci did not install pyodide {want}")
    missing = [name for name in PYODIDE_FILES if not (pkg_dir / name).is_file()]
    if missing:
        raise BuildError(f"pyodide {want} has no {', '.join(missing)}: update PYODIDE_FILES in build.py")
    return pkg_dir


def pack_weei(out: Path) -> int:
    """Write the weei package (its .py files and py.typed, sorted, fixed
    timestamps: byte-identical for the same sources) to the zip ``out``,
    as ``weei/...``; return the number of files."""
    root = ROOT / PY_PACKAGE_DIR
    files = sorted(
        p for p in root.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and (p.suffix == ".py" or p.name == "py.typed")
    )
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        for path in files:
            info = zipfile.ZipInfo(str(Path("weei") / path.relative_to(root)), date_time=_ZIP_DATE)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, path.read_bytes())
    return len(files)


def _kernel_up_to_date(static_dir: Path) -> list[Path]:
    """Recompile app/static/kernel/*.wasm whose C source is newer; return them."""
    rebuilt = []
    for source in sorted((ROOT / KERNEL_DIR).glob("*.c")) if (ROOT / KERNEL_DIR).is_dir() else []:
        out = static_dir / "kernel" / f"{source.stem}.wasm"
        if not out.is_file() or out.stat().st_mtime < source.stat().st_mtime:
            out.parent.mkdir(parents=True, exist_ok=True)
            compile_kernel(source.relative_to(ROOT), out)
            rebuilt.append(out)
    return rebuilt


def make_snapshot(site: Path) -> int:
    """Write ``site``/weei-snapshot.bin from its own Pyodide and weei-py.zip
    (so the snapshot always matches both); return its size in bytes.

    It is a copy of Pyodide's memory after start-up and weei's imports, made
    with Pyodide's (private) ``_makeSnapshot``: boot.mjs restores it with
    ``_loadSnapshot``, which refuses a snapshot of another Pyodide build."""
    if shutil.which("node") is None:
        raise BuildError("node is needed to make the Pyodide snapshot (apt-get install nodejs)")
    out = site / SNAPSHOT_NAME
    run_tool(["node", str(ROOT / SNAPSHOT_SCRIPT), str(site / "pyodide"), str(site / "weei-py.zip"), str(out)], ROOT)
    return out.stat().st_size


def build_site(dist: Path) -> dict[str, Any]:
    """Assemble the static site in ``dist`` (replacing it); return a summary."""
    pyodide = ensure_pyodide()
    static = ROOT / STATIC_DIR
    rebuilt = _kernel_up_to_date(static)
    tmp = dist.with_name(dist.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "pyodide").mkdir(parents=True)
    for name in PYODIDE_FILES:
        shutil.copy2(pyodide / name, tmp / "pyodide" / name)
    for name in SITE_FILES:
        shutil.copy2(static / name, tmp / name)
    for name in SITE_DIRS:
        shutil.copytree(static / name, tmp / name)
    count = pack_weei(tmp / "weei-py.zip")
    snapshot = make_snapshot(tmp)
    # Swap in one step so a running `weei serve` never sees half a site.
    old = dist.with_name(dist.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if dist.exists():
        os.replace(dist, old)
    os.replace(tmp, dist)
    shutil.rmtree(old, ignore_errors=True)
    size = sum(p.stat().st_size for p in dist.rglob("*") if p.is_file())
    return {"pyodide": _locked_pyodide_version(), "python_files": count, "bytes": size, "snapshot_bytes": snapshot,
            "kernels_rebuilt": [str(p.relative_to(ROOT)) for p in rebuilt]}


def cmd_site(args: argparse.Namespace) -> int:
    dist = Path(args.out).resolve() if args.out else ROOT / DIST_DIR
    summary = build_site(dist)
    for path in summary["kernels_rebuilt"]:
        print(f"rebuilt {path} (older than its source)")
    print(f"wrote {dist} ({summary['bytes'] / 1e6:.1f} MB): pyodide {summary['pyodide']}, "
          f"weei-py.zip with {summary['python_files']} files, {SNAPSHOT_NAME} {summary['snapshot_bytes'] / 1e6:.1f} MB")
    return 0


COMMANDS: dict[str, tuple[Callable[[argparse.Namespace], int], str]] = {
    "wasm": (cmd_wasm, "compile models and kernels, write package manifests"),
    "check": (cmd_check, "fail when committed artifacts differ from a fresh build"),
    "site": (cmd_site, "assemble the static site in dist/ for weei serve"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build Weei's WebAssembly artifacts.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (_, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        if name == "wasm":
            p.add_argument("--out", help="static directory to write into (default app/static)")
        if name == "site":
            p.add_argument("--out", help="site directory to write (default dist)")
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command][0](args)
    except BuildError as exc:
        print(f"build failed: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
