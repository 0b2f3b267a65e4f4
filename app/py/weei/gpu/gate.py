"""The admission gate's comparison, sans-I/O (docs/gpu.md, "Admission gate").

Before a device trains for a job, the first optimizer step runs on the GPU
and in the CPU WASM from the same weights and batch; the two weight vectors
are compared here. ``fp32-exact`` backends must match bit for bit;
``fp32-standard`` backends (fused multiply-adds, approximate division or
square roots on real GPUs) within ``|gpu - cpu| <= ATOL + RTOL * |cpu|``
per weight.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

from .errors import GpuError, GpuReason

__all__ = ["ATOL", "RTOL", "NUMERICAL_MODES", "GateResult", "compare_step", "require_pass"]

ATOL = 1e-6
RTOL = 1e-5
NUMERICAL_MODES = ("fp32-exact", "fp32-standard")


@dataclass(frozen=True)
class GateResult:
    passed: bool
    bit_identical: bool
    max_abs_diff: float      # inf when a value is not finite or the sizes differ
    differing: int           # weights whose bits differ
    detail: str


def compare_step(cpu: bytes, gpu: bytes, mode: str) -> GateResult:
    """Compare one step's float32-le weights from the CPU and the GPU."""
    if mode not in NUMERICAL_MODES:
        raise ValueError(f"unknown numericalMode {mode!r}")
    if len(cpu) != len(gpu) or len(cpu) % 4:
        return GateResult(False, False, math.inf, -1, f"sizes differ: CPU {len(cpu)} bytes, GPU {len(gpu)}")
    if cpu == gpu:
        return GateResult(True, True, 0.0, 0, "bit-identical")
    n = len(cpu) // 4
    a = struct.unpack(f"<{n}f", cpu)
    b = struct.unpack(f"<{n}f", gpu)
    differing = 0
    worst = 0.0
    outside = 0
    for x, y in zip(a, b, strict=True):
        if struct.pack("<f", x) == struct.pack("<f", y):
            continue
        differing += 1
        if not (math.isfinite(x) and math.isfinite(y)):
            worst = math.inf
            outside += 1
            continue
        diff = abs(x - y)
        worst = max(worst, diff)
        if diff > ATOL + RTOL * abs(x):
            outside += 1
    detail = f"{differing} of {n} weights differ, max |diff| {worst:.3g}"
    if mode == "fp32-exact":
        return GateResult(False, False, worst, differing, detail + " (fp32-exact needs identical bits)")
    passed = outside == 0
    return GateResult(passed, False, worst, differing, detail + ("" if passed else f", {outside} beyond tolerance"))


def require_pass(result: GateResult) -> None:
    """A device that fails the gate falls back to the CPU: 'gate-mismatch'."""
    if not result.passed:
        raise GpuError(GpuReason.GATE_MISMATCH, f"the GPU's first step differs from the CPU's: {result.detail}")
