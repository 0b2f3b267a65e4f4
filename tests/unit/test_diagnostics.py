"""Execution diagnostics under simulated time: recorder, book, validation, uniformity."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weei.core.observe.diagnostics import (
    AcceptResult,
    DiagnosticsBook,
    DiagnosticsRecorder,
    Stage,
    parse_diagnostics,
    uniformity,
)
from weei.core.errors import UsageError, WeeiError
from weei.core.states import IllegalTransition

WALL0 = 1_714_564_800_000  # the peer's wall clock at mono 0
SHA = "ab" * 32
JOB = "job-1"

TOP_LEVEL = {
    "schemaVersion", "sequence", "measuredAt", "receivedAt", "ageMs", "stale", "connected", "environment",
    "execution", "gpu", "model", "assignment", "stage", "error", "timings", "performance",
}


def assignment(**changes: Any) -> dict[str, Any]:
    value = {
        "jobId": JOB, "round": 3, "assignmentId": "a-3-1", "attemptId": "t-1", "chunkId": "unknown",
        "bytes": 4096, "exampleCount": 128, "batchSize": 32, "localEpochs": 1, "learningRate": 0.01,
    }
    value.update(changes)
    return value


def recorder() -> DiagnosticsRecorder:
    rec = DiagnosticsRecorder(
        environment={"browser": "Firefox", "browserVersion": "126", "os": "Linux", "logicalCores": 8},
        execution={"requested": "auto", "workerLimit": 4},
        gpu={"webgpu": "available", "memoryBudgetMiB": 512},
    )
    rec.set_model({"id": "digits-mlp", "version": "1.0.0", "wasmSha256": SHA, "wgsl": {"present": False, "sha256": []}})
    return rec


def start_training(rec: DiagnosticsRecorder, now: float) -> None:
    """An assignment starts and its model runs at once (no preparation time to speak of)."""
    rec.on("assigned", now)
    rec.on("running", now)


class Clock:
    """The participant's clocks: monotonic ms and the wall clock that goes with it."""

    def __init__(self) -> None:
        self.mono = 0.0

    @property
    def wall(self) -> float:
        return WALL0 + self.mono


# --- the recorder --------------------------------------------------------------------


def test_snapshot_has_exactly_the_spec_fields_and_validates() -> None:
    rec = recorder()
    rec.join_job(JOB, 0)
    record = rec.snapshot(WALL0, 0)
    assert set(record) == TOP_LEVEL
    assert record["schemaVersion"] == 1
    assert record["model"]["id"] == "digits-mlp"
    assert record["assignment"] is None and record["stage"] == "waiting"
    assert record["execution"]["actual"] == "unknown"
    assert record["timings"] == {"preparationMs": None, "compilationMs": None, "trainingMs": None, "uploadMs": None}
    parsed = parse_diagnostics(record)
    assert parsed == {**record, "receivedAt": 0}  # the receiver stamps its own time


def test_periodic_every_two_seconds_only_with_a_job() -> None:
    rec, clock = recorder(), Clock()
    assert not rec.due(clock.mono) and rec.next_due_at() is None
    rec.join_job(JOB, clock.mono)
    sent = []
    for _ in range(100):  # 10 s in 100 ms ticks
        if rec.due(clock.mono):
            sent.append(rec.snapshot(clock.wall, clock.mono)["sequence"])
            sent_at = clock.mono
        clock.mono += 100
        assert rec.next_due_at() == sent_at + 2000
    assert sent == [1, 2, 3, 4, 5]
    rec.leave_job()
    assert not rec.due(clock.mono + 10_000)


def test_stage_change_makes_a_snapshot_due_at_once() -> None:
    rec = recorder()
    rec.join_job(JOB, 0)
    rec.snapshot(WALL0, 0)
    assert not rec.due(500)
    rec.on("files_arriving", 500)
    assert rec.due(500)
    rec.snapshot(WALL0 + 500, 500)
    assert not rec.due(600)
    rec.on("files_arriving", 700)  # the same stage again is no change
    assert not rec.due(700)


