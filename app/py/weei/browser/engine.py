"""The browser engine: :mod:`weei.runtime.engine` over the browser's ``WebAssembly``.

Theory of operation
-------------------
Runs in Pyodide only (the page or a Worker). Compiling uses
``WebAssembly.Module`` (synchronous; :meth:`BrowserEngine.compile_async`
uses ``WebAssembly.compile`` for large modules on the page's main thread,
where Chromium refuses synchronous compiles of more than 8 MB), and
instantiating ``WebAssembly.Instance``. Import and export lists come from
``WebAssembly.Module.imports/exports``, which give kinds but no function
signatures (``signature=None``; ``ModelRuntime`` then checks results
instead). Compiled modules are cached by SHA-256 of their bytes
(:class:`BrowserEngine`), so loading the same module again, in this engine
or in a Worker it was posted to (:meth:`BrowserEngine.adopt`), reuses V8's
compiled code, optimized functions included.

Bytes cross the FFI in bulk only: :meth:`BrowserInstance.read` copies a
``subarray`` of a ``Uint8Array`` over the exported memory with one
``to_bytes`` and :meth:`BrowserInstance.write` with one ``assign``. When
the memory grows its old ``ArrayBuffer`` is detached and a view over it
reads as empty, so the view is re-created whenever its length is no longer
the one it was made with. Only the module grows its memory, and only while
one of its exports runs (nobody else holds the memory object), so the view
is checked again (one FFI property read, the view's ``byteLength``) only
after an export call began or returned, or the progress hook was entered
or left; in between, reads and writes reuse it. Call
:meth:`BrowserInstance.invalidate` if JavaScript grew the memory itself.

Ownership: the only proxy created here is the ``weei.onProgress`` import of
each instance. The engine records the instances it made and
:meth:`BrowserEngine.close` (or :meth:`BrowserInstance.close`) destroys
their proxies; a closed instance must not be called again.

Errors: a JavaScript exception out of compile, instantiate or an export
call becomes :class:`CompileError`, :class:`InstantiateError` or
:class:`Trap`. An exception raised by the progress hook is remembered
before it unwinds the module through JavaScript and is re-raised unchanged
from :meth:`BrowserInstance.call`, as the protocol requires.
"""

from __future__ import annotations

from typing import Any

import js  # type: ignore[import-not-found]
from pyodide.ffi import JsException, JsProxy, create_proxy  # type: ignore[import-not-found]

from weei.runtime.engine import (
    CompileError,
    ExternInfo,
    ExternKind,
    InstantiateError,
    ProgressHook,
    Trap,
)

__all__ = ["BrowserEngine", "PageEngine", "BrowserModule", "BrowserInstance", "to_uint8array"]

_PROGRESS_MODULE = "weei"
_PROGRESS_NAME = "onProgress"
_KINDS: dict[str, ExternKind] = {
    "function": "func",
    "memory": "memory",
    "table": "table",
    "global": "global",
    "tag": "tag",
}

Buffer = bytes | bytearray | memoryview


def to_uint8array(data: Buffer) -> Any:
    """A new JS ``Uint8Array`` holding a copy of ``data`` (one bulk copy)."""
    view = memoryview(data).cast("B")
    array = js.Uint8Array.new(view.nbytes)
    if view.nbytes:
        array.assign(view)
    return array


def _extern_list(descriptors: Any, module: bool) -> tuple[ExternInfo, ...]:
    result = []
    for d in descriptors.to_py():
        kind = _KINDS.get(str(d["kind"]))
        if kind is None:
            raise CompileError(f"unknown extern kind {d['kind']!r}")
        result.append(ExternInfo(module=str(d["module"]) if module else "", name=str(d["name"]), kind=kind))
    return tuple(result)


