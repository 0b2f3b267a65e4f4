"""Benchmark: digits-mlp training per step on the GPU (weei.gpu executor) vs
the CPU WASM (wasmtime), on the same job, plus buffer I/O.

It prints the adapter first: on lavapipe or SwiftShader (software) the GPU
is expected to be slower than the CPU, and the script says so; on a machine
with a real GPU the same script gives the real figures. Reported:

* ms per optimizer step: CPU WASM ``train`` vs ``gpuBegin``/``gpuNext``/
  ``gpuEnd`` on the device (compilation excluded and reported on its own);
* the weights of both runs compared (bit-identical or the largest difference);
* upload and readback of the training run (the batches written; the
  per-step stats and final weights read, which also wait for the step's
  work) against plain ``write_buffer`` / ``read_buffer`` of 16 MiB in the
  same run, in MB/s.

Run: ``.venv/bin/python bench/bench_gpu.py [--examples 2000] [--batch 32]``.
"""

from __future__ import annotations

import argparse
import struct
import sys
import time
from pathlib import Path

__all__ = ["main"]

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "app" / "static" / "models" / "digits-mlp"
MB = 1e6


def _chunk(examples: int) -> bytes:
    records = b"".join(p.read_bytes()[8:] for p in sorted((DIGITS / "data").glob("training-*.bin")))
    available = len(records) // 65
    reps = -(-examples // available)
    body = (records * reps)[: 65 * examples]
    return b"WDG1" + struct.pack("<I", examples) + body


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args(argv)
    try:
        import wgpu
    except ImportError:
        print("wgpu is not installed (pip install -e '.[cpython]')")
        return 1
    from weei.gpu import GpuError, compare_step, is_software, parse_archive
    from weei.gpu.executor import STORAGE_USAGE, GpuDevice
    from weei.gpu.session import GpuBackendSpec, GpuWork, train_on_gpu
    from weei.runtime import ModelRuntime, WasmtimeEngine

    try:
        device = GpuDevice.open(wgpu.gpu, preference="gpu")
    except GpuError as exc:
        print(f"no GPU: {exc}")
        return 1
    f = device.facts
    kind = "software" if is_software(f) else "hardware"
    print(f"adapter: {f.device or f.vendor} ({f.description}; {f.backend}, {f.adapter_type}) - {kind}")
    archive = parse_archive((DIGITS / "model.wgsl.json").read_bytes())
    backend = GpuBackendSpec("gpu-webgpu", 16 << 20, "fp32-standard")
    runtime = ModelRuntime.load((DIGITS / "model.wasm").read_bytes(), WasmtimeEngine())
    weights = runtime.create_initial_weights(1)
    work = {"data": _chunk(args.examples), "format": "weei-digits-v1", "seed": 3,
            "settings": {"batchSize": args.batch, "localEpochs": 1}}

    runtime.load_model(weights)
    t0 = time.perf_counter()
    cpu = runtime.train(**work)
    cpu_s = time.perf_counter() - t0
    compile_ms = device.compile(archive)
    runtime.load_model(weights)
    t0 = time.perf_counter()
    gpu = train_on_gpu(runtime, device, archive, backend, GpuWork(**work), budget_mib=256)
    gpu_s = time.perf_counter() - t0
    steps = cpu.optimizer_steps or 1
    st = gpu.stats
    print(f"job: {args.examples} examples, batch {args.batch}, {steps} steps")
    print(f"CPU WASM : {cpu_s * 1000 / steps:8.3f} ms/step")
    print(f"GPU      : {gpu_s * 1000 / steps:8.3f} ms/step  ({gpu_s / cpu_s:.1f}x the CPU time; "
          f"module compilation {compile_ms:.0f} ms, pipelines {st.compilation_ms:.0f} ms)")
    gate = compare_step(cpu.weights, gpu.train.weights, "fp32-standard")
    print(f"weights after {steps} steps: {gate.detail}")
    print(f"training I/O: upload {st.upload_bytes / MB:.2f} MB in {st.upload_s * 1000:.1f} ms "
          f"({st.upload_bytes / MB / max(st.upload_s, 1e-9):.0f} MB/s); readback {st.readback_bytes / MB:.3f} MB "
          f"in {st.readback_s * 1000:.0f} ms, which includes waiting for each step's work")

    size = 16 << 20
    payload = bytes(size)
    buf = device.device.create_buffer(size=size, usage=STORAGE_USAGE)
    device.device.queue.write_buffer(buf, 0, payload)
    device.device.queue.read_buffer(buf, 0, 4)
    t0 = time.perf_counter()
    device.device.queue.write_buffer(buf, 0, payload)
    device.device.queue.read_buffer(buf, 0, 4)  # fence
    write_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    device.device.queue.read_buffer(buf, 0, size)
    read_s = time.perf_counter() - t0
    buf.destroy()
    print(f"16 MiB write_buffer {size / MB / write_s:.0f} MB/s, read_buffer {size / MB / read_s:.0f} MB/s")
    if kind == "software":
        print("note: a software adapter; slower than the CPU WASM is expected here")
    return 0


if __name__ == "__main__":
    sys.exit(main())
