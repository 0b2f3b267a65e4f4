"""Issue 20 §3: GPU work stops at its deadline, by name (``gpu-timeout``).

Submitted work cannot be recalled: the executor submits a step in pieces
and looks at the clock between them (weei.gpu.executor), and the agent's
GPU thread is waited for only until the assignment's deadline
(weei.api.gpu_backend.LocalGpuHost). The executor tests run on lavapipe.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import wgpu

from weei.api.gpu_backend import LocalGpuHost
from weei.gpu import GpuError, pack_archive, parse_archive, parse_program
from weei.gpu.executor import GpuDevice, ProgramRun
from weei.gpu.program import DeviceProgram
from weei.gpu.session import GpuBackendSpec, GpuWork
from weei.gpu.trainer import GpuAssignment, GpuOutcome
from weei.runtime import WasmtimeEngine

from test_gpu_lavapipe import pytestmark as needs_vulkan

ROOT = Path(__file__).resolve().parents[2]
MODULE = (ROOT / "app" / "static" / "models" / "digits-mlp" / "model.wasm").read_bytes()
# Each workgroup writes once: a dispatch of 65535 x 64 workgroups (the most one dispatch may have) takes
# about 0.3 s on lavapipe, and a step of 16 of them about 5 s if nothing stops it.
SPIN = """
@group(0) @binding(0) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(1) fn main(@builtin(workgroup_id) g: vec3<u32>) {
  out[(g.x + g.y) % 4u] = g.x;
}
"""
ARCHIVE = parse_archive(pack_archive({"spin.wgsl": SPIN}))
WIDE = [65535, 64, 1]


def _program(dispatches: int) -> DeviceProgram:
    step = {"op": "dispatch", "pipeline": "spin", "workgroups": WIDE, "bindings": [{"binding": 0, "buffer": "out"}]}
    doc = {"format": "weei-device-program-v1", "buffers": [{"id": "out", "bytes": 16, "init": "zeros"}],
           "pipelines": [{"id": "spin", "module": "spin.wgsl", "entryPoint": "main"}],
           "steps": [step] * dispatches, "stepReadback": [], "finalReadback": [{"buffer": "out", "offset": 0, "bytes": 16}]}
    return parse_program(doc, archive=ARCHIVE, limits=device().limits, weight_bytes=0, budget_bytes=1 << 20,
                         estimated_working_bytes=1 << 20)


_DEVICE: list[GpuDevice] = []


def device() -> GpuDevice:
    if not _DEVICE:
        _DEVICE.append(GpuDevice.open(wgpu.gpu, preference="gpu"))
    return _DEVICE[0]


def _one_piece_s() -> float:
    run = ProgramRun(device(), ARCHIVE, _program(1), b"")
    try:
        run.run_steps()  # compiles and warms up
        start = time.perf_counter()
        run.run_steps()
        return time.perf_counter() - start
    finally:
        run.release()


@needs_vulkan
@pytest.mark.parametrize("limit", ["step timeout", "operation deadline"])
def test_a_long_step_stops_at_its_limit_within_about_one_piece(limit: str) -> None:
    """The attack: the step timeout was looked at only after the whole step had run."""
    piece = _one_piece_s()
    run = ProgramRun(device(), ARCHIVE, _program(16), b"",
                     **({"step_timeout_s": 0.5} if limit == "step timeout" else {"deadline": time.monotonic() + 0.5}))
    start = time.perf_counter()
    try:
        with pytest.raises(GpuError) as info:
            run.run_steps()
        elapsed = time.perf_counter() - start
    finally:
        run.release()
    print(f"\none piece {piece:.2f} s; stopped by the {limit} after {elapsed:.2f} s, {run.stats.pieces} of 16 pieces")
    assert info.value.reason == "gpu-timeout"
    assert elapsed < 0.5 + 3 * piece + 0.5  # the whole step takes about 16 pieces
    assert run.stats.pieces < 16 and run.stats.steps == 0


class _StuckTrainer:
    """Where the device never returns from one submission (an endless shader): the trainer's run blocks."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls = 0

    def run(self, runtime: Any, assignment: GpuAssignment, on_event: Any) -> GpuOutcome:
        self.calls += 1
        self.release.wait(30)
        return GpuOutcome(b"", {}, 0, None, 0, 0.0, "stuck")


def _assignment(deadline_s: float) -> GpuAssignment:
    return GpuAssignment("job", ARCHIVE, GpuBackendSpec("gpu-webgpu", 1 << 20, "fp32-standard"), "gpu", 64, b"", {},
                         GpuWork(data=b"", format="x"), deadline_s)


def test_the_agents_gpu_thread_is_waited_for_only_until_its_deadline() -> None:
    host = LocalGpuHost(None, WasmtimeEngine())
    stuck = _StuckTrainer()
    host.trainer = stuck  # type: ignore[assignment]

    async def train(deadline_s: float) -> GpuOutcome:
        return await asyncio.wait_for(host.train(_assignment(deadline_s), module_sha256="", module=MODULE,
                                                 on_event=lambda k, p: None, tag="a"), 10)

    async def main() -> None:
        try:
            start = time.monotonic()
            with pytest.raises(GpuError) as info:
                await train(0.5)
            assert info.value.reason == "gpu-timeout" and time.monotonic() - start < 2.5
            # The stuck thread keeps the device: the next assignment is refused by name, not run beside it.
            start = time.monotonic()
            with pytest.raises(GpuError) as info:
                await train(0.5)
            assert info.value.reason == "gpu-timeout" and "has not returned" in info.value.message
            assert time.monotonic() - start < 2.5 and stuck.calls == 1  # its own deadline, not the stuck one's end
        finally:
            stuck.release.set()
        # Once it has returned, the device takes work again.
        for _ in range(100):
            try:
                outcome = await train(5.0)
                break
            except GpuError as exc:  # its result is still on the way to the event loop
                assert "has not returned" in exc.message
                await asyncio.sleep(0.05)
        assert outcome.gate == "stuck" and stuck.calls == 2

    asyncio.run(main())
