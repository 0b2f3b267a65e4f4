"""The WebGPU shim (weei.browser.webgpu) under the same executor, in the page's
Pyodide on Chromium's SwiftShader (needs --enable-unsafe-webgpu for an
adapter): the committed archive compiles, ``auto`` refuses the software
adapter, and one digits-mlp step on the GPU is compared with the CPU WASM
(the browser's WebAssembly) and with the same step on lavapipe in CPython.
"""

from __future__ import annotations

import json
from typing import Any

from site_helpers import ROOT, TIMEOUT_MS, run_in_pyodide

DIGITS = ROOT / "app" / "static" / "models" / "digits-mlp"

STEP = r'''
import hashlib, json
from weei.gpu import GpuError, pack_archive, parse_archive
from weei.gpu.executor import GpuDevice
from weei.gpu.session import GpuBackendSpec, GpuWork, run_gate, train_on_gpu
from weei.runtime import ModelRuntime

def one_step(gpu_api, engine, wasm, archive_bytes, chunk):
    out = {}
    try:
        GpuDevice.open(gpu_api, preference="auto")
        out["auto"] = "opened"
    except GpuError as exc:
        out["auto"] = exc.reason
    device = GpuDevice.open(gpu_api, preference="gpu")
    out["adapter"] = device.facts.as_diagnostics()
    out["software"] = device.facts.is_fallback or "swiftshader" in device.facts.architecture.lower()
    archive = parse_archive(archive_bytes)
    out["compilationMs"] = device.compile(archive)
    runtime = ModelRuntime.load(wasm, engine)
    weights = runtime.create_initial_weights(7)
    gate, cpu, gpu = run_gate(runtime, device, archive, GpuBackendSpec("gpu-webgpu", 16 << 20, "fp32-standard"),
                              weights, GpuWork(data=chunk, format="weei-digits-v1", seed=42,
                                               settings={"batchSize": 32}), budget_mib=64)
    out["gate"] = [gate.passed, gate.bit_identical, gate.max_abs_diff, gate.detail]
    out["cpu"] = hashlib.sha256(cpu.weights).hexdigest()
    out["gpu"] = hashlib.sha256(gpu.train.weights).hexdigest()
    out["gpuWeights"] = gpu.train.weights.hex()
    out["metricsEqual"] = cpu.metrics == gpu.train.metrics
    # A whole assignment (2 passes, 10 steps) on the GPU against train.
    work = GpuWork(data=chunk, format="weei-digits-v1", seed=9, settings={"batchSize": 24, "localEpochs": 2})
    runtime.load_model(weights)
    full_cpu = runtime.train(**work.inputs())
    runtime.load_model(weights)
    full_gpu = train_on_gpu(runtime, device, archive, GpuBackendSpec("gpu-webgpu", 16 << 20, "fp32-standard"),
                            work, budget_mib=64)
    out["full"] = [full_cpu.optimizer_steps, full_cpu.weights == full_gpu.train.weights,
                   full_cpu.metrics == full_gpu.train.metrics]
    # A module that does not compile, through this API's error reporting.
    sources = {m.name: m.source for m in archive.modules}
    sources["reduce.wgsl"] = sources["reduce.wgsl"].replace("var acc = opaque_zero();", "var acc = opaque_zero()")
    try:
        GpuDevice(device.adapter, device.device, device.facts).compile(parse_archive(pack_archive(sources)))
        out["broken"] = "compiled"
    except GpuError as exc:
        out["broken"] = exc.reason
    return out
'''


def test_the_executor_through_the_shim(weei_server: Any, webgpu_browser: Any) -> None:
    import wgpu

    from weei.runtime import WasmtimeEngine

    wasm = (DIGITS / "model.wasm").read_bytes()
    archive = (DIGITS / "model.wgsl.json").read_bytes()
    chunk = (DIGITS / "data" / "training-001.bin").read_bytes()
    scope: dict[str, Any] = {}
    exec(STEP, scope)
    here = scope["one_step"](wgpu.gpu, WasmtimeEngine(), wasm, archive, chunk)

    page = webgpu_browser.new_page()
    page.add_init_script("window.WEEI_NO_SNAPSHOT = true")  # the shim needs run_sync (docs/browser.md)
    page.set_default_timeout(TIMEOUT_MS)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(weei_server.url)
    got = run_in_pyodide(page, STEP, """
from weei.browser.engine import BrowserEngine
from weei.browser.webgpu import gpu
json.dumps(one_step(gpu, BrowserEngine(), wasm.to_bytes(), archive.to_bytes(), chunk.to_bytes()))""",
                         awaited=True, wasm=wasm, archive=archive, chunk=chunk)
    page.close()
    there = json.loads(got)
    print(f"\nSwiftShader: adapter {there['adapter']}, compile {there['compilationMs']:.0f} ms, gate {there['gate']}")
    print(f"SwiftShader, 10 steps: {there['full']}; lavapipe, 10 steps: {here['full']}")
    print(f"lavapipe: gate {here['gate']}; GPU weights identical across the two: {here['gpu'] == there['gpu']}")
    assert not errors, errors
    assert there["auto"] == "software-adapter"
    assert there["software"]
    assert there["gate"][0], there["gate"]
    # SwiftShader has no fused multiply-adds and rounds division and sqrt
    # correctly: the kernels' CPU order gives the CPU's bits.
    assert there["gate"][1], there["gate"]
    assert there["metricsEqual"]
    assert there["full"] == [10, True, True], there["full"]
    assert there["broken"] == here["broken"] == "module-compile-failed"
    # The CPU WASM gives the same bits in the browser and in wasmtime.
    assert there["cpu"] == here["cpu"]
