"""The job store: job records, checkpoints and artifacts, over the Storage port.

Theory of operation
-------------------
What is durable (docs/architecture.md, Persistence):

* ``jobs/<jobId>``: the job record (``records.spec_to_record`` plus status).
* ``jobs/<jobId>/members``: who takes part and robust aggregation's counts of
  them (``participants``, ``robust``, ``updatedAt``), apart from the record:
  they change at every join and leave, and rewriting the record with its
  chunk list each time cost a job of N peers O(N x chunks) (issue 22: 1,000
  Flower clients). A record of an older version holds them itself; the
  members entry, when there is one, wins.
* ``checkpoints/<jobId>/<round, 8 digits>``: ``{"summary", "file"}``. The
  checkpoint file holds the round's weights; they are stored nowhere else.
* ``artifacts/<sha256>``: the bytes job records name (module, chunks,
  auxiliary files, validation, the WGSL archive of a job created with
  executionFiles), once each, whichever jobs name them.
* ``settings/device`` and ``settings/participation``.
* ``quarantine/<store>/<key>``: a record that did not parse when it was read
  back (``stored.py``), set aside with the reason: ``{"store", "key",
  "reason", "message", "value"}``. A set-aside job keeps its checkpoints and
  the artifacts it names.

In memory, :attr:`JobStore.artifacts` holds what the active job needs now:
its files, the current weights, the snapshot weights rounds still refer to
and what arrived with messages. Every key is the SHA-256 of its bytes: the
mapping is read-only, and each writer either hashes what it is given or
takes ``VerifiedBlobs`` (hashed on arrival, by the frame reader or the relay
node, or made here and named by hashing); bytes read back from storage are
hashed, and ones that do not match are refused (``corrupt``). So whatever a
job loads or trains from is what its hash names (issue 20). The executor
calls :meth:`JobStore.evict` after every drain with what is still referred
to; the rest goes.

Deleting a job deletes its checkpoints, its record and the artifacts no
other record names. At start-up :meth:`JobStore.load` deletes artifacts and
checkpoints that no record names (a page closed between two writes; older
versions that stored every checkpoint's weights a second time).

A write that storage refuses raises :class:`~weei.api.ports.StorageError`
(reason ``storage-quota-exceeded`` when it is out of room). Nothing is
deleted before the write that replaces it succeeded, so a refused write never
costs a checkpoint already saved.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Container, Mapping, TypeVar

from ..core.aggregation.aggregate import AggregationKernel
from ..core.formats.checkpoint import Checkpoint, read_checkpoint
from ..core.wire.commands import SaveCheckpoint
from ..core.job.coordinator import Coordinator
from ..core.job.spec import JobSpec
from ..core.errors import CheckpointError, WeeiError, CheckpointReason, WeeiReason
from ..core.verified import VerifiedBlobs, is_verified, sha256_hex
from ..core.states import JobStatus
from ..core.privacy.dp_noise import SEED_BYTES
from .ports import Storage, StorageError, StorageReason
from .metric_history import history_before
from .records import record_artifacts, spec_from_record, spec_to_record
from .stored import QUARANTINE_STORE, parse_job_record, stored_checkpoint

__all__ = ["JobStore", "Reopened", "checkpoint_key", "PARTICIPATION_KEY"]

_T = TypeVar("_T")

PARTICIPATION_KEY = "participation"  # the job this device accepted, in the settings store


def _dp_noise_seed(record: Mapping[str, Any]) -> bytes | None:
    """The DP noise seed a job record keeps; a damaged one is refused as the record's corruption."""
    text = record.get("dpNoiseSeed")
    if text is None:
        return None
    try:
        seed = bytes.fromhex(text) if isinstance(text, str) else b""
    except ValueError:
        seed = b""
    if len(seed) != SEED_BYTES:
        raise StorageError(StorageReason.CORRUPT, "job record: dpNoiseSeed is not 32 bytes of hex")
    return seed


def checkpoint_key(job_id: str, round_: int) -> str:
    return f"{job_id}/{round_:08d}"


_MEMBERS = "/members"
MEMBER_FIELDS = ("participants", "robust")


def members_key(job_id: str) -> str:
    return job_id + _MEMBERS


