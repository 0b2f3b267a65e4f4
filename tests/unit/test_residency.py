"""Which artifacts a participant keeps in memory across two jobs in a row (issue 24, item 1), and what keeping
them costs a drain."""

from __future__ import annotations

from typing import Any

from sim import sha

from weei.api.job_store import JobStore
from weei.api.residency import Residency
from weei.api.session import Session
from weei.core.job.participant import Participant
from weei.core.observe.debuglog import DebugLog
from weei.core.observe.diagnostics import DiagnosticsRecorder
from weei.core.wire.messages import ArtifactRef, Assign, ChunkRef
from weei.host.memory_storage import MemoryStorage

ARCHIVE = ArtifactRef("wgsl", sha(b"job B's WGSL archive"), 20)


def session_in(job_id: str) -> Session:
    s = Session(my_peer_id="p1", clock=lambda: 0.0, monotonic=lambda: 0.0, transport=None,
                debug_log=DebugLog.from_json(None, 0.0, own_peer="p1"), recorder=DiagnosticsRecorder(sequence_base=0))
    s.participant = Participant.local("p1", job_id)  # a participant of ``job_id``; how it joined does not matter here
    return s


def assign(job_id: str, round_: int, *, archive: ArtifactRef | None = None) -> Assign:
    weights = f"{job_id} checkpoint {round_ - 1}".encode()
    chunk = f"{job_id} chunk {round_}".encode()
    return Assign(job_id, round_, f"r{round_}-c0", f"r{round_}-c0-a{round_}",
                  ArtifactRef("checkpoint", sha(weights), len(weights)), {}, 7,
                  ChunkRef("c0", "f32-rows", 8, ArtifactRef("chunk", sha(chunk), len(chunk))), shader_archive=archive)


def test_a_second_job_keeps_its_first_rounds_artifacts_whatever_rounds_the_first_job_reached() -> None:
    residency = Residency()
    first = session_in("job-A")
    for round_ in range(1, 21):  # the first job ran 20 rounds in this tab
        residency.unpin(residency.assignment_taken(assign("job-A", round_)))
        residency.referenced(first)
    # Accepting the next invitation replaces the finished participation (no Leave, no forget_job).
    second = session_in("job-B")
    residency.unpin(residency.assignment_taken(assign("job-B", 1, archive=ARCHIVE)))
    kept = residency.referenced(second)
    # The coordinator sent the archive once, with round 1, and names it as held from round 2 on.
    assert ARCHIVE.sha256 in kept
    residency.unpin(residency.assignment_taken(assign("job-B", 2)))
    assert ARCHIVE.sha256 in residency.referenced(second)
    # Nothing of the first job is kept for the second.
    assert not any(sha(f"job-A checkpoint {r}".encode()) in kept for r in range(20))


def test_the_remembered_window_still_slides_within_one_job() -> None:
    residency = Residency()
    s = session_in("job-B")
    residency.unpin(residency.assignment_taken(assign("job-B", 1, archive=ARCHIVE)))
    for round_ in range(2, 8):
        residency.unpin(residency.assignment_taken(assign("job-B", round_)))
    kept = residency.referenced(s)
    assert sha(b"job-B chunk 1") not in kept and sha(b"job-B chunk 7") in kept


class _CountingSet(frozenset[str]):
    """A job's files that count how often eviction asks about one of them."""

    asked = 0

    def __contains__(self, sha: object) -> bool:
        _CountingSet.asked += 1
        return super().__contains__(sha)


def test_eviction_after_every_drain_does_not_walk_the_jobs_files() -> None:
    store = JobStore(MemoryStorage())
    chunks = {sha(f"chunk {i}".encode()): f"chunk {i}".encode() for i in range(1000)}
    store.remember(chunks)
    fixed = _CountingSet(chunks)
    store.evict(set(), fixed)  # a new set of files: each held artifact is looked at once
    weights = {sha(f"weights {r}".encode()): f"weights {r}".encode() for r in range(100)}
    for r, (w, data) in enumerate(weights.items()):  # a round's weights come, the round before's go
        store.remember({w: data})
        store.evict({w}, fixed)
        assert set(store.artifacts) == set(chunks) | {w}
    # 1,000 files once, then the few held outside them at each of the 100 evictions, not 100 x 1,000.
    assert _CountingSet.asked <= 1000 + 3 * 100
    # Another job's files (another object): what the old files held goes.
    store.evict({w}, frozenset(list(chunks)[:10]))
    assert set(store.artifacts) == set(list(chunks)[:10]) | {w}
    assert store.evict(set()) == 11 and not store.artifacts


def test_the_participants_model_info_is_read_once_not_after_every_drain(monkeypatch: Any) -> None:
    """The snapshot window comes from the model info the participant holds: read when that changes (a new
    job's), not at each of the drains of every message (most of a Flower node's own CPU a message)."""
    from weei.core.formats import modelinfo

    reads = [0]
    parse = modelinfo.ModelInfo.from_json

    def counted(value: Any) -> Any:
        reads[0] += 1
        return parse(value)

    monkeypatch.setattr(modelinfo.ModelInfo, "from_json", staticmethod(counted))
    residency = Residency()
    s = session_in("job-B")
    assert s.participant is not None
    s.participant.model_info = {"name": "a model info"}  # read whatever it holds (this one is refused: no slots)
    for round_ in range(1, 30):
        residency.unpin(residency.assignment_taken(assign("job-B", round_)))
        for _ in range(5):
            kept = residency.referenced(s)
    assert sha(b"job-B chunk 28") in kept and sha(b"job-B chunk 20") not in kept  # the window still slides
    assert reads[0] == 1
    s.participant.model_info = {"another": "job's info"}  # a new object: read again
    residency.referenced(s)
    assert reads[0] == 2
