"""What the controller needs from its platform, as protocols."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable, Mapping, Protocol

from ..core.wire.commands import Send
from ..core.errors import WeeiError, WeeiReason

__all__ = ["Storage", "StorageError", "StorageReason", "STORAGE_QUOTA_EXCEEDED", "KeyValue", "WorkerTask", "WorkerResult",
           "WorkerPool", "TaskCancelled", "Transport", "ProgressSink"]


class StorageReason(str, Enum):
    """Why storage refused or failed a request."""

    STORAGE_QUOTA_EXCEEDED = "storage-quota-exceeded"
    """The browser (or disk) has no room left for a write."""
    STORAGE_FAILED = "storage-failed"
    """Storage refused a request for another reason."""
    STORAGE_UNAVAILABLE = "storage-unavailable"
    """Storage cannot be opened (no IndexedDB, private mode, a folder not writable)."""
    STORAGE_SYMLINK = "storage-symlink"
    """The agent's storage folder holds a symbolic link."""
    CORRUPT = "corrupt"
    """A stored record is damaged (the message names the field)."""


# The reason of a StorageError when the browser (or disk) has no room left for a write.
STORAGE_QUOTA_EXCEEDED = StorageReason.STORAGE_QUOTA_EXCEEDED


class StorageError(WeeiError):
    """Storage refused or failed a request; ``reason`` is a :class:`StorageReason`."""

    reasons = (StorageReason,)


class Storage(Protocol):
    """Durable records (IndexedDB in the browser). Stores: jobs, checkpoints, artifacts, settings.

    Values are JSON-like dicts or bytes. A put is durable when it returns; a refused put
    raises StorageError and leaves the previous value of that key as it was.
    """

    async def put(self, store: str, key: str, value: Any) -> None: ...

    async def get(self, store: str, key: str) -> Any: ...

    async def delete(self, store: str, key: str) -> None: ...

    async def keys(self, store: str) -> list[str]: ...


class KeyValue(Protocol):
    """Small synchronous strings (localStorage in the browser)."""

    def get(self, key: str) -> str | None: ...

    def set(self, key: str, value: str) -> None: ...


@dataclass(frozen=True)
class WorkerTask:
    """One unit of work for one Worker: train or evaluate from ``weights``."""

    op: str  # 'train' | 'evaluate'
    weights: bytes
    auxiliary: Mapping[str, bytes]
    data: bytes | None = None
    format: str | None = None
    experience: tuple[int, int, int] | None = None  # unit_start, unit_count, seed
    seed: int = 0
    settings: Mapping[str, Any] | None = None
    # Sandbox bounds (weei.runtime.sandbox): the backend's estimatedWorkingBytes (None: unknown, the device's
    # memory cap applies) and the operation's deadline (None: the host's default ceiling).
    working_bytes: int | None = None
    deadline_s: float | None = None

    @property
    def input_bytes(self) -> int:
        """Bytes the host copies into module memory for this task."""
        return len(self.weights) + sum(len(v) for v in self.auxiliary.values()) + len(self.data or b"")


@dataclass(frozen=True)
class WorkerResult:
    weights: bytes | None  # None for evaluate
    metrics: dict[str, float]
    count: int  # unique examples / completed units (train), examples (evaluate)
    optimizer_steps: int | None = None


ProgressSink = Callable[[int, dict[str, Any]], None]  # (worker index, {processedExamples, totalExamples, metrics})


class TaskCancelled(WeeiError):
    """A Worker task was cancelled (:meth:`WorkerPool.cancel`) before it finished; reason 'cancelled'."""

    def __init__(self, message: str = "the Worker task was cancelled") -> None:
        super().__init__(WeeiReason.CANCELLED, message)


class WorkerPool(Protocol):
    """Training Workers on this device, each with its own model runtime.

    Every task carries a ``tag`` (the attempt it trains, or '' for other
    work); :meth:`cancel` ends the tasks of a tag, or all of them.
    """

    @property
    def device_limit(self) -> int: ...  # hardwareConcurrency

    @property
    def active(self) -> int: ...  # Workers running a task now

    async def run(self, index: int, module_sha256: str, module: bytes, task: WorkerTask,
                  on_progress: ProgressSink | None = None, *, tag: str = "") -> WorkerResult:
        """Run ``task`` on Worker ``index`` (started, and the module loaded, on first use).

        Raises WeeiError (ModelError...) when the model fails, TaskCancelled
        when the task was cancelled (it never hangs then).
        """
        ...

    def cancel(self, tag: str | None = None) -> int:
        """Cancel the tasks running or waiting now whose tag is ``tag`` (every task when None).

        Their ``run`` raises TaskCancelled within moments: a running model
        call is interrupted (or its Worker terminated and started again), and
        no progress of theirs is reported afterwards. Tasks submitted later
        are not affected. Returns how many tasks were cancelled.
        """
        ...


class Transport(Protocol):
    """Messages to other peers (WebRTC in the browser)."""

    def peers(self) -> list[str]: ...

    def send(self, send: Send, blobs: Mapping[str, bytes]) -> None: ...

    def transfers_state(self) -> dict[str, Any]:
        """``{"transfers": [TransferProgress JSON...], "transferErrors": {id: "reason: message"}}``."""
        ...
