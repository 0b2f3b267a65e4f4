"""The CPython engine: :mod:`weei.runtime.engine` over the ``wasmtime`` package.

Bulk copies go through ``ctypes`` straight into the memory's backing store
(one ``memmove`` each way): wasmtime's own ``Memory.write`` first copies
``bytes`` into a ``bytearray`` and ``Memory.read`` returns a ``bytearray``,
so both would cost an extra copy of every weight vector.

Interruption uses wasmtime's epoch interruption: every engine is configured
with it, each call first sets its store's deadline one epoch ahead, and
:meth:`WasmtimeEngine.interrupt` records the reason and then increments the
epoch (thread-safe), so a call running in another thread traps at its next
loop header or function entry. The reason is recorded first and checked
after the deadline is set, so a call that starts at the same moment either
sees the reason or traps: none runs on. The epoch is per engine: a pool
gives each Worker its own :meth:`~WasmtimeEngine.fork` so interrupting one
Worker touches no other.

The module is untrusted, so each instance is bounded (issue: a hostile
module must never hang or exhaust its host):

* Features outside the ABI (memory64, threads and shared memory, multiple
  memories, GC, exceptions, components) are off: such a module does not
  compile, by name.
* A store limit caps linear memory (``memory_limit_bytes``, read when an
  instance is made; 1 GiB by default, the device's cap): ``memory.grow``
  past it fails inside the module, and a module whose declared minimum is
  larger is refused before instantiation (``ModelRuntime.load``). A pool
  lowers it per task (``weei.runtime.sandbox.memory_limit``).
* Every call (and the start function) has a deadline (``call_deadline_s``,
  read at each call: a pool sets it per task from
  ``weei.runtime.sandbox.operation_deadline_s``): a shared ticker advances each
  busy engine's epoch every :data:`TICK_S`, and a store's deadline is that
  many ticks ahead. A call that overruns traps and raises
  :class:`DeadlineExceeded`. :meth:`WasmtimeEngine.interrupt` advances the
  epoch past every deadline it has given, so stopping stays immediate.
"""

from __future__ import annotations

import ctypes
import math
import hashlib
import threading
import time
import weakref
from typing import Any

import wasmtime

from ..core.limits import DEFAULT_MEMORY_CAP
from .sandbox import DEADLINE_CEILING_S
from .engine import (
    CompileError,
    DeadlineExceeded,
    ExternInfo,
    ExternKind,
    InstantiateError,
    Interrupted,
    ProgressHook,
    Trap,
)
from .wasmtime_calls import fast_call

__all__ = ["WasmtimeEngine", "WasmtimeModule", "WasmtimeInstance", "DEFAULT_MEMORY_LIMIT", "DEFAULT_CALL_DEADLINE_S"]

#: Linear memory one instance may have unless the host sets another: the device's cap.
DEFAULT_MEMORY_LIMIT = DEFAULT_MEMORY_CAP
#: How long one call may run unless the host sets another deadline: generous, but finite.
DEFAULT_CALL_DEADLINE_S = DEADLINE_CEILING_S
#: A start function's deadline: instantiation does no training.
START_DEADLINE_S = 30.0
#: The deadline clock's resolution.
TICK_S = 0.1


class _Ticker:
    """One daemon thread that advances the epoch of every engine with a call under way."""

    def __init__(self) -> None:
        self._engines: weakref.WeakSet[WasmtimeEngine] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def add(self, engine: WasmtimeEngine) -> None:
        with self._lock:
            self._engines.add(engine)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="weei-wasm-deadlines", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(TICK_S)
            self._tick_all()

    def _tick_all(self) -> None:
        # The strong references taken here must end before the sleep: a list kept across it held every engine
        # that only the cycle collector could free (one whose owners refer to each other, as a controller, its
        # pool and their runtimes do), and each tick's new list took them again, so such an engine never was.
        with self._lock:
            engines = list(self._engines)
        for engine in engines:
            engine._tick()


_TICKER = _Ticker()

_PROGRESS_MODULE = "weei"
_PROGRESS_NAME = "onProgress"