class BrowserEngine:
    """An :class:`~weei.runtime.engine.Engine` over the browser's ``WebAssembly``.

    Keeps the instances it creates so :meth:`close` can release their proxies,
    and the last :data:`CACHE_SIZE` compiled modules by SHA-256 of their bytes:
    V8 compiles a module's functions with its baseline compiler first and
    installs optimized code in the compiled module as they get hot, so a
    module compiled once and instantiated again (or posted to another Worker
    and :meth:`adopt`-ed there) keeps its optimized code.
    """

    CACHE_SIZE = 4

    def __init__(self) -> None:
        self._instances: list[BrowserInstance] = []
        self._compiled: dict[str, Any] = {}  # sha256 -> WebAssembly.Module, oldest first
        self.compiles = 0  # modules this engine compiled itself (not from the cache)

    @staticmethod
    def _key(wasm: Buffer) -> str:
        import hashlib

        return hashlib.sha256(memoryview(wasm).cast("B")).hexdigest()

    def _remember(self, key: str, module: Any) -> None:
        self._compiled.pop(key, None)
        self._compiled[key] = module  # most recently used last
        while len(self._compiled) > self.CACHE_SIZE:
            del self._compiled[next(iter(self._compiled))]

    def _cached(self, wasm: Buffer) -> BrowserModule | None:
        if not isinstance(wasm, (bytes, bytearray, memoryview)) or not self._compiled:
            return None
        key = self._key(wasm)
        module = self._compiled.get(key)
        if module is None:
            return None
        self._remember(key, module)
        return BrowserModule(self, module)

    def adopt(self, wasm: Buffer, module: Any) -> bool:
        """Use ``module`` (a ``WebAssembly.Module`` compiled elsewhere from
        these bytes, e.g. posted by the page) for :meth:`compile` of ``wasm``.
        Returns False (and keeps nothing) when ``module`` is not one."""
        if not isinstance(wasm, (bytes, bytearray, memoryview)) or not isinstance(module, JsProxy):
            return False
        if not js.WebAssembly.Module.prototype.isPrototypeOf(module):
            return False
        self._remember(self._key(wasm), module)
        return True

    def compile(self, wasm: Buffer) -> BrowserModule:
        """The cached module for these bytes, else compile synchronously.
        Raises :class:`CompileError`."""
        cached = self._cached(wasm)
        if cached is not None:
            return cached
        source = self._source(wasm)
        try:
            module = js.WebAssembly.Module.new(source)
        except JsException as exc:
            raise CompileError(str(exc)) from None
        self.compiles += 1
        self._remember(self._key(wasm), module)
        return BrowserModule(self, module)

    async def compile_async(self, wasm: Buffer) -> BrowserModule:
        """The cached module for these bytes, else compile with
        ``WebAssembly.compile`` (off the main thread's size limit). Raises
        :class:`CompileError`."""
        cached = self._cached(wasm)
        if cached is not None:
            return cached
        source = self._source(wasm)
        try:
            module = await js.WebAssembly.compile(source)
        except JsException as exc:
            raise CompileError(str(exc)) from None
        self.compiles += 1
        self._remember(self._key(wasm), module)
        return BrowserModule(self, module)

    @staticmethod
    def _source(wasm: Buffer) -> Any:
        if not isinstance(wasm, (bytes, bytearray, memoryview)):
            raise CompileError(f"expected wasm bytes, got {type(wasm).__name__}")
        view = memoryview(wasm).cast("B")
        if view[:4].tobytes() != b"\0asm":
            raise CompileError("not a WebAssembly binary (missing \\0asm magic)")
        return to_uint8array(view)

    def _track(self, instance: BrowserInstance) -> None:
        self._instances = [i for i in self._instances if not i.closed]
        self._instances.append(instance)

    def close(self) -> None:
        """Close every instance this engine created (their progress proxies);
        compiled modules stay cached."""
        for instance in self._instances:
            instance.close()
        self._instances.clear()


class PageEngine(BrowserEngine):
    """A :class:`BrowserEngine` for the page's controller (in the host worker; the same code works on a main thread).

    Chromium refuses synchronous ``WebAssembly.Module`` compiles of large
    modules on the main thread, yet ``ModelRuntime.load`` (job preparation)
    compiles synchronously. So the page awaits :meth:`precompile` first and
    :meth:`compile` then takes the compiled module from the cache; bytes not
    precompiled compile synchronously as in :class:`BrowserEngine`.
    """

    async def precompile(self, wasm: Buffer) -> bool:
        """Compile ``wasm`` asynchronously into the cache. Returns False (and
        caches nothing) when it does not compile: the synchronous compile
        then reports the error where the caller expects it."""
        if not isinstance(wasm, (bytes, bytearray, memoryview)):
            return False
        try:
            await self.compile_async(wasm)
        except CompileError:
            return False
        return True


class BrowserModule:
    """A compiled ``WebAssembly.Module`` (see :class:`~weei.runtime.engine.CompiledModule`)."""

    def __init__(self, engine: BrowserEngine, module: Any) -> None:
        self._engine = engine
        self._module = module
        try:
            self._imports = _extern_list(js.WebAssembly.Module.imports(module), module=True)
            self._exports = _extern_list(js.WebAssembly.Module.exports(module), module=False)
        except JsException as exc:
            raise CompileError(str(exc)) from None

    @property
    def imports(self) -> tuple[ExternInfo, ...]:
        return self._imports

    @property
    def exports(self) -> tuple[ExternInfo, ...]:
        return self._exports

    def instantiate(self, on_progress: ProgressHook) -> BrowserInstance:
        """Instantiate. Raises :class:`InstantiateError`."""
        instance = BrowserInstance(self._module, self._imports, self._exports, on_progress)
        self._engine._track(instance)
        return instance