def _split(record: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the record without its members, the members), neither with ``updatedAt``."""
    main = {k: v for k, v in record.items() if k not in MEMBER_FIELDS and k != "updatedAt"}
    return main, {k: record[k] for k in MEMBER_FIELDS if k in record}


@dataclass(frozen=True)
class Reopened:
    """A saved job made active again: its coordinator at the last durable checkpoint."""

    coordinator: Coordinator
    validation_sha256: str | None
    validation_unavailable: bool  # the record names a validation file that storage no longer holds


class JobStore:
    """Saved jobs and the bytes of the active one. Call ``await load()`` once before use."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self.saved_jobs: dict[str, dict[str, Any]] = {}
        self._held: dict[str, bytes] = {}  # in-memory copies of what the active job needs now
        # What ``evict`` looks at: the held artifacts outside the last ``fixed`` set it was given (the job's
        # own files, ~one per chunk), so that an eviction after every drain does not walk every chunk.
        self._fixed: frozenset[str] = frozenset()
        self._loose: set[str] = set()
        self.latest_checkpoint: tuple[str, bytes] | None = None  # (file name, file) last made durable
        self.saved_round: dict[str, int] = {}  # job id -> the round of its last durable checkpoint
        # Job id -> the chart points before a continued job's first checkpoint (metric_history.py).
        self.histories: dict[str, list[dict[str, Any]]] = {}
        # The spec's part of the job record, for the spec object it was made of (a JobSpec is frozen; new
        # settings make a new one): built once, not at every drain (its chunk list is O(chunks) to build and to
        # compare, and a drain comes with every message).
        self._spec_record: tuple[JobSpec, int | None, str | None, dict[str, Any]] | None = None
        self._saved_inputs: tuple[Any, ...] | None = None  # what the last save_job_record found saved
        # Job id -> the raw record of a job set aside (now or at an earlier start): what it names is kept.
        self.set_aside_jobs: dict[str, Any] = {}
        self.set_aside_now: list[dict[str, str]] = []  # what this start set aside: {store, key, reason, message}

    # ------------------------------------------------------------ start-up

    async def load(self) -> int:
        """Read the saved jobs (a record that does not parse is set aside) and delete what none of them
        names; returns how many entries went."""
        for key in await self.storage.keys(QUARANTINE_STORE):
            entry = await self.storage.get(QUARANTINE_STORE, key)
            if key.startswith("jobs/") and not key.endswith(_MEMBERS) and isinstance(entry, dict):
                self.set_aside_jobs[key[len("jobs/"):]] = entry.get("value")
        keys = await self.storage.keys("jobs")
        for key in keys:
            if key.endswith(_MEMBERS):
                continue
            record = await self.storage.get("jobs", key)
            try:
                parsed = parse_job_record(key, record)
            except StorageError as exc:
                self.set_aside_jobs[key] = record
                await self.set_aside("jobs", key, record, exc)
                continue
            if members_key(key) in keys:
                parsed = await self._with_members(key, parsed)
            self.saved_jobs[key] = parsed
        for key in keys:  # the members of a job no record names (a page closed between two writes)
            job_id = key[:-len(_MEMBERS)]
            if key.endswith(_MEMBERS) and job_id not in self.saved_jobs and job_id not in self.set_aside_jobs:
                await self.storage.delete("jobs", key)
        return await self.collect_garbage()

    async def _with_members(self, job_id: str, record: dict[str, Any]) -> dict[str, Any]:
        """``record`` with its members entry read in. A members entry that does not parse is set aside,
        and what the record itself says of its members (an older version's) stands."""
        key = members_key(job_id)
        members = await self.storage.get("jobs", key)
        main, _ = _split(record)
        try:
            if not isinstance(members, dict):
                raise StorageError(StorageReason.CORRUPT, f"job {job_id}: its members entry is not an object")
            merged = parse_job_record(job_id, {**main, **{k: members[k] for k in MEMBER_FIELDS if k in members}})
        except StorageError as exc:
            await self.set_aside("jobs", key, members, exc)
            return record
        stamps = [t for t in (record.get("updatedAt"), members.get("updatedAt"))
                  if isinstance(t, (int, float)) and not isinstance(t, bool)]
        merged["updatedAt"] = max(stamps) if stamps else None
        return merged

    async def set_aside(self, store: str, key: str, value: Any, error: StorageError) -> None:
        """Move a record that did not parse to the quarantine store (kept, with why) and note it in
        :attr:`set_aside_now`. If storage refuses the move, the record stays where it is (and is refused
        again at the next start): nothing is deleted that was not kept."""
        self.set_aside_now.append({"store": store, "key": key[:200], "reason": str(error.reason),
                                   "message": error.message[:300]})
        try:
            await self.storage.put(QUARANTINE_STORE, f"{store}/{key}", {
                "store": store, "key": key, "reason": str(error.reason), "message": error.message, "value": value})
        except StorageError:
            return
        await self.storage.delete(store, key)

    async def read_setting(self, key: str, parse: Callable[[Any], _T]) -> _T | None:
        """``settings/<key>`` through ``parse``; None when absent or when it did not parse (set aside)."""
        value = await self.setting(key)
        if value is None:
            return None
        try:
            return parse(value)
        except StorageError as exc:
            await self.set_aside("settings", key, value, exc)
            return None

    async def collect_garbage(self) -> int:
        """Delete stored artifacts and checkpoints that no saved job names; returns how many went."""
        named = self._named(None)
        removed = 0
        for sha in await self.storage.keys("artifacts"):
            if sha not in named:
                await self.storage.delete("artifacts", sha)
                removed += 1
        for key in await self.storage.keys("checkpoints"):
            job_id = key.rsplit("/", 1)[0]
            if job_id not in self.saved_jobs and job_id not in self.set_aside_jobs:
                await self.storage.delete("checkpoints", key)
                removed += 1
        return removed

    # ------------------------------------------------------------ settings

    async def setting(self, key: str) -> Any:
        return await self.storage.get("settings", key)

    async def put_setting(self, key: str, value: Any) -> None:
        await self.storage.put("settings", key, value)

    async def delete_setting(self, key: str) -> None:
        await self.storage.delete("settings", key)

    # ----------------------------------------------------------- artifacts

    @property
    def artifacts(self) -> Mapping[str, bytes]:
        """The bytes held in memory by SHA-256, each the hash of its bytes (read-only: write through the methods)."""
        return MappingProxyType(self._held)

    def artifact(self, sha: str) -> bytes:
        """The bytes with this SHA-256, held in memory. Raises WeeiError('missing-artifact')."""
        data = self._held.get(sha)
        if data is None:
            raise WeeiError(WeeiReason.MISSING_ARTIFACT, f"artifact {sha[:12]}… is not in this browser")
        return data

    def module(self, sha: str) -> bytes:
        """The module with this SHA-256, hashed again now: it becomes code, and hashing its few hundred kB
        costs nothing beside running it. Raises WeeiError('missing-artifact' or 'hash-mismatch')."""
        data = self.artifact(sha)
        if sha256_hex(data) != sha:
            raise WeeiError(WeeiReason.HASH_MISMATCH, f"the module held as {sha[:12]}… hashes to something else: not loaded")
        return data

    def remember(self, blobs: Mapping[str, bytes]) -> list[str]:
        """Hold bytes in memory only (weights, what arrived with a message): the checkpoint file keeps weights.

        ``VerifiedBlobs`` are taken as they are; any other entry is hashed now.
        Returns the keys refused because their bytes hash to something else.
        """
        checked = is_verified(blobs)
        refused = []
        for sha, data in blobs.items():
            if checked or sha256_hex(data) == sha:
                self._hold(sha, data)
            else:
                refused.append(sha)
        return refused

    async def put_artifacts(self, items: Mapping[str, bytes]) -> None:
        """Store a new job's files durably and in memory (``VerifiedBlobs`` as they are, others hashed first).

        Raises UsageError('hash-mismatch') for a file that does not hash to its
        key, before anything is written. On a refused write, what this call
        stored and no saved job names is deleted again, and the StorageError
        goes on to the caller.
        """
        items = items if is_verified(items) else VerifiedBlobs.check(items)
        written: list[str] = []
        try:
            for sha, data in items.items():
                await self.storage.put("artifacts", sha, data)
                written.append(sha)
        except StorageError:
            named = self._named(None)
            for sha in written:
                if sha not in named:
                    await self.storage.delete("artifacts", sha)
                    self._held.pop(sha, None)
            raise
        # Held only once every write is done, all at once: a drain while a write awaits (a peer's message)
        # evicts what no job refers to yet, and the new job has no coordinator until this returns. Holding
        # each file as it was written lost the module that way (the coordinator's own participant then
        # failed with missing-artifact, and no peer could be sent the module).
        for sha, data in items.items():
            self._hold(sha, data)

    async def load_artifacts(self, shas: list[str]) -> set[str]:
        """Read stored artifacts into memory, each hashed; returns the SHA-256 of those not in storage.

        Raises StorageError('corrupt') for one whose bytes hash to something else (storage is not ours alone).
        """
        missing = set()
        for sha in shas:
            data = await self.storage.get("artifacts", sha)
            if data is None:
                missing.add(sha)
            elif self.remember({sha: bytes(data)}):
                raise StorageError(StorageReason.CORRUPT, f"artifact {sha[:16]}... in storage does not match its SHA-256")
        return missing

    def _hold(self, sha: str, data: bytes) -> None:
        self._held[sha] = data
        self._loose.add(sha)

    def evict(self, keep: Container[str], fixed: frozenset[str] = frozenset()) -> int:
        """Drop every in-memory artifact in neither ``keep`` nor ``fixed``; returns how many went.

        ``fixed`` is the part of what to keep that stays the same object while it does not change (the
        job's files): the artifacts in it are looked at again only when another object comes.
        """
        if fixed is not self._fixed:
            self._fixed, self._loose = fixed, set(self._held)
        gone = []
        for sha in list(self._loose):
            if sha not in self._held or sha in fixed:
                self._loose.discard(sha)
            elif sha not in keep:
                gone.append(sha)
        for sha in gone:
            del self._held[sha]
            self._loose.discard(sha)
        return len(gone)

    # --------------------------------------------------------- job records

    async def save_job_record(self, coordinator: Coordinator, *, job_seed: int | None,
                              validation_sha256: str | None, now: float, status: str | None = None,
                              active: bool | None = None) -> None:
        """Write the active job's record, if anything in it changed."""
        job_id = coordinator.spec.job_id
        # Everything the record is built from (records and histories are replaced, never changed in place):
        # when none of it moved since the last call that found the record saved, it still is.
        inputs = (coordinator, coordinator.spec, job_seed, validation_sha256, status, active, coordinator.status,
                  self.saved_round.get(job_id), coordinator.checkpoint_round, coordinator.members_version(),
                  coordinator.dp_noise_seed, self.histories.get(job_id), self.saved_jobs.get(job_id))
        if inputs == self._saved_inputs:  # tuples compare by identity first: the same objects cost nothing
            return
        saved = await self._save_job_record(coordinator, job_seed=job_seed, validation_sha256=validation_sha256,
                                            now=now, status=status, active=active)
        if self.saved_jobs.get(job_id) is saved:  # not when a save that interleaved wrote another record since
            self._saved_inputs = inputs[:-1] + (saved,)

    async def _save_job_record(self, coordinator: Coordinator, *, job_seed: int | None,
                               validation_sha256: str | None, now: float, status: str | None,
                               active: bool | None) -> dict[str, Any]:
        """The record as saved now: the one found, when nothing in it changed, or the one written."""
        job_id = coordinator.spec.job_id
        cached = self._spec_record
        if cached is None or cached[0] is not coordinator.spec or cached[1:3] != (job_seed, validation_sha256):
            built = spec_to_record(coordinator.spec, job_seed=job_seed, validation_sha256=validation_sha256)
            cached = self._spec_record = (coordinator.spec, job_seed, validation_sha256, built)
        record = dict(cached[3])
        previous = self.saved_jobs.get(job_id, {})
        record["status"] = status or (coordinator.status if coordinator.status is not JobStatus.READY else previous.get(
            "status", JobStatus.READY))
        if coordinator.status is JobStatus.COMPLETED:
            record["status"] = JobStatus.COMPLETED
        record["active"] = previous.get("active", True) if active is None else active
        # The round a reload continues from: a checkpoint that storage refused is not one.
        record["lastRound"] = self.saved_round.get(job_id, coordinator.checkpoint_round)
        # Who takes part: after a reload they are waited for, and caught up when their channel opens again.
        record["participants"] = coordinator.remote_participants()
        # And robust aggregation's outlier counts and exclusions: a reload must not forgive an attacker.
        robust = coordinator.robust_records()
        if robust:
            record["robust"] = robust
        if coordinator.dp_noise_seed is not None:  # this browser's own storage: the seed never leaves it
            record["dpNoiseSeed"] = coordinator.dp_noise_seed.hex()
        history = self.histories.get(job_id, previous.get("history"))
        if history:
            record["history"] = history  # the charts' rounds before a continued job's first (metric_history.py)
        record["createdAt"] = previous.get("createdAt", now)
        main, members = _split(record)
        old_main, old_members = _split(previous)
        # Written only when something in it changed (every drain asks, few change it), and only the part
        # that changed: a join rewrites the members, not the chunk list.
        if previous and main == old_main and members == old_members:
            return previous
        record["updatedAt"] = now
        # Before the await: a save that interleaves (a validation task's
        # drain during leave()) must build on this record, not the old one.
        self.saved_jobs[job_id] = record
        wrote_main = False
        try:
            if not previous or main != old_main:
                await self.storage.put("jobs", job_id, {**main, "updatedAt": now})
                wrote_main = True
            if not previous or members != old_members:
                await self.storage.put("jobs", members_key(job_id), {**members, "updatedAt": now})
        except StorageError:
            if self.saved_jobs.get(job_id) is record:  # what storage holds is not this record
                if wrote_main:
                    self.saved_jobs[job_id] = {**main, **old_members, "updatedAt": now}
                elif previous:
                    self.saved_jobs[job_id] = previous
                else:
                    self.saved_jobs.pop(job_id, None)
            raise
        return record

    async def delete_job(self, job_id: str) -> None:
        """Delete a saved job: its checkpoints, its record, and the artifacts no other job names."""
        record = self.saved_jobs.get(job_id) or await self.storage.get("jobs", job_id) or {}
        for key in await self.storage.keys("checkpoints"):
            if key.startswith(job_id + "/"):
                await self.storage.delete("checkpoints", key)
        await self.storage.delete("jobs", members_key(job_id))
        await self.storage.delete("jobs", job_id)
        self.saved_jobs.pop(job_id, None)
        self.histories.pop(job_id, None)
        named = self._named(None)
        for sha in record_artifacts(record) if isinstance(record, dict) else set():
            if sha not in named:
                await self.storage.delete("artifacts", sha)
                self._held.pop(sha, None)

    def _named(self, except_job: str | None) -> set[str]:
        named: set[str] = set()
        for job_id, record in self.saved_jobs.items():
            if job_id != except_job:
                named |= record_artifacts(record)
        for record in self.set_aside_jobs.values():
            named |= record_artifacts(record)
        return named

    # ---------------------------------------------------------- checkpoints

    async def save_checkpoint(self, job_id: str, command: SaveCheckpoint) -> None:
        """Make a round's checkpoint durable; its weights stay in memory for the next round."""
        self._hold(command.weights_sha256, command.weights)  # the coordinator named them by hashing them
        await self.storage.put("checkpoints", checkpoint_key(job_id, command.round),
                               {"summary": command.summary, "file": command.file})
        self.latest_checkpoint = (command.summary["artifact"]["fileName"], command.file)
        self.saved_round[job_id] = command.round

    async def save_imported_checkpoint(self, job_id: str, read: Checkpoint, file: bytes,
                                       summary: dict[str, Any], weights_sha256: str) -> None:
        """The checkpoint a job continues from, as its first (continueFromCheckpoint); ``weights_sha256`` is
        the hash its coordinator took of ``read.weights``."""
        self._hold(weights_sha256, bytes(read.weights))
        await self.storage.put("checkpoints", checkpoint_key(job_id, read.metadata.round),
                               {"summary": summary, "file": bytes(file)})
        self.latest_checkpoint = (summary["artifact"]["fileName"], bytes(file))
        self.saved_round[job_id] = read.metadata.round

    async def update_summary(self, job_id: str, round_: int, summary: dict[str, Any]) -> None:
        """Replace a saved checkpoint's summary (validation metrics came in)."""
        key = checkpoint_key(job_id, round_)
        stored = await self.storage.get("checkpoints", key)
        if stored is not None:
            file = stored_checkpoint(stored, key)[1]
            await self.storage.put("checkpoints", key, {"summary": summary, "file": file})

    async def read_checkpoints(self, job_id: str) -> tuple[list[dict[str, Any]], bytes]:
        """Every saved summary of a job, oldest first, and its last checkpoint file.

        Raises CheckpointError('no-checkpoint') when none is saved.
        """
        keys = sorted(k for k in await self.storage.keys("checkpoints") if k.startswith(job_id + "/"))
        if not keys:
            raise CheckpointError(CheckpointReason.NO_CHECKPOINT, f"job {job_id} has no saved checkpoint")
        summaries = []
        file = b""
        for key in keys:
            summary, file = stored_checkpoint(await self.storage.get("checkpoints", key), key)
            summaries.append(summary)
        return summaries, file

    def history(self, job_id: str) -> list[dict[str, Any]]:
        """The chart points before job ``job_id``'s first checkpoint (none unless it continued a saved job)."""
        return self.histories.get(job_id) or list(self.saved_jobs.get(job_id, {}).get("history") or [])

    async def history_before(self, job_id: str | None, round_: int) -> list[dict[str, Any]]:
        """What a job continued from checkpoint ``round_`` of saved job ``job_id`` charts before it: that job's
        history and checkpoints before the round. Empty when that job is not saved here or cannot be read
        (the new job starts anyway: the history is only shown)."""
        if job_id is None or job_id not in self.saved_jobs:
            return []
        try:
            summaries, _file = await self.read_checkpoints(job_id)
        except (StorageError, CheckpointError):
            return []
        return history_before(self.history(job_id), summaries, round_)

    async def reopen(self, job_id: str, *, my_peer_id: str, kernel: AggregationKernel, now: float) -> Reopened:
        """Rebuild a saved job from its record and last checkpoint, its files back in memory.

        Raises CheckpointError('no-checkpoint') and the record parsers' errors.
        """
        record = self.saved_jobs[job_id]
        spec, job_seed, validation_sha = spec_from_record(record)
        summaries, file = await self.read_checkpoints(job_id)
        read = read_checkpoint(file)
        coordinator = Coordinator.continue_from(spec, read, mode="resume", my_peer_id=my_peer_id, kernel=kernel,
                                         now=now, new_job_seed=job_seed, reopening=True,
                                         dp_noise_seed=_dp_noise_seed(record))
        coordinator.restore_checkpoints(summaries)
        if record.get("status") == JobStatus.COMPLETED:
            coordinator.reopened_completed()
        else:
            robust = record.get("robust", {})
            refused = coordinator.restore_participants(record.get("participants") or [], robust)
            if refused or not isinstance(robust, dict):
                raise StorageError(StorageReason.CORRUPT, f"job {job_id}: the saved robust-aggregation state of "
                                              f"{', '.join(refused) or 'its participants'} is damaged")
        self.latest_checkpoint = (summaries[-1]["artifact"]["fileName"], file)
        self.saved_round[job_id] = read.metadata.round
        self._hold(coordinator.weights_sha256, bytes(read.weights))  # the coordinator hashed these weights
        await self._load_snapshots(job_id, coordinator)
        await self.load_artifacts([spec.module.sha256, *(c.sha256 for c in spec.chunks),
                                   *(r.sha256 for r in spec.auxiliary_files.values()),
                                   *([spec.gpu.archive.sha256] if spec.gpu is not None else [])])
        unavailable = bool(await self.load_artifacts([validation_sha])) if validation_sha is not None else False
        return Reopened(coordinator, validation_sha, unavailable)

    async def _load_snapshots(self, job_id: str, coordinator: Coordinator) -> None:
        """Read back the weights of the earlier checkpoints snapshot slots (initial, roundsAgo) may name."""
        for round_, sha in coordinator.snapshot_checkpoints().items():
            if sha in self._held:
                continue
            stored = await self.storage.get("checkpoints", checkpoint_key(job_id, round_))
            if stored is None:
                raise CheckpointError(CheckpointReason.NO_CHECKPOINT, f"job {job_id}: checkpoint {round_}, which a snapshot slot "
                                                       f"names, is not in storage")
            file = stored_checkpoint(stored, checkpoint_key(job_id, round_))[1]
            if self.remember({sha: bytes(read_checkpoint(file).weights)}):
                raise StorageError(StorageReason.CORRUPT, f"job {job_id}: the weights of checkpoint {round_} in storage do not "
                                              f"match the SHA-256 its summary names")

