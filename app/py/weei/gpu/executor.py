"""The GPU executor: runs a checked ``weei-device-program-v1`` on a device.

Written once against the subset of the wgpu-py API that both hosts have:
wgpu-py itself in CPython (Vulkan, Metal, D3D12; lavapipe in tests) and
``weei.browser.webgpu`` over ``navigator.gpu`` in Pyodide. The ``gpu``
object (``wgpu.gpu`` or the shim) is passed in, so this module imports
neither. Every device failure becomes a ``GpuError`` with a named reason.

Submitted work cannot be recalled, so a deadline can only act between
submissions: a step is submitted in pieces of at most
:data:`PIECE_WORKGROUPS` workgroups (whole dispatches; the parser bounds
each one), the executor waits for each piece and stops with
``gpu-timeout`` once the step's timeout or the operation's deadline has
passed. A program within the bounds of ``weei.gpu.program`` is one piece
per step; a heavier one pays a wait per piece.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from .adapter import AdapterFacts, admit_adapter
from .archive import ShaderArchive
from .errors import GpuError, GpuReason
from .program import (MAX_WORKGROUPS_PER_DISPATCH, Clear, Copy, DeviceLimits, DeviceProgram, Dispatch, PipelineSpec,
                      Step, check_upload)

__all__ = ["GpuDevice", "ProgramRun", "STORAGE_USAGE", "PIECE_WORKGROUPS"]

# GPUBufferUsage: STORAGE | COPY_SRC | COPY_DST (the same numbers in wgpu-py and WebGPU).
STORAGE_USAGE = 0x0080 | 0x0004 | 0x0008
#: The most workgroups submitted before the executor waits and looks at the clock (one dispatch may be that big).
PIECE_WORKGROUPS = MAX_WORKGROUPS_PER_DISPATCH


@contextmanager
def _device_errors(what: str, default: GpuReason = GpuReason.GPU_ERROR) -> Iterator[None]:
    """Map the API's exceptions (by class name: wgpu-py's and the shim's match) to reasons."""
    try:
        yield
    except GpuError:
        raise
    except Exception as exc:
        kind = type(exc).__name__
        text = str(exc)
        if kind == "GPUOutOfMemoryError" or "out of memory" in text.lower():
            reason = GpuReason.OUT_OF_MEMORY
        elif "lost" in text.lower():
            reason = GpuReason.DEVICE_LOST
        else:
            reason = default
        raise GpuError(reason, f"{what}: {kind}: {text.strip()[:300]}") from None


class GpuDevice:
    """An adapter and device, with compiled modules and pipelines cached."""

    def __init__(self, adapter: Any, device: Any, facts: AdapterFacts) -> None:
        self.adapter = adapter
        self.device = device
        self.facts = facts
        self.limits = DeviceLimits.from_mapping(dict(device.limits))
        self._modules: dict[tuple[str, str], Any] = {}
        self._pipelines: dict[tuple[str, str, str, tuple[tuple[str, float], ...]], Any] = {}

    @classmethod
    def open(
        cls,
        gpu: Any,
        *,
        preference: str,
        required_features: Sequence[str] = (),
        minimum_limits: Mapping[str, Any] | None = None,
    ) -> GpuDevice:
        """Request an adapter and a device; ``auto`` refuses a software adapter."""
        if gpu is None:
            raise GpuError(GpuReason.WEBGPU_UNAVAILABLE, "this environment has no WebGPU")
        with _device_errors("requestAdapter", GpuReason.NO_ADAPTER):
            adapter = gpu.request_adapter_sync(power_preference="high-performance")
        if adapter is None:
            raise GpuError(GpuReason.NO_ADAPTER, "requestAdapter found no adapter")
        info = dict(adapter.info)
        facts = AdapterFacts.from_info(info, bool(getattr(adapter, "is_fallback_adapter", False)))
        admit_adapter(facts, preference, adapter.features, dict(adapter.limits), required_features, minimum_limits or {})
        with _device_errors("requestDevice", GpuReason.DEVICE_FAILED):
            device = adapter.request_device_sync(required_features=list(required_features))
        return cls(adapter, device, facts)

    def compile(self, archive: ShaderArchive, names: Sequence[str] | None = None) -> float:
        """Compile the archive's modules (all, or ``names``) on this device and
        check each one's compilation info; return the milliseconds spent."""
        start = time.perf_counter()
        for module in archive.modules:
            if names is not None and module.name not in names:
                continue
            key = (module.name, module.sha256)
            if key in self._modules:
                continue
            with _device_errors(f"compiling {module.name}", GpuReason.MODULE_COMPILE_FAILED):
                compiled = self.device.create_shader_module(code=module.source, label=module.name)
                errors = [m for m in _compilation_messages(compiled) if _message_type(m) == "error"]
            if errors:
                raise GpuError(GpuReason.MODULE_COMPILE_FAILED, f"{module.name}: {_message_text(errors[0])}")
            self._modules[key] = compiled
        return (time.perf_counter() - start) * 1000.0

    def pipeline(self, archive: ShaderArchive, spec: PipelineSpec) -> Any:
        """The compute pipeline of ``spec`` (its module compiled first)."""
        module = archive.module(spec.module)
        if module is None:
            raise GpuError(GpuReason.MODULE_MISSING, f"the WGSL archive has no module {spec.module!r}")
        key = (module.sha256, spec.module, spec.entry_point, spec.constants)
        if key not in self._pipelines:
            self.compile(archive, [spec.module])
            compute: dict[str, Any] = {"module": self._modules[(module.name, module.sha256)], "entry_point": spec.entry_point}
            if spec.constants:
                compute["constants"] = dict(spec.constants)
            with _device_errors(f"pipeline {spec.id}", GpuReason.MODULE_COMPILE_FAILED):
                self._pipelines[key] = self.device.create_compute_pipeline(layout="auto", compute=compute, label=spec.id)
        return self._pipelines[key]


