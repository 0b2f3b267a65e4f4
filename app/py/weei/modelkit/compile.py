"""Compiling C into a Weei WASM ABI 1 module: the one set of clang flags.

build.py (the repository's models and kernels) and ``weei model build`` (a
model of your own) both call :func:`compile_wasm`, so a model built outside
the repository gets the same code generation as the reference models.
"""

from __future__ import annotations

import subprocess
from importlib import resources
from pathlib import Path

__all__ = ["WASM_FLAGS", "MODEL_EXTRA_FLAGS", "KERNEL_EXTRA_FLAGS", "NATIVE_FLAGS", "BuildError", "run_tool",
           "compile_wasm", "compile_kernel", "sdk_dir"]

# -ffp-contract=off: no fused multiply-add, so the native build (benchmark)
# computes the same bits as the wasm; no -g, so no paths are embedded.
# -fno-slp-vectorize: clang 14's SLP vectorizer miscompiles for wasm32+simd128:
# in cartpole's reset (four xoshiro draws in a row) it packed two draws into
# an i64x2 whose v128.load64_splat read s[1] after the store of its next
# value, so the first draw came out wrong (found by the native/wasm identity
# check of bench/bench_training.py). The dense layers use explicit vectors
# and loops still vectorize, so nothing is lost.
WASM_FLAGS = [
    "--target=wasm32", "-O3", "-msimd128", "-mbulk-memory", "-nostdlib",
    "-ffp-contract=off", "-fno-math-errno", "-fno-slp-vectorize", "-Wall", "-Wextra",
    "-Wl,--no-entry", "-Wl,--strip-debug", "-Wl,-z,stack-size=1048576", "-Wl,--stack-first",
]
MODEL_EXTRA_FLAGS = ["-Werror"]  # model sources: warnings are errors
KERNEL_EXTRA_FLAGS = ["-Wl,--export-dynamic"]
NATIVE_FLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno"]


class BuildError(Exception):
    """A compiler failed or a built artifact is unusable."""


def run_tool(cmd: list[str], cwd: Path) -> None:
    """Run a build tool in ``cwd``; its output becomes the BuildError on failure."""
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    except FileNotFoundError:
        raise BuildError(f"{cmd[0]} is not installed (make setup installs clang and lld)") from None
    if proc.returncode != 0:
        raise BuildError(f"{' '.join(cmd)}\n{proc.stdout}{proc.stderr}")


def compile_wasm(sources: list[Path], out: Path, cwd: Path) -> None:
    """Compile model ``sources`` (paths relative to ``cwd``, the SDK's .c files
    among them) into the module ``out``.

    Relative paths keep the output independent of where the folder lives.
    """
    run_tool(["clang", *WASM_FLAGS, *MODEL_EXTRA_FLAGS, "-o", str(out), *(str(s) for s in sources)], cwd)


def compile_kernel(source: Path, out: Path, cwd: Path) -> None:
    """Compile one kernel source (relative to ``cwd``) on its own into ``out``."""
    run_tool(["clang", *WASM_FLAGS, *KERNEL_EXTRA_FLAGS, "-o", str(out), str(source)], cwd)


def sdk_dir() -> Path:
    """The C SDK (weei_sdk.h and its .c files) that ``weei model new`` copies.

    It is package data, ``weei/modelkit/sdk`` (pyproject.toml): in a checkout
    that folder is a symlink to c/sdk, in an installed wheel a copy of it.
    """
    path = Path(str(resources.files(__package__) / "sdk"))
    if not (path / "weei_sdk.h").is_file():
        raise BuildError(f"the C SDK is not at {path}: this weei installation lacks its package data "
                         "(reinstall weei)")
    return path
