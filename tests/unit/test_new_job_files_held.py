"""A new job's files are held in memory only once all are written: the host drains (and evicts what no job
refers to yet) whenever a peer's message comes, also while those writes await. Holding each file as soon as it
was written let such a drain evict the module before the job's coordinator existed; the coordinator's own
participant then failed with missing-artifact and no peer could be sent the module (seen in
tests/browser/test_resilience.py, whose persistent profile makes IndexedDB writes slow)."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

from weei.api.job_store import JobStore
from weei.host.memory_storage import MemoryStorage


class _DrainingStorage(MemoryStorage):
    """MemoryStorage whose writes let the host drain in between, as a slow IndexedDB write does."""

    def __init__(self) -> None:
        super().__init__()
        self.store: JobStore | None = None
        self.drains = 0

    async def put(self, store: str, key: str, value: Any) -> None:
        await super().put(store, key, value)
        if self.store is not None:
            self.store.evict(set())  # no job refers to anything yet: keep nothing
            self.drains += 1


def test_a_new_jobs_files_survive_a_drain_between_their_writes() -> None:
    files = {hashlib.sha256(data).hexdigest(): data for data in (b"module", b"chunk 1", b"chunk 2")}
    storage = _DrainingStorage()
    store = JobStore(storage)
    storage.store = store

    async def main() -> None:
        await store.load()
        await store.put_artifacts(files)

    asyncio.run(main())
    assert storage.drains == 3
    assert dict(store.artifacts) == files  # every file is there for the job that is being created