def _extern_info(module: str, name: str, ty: object) -> ExternInfo:
    kind: ExternKind
    signature: tuple[tuple[str, ...], tuple[str, ...]] | None = None
    if isinstance(ty, wasmtime.FuncType):
        kind = "func"
        signature = (
            tuple(str(p) for p in ty.params),
            tuple(str(r) for r in ty.results),
        )
    elif isinstance(ty, wasmtime.MemoryType):
        kind = "memory"
    elif isinstance(ty, wasmtime.TableType):
        kind = "table"
    elif isinstance(ty, wasmtime.GlobalType):
        kind = "global"
    else:
        kind = "tag"
    return ExternInfo(module=module, name=name, kind=kind, signature=signature)


# Native code of the modules compiled in this process, by the wasm's SHA-256 (a few, least recently used out):
# each engine fork (one per Worker, one Worker pool per participant) compiled the same module again, and a
# compile is ~0.1 s of CPU (wasmtime's threads): at 1,000 simulated Flower nodes in one process that was
# most of the engine's cost per message.
_COMPILED: dict[bytes, bytes] = {}
_COMPILED_MAX = 8
_COMPILED_LOCK = threading.Lock()


class WasmtimeEngine:
    """An :class:`~weei.runtime.engine.Engine` backed by one ``wasmtime.Engine``.

    One engine can compile many modules; each instance gets its own store.
    It is :class:`~weei.runtime.engine.Interruptible`.
    """

    def __init__(self, *, memory_limit_bytes: int = DEFAULT_MEMORY_LIMIT,
                 call_deadline_s: float = DEFAULT_CALL_DEADLINE_S, start_deadline_s: float = START_DEADLINE_S) -> None:
        config = wasmtime.Config()
        config.epoch_interruption = True
        for feature in ("wasm_memory64", "wasm_threads", "shared_memory", "wasm_multi_memory", "wasm_gc",
                        "wasm_exceptions", "wasm_component_model", "wasm_stack_switching", "wasm_custom_page_sizes"):
            setattr(config, feature, False)  # (write-only properties: hasattr() says False)
        self._engine = wasmtime.Engine(config)
        self._lock = threading.Lock()
        self._reason: str | None = None  # set by interrupt(), cleared by resume()
        self.memory_limit_bytes = memory_limit_bytes
        self.call_deadline_s = call_deadline_s
        self.start_deadline_s = start_deadline_s
        self._busy = 0  # calls under way: the ticker advances the epoch only then
        self._furthest = 1  # the most ticks ahead any deadline was set
        _TICKER.add(self)

    def fork(self) -> WasmtimeEngine:
        """A new engine with its own epoch and the same limits."""
        return WasmtimeEngine(memory_limit_bytes=self.memory_limit_bytes, call_deadline_s=self.call_deadline_s,
                              start_deadline_s=self.start_deadline_s)

    def interrupt(self, reason: str) -> None:
        """Stop running calls and refuse new ones with :class:`Interrupted` until :meth:`resume`."""
        with self._lock:
            self._reason = reason
            ahead = self._furthest
        for _ in range(ahead):  # past every deadline given out (at most deadline / TICK_S steps)
            self._engine.increment_epoch()

    def _tick(self) -> None:
        if self._busy:
            self._engine.increment_epoch()

    def _deadline_ticks(self, seconds: float) -> int:
        ticks = max(2, math.ceil(seconds / TICK_S) + 1)
        with self._lock:
            self._furthest = max(self._furthest, ticks)
        return ticks

    def resume(self) -> None:
        with self._lock:
            self._reason = None

    def interrupted(self) -> str | None:
        """The reason of the pending interruption, if any."""
        return self._reason

    def compile(self, wasm: bytes) -> WasmtimeModule:
        """Compile ``wasm``. Raises :class:`CompileError`."""
        if not isinstance(wasm, (bytes, bytearray, memoryview)):
            raise CompileError(f"expected wasm bytes, got {type(wasm).__name__}")
        data = bytes(wasm)
        # wasmtime.Module also accepts WAT text; insist on the binary format so
        # the browser engine (which cannot) behaves the same.
        if not data.startswith(b"\0asm"):
            raise CompileError("not a WebAssembly binary (missing \\0asm magic)")
        key = hashlib.sha256(data).digest()
        with _COMPILED_LOCK:
            native = _COMPILED.pop(key, None)
            if native is not None:
                _COMPILED[key] = native  # the most recently used last
        if native is not None:
            # Every engine of this process has the one configuration (__init__), so code compiled by one
            # loads in another. Only this process's own output is deserialized, never bytes from outside.
            return WasmtimeModule(self, wasmtime.Module.deserialize(self._engine, native))
        try:
            module = wasmtime.Module(self._engine, data)
        except wasmtime.WasmtimeError as exc:
            raise CompileError(str(exc)) from exc
        with _COMPILED_LOCK:
            _COMPILED[key] = bytes(module.serialize())
            while len(_COMPILED) > _COMPILED_MAX:
                del _COMPILED[next(iter(_COMPILED))]
        return WasmtimeModule(self, module)


