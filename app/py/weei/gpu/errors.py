"""``GpuError`` and the named reasons a GPU backend is refused or falls back.

Every reason here can appear as ``execution.fallback`` / the diagnostics
card's fallback reason (docs/gpu.md lists what each means). The assignment
then restarts on the CPU (``cpuFallback: restart-assignment``). ``GpuError``
is a ``WeeiError`` (core is below the GPU layer), so a host that catches
Weei errors catches these too.
"""

from __future__ import annotations

from enum import Enum

from ..core.errors import WeeiError

__all__ = ["GpuError", "GpuReason", "REASONS"]


class GpuReason(str, Enum):
    """Why a GPU backend was refused or fell back to the CPU (docs/gpu.md, "Fallback reasons")."""

    # device
    WEBGPU_UNAVAILABLE = "webgpu-unavailable"
    """No ``navigator.gpu`` (or no wgpu in CPython)."""
    NO_ADAPTER = "no-adapter"
    """``requestAdapter()`` returned null or failed."""
    SOFTWARE_ADAPTER = "software-adapter"
    """``auto`` and the only adapter is a software one."""
    MISSING_FEATURE = "missing-feature"
    """The adapter lacks a feature the backend requires."""
    ADAPTER_LIMITS = "adapter-limits"
    """The adapter's limits are below the backend's requirements."""
    DEVICE_FAILED = "device-failed"
    """``requestDevice()`` failed."""
    DEVICE_LOST = "device-lost"
    """The device was lost."""
    OUT_OF_MEMORY = "out-of-memory"
    """``GPUOutOfMemoryError`` creating or writing a buffer."""
    GPU_ERROR = "gpu-error"
    """Any other validation or internal error while running."""
    GPU_TIMEOUT = "gpu-timeout"
    """The assignment or one step ran past its deadline."""
    # package and archive
    OVER_MEMORY_BUDGET = "over-memory-budget"
    """``estimatedWorkingBytes`` exceed the device's GPU memory budget."""
    ARCHIVE_SIZE_MISMATCH = "archive-size-mismatch"
    """The archive's size differs from the package's."""
    ARCHIVE_HASH_MISMATCH = "archive-hash-mismatch"
    """The archive's SHA-256 differs from the package's."""
    ARCHIVE_MALFORMED = "archive-malformed"
    """The archive is not a well-formed WGSL archive."""
    ARCHIVE_FORMAT = "archive-format"
    """The archive is of another format or version."""
    ARCHIVE_NOT_ACCEPTED = "archive-not-accepted"
    """The host does not run this archive (``weei agent --accept-model``)."""
    MODULE_DUPLICATE = "module-duplicate"
    """Two archive modules share a name."""
    MODULE_HASH_MISMATCH = "module-hash-mismatch"
    """A module's SHA-256 differs from the archive's index."""
    MODULE_ENTRY_POINT_MISSING = "module-entry-point-missing"
    """A module lacks an entry point the index names."""
    MODULE_MISSING = "module-missing"
    """The program names a module the archive lacks."""
    ENTRY_POINT_MISSING = "entry-point-missing"
    """The program names an entry point its module lacks."""
    MODULE_COMPILE_FAILED = "module-compile-failed"
    """A WGSL module did not compile."""
    # program
    PROGRAM_INVALID = "program-invalid"
    """The model's GPU program is malformed."""
    PROGRAM_OVER_BUDGET = "program-over-budget"
    """The program's buffers exceed the memory budget."""
    PROGRAM_OVER_ESTIMATE = "program-over-estimate"
    """The program's buffers exceed the package's ``estimatedWorkingBytes``."""
    PROGRAM_OVER_WORKGROUPS = "program-over-workgroups"
    """A dispatch exceeds the device's workgroup limits."""
    UPLOAD_INVALID = "upload-invalid"
    """An upload does not fit its buffer."""
    GPU_STEP_LIMIT = "gpu-step-limit"
    """The program ran more steps than allowed."""
    GRAPH_NOT_ON_GPU = "graph-not-on-gpu"
    """An imported ONNX graph has an operator, loss or shape without a WGSL kernel (the message names it)."""
    # admission gate
    GATE_MISMATCH = "gate-mismatch"
    """The admission gate's result differs from the CPU's."""


#: Every reason code a GpuError can carry, as strings.
REASONS: frozenset[str] = frozenset(reason.value for reason in GpuReason)


class GpuError(WeeiError):
    """A GPU backend failure with a :class:`GpuReason`."""

    reasons = (GpuReason,)