def _compilation_messages(module: Any) -> list[Any]:
    get = getattr(module, "get_compilation_info_sync", None) or module.get_compilation_info
    info = get()
    return list(getattr(info, "messages", info) or [])


def _message_type(message: Any) -> str:
    return str(message.get("type") if isinstance(message, dict) else getattr(message, "type", ""))


def _message_text(message: Any) -> str:
    return str(message.get("message") if isinstance(message, dict) else getattr(message, "message", message))


@dataclass
class RunStats:
    compilation_ms: float = 0.0
    steps: int = 0
    upload_bytes: int = 0
    upload_s: float = 0.0
    readback_bytes: int = 0
    readback_s: float = 0.0
    compute_s: float = 0.0
    pieces: int = 0  # submissions waited on


class ProgramRun:
    """One program's buffers and pipelines on a device: upload, run, read back."""

    def __init__(
        self, gpu: GpuDevice, archive: ShaderArchive, program: DeviceProgram, weights: bytes, *,
        step_timeout_s: float = 60.0, deadline: float | None = None,
    ) -> None:
        """``deadline``: the operation's end on the ``time.monotonic()`` clock (None: only the step timeout)."""
        self.gpu = gpu
        self.program = program
        self.stats = RunStats()
        self._timeout = step_timeout_s
        self.deadline = deadline
        self._pieces = _pieces(program.steps)
        dev = gpu.device
        start = time.perf_counter()
        pipelines = {p.id: gpu.pipeline(archive, p) for p in program.pipelines}
        self.stats.compilation_ms = (time.perf_counter() - start) * 1000.0
        self._buffers: dict[str, Any] = {}
        with _device_errors("creating buffers"):
            for spec in program.buffers:
                # WebGPU zero-fills new buffers: init "zeros" and "batch" need nothing more.
                self._buffers[spec.id] = dev.create_buffer(size=spec.bytes, usage=STORAGE_USAGE, label=spec.id)
                if spec.init == "weights":
                    dev.queue.write_buffer(self._buffers[spec.id], 0, weights)
            self._groups: list[Any] = []
            for step in program.steps:
                if isinstance(step, Dispatch):
                    pipe = pipelines[step.pipeline]
                    entries = [
                        {"binding": b.binding, "resource": {"buffer": self._buffers[b.buffer], "offset": 0,
                                                            "size": program.buffer(b.buffer).bytes}}  # type: ignore[union-attr]
                        for b in step.bindings
                    ]
                    self._groups.append((pipe, dev.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=entries)))

    def upload(self, uploads: Sequence[tuple[str, bytes]]) -> None:
        """Write a gpuNext's batch regions into their ``batch`` buffers."""
        start = time.perf_counter()
        for buffer_id, data in uploads:
            check_upload(self.program, buffer_id, len(data))
            if data:
                with _device_errors(f"writeBuffer {buffer_id}"):
                    self.gpu.device.queue.write_buffer(self._buffers[buffer_id], 0, data)
            self.stats.upload_bytes += len(data)
        self.stats.upload_s += time.perf_counter() - start

    def run_steps(self) -> list[bytes]:
        """Submit the program's steps once, piece by piece; return the step readback.

        Raises ``gpu-timeout`` after the piece during which the step's timeout or the deadline passed."""
        start = time.perf_counter()
        self.check_deadline()
        groups = iter(self._groups)
        out: list[bytes] = []
        for k, piece in enumerate(self._pieces):
            with _device_errors("running the program"):
                self._submit(piece, groups)
            # A read waits for the piece: the queue runs in order (wgpu-py 0.32's on_submitted_work_done
            # fails with its wgpu-native, and the shim has no other wait). The last piece's is the readback.
            if k == len(self._pieces) - 1 and self.program.step_readback:
                out = self.read(self.program.step_readback)
            else:
                with _device_errors("waiting for the program"):
                    self.gpu.device.queue.read_buffer(self._buffers[self.program.buffers[0].id], 0, 4)
            self.stats.pieces += 1
            elapsed = time.perf_counter() - start
            if elapsed > self._timeout:
                self.stats.compute_s += elapsed
                raise GpuError(GpuReason.GPU_TIMEOUT, f"a step ran {elapsed:.1f} s, past the limit of {self._timeout:g} s")
            self.check_deadline()
        self.stats.compute_s += time.perf_counter() - start
        self.stats.steps += 1
        return out

    def check_deadline(self) -> None:
        """Raise ``gpu-timeout`` if the operation's deadline has passed."""
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise GpuError(GpuReason.GPU_TIMEOUT, f"the GPU work ran past its deadline after {self.stats.steps} steps "
                                          f"({self.stats.pieces} submissions)")

    def _submit(self, piece: Sequence[Step], groups: Iterator[tuple[Any, Any]]) -> None:
        encoder = self.gpu.device.create_command_encoder()
        compute = None
        for step in piece:
            if isinstance(step, Dispatch):
                if compute is None:
                    compute = encoder.begin_compute_pass()
                pipe, group = next(groups)
                compute.set_pipeline(pipe)
                compute.set_bind_group(0, group)
                compute.dispatch_workgroups(*step.workgroups)
                continue
            if compute is not None:
                compute.end()
                compute = None
            if isinstance(step, Copy):
                encoder.copy_buffer_to_buffer(self._buffers[step.source], step.source_offset,
                                              self._buffers[step.target], step.target_offset, step.bytes)
            elif isinstance(step, Clear):
                encoder.clear_buffer(self._buffers[step.buffer], step.offset, step.bytes)
        if compute is not None:
            compute.end()
        self.gpu.device.queue.submit([encoder.finish()])

    def read(self, ranges: Sequence[Any]) -> list[bytes]:
        """Read back ranges (the read also waits for the submitted work)."""
        start = time.perf_counter()
        out: list[bytes] = []
        with _device_errors("reading back"):
            for r in ranges:
                out.append(bytes(self.gpu.device.queue.read_buffer(self._buffers[r.buffer], r.offset, r.bytes)))
        size = sum(len(b) for b in out)
        self.stats.readback_bytes += size
        self.stats.readback_s += time.perf_counter() - start
        return out

    def release(self) -> None:
        for buf in self._buffers.values():
            buf.destroy()
        self._buffers.clear()


def _pieces(steps: Sequence[Step]) -> tuple[tuple[Step, ...], ...]:
    """Consecutive steps, cut where the next dispatch would take a piece past PIECE_WORKGROUPS."""
    pieces: list[tuple[Step, ...]] = []
    current: list[Step] = []
    size = 0
    for step in steps:
        n = math.prod(step.workgroups) if isinstance(step, Dispatch) else 0
        if current and size + n > PIECE_WORKGROUPS:
            pieces.append(tuple(current))
            current, size = [], 0
        current.append(step)
        size += n
    if current:
        pieces.append(tuple(current))
    return tuple(pieces)
