"""Training speed of the reference models: wasm under wasmtime versus native C.

    .venv/bin/python bench/bench_training.py [--repeat 3] [--json]

Both sides are built from the same C right now (c/models/<id>, c/sdk): the
wasm with build.py's flags, the native binary with clang -O3 -march=native
and the driver c/bench/bench_main.c. Both run the same sequence of train
operations with the same JSON inputs and seeds (each train starting from
the previous one's weights), so they do identical work; the final weights
must agree bit for bit (-ffp-contract=off on both sides), which the
benchmark checks. Each side is measured --repeat times, alternating, and
the best time counts. The wasm side goes through weei.runtime
(ModelRuntime + WasmtimeEngine), so it includes the host's per-call costs
(JSON, copying the chunk into module memory), as in real training.

Workloads:
  digits-chunks   digits-mlp on the 15 committed chunks of 100 examples,
                  batch 32, 20 passes (the shape of real rounds)
  digits-merged   digits-mlp on one chunk of all 1500 training examples,
                  batch 32, 20 passes (compute-bound)
  cartpole        cartpole-reinforce, 48 assignments of 32 episodes, each
                  from the previous one's weights (episodes grow longer)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "app" / "py"))
sys.path.insert(0, str(ROOT))

import build  # noqa: E402  (build.py at the repository root)
from weei.runtime import ModelRuntime, WasmtimeEngine  # noqa: E402

__all__ = ["Measurement", "fnv1a", "native_binary", "run", "main", "wasm_dataset", "wasm_experience"]

DATA = ROOT / "app" / "static" / "models" / "digits-mlp" / "data"
FORMAT = "weei-digits-v1"
SEED = 1000
FNV_OFFSET, FNV_PRIME = 1469598103934665603, 1099511628211


def fnv1a(data: bytes) -> str:
    h = FNV_OFFSET
    for b in data:
        h = ((h ^ b) * FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


@dataclass(frozen=True)
class Measurement:
    workload: str
    unit: str
    units: int
    native_per_second: float
    wasm_per_second: float
    identical_weights: bool

    @property
    def ratio(self) -> float:
        """wasm speed as a fraction of native speed."""
        return self.wasm_per_second / self.native_per_second


def native_binary(model_id: str, out: Path) -> Path:
    sources = sorted(str(p) for p in (build.MODELS_DIR / model_id).glob("*.c"))
    sources += sorted(str(p) for p in build.SDK_DIR.glob("*.c"))
    exe = out / f"native-{model_id}"
    subprocess.run(
        ["clang", *build.NATIVE_FLAGS, "-o", str(exe), str(build.C_DIR / "bench" / "bench_main.c"), *sources],
        cwd=ROOT, check=True,
    )
    return exe


def _wasm(model_id: str, out: Path) -> bytes:
    path = out / f"{model_id}.wasm"
    build.compile_model(build.MODELS_DIR / model_id, path)
    return path.read_bytes()


def _run_native(exe: Path, args: list[str]) -> tuple[float, int, str]:
    proc = subprocess.run([str(exe), *args], check=True, capture_output=True, text=True)
    result = json.loads(proc.stdout)
    return result["seconds"], result["units"], result["weightsFnv1a"]


def wasm_dataset(runtime: ModelRuntime, files: list[bytes], epochs: int, batch: int) -> tuple[float, int, str]:
    weights = runtime.create_initial_weights(1)
    units = 0
    start = time.perf_counter()
    for e in range(epochs):
        for k, data in enumerate(files):
            runtime.load_model(weights)
            result = runtime.train(
                data=data, format=FORMAT, seed=SEED + e * len(files) + k,
                settings={"localEpochs": 1, "batchSize": batch},
            )
            weights = result.weights
            units += result.unique_examples or 0
    return time.perf_counter() - start, units, fnv1a(weights)


def wasm_experience(runtime: ModelRuntime, assignments: int, count: int) -> tuple[float, int, str]:
    weights = runtime.create_initial_weights(1)
    units = 0
    start = time.perf_counter()
    for a in range(assignments):
        runtime.load_model(weights)
        result = runtime.train(experience=(a * count, count, SEED + a), settings={"localEpochs": 1, "batchSize": 16})
        weights = result.weights
        units += result.completed_units or 0
    return time.perf_counter() - start, units, fnv1a(weights)


def _merged_chunk(paths: list[Path]) -> bytes:
    records = b"".join(p.read_bytes()[8:] for p in paths)
    return b"WDG1" + (len(records) // 65).to_bytes(4, "little") + records


def run(repeat: int = 3, epochs: int = 20, assignments: int = 48) -> list[Measurement]:
    """Measure every workload; return one Measurement each."""
    chunk_paths = sorted(DATA.glob("training-*.bin"))
    results = []
    with tempfile.TemporaryDirectory(prefix="weei-bench-") as tmp_name:
        tmp = Path(tmp_name)
        merged = tmp / "merged.bin"
        merged.write_bytes(_merged_chunk(chunk_paths))
        engine = WasmtimeEngine()
        digits = ModelRuntime.load(_wasm("digits-mlp", tmp), engine)
        cartpole = ModelRuntime.load(_wasm("cartpole-reinforce", tmp), engine)
        native_digits = native_binary("digits-mlp", tmp)
        native_cartpole = native_binary("cartpole-reinforce", tmp)
        workloads = [
            ("digits-chunks", "examples", native_digits,
             ["dataset", FORMAT, str(SEED), str(epochs), "32", *map(str, chunk_paths)],
             lambda: wasm_dataset(digits, [p.read_bytes() for p in chunk_paths], epochs, 32)),
            ("digits-merged", "examples", native_digits,
             ["dataset", FORMAT, str(SEED), str(epochs), "32", str(merged)],
             lambda: wasm_dataset(digits, [merged.read_bytes()], epochs, 32)),
            ("cartpole", "episodes", native_cartpole,
             ["experience", str(SEED), str(assignments), "32"],
             lambda: wasm_experience(cartpole, assignments, 32)),
        ]
        for name, unit, exe, args, wasm_run in workloads:
            best_native = best_wasm = float("inf")
            native_units = wasm_units = 0
            native_fp = wasm_fp = ""
            for _ in range(repeat):
                seconds, native_units, native_fp = _run_native(exe, args)
                best_native = min(best_native, seconds)
                seconds, wasm_units, wasm_fp = wasm_run()
                best_wasm = min(best_wasm, seconds)
            if native_units != wasm_units:
                raise RuntimeError(f"{name}: native trained {native_units} {unit}, wasm {wasm_units}")
            results.append(Measurement(
                name, unit, wasm_units, native_units / best_native, wasm_units / best_wasm, native_fp == wasm_fp,
            ))
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description="wasm (wasmtime) versus native training speed")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()
    results = run(args.repeat)
    if args.json:
        print(json.dumps([asdict(m) | {"ratio": m.ratio} for m in results], indent=2))
    else:
        print(f"{'workload':<15} {'unit':<9} {'units':>6} {'native/s':>12} {'wasmtime/s':>12} {'wasm/native':>12}  same weights")
        for m in results:
            print(f"{m.workload:<15} {m.unit:<9} {m.units:>6} {m.native_per_second:>12.0f} "
                  f"{m.wasm_per_second:>12.0f} {m.ratio:>12.2f}  {'yes' if m.identical_weights else 'NO'}")
    return 0 if all(m.identical_weights for m in results) else 1


if __name__ == "__main__":
    sys.exit(main())