class WasmtimeModule:
    """A compiled module (see :class:`~weei.runtime.engine.CompiledModule`)."""

    def __init__(self, engine: WasmtimeEngine, module: wasmtime.Module) -> None:
        self._engine = engine
        self._module = module
        self._imports = tuple(
            _extern_info(imp.module, imp.name or "", imp.type) for imp in module.imports
        )
        self._exports = tuple(_extern_info("", exp.name, exp.type) for exp in module.exports)

    @property
    def imports(self) -> tuple[ExternInfo, ...]:
        return self._imports

    @property
    def exports(self) -> tuple[ExternInfo, ...]:
        return self._exports

    def instantiate(self, on_progress: ProgressHook) -> WasmtimeInstance:
        """Instantiate in a fresh store. Raises :class:`InstantiateError`."""
        return WasmtimeInstance(self._engine, self._module, self._imports, on_progress)


def _weak_progress(instance: WasmtimeInstance) -> Any:
    """The progress import's callback, holding ``instance`` weakly.

    wasmtime-py keeps a host function's callback in a module-level table
    (``wasmtime._func.FUNCTIONS``) until the store that owns the function is
    deleted. A callback that held the instance (a bound method) kept the
    instance, hence its store, hence the callback itself: no instance was ever
    freed, nor its linear memory, and a process that ran job after job grew by
    every Worker's instances of every job. A call into the module holds the
    instance, so the weak reference is live whenever the module reports.
    """
    ref = weakref.ref(instance)

    def progress(caller: wasmtime.Caller, ptr: int, size: int) -> None:
        live = ref()
        if live is not None:
            live._progress(caller, ptr, size)

    return progress


