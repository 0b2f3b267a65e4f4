"""Issue 9 §4, second part: the parsers the first part left, and what fuzzing them found.

Each test fails on the code before this change (the exception that escaped,
or the check that was missing, is named in its comment) and passes after.
"""

from __future__ import annotations

import asyncio
import copy
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from weei.agent.storage import DiskKeyValue, DiskStorage
from weei.api.job_store import JobStore, checkpoint_key
from weei.api.ports import StorageError
from weei.api.records import spec_from_record
from weei.core.observe.debuglog import DebugLog
from weei.core.errors import ModelError, WeeiError
from weei.core.wire.framing.frames import data_frame, message_begin_frame
from weei.core.wire.framing.reader import FrameReader
from weei.core.wire.signaling_session import SignalingSession, Unreadable
from weei.core.observe.transfers import TransferFailed
from weei.gpu import GpuError, parse_archive
from weei.gpu.archive import entry_points_of
from weei.host.memory_storage import MemoryStorage
from weei.runtime.results import parse_result_json
from weei.server.signaling_rules import SignalingError, parse_text_frame

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fuzz"))

NOW_MS = 1_700_000_000_000
DEEP_TEXT = "[" * 100_000


def deep_json(depth: int) -> str:
    return '{"a":' * depth + "0" + "}" * depth


# ------------------------------------------------------------------ the wire decoder


def test_a_message_nested_past_the_limit_fails_its_transfer_by_name() -> None:
    # Before: 70 levels were read, and only decode_message's own checks stood between them and the core.
    body = json.dumps({"type": "leave", "jobId": "job-1", "extra": json.loads(deep_json(70))}).encode()
    reader = FrameReader("peer")
    events = reader.feed(message_begin_frame(1, len(body), ()), 0.0) + reader.feed(data_frame(1, 0, body), 0.0)
    failed = [e for e in events if isinstance(e, TransferFailed)]
    assert len(failed) == 1 and failed[0].error.reason == "bad-message"
    assert "nests deeper than 64" in str(failed[0].error)
    assert reader.broken is None  # one transfer refused, the channel goes on


# ------------------------------------------------------------------ the debug log


def stored_log(**changes: Any) -> dict[str, Any]:
    log = DebugLog()
    log.add_phase("train", 10.0, NOW_MS)
    data = json.loads(log.to_json())
    data.update(changes)
    return data


def reset_parts(text: str) -> list[str]:
    log = DebugLog.from_json(text, NOW_MS)
    log.to_json()  # what was read can be written back
    return [e["details"]["part"] for e in log.events() if e["event"] == "debuglog.reset"]


def test_a_duration_past_float_range_resets_the_baseline() -> None:
    # Before: OverflowError from math.isfinite(10**400).
    text = json.dumps(stored_log()).replace('"totalMs": 10.0', '"totalMs": 1' + "0" * 400)
    assert "1" + "0" * 400 in text
    assert reset_parts(text) == ["baseline"]


def test_an_event_that_cannot_be_written_back_resets_the_events() -> None:
    # Before: 1e400 read as infinity, and the next to_json raised ValueError (allow_nan=False).
    text = json.dumps(stored_log(events=[{"at": "2023-11-14T22:13:20.000Z", "event": "x", "details": {"v": "INF"}}]))
    assert reset_parts(text.replace('"INF"', "1e400")) == ["events"]


def test_a_deep_stored_log_resets_by_name() -> None:
    log = DebugLog.from_json(json.dumps(stored_log(events=[{"at": "x", "event": "y",
                                                            "details": json.loads(deep_json(70))}])), NOW_MS)
    assert [e["details"]["part"] for e in log.events() if e["event"] == "debuglog.reset"] == ["all"]
    assert "nests deeper than 64" in log.events()[-1]["details"]["reason"]


# ------------------------------------------------------------------ signaling, both ends


def test_the_signaling_client_reads_deep_frames_as_unreadable() -> None:
    # Before: RecursionError out of SignalingSession.on_server_message (json.loads, nothing caught it).
    for text in (DEEP_TEXT, deep_json(70)):
        items = SignalingSession().on_server_message(text)
        assert len(items) == 1 and isinstance(items[0], Unreadable) and "not JSON" in items[0].detail


