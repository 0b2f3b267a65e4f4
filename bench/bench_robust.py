"""Benchmark: the cost of robust aggregation against plain FedAvg, side by side.

For N updates of ``--elems`` float32 it times one round's ``aggregate_round``
(canonical order, finiteness check included) with plain FedAvg and with each
robust setting (docs/api.md) on the native (ctypes), wasm (wasmtime, copies
in and out included) and numpy kernels, in one run, and prints each time and
its ratio to FedAvg on the same kernel. All kernels must agree to the bit.

Run: ``.venv/bin/python bench/bench_robust.py [--elems N] [--updates 4 7 16]``.
"""

from __future__ import annotations

import argparse
import hashlib
from typing import Any

import numpy as np

from weei.core.aggregation.aggregate import aggregate_round
from weei.core.formats.settings import AggregationSettings
from weei.kernel.native import NativeKernel
from weei.kernel.numpy_kernel import NumpyKernel
from weei.kernel.wasm_kernel import WasmKernel

from bench_aggregate import best_of  # the same timing rule as the FedAvg benchmark

__all__ = ["main", "SETTINGS"]

SETTINGS: dict[str, AggregationSettings] = {
    "fedavg": AggregationSettings(),
    "normClip 3": AggregationSettings(norm_clip=3),
    "trimmedMean": AggregationSettings(combine="trimmedMean"),
    "median": AggregationSettings(combine="median"),
    "normClip 3 + trimmedMean": AggregationSettings(norm_clip=3, combine="trimmedMean"),
}


def bench(n_updates: int, n_elems: int, repeat: int, kernels: dict[str, Any]) -> bool:
    rng = np.random.default_rng(n_updates)
    start = rng.standard_normal(n_elems, dtype=np.float32)
    ups = [(start + rng.standard_normal(n_elems, dtype=np.float32) * np.float32(0.01)).astype("<f4") for _ in range(n_updates)]
    ups[-1] *= np.float32(100)  # one poisoner, so clipping has work to do
    contributions = [(f"a{k:03d}", int(c), ups[k].tobytes()) for k, c in enumerate(rng.integers(1, 5000, n_updates))]
    s = start.tobytes()
    print(f"\n{n_updates} updates of {n_elems} float32 ({n_elems * 4 / 2**20:.1f} MiB each): seconds, and x fedavg")
    print(f"{'setting':<26}" + "".join(f"{name:>22}" for name in kernels))
    ok = True
    for label, settings in SETTINGS.items():
        cells, digests = [], set()
        for name, kernel in kernels.items():
            result = aggregate_round(kernel, s, contributions, settings, None)
            digests.add(hashlib.sha256(result.weights).hexdigest())
            t = best_of(lambda: aggregate_round(kernel, s, contributions, settings, None), repeat)
            if label == "fedavg":
                kernel.base = t  # type: ignore[attr-defined]
            cells.append(f"{t:10.4f} {t / kernel.base:8.1f}x")  # type: ignore[attr-defined]
        same = len(digests) == 1
        ok &= same
        print(f"{label:<26}" + "".join(f"{c:>22}" for c in cells) + ("" if same else "  BITS DIFFER"))
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elems", type=int, default=1 << 20)
    parser.add_argument("--updates", type=int, nargs="+", default=[4, 7, 16])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    kernels = {"native": NativeKernel(), "wasm (wasmtime)": WasmKernel(), "numpy": NumpyKernel()}
    ok = all([bench(n, args.elems, args.repeat, kernels) for n in args.updates])
    print("\nbits: " + ("identical on every kernel" if ok else "DIFFER"))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
