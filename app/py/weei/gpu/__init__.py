"""The GPU backend (docs/gpu.md): WGSL archives, ``weei-device-program-v1``
programs, the admission gate, and the executor over the wgpu-py API.

``errors``, ``archive``, ``program``, ``gate`` and ``adapter`` are pure
(no I/O, no clock); ``executor``, ``session`` and ``trainer`` drive a device
through the ``gpu`` object the host passes in (``wgpu.gpu`` in CPython, the
``weei.browser.webgpu`` shim in a browser's training Worker).
"""

from __future__ import annotations

from .adapter import AdapterFacts, admit_adapter, check_budget, is_software
from .archive import ShaderArchive, ShaderModule, check_descriptor, pack_archive, parse_archive, require_modules
from .errors import REASONS, GpuError
from .gate import GateResult, compare_step, require_pass
from .program import DeviceLimits, DeviceProgram, parse_program

__all__ = [
    "AdapterFacts",
    "DeviceLimits",
    "DeviceProgram",
    "GateResult",
    "GpuError",
    "REASONS",
    "ShaderArchive",
    "ShaderModule",
    "admit_adapter",
    "check_budget",
    "check_descriptor",
    "compare_step",
    "is_software",
    "pack_archive",
    "parse_archive",
    "parse_program",
    "require_modules",
    "require_pass",
]