# Written out by hand from the spec's stages, not read from the table: every move a host makes.
STAGE_MOVES = [
    ("waiting", "files_arriving", "receiving"), ("receiving", "files_idle", "waiting"),
    ("waiting", "assigned", "preparing"), ("awaitingAggregation", "assigned", "preparing"),
    ("error", "assigned", "preparing"), ("preparing", "running", "training"), ("preparing", "compiling", "compiling"),
    ("compiling", "running", "training"), ("training", "trained", "uploading"), ("preparing", "trained", "uploading"),
    ("uploading", "sent", "awaitingAggregation"), ("training", "failed", "error"),
    ("awaitingAggregation", "ended", "waiting"),
    # What means nothing new in a stage leaves it as it is:
    ("training", "sent", "training"), ("uploading", "running", "uploading"), ("error", "sent", "error"),
    ("awaitingAggregation", "files_arriving", "awaitingAggregation"), ("waiting", "running", "waiting"),
]
# Moves no host may make: each is a bug, raised by the one error every machine of weei.core raises.
STAGE_BUGS = [("waiting", "trained"), ("receiving", "compiling"), ("uploading", "trained"),
              ("awaitingAggregation", "compiling"), ("error", "trained"), ("training", "dreaming")]


def _at(stage: str) -> DiagnosticsRecorder:
    rec = recorder()
    rec.join_job(JOB, 0)
    rec.start_assignment(assignment(), 0)
    path = {"waiting": [], "receiving": ["files_arriving"], "preparing": ["assigned"],
            "compiling": ["assigned", "compiling"], "training": ["assigned", "running"],
            "uploading": ["assigned", "running", "trained"], "awaitingAggregation": ["assigned", "running", "trained", "sent"],
            "error": ["assigned"]}[stage]
    for event in path:
        rec.on(event, 0)
    if stage == "error":
        rec.on("failed", 0, error="it broke")
    assert rec.stage == stage
    return rec


@pytest.mark.parametrize("stage, event, after", STAGE_MOVES)
def test_the_stage_table(stage: str, event: str, after: str) -> None:
    rec = _at(stage)
    rec.on(event, 10, error="it broke" if event == "failed" else None)
    assert rec.stage is Stage(after)


@pytest.mark.parametrize("stage, event", STAGE_BUGS)
def test_a_stage_move_the_table_lacks_is_an_illegal_transition(stage: str, event: str) -> None:
    rec = _at(stage)
    with pytest.raises(IllegalTransition) as raised:
        rec.on(event, 10)
    assert (raised.value.role, raised.value.state, raised.value.event) == ("diagnostics", stage, event)
    assert rec.stage == stage  # nothing half-done


def test_every_stage_has_a_row() -> None:
    from weei.core.observe.diagnostics import STAGE_TRANSITIONS, STAGES
    assert [str(s) for s in STAGE_TRANSITIONS] == list(STAGES)


def test_reconnection_sends_a_complete_snapshot_at_once() -> None:
    rec = recorder()
    rec.join_job(JOB, 0)
    rec.start_assignment(assignment(), 0)
    start_training(rec, 0)
    rec.snapshot(WALL0, 0)
    rec.reconnected()
    assert rec.due(1)
    record = rec.snapshot(WALL0 + 1, 1)
    assert set(record) == TOP_LEVEL and record["assignment"]["assignmentId"] == "a-3-1"


def test_stage_durations_are_summed_and_separate() -> None:
    rec = recorder()
    rec.join_job(JOB, 0)
    rec.start_assignment(assignment(), 0)
    rec.on("assigned", 0)
    rec.on("running", 100)  # preparing 100
    rec.on("ended", 1100)  # training 1000
    rec.on("assigned", 3100)  # waiting 2000, not counted anywhere
    rec.on("running", 3150)  # preparing +50
    mid = rec.snapshot(WALL0 + 3650, 3650)
    # Training is in progress: its field still shows the finished part only.
    assert mid["timings"]["trainingMs"] == 1000
    rec.on("trained", 3650)  # training +500
    rec.on("sent", 3900)  # uploading 250
    timings = rec.snapshot(WALL0 + 4000, 4000)["timings"]
    assert timings == {"preparationMs": 150, "compilationMs": None, "trainingMs": 1500, "uploadMs": 250}


