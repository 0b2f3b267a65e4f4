"""The subset of the wgpu-py API that ``weei.gpu.executor`` uses, over ``navigator.gpu``.

Pyodide only. wgpu-py's own JS backend is a stub (0.32), so this shim gives
the executor the same calls it makes on wgpu-py in CPython: snake_case
methods and keyword descriptors become WebGPU's camelCase calls and JS
objects, promises are awaited with ``run_sync`` (which needs JavaScript to
have entered Python through an async handler or ``callPromising``), and
errors are raised synchronously, as wgpu-py raises them: every call that can
fail runs inside validation and out-of-memory error scopes, and a captured
error becomes :class:`GPUValidationError` / :class:`GPUOutOfMemoryError`
(the executor maps them to reasons by class name). ``write_buffer`` passes a
zero-copy view of the Pyodide heap; ``read_buffer`` copies through a
mappable staging buffer (``mapAsync``, ``getMappedRange``).

``gpu`` is ``None`` where ``navigator.gpu`` does not exist.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import js  # type: ignore[import-not-found]
from pyodide.ffi import create_proxy, run_sync, to_js  # type: ignore[import-not-found]

from .convert import is_nullish

__all__ = ["gpu", "GPUError", "GPUValidationError", "GPUOutOfMemoryError"]

_MAP_READ = 0x0001
_COPY_DST = 0x0008


class GPUError(Exception):
    """A WebGPU error captured by an error scope."""


class GPUValidationError(GPUError):
    pass


class GPUOutOfMemoryError(GPUError):
    pass


def _js(value: Any) -> Any:
    return to_js(value, dict_converter=js.Object.fromEntries)


def _camel(name: str) -> str:
    return re.sub(r"_([a-z])", lambda m: m.group(1).upper(), name)


def _kebab(name: str) -> str:
    return re.sub(r"([A-Z])", r"-\1", name).lower()


def _limits(js_limits: Any) -> dict[str, int]:
    # GPUSupportedLimits' attributes are enumerable accessors on its prototype (what for ... in lists),
    # walked here: js.eval is refused under a Content-Security-Policy without 'unsafe-eval' (Weei's).
    names: list[str] = []
    obj = js_limits
    while obj is not None and not obj == js.Object.prototype:
        for name in js.Object.getOwnPropertyNames(obj).to_py():
            if js.Object.getOwnPropertyDescriptor(obj, name).enumerable and name not in names:
                names.append(name)
        obj = js.Object.getPrototypeOf(obj)
    return {_kebab(n): int(getattr(js_limits, n)) for n in names}


class _Device:
    def __init__(self, adapter: _Adapter, js_device: Any) -> None:
        self.adapter = adapter
        self._js = js_device
        self.limits = _limits(js_device.limits)
        self.queue = _Queue(self)

    def _checked(self, call: Callable[[], Any]) -> Any:
        """Run a call inside error scopes; raise what they captured."""
        self._js.pushErrorScope("out-of-memory")
        self._js.pushErrorScope("validation")
        try:
            return call()
        finally:
            validation = run_sync(self._js.popErrorScope())
            memory = run_sync(self._js.popErrorScope())
            if not is_nullish(memory):
                raise GPUOutOfMemoryError(str(memory.message))
            if not is_nullish(validation):
                raise GPUValidationError(str(validation.message))

    def create_shader_module(self, *, code: str, label: str = "") -> _Wrapped:
        return _Wrapped(self._checked(lambda: self._js.createShaderModule(_js({"code": code, "label": label}))))

    def create_compute_pipeline(self, *, layout: Any, compute: dict[str, Any], label: str = "") -> _Wrapped:
        stage = {_camel(k): (v._js if isinstance(v, _Wrapped) else v) for k, v in compute.items()}
        desc = _js({"layout": layout, "label": label, "compute": stage})
        return _Wrapped(self._checked(lambda: self._js.createComputePipeline(desc)))

    def create_buffer(self, *, size: int, usage: int, label: str = "") -> _Wrapped:
        return _Wrapped(self._checked(lambda: self._js.createBuffer(_js({"size": size, "usage": usage, "label": label}))))

    def create_bind_group(self, *, layout: _Wrapped, entries: Sequence[dict[str, Any]]) -> _Wrapped:
        items = [{"binding": e["binding"], "resource": {**e["resource"], "buffer": e["resource"]["buffer"]._js}}
                 for e in entries]
        return _Wrapped(self._checked(lambda: self._js.createBindGroup(_js({"layout": layout._js, "entries": items}))))

    def create_command_encoder(self) -> _Encoder:
        return _Encoder(self._js.createCommandEncoder())


class _Wrapped:
    """A WebGPU object; snake_case calls are forwarded, wrapped results kept wrapped."""

    def __init__(self, js_object: Any) -> None:
        self._js = js_object

    @property
    def size(self) -> int:
        return int(self._js.size)

    def get_bind_group_layout(self, index: int) -> _Wrapped:
        return _Wrapped(self._js.getBindGroupLayout(index))

    def get_compilation_info_sync(self) -> list[dict[str, Any]]:
        info = run_sync(self._js.getCompilationInfo())
        return [{"type": str(m.type), "message": str(m.message)} for m in info.messages]

    def destroy(self) -> None:
        self._js.destroy()


class _Encoder:
    def __init__(self, js_encoder: Any) -> None:
        self._js = js_encoder

    def begin_compute_pass(self) -> _Pass:
        return _Pass(self._js.beginComputePass())

    def copy_buffer_to_buffer(self, src: _Wrapped, src_offset: int, dst: _Wrapped, dst_offset: int, size: int) -> None:
        self._js.copyBufferToBuffer(src._js, src_offset, dst._js, dst_offset, size)

    def clear_buffer(self, buffer: _Wrapped, offset: int, size: int) -> None:
        self._js.clearBuffer(buffer._js, offset, size)

    def finish(self) -> _Wrapped:
        return _Wrapped(self._js.finish())


class _Pass:
    def __init__(self, js_pass: Any) -> None:
        self._js = js_pass

    def set_pipeline(self, pipeline: _Wrapped) -> None:
        self._js.setPipeline(pipeline._js)

    def set_bind_group(self, index: int, group: _Wrapped) -> None:
        self._js.setBindGroup(index, group._js)

    def dispatch_workgroups(self, x: int, y: int = 1, z: int = 1) -> None:
        self._js.dispatchWorkgroups(x, y, z)

    def end(self) -> None:
        self._js.end()


class _Queue:
    def __init__(self, device: _Device) -> None:
        self._device = device
        self._js = device._js.queue

    def write_buffer(self, buffer: _Wrapped, offset: int, data: Any) -> None:
        # A view of the bytes where they lie in the Pyodide heap: no copy before WebGPU's own.
        proxy = create_proxy(memoryview(data).cast("B"))
        view = proxy.getBuffer("u8")
        try:
            self._device._checked(lambda: self._js.writeBuffer(buffer._js, offset, view.data))
        finally:
            view.release()
            proxy.destroy()

    def submit(self, command_buffers: Sequence[_Wrapped]) -> None:
        self._device._checked(lambda: self._js.submit(_js([c._js for c in command_buffers])))

    def read_buffer(self, buffer: _Wrapped, offset: int, size: int) -> memoryview:
        staging = self._device.create_buffer(size=size, usage=_MAP_READ | _COPY_DST, label="readback")
        try:
            encoder = self._device.create_command_encoder()
            encoder.copy_buffer_to_buffer(buffer, offset, staging, 0, size)
            self.submit([encoder.finish()])
            run_sync(staging._js.mapAsync(_MAP_READ))
            data = js.Uint8Array.new(staging._js.getMappedRange()).to_bytes()
            staging._js.unmap()
        finally:
            staging.destroy()
        return memoryview(data)


class _Adapter:
    def __init__(self, js_adapter: Any) -> None:
        self._js = js_adapter
        info = js_adapter.info
        fallback = getattr(info, "isFallbackAdapter", None)
        if is_nullish(fallback):
            fallback = getattr(js_adapter, "isFallbackAdapter", False)
        self.is_fallback_adapter = bool(fallback)
        self.info = {k: str(getattr(info, k, "") or "") for k in ("vendor", "architecture", "device", "description")}
        self.info.update(is_fallback_adapter=self.is_fallback_adapter, backend_type="WebGPU")
        self.features = {str(f) for f in getattr(js.Array, "from")(js_adapter.features).to_py()}
        self.limits = _limits(js_adapter.limits)

    def request_device_sync(self, *, required_features: Sequence[str] = ()) -> _Device:
        desc = _js({"requiredFeatures": list(required_features)})
        return _Device(self, run_sync(self._js.requestDevice(desc)))


class _Gpu:
    def __init__(self, js_gpu: Any) -> None:
        self._js = js_gpu

    def request_adapter_sync(self, *, power_preference: str = "high-performance") -> _Adapter | None:
        adapter = run_sync(self._js.requestAdapter(_js({"powerPreference": power_preference})))
        return None if is_nullish(adapter) else _Adapter(adapter)


_navigator_gpu = getattr(js.navigator, "gpu", None)
gpu: _Gpu | None = None if is_nullish(_navigator_gpu) else _Gpu(_navigator_gpu)
"""The WebGPU entry point (``wgpu.gpu``'s counterpart), or ``None``."""
