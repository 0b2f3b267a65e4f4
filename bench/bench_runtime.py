"""Benchmark of the ABI host over wasmtime: bulk copy throughput and call overhead.

Run: .venv/bin/python bench/bench_runtime.py  (needs clang for the fixture).
Prints one JSON object; figures are noisy, compare within one run.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "app" / "py"))

from weei.runtime import ModelRuntime, WasmtimeEngine  # noqa: E402

MiB = 1 << 20


def build_fixture(tmp: Path) -> bytes:
    """Compile tests/unit/fixtures/echo_model.c. Raises RuntimeError without clang."""
    clang = shutil.which("clang") or shutil.which("clang-14")
    if clang is None:
        raise RuntimeError("clang not found")
    out = tmp / "echo.wasm"
    subprocess.run(
        [clang, "--target=wasm32", "-O2", "-nostdlib", "-mbulk-memory", "-Wl,--no-entry",
         "-o", str(out), str(ROOT / "tests/unit/fixtures/echo_model.c")],
        check=True,
    )
    return out.read_bytes()


def best(fn: Callable[[], object], repeat: int = 5) -> float:
    """The best of ``repeat`` wall-clock timings of ``fn``, in seconds."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        wasm = build_fixture(Path(tmp))
    engine = WasmtimeEngine()
    instance = engine.compile(wasm).instantiate(lambda p, n: None)
    size = 16 * MiB
    ptr = instance.call("alloc", size)
    assert isinstance(ptr, int)
    data = bytes(size)
    write_s = best(lambda: instance.write(ptr, data))
    read_s = best(lambda: instance.read(ptr, size))

    rt = ModelRuntime.load(wasm, engine)
    weights = bytes(16)
    rt.load_model(weights)

    def small_train() -> None:
        rt.load_model(weights)
        rt.train(data=b"", format="echo-v1")

    n = 2000
    call_s = best(lambda: [small_train() for _ in range(n)], repeat=3) / n
    export_s = best(lambda: [instance.call("resultLength") for _ in range(100_000)], repeat=3) / 100_000

    big = bytes(16 * MiB)

    def big_train() -> None:
        rt.load_model(big)
        rt.train(data=b"", format="echo-v1")

    big_s = best(big_train, repeat=3)
    print(json.dumps({
        "write_16MiB_GBps": round(size / write_s / 1e9, 2),
        "read_16MiB_GBps": round(size / read_s / 1e9, 2),
        "export_call_us": round(export_s * 1e6, 2),
        "loadModel_plus_train_small_us": round(call_s * 1e6, 1),
        "loadModel_plus_train_16MiB_ms": round(big_s * 1e3, 1),
    }, indent=2))


if __name__ == "__main__":
    main()