def test_a_huge_idle_timeout_is_capped() -> None:
    # Before: OverflowError from float(10**400) in ping_interval_s.
    session = SignalingSession()
    session.hello()
    welcome = json.dumps({"type": "welcome", "peerId": "p", "token": "t", "limits": {"idleTimeout": "BIG"}})
    session.on_server_message(welcome.replace('"BIG"', "1" + "0" * 400))
    assert session.ping_interval_s() == 86_400.0 / 3


def test_the_server_refuses_deep_frames_as_bad_json() -> None:
    with pytest.raises(SignalingError) as err:
        parse_text_frame(json.dumps({"type": "ping", "x": json.loads(deep_json(70))}))
    assert err.value.reason == "bad-json"


# ------------------------------------------------------------------ model results


@pytest.mark.parametrize("raw", [DEEP_TEXT.encode(), ('{"metrics": ' + deep_json(70) + "}").encode(),
                                 ('{"error": ' + deep_json(900) + "}").encode()])
def test_deep_results_are_malformed(raw: bytes) -> None:
    # Before: 70 levels were accepted; an error value 900 deep reached json.dumps.
    with pytest.raises(ModelError) as err:
        parse_result_json("train", raw)
    assert err.value.reason == "malformed-result"


# ------------------------------------------------------------------ agent storage and job records


def test_a_deep_record_on_disk_is_corrupt(tmp_path: Path) -> None:
    # Before: RecursionError out of DiskStorage.get (json.loads) and out of DiskKeyValue.
    storage = DiskStorage(tmp_path)
    folder = tmp_path / "records" / "jobs"
    folder.mkdir(parents=True)
    (folder / "job-1.json").write_text(DEEP_TEXT)
    with pytest.raises(StorageError) as err:
        asyncio.run(storage.get("jobs", "job-1"))
    assert err.value.reason == "corrupt"
    (tmp_path / "kv.json").write_text(DEEP_TEXT)
    with pytest.raises(StorageError) as err:
        DiskKeyValue(tmp_path / "kv.json")
    assert err.value.reason == "corrupt"


def test_records_nest_documents_below_the_storage_limit(tmp_path: Path) -> None:
    # A record holds checked documents a few levels down: 64 deep inside a record still reads back.
    storage = DiskStorage(tmp_path)
    value: Any = 0
    for _ in range(63):
        value = [value]
    asyncio.run(storage.put("jobs", "job-1", {"modelInfo": {"extra": value}}))
    assert asyncio.run(storage.get("jobs", "job-1")) == {"modelInfo": {"extra": value}}


def job_record() -> dict[str, Any]:
    from targets import TARGETS  # tests/fuzz: the fuzzer's sample record

    return copy.deepcopy(TARGETS["job-record"]().samples[0])


@pytest.mark.parametrize(("change", "reason"), [
    ({"module": None}, "corrupt"),  # before: TypeError
    ({"chunks": "abc"}, "corrupt"),  # before: TypeError
    ({"chunks": [{"id": "c"}]}, "corrupt"),  # before: KeyError
    ({"weightBytes": "456x"}, "corrupt"),  # before: ValueError from int()
    ({"validation": []}, "corrupt"),  # before: TypeError
    ({"jobSeed": "1" * 5000}, "bad-seed"),  # before: ValueError (int of 5000 digits)
    ({"auxiliaryFiles": [1]}, "corrupt"),  # before: AttributeError
])
def test_a_damaged_job_record_is_refused_by_name(change: dict[str, Any], reason: str) -> None:
    record = job_record()
    spec_from_record(record)
    with pytest.raises(WeeiError) as err:
        spec_from_record({**record, **change})
    assert err.value.reason == reason


def test_a_missing_field_of_a_job_record_is_named() -> None:
    record = job_record()
    del record["module"]
    with pytest.raises(StorageError, match="job record.module: is required") as err:
        spec_from_record(record)
    assert err.value.reason == "corrupt"


_ARTIFACT = {"round": 0, "sha256": "ab" * 32, "bytes": 1, "fileName": "m-round-0.weeickpt"}


