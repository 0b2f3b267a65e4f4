"""The distributed-training API, independent of where it runs.

``TrainingController`` implements the methods and state of
``weei.widgetsApi.get('distributed-training')`` over ports (storage, a
key-value store for the debug log, a pool of training Workers, a transport
to other peers, a clock). The browser binds the ports to IndexedDB,
localStorage, Web Workers and WebRTC; CPython binds them to memory, wasmtime
and the in-memory transport, which is how the controller is tested.
"""

from .controller import TrainingController
from .ports import KeyValue, Storage, WorkerPool, Transport

__all__ = ["TrainingController", "KeyValue", "Storage", "WorkerPool", "Transport"]
