"""``weei-device-program-v1``: the work a model's WASM hands the GPU, sans-I/O.

``gpuBegin`` returns a program (JSON, untrusted); :func:`parse_program`
turns it into frozen objects with every bound checked against the archive,
the device's limits, the memory budget and the backend's
``estimatedWorkingBytes``, so the executor never sees a bad index, size or
count. The format is described in docs/gpu.md.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..core._check import _describe
from .archive import ShaderArchive
from .errors import GpuError, GpuReason

__all__ = [
    "PROGRAM_FORMAT",
    "MAX_WORKGROUPS_PER_DISPATCH",
    "MAX_WORKGROUPS_PER_STEP",
    "DeviceLimits",
    "BufferSpec",
    "PipelineSpec",
    "Binding",
    "Dispatch",
    "Copy",
    "Clear",
    "Range",
    "DeviceProgram",
    "parse_program",
    "check_upload",
]

PROGRAM_FORMAT = "weei-device-program-v1"
MAX_BUFFERS = 256  # an imported graph: two per activation (docs/gpu.md, "Imported ONNX graphs")
MAX_PIPELINES = 256
MAX_STEPS = 4096
MAX_CONSTANTS = 32
MAX_READBACKS = 16
#: WebGPU's maxComputeWorkgroupsPerDimension default: a native device may report more, a browser's will not.
WEBGPU_MAX_WORKGROUPS_PER_DIMENSION = 65535
#: A dispatch cannot be interrupted or split without changing what the shader sees, so its size is the
#: executor's smallest piece of work between deadline checks. 2^22 is eight times what one 64-wide
#: workgroup per element of the largest storage binding (2^25 floats) needs.
MAX_WORKGROUPS_PER_DISPATCH = 1 << 22
#: All the dispatches of one program step together.
MAX_WORKGROUPS_PER_STEP = 1 << 26
BUFFER_INITS = ("zeros", "weights", "batch")
_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


@dataclass(frozen=True)
class DeviceLimits:
    """The device limits a program is checked against (WebGPU's defaults)."""

    max_buffer_size: int = 268435456
    max_storage_buffer_binding_size: int = 134217728
    max_storage_buffers_per_shader_stage: int = 8
    max_compute_workgroups_per_dimension: int = 65535

    @classmethod
    def from_mapping(cls, limits: Mapping[str, Any]) -> DeviceLimits:
        """From a device's limits (kebab-case keys, as wgpu-py and the shim give them)."""
        def get(name: str, default: int) -> int:
            value = limits.get(name.replace("_", "-"), default)
            return int(value) if isinstance(value, int | float) and value > 0 else default
        return cls(*(get(f, getattr(cls, f)) for f in cls.__dataclass_fields__))


@dataclass(frozen=True)
class BufferSpec:
    id: str
    bytes: int
    init: str  # one of BUFFER_INITS


@dataclass(frozen=True)
class PipelineSpec:
    id: str
    module: str
    entry_point: str
    constants: tuple[tuple[str, float], ...]


@dataclass(frozen=True)
class Binding:
    binding: int
    buffer: str


@dataclass(frozen=True)
class Dispatch:
    pipeline: str
    bindings: tuple[Binding, ...]
    workgroups: tuple[int, int, int]


@dataclass(frozen=True)
class Copy:
    source: str
    source_offset: int
    target: str
    target_offset: int
    bytes: int


@dataclass(frozen=True)
class Clear:
    buffer: str
    offset: int
    bytes: int


@dataclass(frozen=True)
class Range:
    buffer: str
    offset: int
    bytes: int


Step = Dispatch | Copy | Clear


@dataclass(frozen=True)
class DeviceProgram:
    buffers: tuple[BufferSpec, ...]
    pipelines: tuple[PipelineSpec, ...]
    steps: tuple[Step, ...]
    step_readback: tuple[Range, ...]
    final_readback: tuple[Range, ...]
    total_bytes: int  # buffers plus readback staging
    workgroups: int = 0  # of all the dispatches of one step

    def buffer(self, buffer_id: str) -> BufferSpec | None:
        return next((b for b in self.buffers if b.id == buffer_id), None)


def _bad(path: str, message: str) -> GpuError:
    return GpuError(GpuReason.PROGRAM_INVALID, f"device program: {path}: {message}")


def _obj(value: Any, path: str, keys: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _bad(path, "must be an object")
    missing = [k for k in keys if k not in value]
    if missing:
        raise _bad(path, f"missing {missing[0]!r}")
    extra = [k for k in value if k not in keys and k not in optional]
    if extra:
        raise _bad(path, f"unknown field {extra[0]!r}")
    return value


def _list(value: Any, path: str, most: int, least: int = 0) -> list[Any]:
    if not isinstance(value, list) or not least <= len(value) <= most:
        raise _bad(path, f"must be a list of {least} to {most} entries")
    return value


def _int(value: Any, path: str, low: int, high: int, multiple: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value or math.isinf(value):
        raise _bad(path, "must be a whole number")
    if int(value) != value or not low <= value <= high or int(value) % multiple:
        raise _bad(path, f"must be a whole number in {low}..{high}" + (f", a multiple of {multiple}" if multiple > 1 else ""))
    return int(value)


def _ident(value: Any, path: str, pattern: re.Pattern[str] = _ID) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise _bad(path, "must be an identifier (letters, digits, _ . -; at most 64)")
    return value


def parse_program(
    raw: Any,
    *,
    archive: ShaderArchive,
    limits: DeviceLimits,
    weight_bytes: int,
    budget_bytes: int,
    estimated_working_bytes: int,
) -> DeviceProgram:
    """Check an untrusted program; raise ``GpuError`` naming the first problem."""
    doc = _obj(raw, "program", ("format", "buffers", "pipelines", "steps", "stepReadback", "finalReadback"))
    if doc["format"] != PROGRAM_FORMAT:
        raise _bad("format", f"must be {PROGRAM_FORMAT!r}")
    max_bytes = min(limits.max_buffer_size, limits.max_storage_buffer_binding_size)
    buffers: dict[str, BufferSpec] = {}
    for k, item in enumerate(_list(doc["buffers"], "buffers", MAX_BUFFERS, 1)):
        p = f"buffers[{k}]"
        b = _obj(item, p, ("id", "bytes", "init"))
        bid = _ident(b["id"], f"{p}.id")
        if bid in buffers:
            raise _bad(f"{p}.id", f"duplicate buffer {bid!r}")
        if b["init"] not in BUFFER_INITS:
            raise _bad(f"{p}.init", f"must be one of {', '.join(BUFFER_INITS)}")
        size = _int(b["bytes"], f"{p}.bytes", 4, max_bytes, 4)
        if b["init"] == "weights" and size != weight_bytes:
            raise _bad(f"{p}.bytes", f"a weights buffer holds the {weight_bytes} weight bytes")
        buffers[bid] = BufferSpec(bid, size, b["init"])

    pipelines: dict[str, PipelineSpec] = {}
    for k, item in enumerate(_list(doc["pipelines"], "pipelines", MAX_PIPELINES, 1)):
        p = f"pipelines[{k}]"
        q = _obj(item, p, ("id", "module", "entryPoint"), ("constants",))
        pid = _ident(q["id"], f"{p}.id")
        if pid in pipelines:
            raise _bad(f"{p}.id", f"duplicate pipeline {pid!r}")
        module = archive.module(q["module"]) if isinstance(q["module"], str) else None
        if module is None:
            raise GpuError(GpuReason.MODULE_MISSING, f"device program: {p}.module: the archive has no module {_named(q['module'])}")
        if q["entryPoint"] not in module.entry_points:
            raise GpuError(GpuReason.ENTRY_POINT_MISSING, f"device program: {p}: {module.name} has no entry point {_named(q['entryPoint'])}")
        consts = q.get("constants", {})
        if not isinstance(consts, dict) or len(consts) > MAX_CONSTANTS:
            raise _bad(f"{p}.constants", f"must be an object of at most {MAX_CONSTANTS} numbers")
        for name, value in consts.items():
            _ident(name, f"{p}.constants", _IDENT)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or abs(value) > 2**32:
                raise _bad(f"{p}.constants.{name}", "must be a finite number within +-2^32")
        pipelines[pid] = PipelineSpec(pid, module.name, q["entryPoint"], tuple(sorted(consts.items())))

    steps: list[Step] = []
    for k, item in enumerate(_list(doc["steps"], "steps", MAX_STEPS, 1)):
        p = f"steps[{k}]"
        op = item.get("op") if isinstance(item, dict) else None
        if op == "dispatch":
            steps.append(_dispatch(item, p, buffers, pipelines, limits))
        elif op == "copy":
            c = _obj(item, p, ("op", "from", "fromOffset", "to", "toOffset", "bytes"))
            src, dst = _buffer_ref(c["from"], f"{p}.from", buffers), _buffer_ref(c["to"], f"{p}.to", buffers)
            if src.id == dst.id:
                raise _bad(p, "a copy needs two different buffers")
            size = _int(c["bytes"], f"{p}.bytes", 4, max_bytes, 4)
            so = _int(c["fromOffset"], f"{p}.fromOffset", 0, src.bytes - size, 4)
            to = _int(c["toOffset"], f"{p}.toOffset", 0, dst.bytes - size, 4)
            steps.append(Copy(src.id, so, dst.id, to, size))
        elif op == "clear":
            c = _obj(item, p, ("op", "buffer", "offset", "bytes"))
            buf = _buffer_ref(c["buffer"], f"{p}.buffer", buffers)
            size = _int(c["bytes"], f"{p}.bytes", 4, buf.bytes, 4)
            steps.append(Clear(buf.id, _int(c["offset"], f"{p}.offset", 0, buf.bytes - size, 4), size))
        else:
            raise _bad(f"{p}.op", "must be 'dispatch', 'copy' or 'clear'")
    workgroups = sum(math.prod(step.workgroups) for step in steps if isinstance(step, Dispatch))
    if workgroups > MAX_WORKGROUPS_PER_STEP:
        raise GpuError(GpuReason.PROGRAM_OVER_WORKGROUPS, f"device program: one step dispatches {workgroups} workgroups, "
                                                  f"over the limit of {MAX_WORKGROUPS_PER_STEP}")

    step_rb = _ranges(doc["stepReadback"], "stepReadback", buffers, 0)
    final_rb = _ranges(doc["finalReadback"], "finalReadback", buffers, 1)
    total = sum(b.bytes for b in buffers.values()) + sum(r.bytes for r in step_rb + final_rb)
    if total > budget_bytes:
        raise GpuError(GpuReason.PROGRAM_OVER_BUDGET, f"device program: needs {total} bytes, over the GPU memory budget of {budget_bytes}")
    if total > estimated_working_bytes:
        raise GpuError(
            GpuReason.PROGRAM_OVER_ESTIMATE,
            f"device program: needs {total} bytes, more than the backend's estimatedWorkingBytes {estimated_working_bytes}",
        )
    return DeviceProgram(tuple(buffers.values()), tuple(pipelines.values()), tuple(steps), step_rb, final_rb, total,
                         workgroups)


def _named(value: Any) -> str:
    """A name from the program for an error message: never repr() of an untrusted structure (a deep one
    recurses past the interpreter's limit; make fuzz found it)."""
    return repr(value[:80]) if isinstance(value, str) else _describe(value)


def _buffer_ref(value: Any, path: str, buffers: Mapping[str, BufferSpec]) -> BufferSpec:
    if not isinstance(value, str) or value not in buffers:
        raise _bad(path, f"unknown buffer {_named(value)}")
    return buffers[value]


def _dispatch(
    item: Any, p: str, buffers: Mapping[str, BufferSpec], pipelines: Mapping[str, PipelineSpec], limits: DeviceLimits
) -> Dispatch:
    d = _obj(item, p, ("op", "pipeline", "bindings", "workgroups"))
    if not isinstance(d["pipeline"], str) or d["pipeline"] not in pipelines:
        raise _bad(f"{p}.pipeline", f"unknown pipeline {_named(d['pipeline'])}")
    most = limits.max_storage_buffers_per_shader_stage
    bindings: list[Binding] = []
    for j, entry in enumerate(_list(d["bindings"], f"{p}.bindings", most, 1)):
        bp = f"{p}.bindings[{j}]"
        e = _obj(entry, bp, ("binding", "buffer"))
        number = _int(e["binding"], f"{bp}.binding", 0, 15)
        buf = _buffer_ref(e["buffer"], f"{bp}.buffer", buffers)
        if any(b.binding == number for b in bindings):
            raise _bad(bp, f"binding {number} is bound twice")
        # WebGPU refuses a writable storage range aliased by another binding.
        if any(b.buffer == buf.id for b in bindings):
            raise _bad(bp, f"buffer {buf.id!r} is bound twice in one dispatch")
        bindings.append(Binding(number, buf.id))
    wg = _list(d["workgroups"], f"{p}.workgroups", 3, 3)
    top = min(limits.max_compute_workgroups_per_dimension, WEBGPU_MAX_WORKGROUPS_PER_DIMENSION)
    x, y, z = (_int(v, f"{p}.workgroups[{j}]", 1, top) for j, v in enumerate(wg))
    if x * y * z > MAX_WORKGROUPS_PER_DISPATCH:
        raise GpuError(GpuReason.PROGRAM_OVER_WORKGROUPS, f"device program: {p}.workgroups: {x} x {y} x {z} workgroups, "
                                                  f"over the limit of {MAX_WORKGROUPS_PER_DISPATCH} per dispatch")
    return Dispatch(d["pipeline"], tuple(bindings), (x, y, z))


def _ranges(value: Any, path: str, buffers: Mapping[str, BufferSpec], least: int) -> tuple[Range, ...]:
    out: list[Range] = []
    for k, item in enumerate(_list(value, path, MAX_READBACKS, least)):
        p = f"{path}[{k}]"
        r = _obj(item, p, ("buffer", "offset", "bytes"))
        buf = _buffer_ref(r["buffer"], f"{p}.buffer", buffers)
        size = _int(r["bytes"], f"{p}.bytes", 4, buf.bytes, 4)
        out.append(Range(buf.id, _int(r["offset"], f"{p}.offset", 0, buf.bytes - size, 4), size))
    return tuple(out)


def check_upload(program: DeviceProgram, buffer_id: str, size: int) -> BufferSpec:
    """A gpuNext batch upload: into a ``batch`` buffer, 4-byte multiple, fits."""
    buf = program.buffer(buffer_id)
    if buf is None or buf.init != "batch":
        raise GpuError(GpuReason.UPLOAD_INVALID, f"gpuNext: {buffer_id!r} is not a batch buffer of the program")
    if size % 4 or size > buf.bytes:
        raise GpuError(GpuReason.UPLOAD_INVALID, f"gpuNext: {size} bytes for {buffer_id!r} ({buf.bytes} bytes, multiples of 4)")
    return buf