@pytest.mark.parametrize("stored", [
    {"summary": {}}, {"file": b"x"}, "text", {"summary": [], "file": b"x"},
    # Before: reopen indexed these unchecked (KeyError, TypeError, a history under the wrong round).
    {"summary": {}, "file": b"x"},
    {"summary": {"artifact": []}, "file": b"x"},
    {"summary": {"artifact": {**_ARTIFACT, "round": "0"}}, "file": b"x"},
    {"summary": {"artifact": {**_ARTIFACT, "round": 7}}, "file": b"x"},
    {"summary": {"artifact": {**_ARTIFACT, "round": True}}, "file": b"x"},
    {"summary": {"artifact": {**_ARTIFACT, "sha256": "zz" * 32}}, "file": b"x"},
    {"summary": {"artifact": {k: v for k, v in _ARTIFACT.items() if k != "fileName"}}, "file": b"x"},
])
def test_a_damaged_checkpoint_entry_is_corrupt(stored: Any) -> None:
    # Before: KeyError or TypeError out of JobStore.read_checkpoints.
    storage = MemoryStorage()
    asyncio.run(storage.put("checkpoints", checkpoint_key("job-1", 0), stored))
    with pytest.raises(StorageError) as err:
        asyncio.run(JobStore(storage).read_checkpoints("job-1"))
    assert err.value.reason == "corrupt"


def test_a_checkpoint_entry_as_saved_reads_back() -> None:
    storage = MemoryStorage()
    asyncio.run(storage.put("checkpoints", checkpoint_key("job-1", 0), {"summary": {"artifact": _ARTIFACT},
                                                                        "file": b"x"}))
    assert asyncio.run(JobStore(storage).read_checkpoints("job-1")) == ([{"artifact": _ARTIFACT}], b"x")


# ------------------------------------------------------------------ the WGSL archive


def test_a_lone_surrogate_in_a_shader_source_is_malformed() -> None:
    # Found by make fuzz: UnicodeEncodeError from source.encode("utf-8").
    archive = {"format": "weei-wgsl-archive-v1", "modules": [
        {"name": "a.wgsl", "sha256": "0" * 64, "entryPoints": ["main"], "source": "@compute fn main() {} \ud800"}]}
    with pytest.raises(GpuError) as err:
        parse_archive(json.dumps(archive).encode())
    assert err.value.reason == "archive-malformed"


def test_entry_points_are_found_in_linear_time() -> None:
    # The attribute-list regex backtracked exponentially: 12 attributes with two spaces each took
    # 0.3 s and each one more three times as long, so this never finished.
    assert entry_points_of("@a  " * 40 + "x") == ()
    start = time.process_time()
    assert entry_points_of("@a  " * 200_000 + "x") == ()
    assert entry_points_of("@compute  " * 100_000 + "fn main() {}") == ("main",)
    assert entry_points_of("@workgroup_size(" * 100_000) == ()
    assert time.process_time() - start < 30  # ~1 s; a generous bound against load, far below "never"


def test_entry_points_keep_their_meaning() -> None:
    src = ("@compute @workgroup_size(64, 1)\nfn a() {}\n@compute@workgroup_size(1)fn b(){} fn c(){}\n"
           "@vertex fn v() {} @compute x fn d() {} @compute\n\n  fn e () {}")
    assert entry_points_of(src) == ("a", "b", "e")


@pytest.mark.parametrize("where", ["buffer", "pipeline"])
def test_a_deep_name_in_a_device_program_is_refused_by_name(where: str) -> None:
    # Found by make fuzz: the error message repr()'d the 900-deep value and raised RecursionError.
    from test_gpu_program import _program

    from weei.gpu import DeviceLimits, parse_program

    deep: Any = "x"
    for _ in range(900):
        deep = [deep]
    program = _program()
    step = next(s for s in program["steps"] if s.get("op") == "dispatch")
    if where == "buffer":
        step["bindings"][0]["buffer"] = deep
    else:
        step["pipeline"] = deep
    archive = parse_archive((Path(__file__).resolve().parents[2] / "app/static/models/digits-mlp/model.wgsl.json")
                            .read_bytes())
    with pytest.raises(GpuError, match=f"unknown {where} an array"):
        parse_program(program, archive=archive, limits=DeviceLimits(), weight_bytes=16, budget_bytes=64 << 20,
                      estimated_working_bytes=16 << 20)
