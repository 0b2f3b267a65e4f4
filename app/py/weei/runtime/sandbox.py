"""How much memory and time one untrusted model module gets: the rules both hosts share.

Sans-I/O: sizes and measured seconds come in, limits go out. The wasmtime
host (``weei.host.worker_pool``) and the browser's Worker pool
(``weei.browser.workers``) apply the same numbers, so a module fails the
same way, by the same name, on both (docs/abi.md, "Bounds on an untrusted
module").

Memory: a task may use the backend's ``estimatedWorkingBytes`` plus the
bytes the host copies in (weights, auxiliary weights, the chunk), plus
headroom (half of that again, at least :data:`HEADROOM_BYTES`), never more
than the device's cap. Unknown ``estimatedWorkingBytes`` (a participant
whose coordinator did not announce it) gives the device's cap, as before.

Time: an operation may take ``units`` × the measured seconds per unit ×
:data:`DEADLINE_FACTOR`, within [:data:`DEADLINE_FLOOR_S`,
:data:`DEADLINE_CEILING_S`]; before anything was measured, the ceiling.

The module's memory section is read here too (:func:`module_memory`): a
declared minimum above the limit is refused before instantiation, and the
browser gives a module the limit as its declared maximum
(:func:`cap_module_memory`), since a page cannot put a store limiter on
``WebAssembly.Memory``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..core.errors import ModelError, ModelReason
from ..core.limits import DEFAULT_MEMORY_CAP

__all__ = ["PAGE", "HEADROOM_BYTES", "DEADLINE_FACTOR", "DEADLINE_FLOOR_S",
           "DEADLINE_CEILING_S", "memory_limit", "operation_deadline_s", "SpeedMeter", "module_memory",
           "check_module_memory", "cap_module_memory"]

#: A WebAssembly page.
PAGE = 65536
#: The least headroom above what a task is known to need: allocator slack, result buffers, the stack.
HEADROOM_BYTES = 64 << 20
#: Times the measured pace an operation may take: a busy or throttled device is not a hung module.
DEADLINE_FACTOR = 20.0
#: No operation gets less (the first call also instantiates and warms up).
DEADLINE_FLOOR_S = 120.0
#: No operation gets more, and one gets this before the device's pace is known.
DEADLINE_CEILING_S = 900.0
_MAX_PAGES = 65536  # wasm32: 4 GiB


def memory_limit(working_bytes: int | None, input_bytes: int, device_cap: int = DEFAULT_MEMORY_CAP) -> int:
    """The linear memory one task may use, in bytes (a whole number of pages).

    Raises ModelError ``memory-over-limit`` when the backend's estimate and
    the inputs alone exceed the device's cap (the task cannot fit).
    """
    cap = device_cap - device_cap % PAGE
    if working_bytes is None:
        return cap
    need = max(0, int(working_bytes)) + max(0, int(input_bytes))
    if need > cap:
        raise ModelError(ModelReason.MEMORY_OVER_LIMIT, f"the task needs {need:,} bytes of module memory "
                                              f"(estimatedWorkingBytes and inputs), over this device's {cap:,}")
    want = need + max(HEADROOM_BYTES, need // 2)
    return min(cap, math.ceil(want / PAGE) * PAGE)


def operation_deadline_s(units: int, seconds_per_unit: float | None) -> float:
    """How long one operation over ``units`` examples (or episodes) may run."""
    if seconds_per_unit is None or units <= 0:
        return DEADLINE_CEILING_S
    return min(DEADLINE_CEILING_S, max(DEADLINE_FLOOR_S, units * seconds_per_unit * DEADLINE_FACTOR))


@dataclass
class SpeedMeter:
    """The device's measured pace per operation kind (train, evaluate): seconds per unit.

    Each finished task reports its units and elapsed seconds; the pace kept
    is the slowest seen, so one fast task never shortens a later deadline
    below what the device has already needed."""

    _pace: dict[str, float] = field(default_factory=dict)

    def observe(self, op: str, units: int, seconds: float) -> None:
        if units > 0 and seconds >= 0 and math.isfinite(seconds):
            self._pace[op] = max(self._pace.get(op, 0.0), seconds / units)

    def pace(self, op: str) -> float | None:
        return self._pace.get(op)

    def deadline_s(self, op: str, units: int) -> float:
        return operation_deadline_s(units, self._pace.get(op))


def _leb(data: bytes, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= end or shift > 35:
            raise ModelError(ModelReason.INVALID_MODULE, "load: a malformed LEB128 number in the module")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def _uleb(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _memory_section(wasm: bytes) -> tuple[int, int, int, int | None] | None:
    """(section start, section end, minimum pages, maximum pages or None) of the module's one memory."""
    if len(wasm) < 8 or wasm[:4] != b"\0asm":
        raise ModelError(ModelReason.INVALID_MODULE, "load: not a WebAssembly binary (missing \\0asm magic)")
    pos = 8
    while pos < len(wasm):
        start = pos
        section = wasm[pos]
        size, body = _leb(wasm, pos + 1, len(wasm))
        end = body + size
        if end > len(wasm):
            raise ModelError(ModelReason.INVALID_MODULE, "load: a section runs past the end of the module")
        if section == 5:
            count, at = _leb(wasm, body, end)
            if count != 1 or at >= end:
                raise ModelError(ModelReason.INVALID_MODULE, f"load: the module defines {count} memories; the ABI allows one")
            flags = wasm[at]
            if flags not in (0, 1):  # 2, 3: shared; 4 and up: memory64
                raise ModelError(ModelReason.INVALID_MODULE, f"load: memory limits flags {flags:#x} are outside the ABI "
                                                   "(shared memory and memory64 are refused)")
            minimum, at = _leb(wasm, at + 1, end)
            maximum = None
            if flags == 1:
                maximum, at = _leb(wasm, at, end)
            if at != end:
                raise ModelError(ModelReason.INVALID_MODULE, "load: the memory section has trailing bytes")
            return start, end, minimum, maximum
        pos = end
    return None


def module_memory(wasm: bytes) -> tuple[int, int | None] | None:
    """The declared (minimum, maximum) pages of the module's own memory, or None when it defines none.

    Raises ModelError ``invalid-module`` for a malformed section, several
    memories, shared memory or memory64."""
    found = _memory_section(bytes(wasm))
    return None if found is None else (found[2], found[3])


def check_module_memory(wasm: bytes, limit_bytes: int) -> None:
    """Refuse, before instantiation, a module whose declared minimum memory exceeds ``limit_bytes``:
    ModelError ``memory-over-limit``."""
    found = module_memory(wasm)
    if found is not None and found[0] * PAGE > limit_bytes:
        raise ModelError(ModelReason.MEMORY_OVER_LIMIT, f"load: the module declares at least {found[0] * PAGE:,} bytes "
                                              f"of memory, over the limit of {limit_bytes:,}")


def cap_module_memory(wasm: bytes, limit_bytes: int) -> bytes:
    """``wasm`` with its memory's declared maximum lowered to ``limit_bytes`` (set when absent).

    A ``memory.grow`` past it then returns -1 inside the module, as under
    wasmtime's store limit. Checks :func:`check_module_memory` first."""
    data = bytes(wasm)
    check_module_memory(data, limit_bytes)
    found = _memory_section(data)
    if found is None:
        return data
    start, end, minimum, maximum = found
    pages = min(limit_bytes // PAGE, _MAX_PAGES)
    if maximum is not None and maximum <= pages:
        return data
    body = _uleb(1) + b"\x01" + _uleb(minimum) + _uleb(pages)
    return data[:start] + b"\x05" + _uleb(len(body)) + body + data[end:]
