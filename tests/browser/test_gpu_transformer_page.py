"""byte-transformer's GPU step on Chromium's SwiftShader through the WebGPU
shim (weei.browser.webgpu) and the same executor and gate as CPython: the
model's archive (wgsl/transformer.wgsl and the shared kernels) compiles there, and one
step of the model's device program matches the browser's CPU WASM step
within the gate's tolerance, the same bits as on lavapipe in CPython.
"""

from __future__ import annotations

import json
import struct
from typing import Any

from site_helpers import ROOT, TIMEOUT_MS, run_in_pyodide

MODEL = ROOT / "app" / "static" / "models" / "byte-transformer"

STEP = r'''
import hashlib, json, time
from weei.gpu import parse_archive
from weei.gpu.executor import GpuDevice
from weei.gpu.session import GpuBackendSpec, GpuWork, run_gate
from weei.runtime import ModelRuntime

def one_step(gpu_api, engine, wasm, archive_bytes, chunk, estimate):
    device = GpuDevice.open(gpu_api, preference="gpu")
    archive = parse_archive(archive_bytes)
    out = {"compilationMs": device.compile(archive)}
    runtime = ModelRuntime.load(wasm, engine)
    weights = runtime.create_initial_weights(7)
    started = time.monotonic()
    gate, cpu, gpu = run_gate(runtime, device, archive, GpuBackendSpec("gpu-webgpu", estimate, "fp32-standard"),
                              weights, GpuWork(data=chunk, format="weei-bytes-v1", seed=42,
                                               settings={"batchSize": 1}), budget_mib=256)
    out["gateS"] = time.monotonic() - started
    out["gate"] = [gate.passed, gate.bit_identical, gate.max_abs_diff, gate.detail]
    out["cpu"] = hashlib.sha256(cpu.weights).hexdigest()
    out["gpu"] = hashlib.sha256(gpu.train.weights).hexdigest()
    out["metricsEqual"] = cpu.metrics == gpu.train.metrics
    return out
'''


def test_a_transformer_step_through_the_shim(weei_server: Any, webgpu_browser: Any) -> None:
    import wgpu

    from weei.runtime import WasmtimeEngine

    manifest = json.loads((MODEL / "manifest.json").read_text(encoding="utf-8"))
    estimate = next(b for b in manifest["execution"]["backends"] if b["kind"] == "gpu")["estimatedWorkingBytes"]
    wasm = (MODEL / "model.wasm").read_bytes()
    archive = (MODEL / "model.wgsl.json").read_bytes()
    chunk = b"WBT1" + struct.pack("<I", 2) + (MODEL / "data" / "training-001.bin").read_bytes()[8 : 8 + 2 * 65]
    scope: dict[str, Any] = {}
    exec(STEP, scope)
    here = scope["one_step"](wgpu.gpu, WasmtimeEngine(), wasm, archive, chunk, estimate)

    page = webgpu_browser.new_page()
    page.add_init_script("window.WEEI_NO_SNAPSHOT = true")  # the shim needs run_sync (docs/browser.md)
    page.set_default_timeout(TIMEOUT_MS)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(weei_server.url)
    got = run_in_pyodide(page, STEP, """
from weei.browser.engine import BrowserEngine
from weei.browser.webgpu import gpu
json.dumps(one_step(gpu, BrowserEngine(), wasm.to_bytes(), archive.to_bytes(), chunk.to_bytes(), estimate))""",
                         awaited=True, wasm=wasm, archive=archive, chunk=chunk, estimate=estimate)
    page.close()
    there = json.loads(got)
    print(f"\nbyte-transformer step, SwiftShader: compile {there['compilationMs']:.0f} ms, gate {there['gate']} "
          f"({there['gateS']:.1f} s); lavapipe: gate {here['gate']} ({here['gateS']:.1f} s)")
    assert not errors, errors
    assert there["gate"][0], there["gate"]
    assert there["metricsEqual"]
    # The CPU WASM gives the same bits in the browser and in wasmtime, and so do the two software GPUs.
    assert there["cpu"] == here["cpu"]
    assert here["gate"][1] and there["gpu"] == here["gpu"]