def test_timings_and_performance_reset_with_the_next_assignment() -> None:
    rec = recorder()
    rec.join_job(JOB, 0)
    rec.start_assignment(assignment(), 0)
    start_training(rec, 0)
    rec.progress(64, WALL0 + 500, 500, total=128, optimizer_steps=2)
    rec.on("trained", 1000)
    rec.on("sent", 1200)
    rec.start_assignment(assignment(round=4, assignmentId="a-4-1"), 5000)
    record = rec.snapshot(WALL0 + 5000, 5000)
    assert record["assignment"]["round"] == 4
    assert record["timings"] == {"preparationMs": None, "compilationMs": None, "trainingMs": None, "uploadMs": None}
    perf = record["performance"]
    assert perf == {
        "processedExamples": 0, "totalExamples": "unknown", "optimizerSteps": "unknown",
        "currentExamplesPerSecond": None, "averageExamplesPerSecond": None, "lastProgressAt": None,
        "uploadBytes": None,
    }
    start_training(rec, 5000)
    rec.progress(32, WALL0 + 5050, 5050, total=64)
    rec.on("ended", 5100)
    rec.finish_assignment()
    done = rec.snapshot(WALL0 + 5100, 5100)
    assert done["assignment"] is None
    # The finished assignment's figures stay until the next one starts.
    assert done["timings"]["trainingMs"] == 100 and done["performance"]["processedExamples"] == 32


