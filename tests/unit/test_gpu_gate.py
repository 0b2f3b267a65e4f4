"""The admission gate's comparison and the adapter / budget rules (pure parts of weei.gpu)."""

from __future__ import annotations

import math
import struct

import pytest

from weei.gpu import AdapterFacts, GpuError, admit_adapter, check_budget, compare_step, is_software, require_pass
from weei.gpu.adapter import limit_key
from weei.gpu.gate import ATOL, RTOL


def _f32(*values: float) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


def _next_up(x: float) -> float:
    (u,) = struct.unpack("<I", struct.pack("<f", x))
    (y,) = struct.unpack("<f", struct.pack("<I", u + 1))
    return y


def test_identical_bits_pass_in_both_modes() -> None:
    cpu = _f32(0.5, -1.25, 3.0)
    for mode in ("fp32-exact", "fp32-standard"):
        result = compare_step(cpu, cpu, mode)
        assert result.passed and result.bit_identical and result.max_abs_diff == 0.0 and result.differing == 0


def test_one_ulp_passes_standard_and_fails_exact() -> None:
    cpu = _f32(0.04455763, 1.0)
    gpu = _f32(_next_up(0.04455763), 1.0)
    standard = compare_step(cpu, gpu, "fp32-standard")
    assert standard.passed and not standard.bit_identical and standard.differing == 1
    assert 0 < standard.max_abs_diff < 1e-8
    exact = compare_step(cpu, gpu, "fp32-exact")
    assert not exact.passed
    with pytest.raises(GpuError) as info:
        require_pass(exact)
    assert info.value.reason == "gate-mismatch"
    require_pass(standard)


def test_the_tolerance_bound() -> None:
    inside = ATOL + RTOL * 2.0
    assert compare_step(_f32(2.0), _f32(2.0 + inside * 0.9), "fp32-standard").passed
    assert not compare_step(_f32(2.0), _f32(2.0 + inside * 1.5), "fp32-standard").passed


def test_non_finite_and_size_mismatch_fail() -> None:
    result = compare_step(_f32(1.0), _f32(math.nan), "fp32-standard")
    assert not result.passed and result.max_abs_diff == math.inf
    assert not compare_step(_f32(1.0), _f32(1.0, 2.0), "fp32-standard").passed
    with pytest.raises(ValueError):
        compare_step(b"", b"", "fp16")


SWIFTSHADER = {"vendor": "google", "architecture": "swiftshader", "device": "", "description": ""}
LAVAPIPE = {"vendor": "llvmpipe", "architecture": "", "device": "llvmpipe (LLVM 15.0.6, 256 bits)",
            "description": "Mesa 22.3.6", "adapter_type": "CPU", "backend_type": "Vulkan"}
REAL = {"vendor": "nvidia", "architecture": "ampere", "device": "NVIDIA GeForce RTX 3060", "description": "",
        "adapter_type": "DiscreteGPU", "backend_type": "Vulkan"}


def test_software_adapters_are_recognised() -> None:
    assert is_software(AdapterFacts.from_info(SWIFTSHADER))
    assert is_software(AdapterFacts.from_info({**SWIFTSHADER, "architecture": ""}, is_fallback=True))
    assert is_software(AdapterFacts.from_info(LAVAPIPE))
    assert is_software(AdapterFacts.from_info({**LAVAPIPE, "adapter_type": ""}))
    assert not is_software(AdapterFacts.from_info(REAL))
    assert AdapterFacts.from_info(REAL).as_diagnostics()["device"] == "NVIDIA GeForce RTX 3060"


def test_auto_refuses_a_software_adapter_and_gpu_forces_it() -> None:
    facts = AdapterFacts.from_info(LAVAPIPE)
    with pytest.raises(GpuError) as info:
        admit_adapter(facts, "auto", [], {}, [], {})
    assert info.value.reason == "software-adapter"
    admit_adapter(facts, "gpu", [], {}, [], {})
    admit_adapter(facts, "hybrid", [], {}, [], {})
    admit_adapter(AdapterFacts.from_info(REAL), "auto", [], {}, [], {})


def test_features_and_limits() -> None:
    facts = AdapterFacts.from_info(REAL)
    limits = {"max-storage-buffers-per-shader-stage": 8}
    admit_adapter(facts, "gpu", ["timestamp-query"], limits, ["timestamp-query"], {"maxStorageBuffersPerShaderStage": 5})
    with pytest.raises(GpuError) as info:
        admit_adapter(facts, "gpu", [], limits, ["shader-f16"], {})
    assert info.value.reason == "missing-feature"
    with pytest.raises(GpuError) as info:
        admit_adapter(facts, "gpu", [], limits, [], {"maxStorageBuffersPerShaderStage": 10})
    assert info.value.reason == "adapter-limits"
    assert limit_key("maxComputeWorkgroupSizeX") == "max-compute-workgroup-size-x"


def test_budget_rule() -> None:
    check_budget(16 << 20, 16)
    with pytest.raises(GpuError) as info:
        check_budget((16 << 20) + 1, 16)
    assert info.value.reason == "over-memory-budget"
