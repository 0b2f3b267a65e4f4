"""SHA-256 of several buffers at once, on every core: the CPython kernels' ``sha256_many``.

A round's critical path at the coordinator hashes the new weights twice
over: whole (they name the checkpoint) and in the relay's pieces (a relayed
plan lists every piece's hash before the first piece leaves). CPython's
hashlib releases the GIL for buffers over 2 KiB, so a second thread takes
the pieces while the first takes the whole: 16M weights, 97 ms of
hashing in 55 ms of wall time on two idle cores (bench/bench_round.py).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from weei.core.floats import BytesLike
from weei.core.links.relay import sequential_sha256

__all__ = ["PARALLEL_MIN_BYTES", "sha256_many"]

#: Below this many bytes in all, one thread: handing work to another costs more than it saves.
PARALLEL_MIN_BYTES = 1 << 20

_pool: ThreadPoolExecutor | None = None


def _hex(data: BytesLike) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_many(buffers: Sequence[BytesLike]) -> list[str]:
    """The hex SHA-256 of each buffer, in order; large work spread over the machine's cores."""
    global _pool
    cores = os.cpu_count() or 1
    if cores < 2 or len(buffers) < 2 or sum(memoryview(b).nbytes for b in buffers) < PARALLEL_MIN_BYTES:
        return sequential_sha256(buffers)
    if _pool is None:  # one pool per process, threads started on first use; idle threads cost nothing
        _pool = ThreadPoolExecutor(max_workers=min(cores, 4), thread_name_prefix="weei-sha256")
    # The pool hands out buffers in order as threads come free: the whole goes to one thread and
    # its pieces queue behind on the others, so the first buffer should be the largest.
    return list(_pool.map(_hex, buffers))