def test_current_speed_uses_the_last_five_seconds() -> None:
    rec = recorder()
    rec.join_job(JOB, 0)
    rec.start_assignment(assignment(exampleCount=10_000), 0)
    start_training(rec, 0)
    rec.progress(0, WALL0, 0)
    assert rec.snapshot(WALL0, 0)["performance"]["currentExamplesPerSecond"] is None  # one sample
    # 10 examples/s for 10 s, then 50 examples/s for 4 s.
    for t in range(1000, 10_001, 1000):
        rec.progress(t // 100, WALL0 + t, t)
    for t in range(11_000, 14_001, 1000):
        rec.progress(100 + (t - 10_000) // 20, WALL0 + t, t)
    perf = rec.snapshot(WALL0 + 14_000, 14_000)["performance"]
    # Window [9000, 14000]: from 90 at 9 s to 300 at 14 s.
    assert perf["currentExamplesPerSecond"] == pytest.approx(210 / 5)
    assert perf["processedExamples"] == 300
    assert perf["averageExamplesPerSecond"] == pytest.approx(300 / 14)
    assert perf["lastProgressAt"] == WALL0 + 14_000
    # Nothing reported for more than 5 s: no current speed rather than an old one.
    assert rec.snapshot(WALL0 + 25_000, 25_000)["performance"]["currentExamplesPerSecond"] is None


def test_average_speed_counts_training_time_only() -> None:
    rec = recorder()
    rec.join_job(JOB, 0)
    rec.start_assignment(assignment(), 0)
    rec.on("assigned", 0)
    rec.on("running", 3000)
    rec.progress(100, WALL0 + 5000, 5000)
    rec.on("trained", 5000)
    perf = rec.snapshot(WALL0 + 9000, 9000)["performance"]
    assert perf["averageExamplesPerSecond"] == pytest.approx(50.0)  # 100 in 2 s of training


def test_lower_progress_starts_a_new_speed_series() -> None:
    rec = recorder()
    rec.join_job(JOB, 0)
    rec.start_assignment(assignment(), 0)
    start_training(rec, 0)
    rec.progress(100, WALL0 + 1000, 1000)
    rec.progress(10, WALL0 + 2000, 2000)
    rec.progress(30, WALL0 + 3000, 3000)
    assert rec.snapshot(WALL0 + 3000, 3000)["performance"]["currentExamplesPerSecond"] == pytest.approx(20)


def test_sequence_base_survives_a_page_reload() -> None:
    first = DiagnosticsRecorder(sequence_base=WALL0)
    assert first.snapshot(WALL0, 0)["sequence"] == WALL0 + 1


def test_recorder_refuses_misuse() -> None:
    rec = recorder()
    with pytest.raises(UsageError):
        rec.start_assignment(assignment(), 0)  # no job
    rec.join_job(JOB, 0)
    with pytest.raises(UsageError):
        rec.start_assignment(assignment(jobId="other"), 0)
    with pytest.raises(UsageError):
        rec.start_assignment(assignment(batchSize=0), 0)
    with pytest.raises(IllegalTransition):
        rec.on("dreaming", 0)
    with pytest.raises(UsageError):
        rec.on("failed", 0)  # needs a message
    with pytest.raises(UsageError):
        rec.on("assigned", 0, error="a message goes with 'failed' only")
    with pytest.raises(UsageError):
        rec.update_execution({"actual": "quantum"})
    with pytest.raises(UsageError):
        rec.update_execution({"activeWorker": 1})  # misspelt field
    rec.on("failed", 10, error="GPU device lost")
    record = rec.snapshot(WALL0, 10)
    assert record["stage"] == "error" and record["error"] == "GPU device lost"
    rec.on("ended", 20)
    assert rec.snapshot(WALL0, 20)["error"] is None


# --- the book ------------------------------------------------------------------------


def test_pair_under_simulated_time() -> None:
    rec, clock, book = recorder(), Clock(), DiagnosticsBook(JOB)
    coordinator_wall = 5_000_000.0  # another clock entirely
    rec.join_job(JOB, 0)
    rec.start_assignment(assignment(), 0)
    start_training(rec, 0)
    for _ in range(50):
        if rec.due(clock.mono):
            snap = rec.snapshot(clock.wall, clock.mono)
            result = book.accept("peer-b", JOB, snap, coordinator_wall + clock.mono, chunk_id="chunk-007")
            assert result is AcceptResult.ACCEPTED
        clock.mono += 100
    view = book.view(coordinator_wall + clock.mono)
    entry = view["peer-b"]
    assert entry["assignment"]["chunkId"] == "chunk-007"
    assert entry["receivedAt"] == coordinator_wall + 4000
    assert entry["ageMs"] == 1000 and entry["stale"] is False and entry["connected"] is True


def test_stale_after_ten_seconds() -> None:
    book = DiagnosticsBook(JOB)
    rec = recorder()
    rec.join_job(JOB, 0)
    book.accept("p", JOB, rec.snapshot(WALL0, 0), 1000)
    assert book.view(11_000)["p"]["stale"] is False  # exactly 10 s is not above 10 s
    assert book.view(11_001)["p"]["stale"] is True
    assert book.view(500)["p"]["ageMs"] == 0  # the local clock stepped back


def test_lower_or_equal_sequence_is_ignored() -> None:
    book = DiagnosticsBook(JOB)
    rec = recorder()
    rec.join_job(JOB, 0)
    first, second = rec.snapshot(WALL0, 0), rec.snapshot(WALL0 + 2000, 2000)
    assert book.accept("p", JOB, second, 10) is AcceptResult.ACCEPTED
    assert book.accept("p", JOB, first, 20) is AcceptResult.OLD_SEQUENCE
    assert book.accept("p", JOB, second, 30) is AcceptResult.OLD_SEQUENCE
    assert book.view(30)["p"]["sequence"] == 2 and book.view(30)["p"]["receivedAt"] == 10


def test_disconnect_keeps_the_snapshot_and_reconnect_replaces_it() -> None:
    book = DiagnosticsBook(JOB)
    rec = recorder()
    rec.join_job(JOB, 0)
    book.accept("p", JOB, rec.snapshot(WALL0, 0), 0)
    book.mark_disconnected("p")
    entry = book.view(1)["p"]
    assert entry["connected"] is False and entry["stale"] is True and entry["ageMs"] == 1
    rec.reconnected()
    assert rec.due(5000)
    assert book.accept("p", JOB, rec.snapshot(WALL0 + 5000, 5000), 5000) is AcceptResult.ACCEPTED
    entry = book.view(5001)["p"]
    assert entry["connected"] is True and entry["stale"] is False
    book.mark_disconnected("unknown-peer")  # nothing to do, no error


def test_diagnostics_of_another_job_are_ignored() -> None:
    book = DiagnosticsBook(JOB)
    rec = recorder()
    rec.join_job("job-2", 0)
    assert book.accept("p", "job-2", rec.snapshot(WALL0, 0), 0) is AcceptResult.OTHER_JOB
    assert book.view(0) == {}
    assert DiagnosticsBook().accept("p", JOB, {}, 0) is AcceptResult.OTHER_JOB  # no job at all


def test_set_job_drops_entries_of_the_previous_job() -> None:
    book = DiagnosticsBook(JOB)
    rec = recorder()
    rec.join_job(JOB, 0)
    book.accept("p", JOB, rec.snapshot(WALL0, 0), 0)
    book.set_job(JOB)
    assert list(book.view(0)) == ["p"]
    book.set_job("job-2")
    assert book.view(0) == {}


def test_assignment_of_another_job_than_the_envelope_is_refused() -> None:
    book = DiagnosticsBook(JOB)
    rec = recorder()
    rec.join_job("job-2", 0)
    rec.start_assignment(assignment(jobId="job-2"), 0)
    with pytest.raises(WeeiError) as info:
        book.accept("p", JOB, rec.snapshot(WALL0, 0), 0)
    assert info.value.reason == "bad-diagnostics" and "assignment.jobId" in info.value.message


def test_receiver_fields_from_the_peer_are_not_trusted() -> None:
    book = DiagnosticsBook(JOB)
    rec = recorder()
    rec.join_job(JOB, 0)
    snap = rec.snapshot(WALL0, 0)
    snap.update(receivedAt=9e12, ageMs=-5, stale="no", connected=False, extra={"x": 1})
    book.accept("p", JOB, snap, 100)
    entry = book.view(150)["p"]
    assert entry["receivedAt"] == 100 and entry["ageMs"] == 50 and entry["connected"] is True
    assert set(entry) == TOP_LEVEL


def test_view_is_a_copy() -> None:
    book = DiagnosticsBook(JOB)
    rec = recorder()
    rec.join_job(JOB, 0)
    book.accept("p", JOB, rec.snapshot(WALL0, 0), 0)
    book.view(0)["p"]["environment"]["browser"] = "changed"
    assert book.view(0)["p"]["environment"]["browser"] == "Firefox"


# --- malformed snapshots -------------------------------------------------------------


def valid_record() -> dict[str, Any]:
    rec = recorder()
    rec.join_job(JOB, 0)
    rec.start_assignment(assignment(), 0)
    start_training(rec, 0)
    rec.progress(10, WALL0 + 100, 100, total=128)
    rec.progress(20, WALL0 + 200, 200)
    return rec.snapshot(WALL0 + 200, 200)


def with_change(path: str, value: Any) -> dict[str, Any]:
    record = valid_record()
    *parents, last = path.split(".")
    target = record
    for key in parents:
        target = target[key]
    if value is DELETE:
        del target[last]
    else:
        target[last] = value
    return record


DELETE = object()


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        ("schemaVersion", 2, "schemaVersion"),
        ("schemaVersion", True, "schemaVersion"),
        ("sequence", -1, "sequence"),
        ("sequence", 1.5, "sequence"),
        ("sequence", 2**60, "sequence"),
        ("sequence", "7", "sequence"),
        ("measuredAt", float("nan"), "measuredAt"),
        ("stage", "dreaming", "stage"),
        ("stage", DELETE, "stage"),
        ("environment", "Chrome", "environment"),
        ("environment.logicalCores", 0, "environment.logicalCores"),
        ("environment.browser", "x" * 5000, "environment.browser"),
        ("execution.requested", "unknown", "execution.requested"),
        ("execution.activeWorkers", True, "execution.activeWorkers"),
        ("gpu.webgpu", "yes", "gpu.webgpu"),
        ("gpu.adapter", {"vendor": "x"}, "gpu.adapter.architecture"),
        ("gpu.memoryBudgetMiB", float("inf"), "gpu.memoryBudgetMiB"),
        ("model.wasmSha256", "AB" * 32, "model.wasmSha256"),
        ("model.wgsl.sha256", ["00"], "model.wgsl.sha256[0]"),
        ("model.wgsl.present", 1, "model.wgsl.present"),
        ("assignment.batchSize", 0, "assignment.batchSize"),
        ("assignment.learningRate", "default", "assignment.learningRate"),
        ("assignment.round", None, "assignment.round"),
        ("error", 42, "error"),
        ("timings", None, "timings"),
        ("timings.trainingMs", -1, "timings.trainingMs"),
        ("performance.totalExamples", "many", "performance.totalExamples"),
        ("performance.currentExamplesPerSecond", [], "performance.currentExamplesPerSecond"),
    ],
)
def test_malformed_snapshot_is_refused_with_the_field_named(path: str, value: Any, named: str) -> None:
    book = DiagnosticsBook(JOB)
    with pytest.raises(WeeiError) as info:
        book.accept("p", JOB, with_change(path, value), 0)
    assert info.value.reason == "bad-diagnostics"
    assert f"diagnostics.{named}:" in info.value.message
    assert book.view(0) == {}


