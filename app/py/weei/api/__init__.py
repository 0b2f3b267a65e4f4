"""The distributed-training API, independent of where it runs.

``TrainingController`` implements the methods and state of
``weei.widgetsApi.get('distributed-training')`` over ports (storage, a
key-value store for the debug log, a pool of training Workers, a transport
to other peers, a clock) and a ``ComputeBackend`` (the CPU Worker pool
today). The browser binds the ports to IndexedDB, localStorage, Web Workers
and WebRTC; CPython binds them to memory, wasmtime and the in-memory
transport, which is how the controller is tested. docs/architecture.md
("The controller's parts") shows how the controller is split.
"""

from .compute import ComputeBackend, CpuWorkerBackend
from .controller import TrainingController
from .ports import KeyValue, Storage, StorageError, Transport, WorkerPool

__all__ = ["TrainingController", "ComputeBackend", "CpuWorkerBackend", "KeyValue", "Storage", "StorageError",
           "WorkerPool", "Transport"]
