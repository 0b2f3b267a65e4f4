"""``GpuError`` and the named reasons a GPU backend is refused or falls back.

Every reason here can appear as ``execution.fallback`` / the diagnostics
card's fallback reason (docs/gpu.md lists what each means). The assignment
then restarts on the CPU (``cpuFallback: restart-assignment``).
"""

from __future__ import annotations

__all__ = ["GpuError", "REASONS"]

REASONS: frozenset[str] = frozenset({
    # device
    "webgpu-unavailable", "no-adapter", "software-adapter", "missing-feature", "adapter-limits",
    "device-failed", "device-lost", "out-of-memory", "gpu-error", "gpu-timeout",
    # package and archive
    "over-memory-budget", "archive-size-mismatch", "archive-hash-mismatch", "archive-malformed",
    "archive-format", "archive-not-accepted", "module-duplicate", "module-hash-mismatch", "module-entry-point-missing",
    "module-missing", "entry-point-missing", "module-compile-failed",
    # program
    "program-invalid", "program-over-budget", "program-over-estimate", "program-over-workgroups", "upload-invalid",
    "gpu-step-limit",
    # admission gate
    "gate-mismatch",
})


class GpuError(Exception):
    """A GPU backend failure with a reason from :data:`REASONS`."""

    def __init__(self, reason: str, message: str) -> None:
        assert reason in REASONS, reason
        super().__init__(f"{message} [{reason}]")
        self.reason = reason
        self.message = message