@pytest.mark.parametrize("value", [None, [], "x", 1, {"schemaVersion": 1}])
def test_non_records_are_refused(value: Any) -> None:
    with pytest.raises(WeeiError) as info:
        parse_diagnostics(value)
    assert info.value.reason == "bad-diagnostics"


def test_unknown_values_and_whole_floats_are_accepted() -> None:
    record = valid_record()
    record["model"] = "unknown"
    record["gpu"]["initializationError"] = "unknown"
    record["assignment"]["learningRate"] = "unknown"
    record["sequence"] = 12.0
    parsed = parse_diagnostics(record)
    assert parsed["model"] == "unknown" and parsed["sequence"] == 12 and isinstance(parsed["sequence"], int)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300)
@given(json_values)
def test_arbitrary_values_only_raise_the_named_error(value: Any) -> None:
    try:
        parse_diagnostics(value)
    except WeeiError as error:
        assert error.reason == "bad-diagnostics"


def leaf_paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in leaf_paths(v, (*prefix, k))] + [prefix]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in leaf_paths(v, (*prefix, i))] + [prefix]
    return [prefix]


@settings(max_examples=300, deadline=None)  # a loaded machine is slow, not wrong
@given(st.data())
def test_mutated_records_only_raise_the_named_error(data: st.DataObject) -> None:
    record = valid_record()
    record["model"]["wgsl"] = {"present": True, "sha256": [SHA]}
    paths = [p for p in leaf_paths(record) if p]
    path = data.draw(st.sampled_from(paths))
    target = record
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = data.draw(json_values)
    try:
        parsed = parse_diagnostics(copy.deepcopy(record))
    except WeeiError as error:
        assert error.reason == "bad-diagnostics"
    else:
        assert set(parsed) == TOP_LEVEL


