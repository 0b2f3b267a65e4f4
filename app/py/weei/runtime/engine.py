"""The engine interface: the little a model host needs from a WebAssembly engine.

Theory of operation
-------------------
``ModelRuntime`` (in :mod:`weei.runtime.abi`) implements ABI 1 once, over
these three protocols, so the same host code runs on two engines:

* CPython: :class:`weei.runtime.wasmtime_engine.WasmtimeEngine`.
* Pyodide (later, in ``weei.browser``): the browser's ``WebAssembly``. Its
  adapter compiles with ``WebAssembly.Module``, lists imports and exports
  with ``WebAssembly.Module.imports/exports`` (which give kinds but no
  function signatures: it reports ``signature=None``), instantiates with
  ``WebAssembly.Instance`` and calls exports through ``pyodide.ffi`` proxies
  held in locals (a ``js.`` lookup per call costs ~10x). Bulk bytes must be
  copied with ``Uint8Array.set`` / ``subarray`` (``to_py``/``assign`` on a
  view), never byte by byte over the FFI; the ``Uint8Array`` view of
  ``memory.buffer`` must be re-created after the memory grows (the old
  buffer is detached).

The protocol is synchronous on purpose: an ABI-1 operation is one blocking
export call, and a Worker runs one model at a time. Only adapters import an
engine; nothing here imports ``js``, ``pyodide`` or ``wasmtime``.

Errors: engines raise only the :class:`EngineError` family below (never
their own exception types), so the host can name the failed operation
without knowing the engine. An exception raised by the ``on_progress`` hook
must propagate out of :meth:`Instance.call` unchanged (it is how a host
aborts an operation).

Interruption: an engine that can stop a running call from another thread
is :class:`Interruptible` (wasmtime, through epoch interruption).
``interrupt(reason)`` makes every call running now on the engine's instances,
and every call started before ``resume()``, raise :class:`Interrupted` with
that reason; the trapped instance is unusable like after any trap. The
browser cannot interrupt a Worker's synchronous wasm call: its pool
terminates the Worker instead (``weei.browser.workers``). Cancelling a task
is one reason (``cancelled``); a deadline per operation will be another.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

__all__ = [
    "ExternKind",
    "ExternInfo",
    "ProgressHook",
    "Engine",
    "CompiledModule",
    "Instance",
    "EngineError",
    "CompileError",
    "InstantiateError",
    "Trap",
    "DeadlineExceeded",
    "Interrupted",
    "Interruptible",
]

ExternKind = Literal["func", "memory", "table", "global", "tag"]
"""The kind of an import or export, as ``WebAssembly.Module.imports`` spells it
(``function`` is normalised to ``func``)."""

ProgressHook = Callable[[int, int], None]
"""``weei.onProgress(ptr, bytes)`` as the host sees it: called synchronously
from inside an export call, with the raw (possibly negative, i32) values."""


@dataclass(frozen=True)
class ExternInfo:
    """One import or export of a compiled module.

    ``module`` is the import's module name ("" for exports). ``signature`` is
    ``(params, results)`` as value-type names (``"i32"``, ``"f64"``, ...) for
    functions when the engine can tell, else ``None`` (browsers cannot).
    """

    module: str
    name: str
    kind: ExternKind
    signature: tuple[tuple[str, ...], tuple[str, ...]] | None = None


class EngineError(Exception):
    """Base of the errors an engine raises; the message is the engine's text."""


class CompileError(EngineError):
    """The bytes are not a valid WebAssembly module for this engine."""


class InstantiateError(EngineError):
    """Instantiation failed (link error, start function trapped, memory limits)."""


class Trap(EngineError):
    """An export call trapped (unreachable, out-of-bounds access, stack overflow ...).

    After a trap the instance's own state (its allocator, globals) is
    unknown; hosts must not call it again.
    """


class DeadlineExceeded(Trap):
    """The call ran past the deadline its host set (a hung or far too slow module)."""

    reason = "deadline-exceeded"


class Interrupted(Trap):
    """The call was interrupted from outside (:meth:`Interruptible.interrupt`); ``reason`` says why."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@runtime_checkable
class Interruptible(Protocol):
    """An engine whose running calls another thread can stop."""

    def interrupt(self, reason: str) -> None:
        """Make running calls, and calls started until :meth:`resume`, raise
        :class:`Interrupted` with ``reason``. Safe to call from any thread."""
        ...

    def resume(self) -> None:
        """Let calls run again (the next task's calls)."""
        ...


@runtime_checkable
class Instance(Protocol):
    """A live module instance: its exports and its exported ``memory``."""

    def call(self, name: str, *args: int) -> int | None:
        """Call export ``name`` with i32 arguments (Python ints in signed i32
        range); return its single i32 result as the engine gives it (it may be
        negative: the host reinterprets as u32) or ``None`` for no result.

        Raises :class:`Trap` on a trap or when the export cannot be called;
        lets an exception from the progress hook propagate unchanged.
        """
        ...

    def read(self, ptr: int, size: int) -> bytes:
        """Copy ``size`` bytes at ``ptr`` out of memory in one bulk copy.

        Raises ``IndexError`` when the range is outside memory. Must work
        while the progress hook runs (inside an export call).
        """
        ...

    def write(self, ptr: int, data: bytes | bytearray | memoryview) -> None:
        """Copy ``data`` into memory at ``ptr`` in one bulk copy.

        Raises ``IndexError`` when the range is outside memory.
        """
        ...

    def memory_size(self) -> int:
        """Current byte length of the exported memory (it may grow during calls)."""
        ...


@runtime_checkable
class CompiledModule(Protocol):
    """A compiled, not yet instantiated module."""

    @property
    def imports(self) -> tuple[ExternInfo, ...]:
        """The module's imports, in declaration order."""
        ...

    @property
    def exports(self) -> tuple[ExternInfo, ...]:
        """The module's exports, in declaration order."""
        ...

    def instantiate(self, on_progress: ProgressHook) -> Instance:
        """Instantiate, providing ``weei.onProgress`` as ``on_progress`` if the
        module imports it (no other import is provided).

        Raises :class:`InstantiateError`.
        """
        ...


@runtime_checkable
class Engine(Protocol):
    """Compiles WebAssembly bytes into :class:`CompiledModule` objects."""

    def compile(self, wasm: bytes) -> CompiledModule:
        """Compile ``wasm`` (binary format). Raises :class:`CompileError`."""
        ...