class BrowserInstance:
    """A live ``WebAssembly.Instance`` (see :class:`~weei.runtime.engine.Instance`)."""

    def __init__(
        self,
        module: Any,
        imports: tuple[ExternInfo, ...],
        exports: tuple[ExternInfo, ...],
        on_progress: ProgressHook,
    ) -> None:
        self._on_progress = on_progress
        self._pending: BaseException | None = None
        self._proxies: list[Any] = []
        # Held in a dict: a `js.`-style attribute lookup per call costs ~10x.
        self._funcs: dict[str, Any] = {}
        self._memory: Any = None
        self._u8: Any = None
        self._u8_len = -1
        self._fresh = False  # _u8 is known to cover the current buffer
        self.closed = False
        import_object = js.Object.new()
        for imp in imports:
            if (imp.module, imp.name, imp.kind) != (_PROGRESS_MODULE, _PROGRESS_NAME, "func"):
                raise InstantiateError(f"no host value for import {imp.module}.{imp.name}")
            if not self._proxies:
                proxy = create_proxy(self._progress)
                self._proxies.append(proxy)
                namespace = js.Object.new()
                setattr(namespace, _PROGRESS_NAME, proxy)
                setattr(import_object, _PROGRESS_MODULE, namespace)
        try:
            instance = js.WebAssembly.Instance.new(module, import_object)
        except JsException as exc:
            self.close()
            raise InstantiateError(str(exc)) from None
        js_exports = instance.exports
        for info in exports:
            if info.kind == "func":
                self._funcs[info.name] = getattr(js_exports, info.name)
            elif info.kind == "memory" and info.name == "memory":
                self._memory = js_exports.memory

    # -- lifetime --------------------------------------------------------------

    def close(self) -> None:
        """Destroy the progress proxy; the instance must not be called again."""
        for proxy in self._proxies:
            proxy.destroy()
        self._proxies.clear()
        self._funcs.clear()
        self._memory = self._u8 = None
        self._fresh = False
        self.closed = True

    def __enter__(self) -> BrowserInstance:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- calls -------------------------------------------------------------------

    def _progress(self, ptr: int, size: int) -> None:
        self._fresh = False  # the module may have grown its memory
        try:
            self._on_progress(int(ptr), int(size))
        except BaseException as exc:
            # JavaScript will wrap it while it unwinds the module; keep the
            # original to re-raise from call().
            self._pending = exc
            raise
        finally:
            self._fresh = False

    def call(self, name: str, *args: int) -> int | None:
        """Call export ``name``. Raises :class:`Trap`; re-raises a progress
        hook's exception unchanged."""
        func = self._funcs.get(name)
        if func is None:
            raise Trap(f"no exported function {name!r}" + (" (instance closed)" if self.closed else ""))
        self._pending = None
        self._fresh = False
        try:
            result = func(*args)
        except BaseException as exc:
            self._fresh = False
            pending, self._pending = self._pending, None
            if pending is not None:
                if pending is exc:
                    raise
                raise pending from None
            if isinstance(exc, JsException):
                raise Trap(str(exc)) from None
            raise
        self._fresh = False
        if result is None or (isinstance(result, int) and not isinstance(result, bool)):
            return result
        raise Trap(f"export {name!r} returned {type(result).__name__}, expected one i32")

    # -- memory ------------------------------------------------------------------

    def invalidate(self) -> None:
        """Forget the memory view (after JavaScript grew the memory itself)."""
        self._fresh = False

    def _view(self) -> Any:
        if self._memory is None:
            raise IndexError("module exports no memory")
        # Growing the memory detaches its old ArrayBuffer, and a view over a
        # detached buffer has byteLength 0; memory never shrinks. So a view
        # that still reports the length it was made with covers the memory
        # as it is: one FFI property read instead of two (each ~20 µs in Pyodide).
        if not self._fresh and (self._u8 is None or self._u8_len == 0 or int(self._u8.byteLength) != self._u8_len):
            buffer = self._memory.buffer
            self._u8 = js.Uint8Array.new(buffer)
            self._u8_len = int(self._u8.byteLength)
        self._fresh = True
        return self._u8

    def _check(self, ptr: int, size: int) -> Any:
        view = self._view()
        if ptr < 0 or size < 0 or ptr + size > self._u8_len:
            raise IndexError(f"range {ptr}+{size} outside memory of {self._u8_len} bytes")
        return view

    def read(self, ptr: int, size: int) -> bytes:
        """Copy ``size`` bytes out of memory (one ``to_bytes``). Raises ``IndexError``."""
        view = self._check(ptr, size)
        return view.subarray(ptr, ptr + size).to_bytes() if size else b""

    def write(self, ptr: int, data: Buffer) -> None:
        """Copy ``data`` into memory at ``ptr`` (one ``assign``). Raises ``IndexError``."""
        source = memoryview(data).cast("B")
        size = source.nbytes
        view = self._check(ptr, size)
        if size:
            view.subarray(ptr, ptr + size).assign(source)

    def memory_size(self) -> int:
        """Byte length of the exported memory (0 if there is none)."""
        if self._memory is None:
            return 0
        self._view()
        return self._u8_len
