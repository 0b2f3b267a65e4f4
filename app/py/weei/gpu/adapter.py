"""Adapter choice, requirements and the memory budget, sans-I/O.

``auto`` never trains on a software adapter (``isFallbackAdapter``, or
SwiftShader / lavapipe / llvmpipe by name): they are for tests; ``gpu`` and
``hybrid`` take whatever adapter there is.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import GpuError, GpuReason

__all__ = ["AdapterFacts", "SOFTWARE_NAMES", "is_software", "admit_adapter", "check_budget", "limit_key"]

SOFTWARE_NAMES = ("swiftshader", "lavapipe", "llvmpipe", "softpipe", "warp")


@dataclass(frozen=True)
class AdapterFacts:
    vendor: str
    architecture: str
    device: str
    description: str
    is_fallback: bool
    adapter_type: str = ""   # wgpu-py: 'DiscreteGPU', 'IntegratedGPU', 'CPU', ...
    backend: str = ""        # wgpu-py: 'Vulkan', 'Metal', 'D3D12', ...; 'WebGPU' in the browser

    @classmethod
    def from_info(cls, info: Mapping[str, Any], is_fallback: bool = False) -> AdapterFacts:
        def s(key: str) -> str:
            value = info.get(key, "")
            return value if isinstance(value, str) else str(value)
        fallback = bool(is_fallback or info.get("is_fallback_adapter") or info.get("isFallbackAdapter"))
        return cls(s("vendor"), s("architecture"), s("device"), s("description"), fallback,
                   s("adapter_type"), s("backend_type"))

    def as_diagnostics(self) -> dict[str, str]:
        """diagnostics.gpu.adapter."""
        return {"vendor": self.vendor, "architecture": self.architecture, "device": self.device,
                "description": self.description}


def is_software(facts: AdapterFacts) -> bool:
    if facts.is_fallback or facts.adapter_type.upper() == "CPU":
        return True
    text = " ".join((facts.vendor, facts.architecture, facts.device, facts.description)).lower()
    return any(re.search(rf"\b{name}\b", text) for name in SOFTWARE_NAMES)


def limit_key(name: str) -> str:
    """``maxStorageBufferBindingSize`` -> ``max-storage-buffer-binding-size``."""
    return re.sub(r"([A-Z])", r"-\1", name).lower()


def admit_adapter(
    facts: AdapterFacts,
    preference: str,
    features: Iterable[str],
    limits: Mapping[str, Any],
    required_features: Iterable[str],
    minimum_limits: Mapping[str, Any],
) -> None:
    """Raise ``GpuError`` when this adapter may not train for the preference and backend."""
    if preference == "auto" and is_software(facts):
        raise GpuError(GpuReason.SOFTWARE_ADAPTER, f"auto does not use the software adapter {facts.device or facts.vendor!r}")
    have = set(features)
    for feature in required_features:
        if feature not in have:
            raise GpuError(GpuReason.MISSING_FEATURE, f"the adapter lacks the feature {feature!r}")
    for name, need in minimum_limits.items():
        got = limits.get(limit_key(name), limits.get(name))
        if not isinstance(got, int | float) or got < need:
            raise GpuError(GpuReason.ADAPTER_LIMITS, f"the adapter's {name} is {got}, the backend needs {need}")


def check_budget(estimated_working_bytes: int, budget_mib: float) -> None:
    """A backend needing more than gpuMemoryBudgetMiB is refused before any allocation."""
    budget = int(budget_mib * (1 << 20))
    if estimated_working_bytes > budget:
        raise GpuError(
            GpuReason.OVER_MEMORY_BUDGET,
            f"the GPU backend needs {estimated_working_bytes} bytes, over the budget of {budget_mib} MiB",
        )
