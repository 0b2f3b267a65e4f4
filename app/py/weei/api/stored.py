"""Records read back from storage, parsed like wire input.

Storage belongs to the origin (IndexedDB and localStorage in a browser, a
folder for the agent): any script of the same origin, an older version or a
half-finished write can leave anything there. So every record the
controller reads back passes one of these parsers before any field of it is
used, as a peer's message does. Each returns checked values or raises
:class:`~weei.api.ports.StorageError` with reason ``corrupt`` naming the
record and the field; nothing else escapes. The caller sets a refused record
aside (:meth:`weei.api.job_store.JobStore.set_aside`: moved to the
``quarantine`` store, never silently deleted) and starts without it.

The checkpoint entries' parser is :func:`stored_checkpoint`; the debug log
in localStorage has its own (``DebugLog.from_json``, which resets a part it
cannot read by name).
"""

from __future__ import annotations

import json
from typing import Any

from ..core._check import Where, as_bool, as_choice, as_int, as_list, as_number, as_object, as_str, check_depth
from ..core.errors import WeeiError
from ..core.states import JobStatus
from ..core.wire.messages import Invitation, decode_message
from .metric_history import parse_history
from .ports import StorageError, StorageReason
from .records import spec_from_record
from .session import DeviceSettings

__all__ = ["QUARANTINE_STORE", "parse_device_settings", "parse_job_record", "parse_participation",
           "stored_checkpoint", "BACKEND_PREFERENCES", "MAX_LOCAL_WORKERS", "MAX_GPU_BUDGET_MIB"]

#: Where a record that did not parse is kept, under ``<store>/<key>`` (a fifth object store).
QUARANTINE_STORE = "quarantine"

MAX_LOCAL_WORKERS = 64
MAX_GPU_BUDGET_MIB = 1 << 20
BACKEND_PREFERENCES = ("auto", "cpu", "gpu", "hybrid")
JOB_STATUSES = tuple(str(status) for status in JobStatus)
_PEER = 64  # characters of a peer ID (the signaling server's are 26)


def _where(record: str) -> Where:
    return Where(StorageError, StorageReason.CORRUPT, record)


def _json_like(value: Any, at: Where) -> None:
    """What the state view copies as JSON must be JSON: no bytes, no NaN, no deep nesting."""
    check_depth(value, at)
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        at(f"is not JSON ({str(exc)[:80]})")


def parse_device_settings(value: Any, *, default_workers: int) -> DeviceSettings:
    """``settings/device``: the device's own settings; a missing field takes its default
    (``default_workers`` for maxLocalWorkers). Bounds are the setters' (``setMaxLocalWorkers``...)."""
    at = _where("settings/device")
    record = as_object(value, at)
    device = DeviceSettings(max_local_workers=min(max(default_workers, 1), MAX_LOCAL_WORKERS))
    if "maxLocalWorkers" in record:
        device.max_local_workers = at.read(record, "maxLocalWorkers", as_int, minimum=1, maximum=MAX_LOCAL_WORKERS)
    if "gpuMemoryBudgetMiB" in record:
        device.gpu_memory_budget_mib = at.read(record, "gpuMemoryBudgetMiB", as_int, minimum=0,
                                               maximum=MAX_GPU_BUDGET_MIB)
    if "backendPreference" in record:
        device.backend_preference = at.read(record, "backendPreference", as_choice, allowed=BACKEND_PREFERENCES)
    return device


def parse_job_record(key: str, value: Any) -> dict[str, Any]:
    """``jobs/<key>``: a saved job's record. Its spec must rebuild (``records.spec_from_record``) and every
    field the controller and the state view read beside it must have its type; returns the record."""
    at = _where(f"job record {key[:80]}")
    record = as_object(value, at)
    _json_like(record, at)
    try:
        spec, _seed, _validation = spec_from_record(record)
    except StorageError:
        raise
    except WeeiError as exc:  # the document parsers' own errors (model info, settings, file references)
        at(f"{exc.reason}: {exc.message}"[:300])
    if spec.job_id != key:
        at.at("id")(f"names job {spec.job_id[:80]!r}, not the key it is stored under")
    if "status" in record:
        at.read(record, "status", as_choice, allowed=JOB_STATUSES)
    if "active" in record:
        at.read(record, "active", as_bool)
    for field in ("createdAt", "updatedAt"):
        if record.get(field) is not None:
            at.read(record, field, as_number)
    if "lastRound" in record:
        at.read(record, "lastRound", as_int, minimum=0)
    if "participants" in record:
        for i, peer in enumerate(at.read(record, "participants", as_list)):
            as_str(peer, at.at("participants").at(i), max_chars=_PEER)
    if "robust" in record:
        at.read(record, "robust", as_object)
    if "history" in record:
        parse_history(record["history"], at.at("history"))
    return record


def parse_participation(value: Any) -> tuple[str, Invitation]:
    """``settings/participation``: the job this device accepted, as (coordinator, invitation). The
    invitation names the coordinator it came from, as one arriving over a channel must."""
    at = _where("settings/participation")
    record = as_object(value, at)
    coordinator = at.read(record, "from", as_str, max_chars=_PEER)
    invitation_json = at.get(record, "invitation")
    check_depth(invitation_json, at.at("invitation"))
    try:
        invitation = decode_message(invitation_json)
    except WeeiError as exc:
        at.at("invitation")(f"{exc.reason}: {exc.message}"[:300])
    if not isinstance(invitation, Invitation):
        at.at("invitation")(f"is a {invitation.TYPE} message, not an invitation")
    if invitation.coordinator != coordinator:
        at.at("invitation").at("coordinator")("is not the peer the invitation came from")
    return coordinator, invitation


def stored_checkpoint(stored: Any, key: str) -> tuple[dict[str, Any], bytes]:
    """``checkpoints/<key>``: a checkpoint entry, as (summary, file).

    The summary's artifact is what a reopened job indexes its history by (the round a snapshot slot
    names, the file the page offers), so it is checked here, against the key it was saved under; the
    rest of the summary is shown as it is, so it must be JSON."""
    at = _where(f"checkpoint {key[:80]}")
    if not isinstance(stored, dict) or not isinstance(stored.get("summary"), dict) \
            or not isinstance(stored.get("file"), (bytes, bytearray, memoryview)):
        at("is not a summary and a file")
    summary = as_object(stored["summary"], at.at("summary"))
    _json_like(summary, at.at("summary"))
    artifact = summary.get("artifact")
    round_ = artifact.get("round") if isinstance(artifact, dict) else None
    sha = artifact.get("sha256") if isinstance(artifact, dict) else None
    if type(round_) is not int or not key.endswith(f"/{round_:08d}") or not isinstance(sha, str) \
            or len(sha) != 64 or sha.strip("0123456789abcdef") or not isinstance(artifact.get("fileName"), str):
        at("its summary does not name the round, SHA-256 and file name it was saved under")
    return summary, bytes(stored["file"])
