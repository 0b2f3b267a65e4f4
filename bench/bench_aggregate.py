"""Benchmark: update bytes merged per second by the aggregation kernels.

For N updates of 16M float32 (64 MiB each) it times the weighted average on
the native (ctypes), wasm (wasmtime; copy-in excluded from the kernel time
and reported on its own) and numpy-blocked paths, and compares each with

* memcpy of the same bytes (``np.copyto`` of the N updates into a
  preallocated buffer, measured in the same run), target >= 0.7x, and
* numpy's plain ``np.average(stack, axis=0, weights=counts)``, target >= 4x.

Run: ``.venv/bin/python bench/bench_aggregate.py [--elems N] [--updates 4 16]``.
Best of ``--repeat`` runs after a warm-up; all three paths must agree to the bit.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import time
from collections.abc import Callable

import numpy as np

from weei.kernel.native import NativeKernel
from weei.kernel.numpy_kernel import NumpyKernel
from weei.kernel.wasm_kernel import WasmKernel

__all__ = ["main"]

GB = 1e9


def best_of(fn: Callable[[], object], repeat: int) -> float:
    """Seconds of the fastest of ``repeat`` calls (after one warm-up call)."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def bench(n_updates: int, n_elems: int, repeat: int, with_np_average: bool) -> list[tuple[str, float, str]]:
    """Returns rows ``(path, seconds, note)`` for one N."""
    rng = np.random.default_rng(n_updates)
    stack = rng.standard_normal((n_updates, n_elems), dtype=np.float32)
    counts = [int(c) for c in rng.integers(1, 5000, size=n_updates)]
    rows = [stack[k] for k in range(n_updates)]
    out = np.empty(n_elems, np.float32)
    dst = np.empty_like(stack)
    dst.fill(0.0)  # fault the pages in before timing
    out.fill(0.0)
    results: list[tuple[str, float, str]] = []

    t_copy = best_of(lambda: np.copyto(dst, stack), repeat)
    results.append(("memcpy (np.copyto)", t_copy, ""))
    del dst

    native = NativeKernel()
    t_native = best_of(lambda: native.average_into(out, rows, counts), repeat)
    h_native = hashlib.sha256(out.tobytes()).hexdigest()
    results.append(("native C (ctypes)", t_native, ""))

    numpy_k = NumpyKernel()
    t_numpy = best_of(lambda: numpy_k.average_into(out, rows, counts), repeat)
    h_numpy = hashlib.sha256(out.tobytes()).hexdigest()
    results.append(("numpy blocked 64K", t_numpy, ""))

    wasm = WasmKernel()
    t0 = time.perf_counter()
    staged = wasm.stage_average(rows, counts)
    t_stage_first = time.perf_counter() - t0
    t_stage = best_of(lambda: wasm.stage_average(rows, counts), repeat)
    t_wasm = best_of(lambda: wasm.run_average(staged), repeat)
    t0 = time.perf_counter()
    wasm_out = wasm.read(staged.out_ptr, n_elems * 4)
    t_read = time.perf_counter() - t0
    h_wasm = hashlib.sha256(wasm_out).hexdigest()
    results.append(("wasm SIMD (wasmtime)", t_wasm, f"copy-in {t_stage * 1e3:.0f} ms (first {t_stage_first * 1e3:.0f} ms), read-out {t_read * 1e3:.0f} ms"))
    results.append(("wasm incl. copy-in", t_wasm + t_stage, ""))
    del wasm, wasm_out
    gc.collect()

    if with_np_average:
        t_avg = best_of(lambda: np.average(stack, axis=0, weights=counts), max(1, repeat // 2))
        results.append(("np.average(stack, weights)", t_avg, ""))

    same = len({h_native, h_numpy, h_wasm}) == 1
    results.append(("bit-identical native/numpy/wasm", 0.0, "yes" if same else "NO"))
    return results


def main() -> None:
    """Parse arguments, run the benchmark and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elems", type=int, default=16 * 1024 * 1024)
    parser.add_argument("--updates", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-np-average", action="store_true")
    args = parser.parse_args()

    for n_updates in args.updates:
        rows = bench(n_updates, args.elems, args.repeat, not args.no_np_average)
        times = {name: t for name, t, _ in rows}
        nbytes = n_updates * args.elems * 4
        t_copy = times["memcpy (np.copyto)"]
        t_npavg = times.get("np.average(stack, weights)")
        print(f"\n{n_updates} updates x {args.elems} float32 ({nbytes / 2**20:.0f} MiB of updates)")
        print(f"{'path':34} {'ms':>9} {'GB/s':>7} {'x memcpy':>9} {'x np.average':>13}  note")
        for name, t, note in rows:
            if t == 0.0:
                print(f"{name:34} {note}")
                continue
            vs_avg = f"{t_npavg / t:13.2f}" if t_npavg else f"{'-':>13}"
            print(f"{name:34} {t * 1e3:9.1f} {nbytes / t / GB:7.2f} {t_copy / t:9.2f} {vs_avg}  {note}")
        for name in ("native C (ctypes)", "wasm SIMD (wasmtime)", "numpy blocked 64K"):
            t = times[name]
            ok_copy = t_copy / t >= 0.7
            ok_avg = (t_npavg / t >= 4.0) if t_npavg else None
            print(
                f"  target {name:22}: >=0.7x memcpy {'MET' if ok_copy else 'not met'}"
                f"; >=4x np.average {'-' if ok_avg is None else ('MET' if ok_avg else 'not met')}"
            )
    finite_scan(args.repeat)


def finite_scan(repeat: int) -> None:
    """The non-finite check of an update on its slow path (every high byte a candidate), 64 MiB, next to
    SHA-256 of the same bytes (both run on every update that arrives)."""
    from weei.core.floats import first_non_finite

    data = np.full(16 * 1024 * 1024, -3.0e38, dtype="<f4").tobytes()
    scan = best_of(lambda: first_non_finite(data), repeat)
    sha = best_of(lambda: hashlib.sha256(data).digest(), repeat)
    print(f"\nnon-finite scan, 64 MiB slow path: {scan * 1e3:.1f} ms, {sha / scan:.2f} x the speed of SHA-256 "
          f"({sha * 1e3:.1f} ms)")


if __name__ == "__main__":
    main()