# --- uniformity ----------------------------------------------------------------------


def record_for(**assignment_changes: Any) -> dict[str, Any]:
    rec = recorder()
    rec.join_job(JOB, 0)
    rec.start_assignment(assignment(**assignment_changes), 0)
    return rec.snapshot(WALL0, 0)


def test_uniform_when_everything_matches() -> None:
    book = DiagnosticsBook(JOB)
    book.accept("a", JOB, record_for(), 0)
    book.accept("b", JOB, record_for(learningRate=0.01, chunkId="c-2"), 0)
    result = uniformity(book.view(0))
    assert result.uniform and result.differences == () and dict(result.unknown) == {}


def test_differences_are_listed_by_peer() -> None:
    book = DiagnosticsBook(JOB)
    book.accept("a", JOB, record_for(), 0)
    other = record_for(batchSize=64)
    other["model"]["wasmSha256"] = "cd" * 32
    book.accept("b", JOB, other, 0)
    result = uniformity(book.view(0))
    assert not result.uniform
    assert [d.to_json() for d in result.differences] == [
        {"field": "model.wasmSha256", "values": {"a": SHA, "b": "cd" * 32}},
        {"field": "assignment.batchSize", "values": {"a": 32, "b": 64}},
    ]


def test_unknown_is_missing_data_not_a_difference() -> None:
    book = DiagnosticsBook(JOB)
    book.accept("a", JOB, record_for(), 0)
    unknown_lr = record_for(learningRate="unknown")
    unknown_lr["model"] = "unknown"
    book.accept("b", JOB, unknown_lr, 0)
    between = recorder()
    between.join_job(JOB, 0)
    book.accept("c", JOB, between.snapshot(WALL0, 0), 0)  # between assignments
    result = uniformity(book.view(0)).to_json()
    assert result["uniform"] is True
    assert result["unknown"]["b"] == ["model.id", "model.version", "model.wasmSha256", "assignment.learningRate"]
    assert result["unknown"]["c"] == ["assignment.batchSize", "assignment.localEpochs", "assignment.learningRate"]


def test_the_update_s_bytes_as_sent_are_shown_and_parsed() -> None:
    # Issue 25: a compressed update's size, not the weights', is what left; an older peer's record lacks it.
    rec = recorder()
    rec.join_job(JOB, 0)
    rec.start_assignment(assignment(), 0)
    rec.update_sent(152_380)
    record = rec.snapshot(WALL0, 0)
    assert record["performance"]["uploadBytes"] == 152_380
    assert parse_diagnostics(record)["performance"]["uploadBytes"] == 152_380
    older = copy.deepcopy(record)
    del older["performance"]["uploadBytes"]
    assert parse_diagnostics(older)["performance"]["uploadBytes"] is None
    older["performance"]["uploadBytes"] = -1
    with pytest.raises(WeeiError):
        parse_diagnostics(older)
    rec.start_assignment(assignment(round=2), 10)
    assert rec.snapshot(WALL0, 10)["performance"]["uploadBytes"] is None