class WasmtimeInstance:
    """A live instance (see :class:`~weei.runtime.engine.Instance`)."""

    def __init__(
        self,
        engine: WasmtimeEngine,
        module: wasmtime.Module,
        imports: tuple[ExternInfo, ...],
        on_progress: ProgressHook,
    ) -> None:
        self._engine = engine
        self._store = wasmtime.Store(engine._engine)
        self._store.set_limits(memory_size=engine.memory_limit_bytes, memories=1, tables=4, instances=1)
        # A start function runs during instantiation: it needs a deadline too.
        self._store.set_epoch_deadline(engine._deadline_ticks(engine.start_deadline_s))
        # While the progress hook runs, memory must be reached through the
        # Caller (the store is borrowed by the running call).
        self._caller: wasmtime.Caller | None = None
        self._on_progress = on_progress
        externs: list[wasmtime.Func] = []
        for imp in imports:
            if (imp.module, imp.name, imp.kind) != (_PROGRESS_MODULE, _PROGRESS_NAME, "func"):
                raise InstantiateError(f"no host value for import {imp.module}.{imp.name}")
            ty = wasmtime.FuncType([wasmtime.ValType.i32(), wasmtime.ValType.i32()], [])
            externs.append(wasmtime.Func(self._store, ty, _weak_progress(self), access_caller=True))
        engine._busy += 1
        try:
            self._instance = wasmtime.Instance(self._store, module, externs)
        except wasmtime.Trap as exc:
            if exc.trap_code == wasmtime.TrapCode.INTERRUPT and engine.interrupted() is None:
                raise InstantiateError(f"the start function ran past its {engine.start_deadline_s:g} s deadline") from exc
            raise InstantiateError(str(exc)) from exc
        except wasmtime.WasmtimeError as exc:
            raise InstantiateError(str(exc)) from exc
        finally:
            engine._busy -= 1
        exports = self._instance.exports(self._store)
        self._funcs: dict[str, Any] = {}  # name -> a callable(store, *args): wasmtime_calls' or the Func
        self._memory: wasmtime.Memory | None = None
        for info in module.exports:
            ext = exports[info.name]
            if isinstance(ext, wasmtime.Func):
                self._funcs[info.name] = fast_call(self._store, ext) or ext
            elif isinstance(ext, wasmtime.Memory) and info.name == "memory":
                self._memory = ext

    def _progress(self, caller: wasmtime.Caller, ptr: int, size: int) -> None:
        previous = self._caller
        self._caller = caller
        try:
            self._on_progress(ptr, size)
        finally:
            self._caller = previous

    def _ctx(self) -> wasmtime.Store | wasmtime.Caller:
        return self._caller if self._caller is not None else self._store

    def call(self, name: str, *args: int) -> int | None:
        """Call export ``name``. Raises :class:`Trap`."""
        func = self._funcs.get(name)
        if func is None:
            raise Trap(f"no exported function {name!r}")
        engine = self._engine
        deadline_s = engine.call_deadline_s  # read per call: a pool sets it per task
        self._store.set_epoch_deadline(engine._deadline_ticks(deadline_s))
        reason = engine.interrupted()
        if reason is not None:
            raise Interrupted(reason, f"{name}: interrupted ({reason}) before it started")
        engine._busy += 1
        try:
            result = func(self._store, *args)
        except wasmtime.Trap as exc:
            reason = engine.interrupted()
            if exc.trap_code == wasmtime.TrapCode.INTERRUPT:
                if reason is not None:
                    raise Interrupted(reason, f"{name}: interrupted ({reason})") from exc
                raise DeadlineExceeded(f"{name}: ran past its {deadline_s:g} s deadline") from exc
            raise Trap(str(exc)) from exc
        except wasmtime.WasmtimeError as exc:
            # WasmtimeError also covers argument/type mismatches and
            # wasmtime's own resource limits: all "the call did not complete".
            raise Trap(str(exc)) from exc
        finally:
            engine._busy -= 1
        if result is None or isinstance(result, int):
            return result
        raise Trap(f"export {name!r} returned {type(result).__name__}, expected one i32")

    def _base(self, ptr: int, size: int) -> int:
        if self._memory is None:
            raise IndexError("module exports no memory")
        ctx = self._ctx()
        length = self._memory.data_len(ctx)
        if ptr < 0 or size < 0 or ptr + size > length:
            raise IndexError(f"range {ptr}+{size} outside memory of {length} bytes")
        # Re-read the base every time: it moves when the memory grows.
        return ctypes.addressof(self._memory.data_ptr(ctx).contents) + ptr

    def read(self, ptr: int, size: int) -> bytes:
        """Copy ``size`` bytes out of memory. Raises ``IndexError``."""
        addr = self._base(ptr, size)
        return ctypes.string_at(addr, size) if size else b""

    def write(self, ptr: int, data: bytes | bytearray | memoryview) -> None:
        """Copy ``data`` into memory at ``ptr``. Raises ``IndexError``."""
        view = memoryview(data).cast("B")
        size = view.nbytes
        addr = self._base(ptr, size)
        if size:
            # A memoryview over the destination makes slice assignment one
            # memcpy from any buffer (bytes, bytearray, numpy, read-only views).
            dest = (ctypes.c_ubyte * size).from_address(addr)
            memoryview(dest).cast("B")[:] = view

    def memory_size(self) -> int:
        """Byte length of the exported memory (0 if there is none)."""
        if self._memory is None:
            return 0
        return self._memory.data_len(self._ctx())
