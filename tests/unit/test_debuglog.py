"""The debug log: 1,000-event cap, baseline statistics, idle gaps, corrupt storage."""

from __future__ import annotations

import json
import statistics
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weei.core.observe.debuglog import MAX_EVENTS, MAX_PHASE_SAMPLES, DebugLog, iso8601
from weei.core.errors import UsageError

T0 = 1_714_564_800_000  # 2024-05-01T12:00:00.000Z


def test_iso8601_matches_javascript_to_iso_string() -> None:
    assert iso8601(T0) == "2024-05-01T12:00:00.000Z"
    assert iso8601(T0 + 123.4) == "2024-05-01T12:00:00.123Z"
    assert iso8601(0) == "1970-01-01T00:00:00.000Z"
    assert iso8601(-1) == "1969-12-31T23:59:59.999Z"
    for bad in (float("nan"), float("inf"), 1e20, "0", True):
        with pytest.raises(UsageError):
            iso8601(bad)  # type: ignore[arg-type]


def test_keeps_the_last_thousand_events() -> None:
    log = DebugLog()
    for i in range(MAX_EVENTS + 250):
        log.record(T0 + i, "tick", {"i": i})
    events = log.events()
    assert len(events) == MAX_EVENTS
    assert events[0]["details"] == {"i": 250} and events[-1]["details"] == {"i": MAX_EVENTS + 249}
    assert DebugLog.from_json(log.to_json(), T0).events() == events


def test_event_shape_and_details_are_copied_as_json() -> None:
    log = DebugLog()
    details: dict[str, Any] = {"peer": "p", "values": [1, 2.5, float("nan")], "obj": object.__new__(object)}
    log.record(T0, "aggregation.started", details)
    log.record(T0 + 1, "job.left")
    details["peer"] = "changed"
    first, second = log.events()
    assert first["at"] == "2024-05-01T12:00:00.000Z" and first["event"] == "aggregation.started"
    assert first["details"]["peer"] == "p" and first["details"]["values"][:2] == [1, 2.5]
    assert first["details"]["values"][2] == "nan" and first["details"]["obj"].startswith("<object")
    assert second == {"at": "2024-05-01T12:00:00.001Z", "event": "job.left"}  # no details key at all
    json.loads(log.to_json())  # storable: no NaN, no objects
    with pytest.raises(UsageError):
        log.record(T0, "")


def test_phase_baseline_statistics() -> None:
    log = DebugLog()
    durations = [30.0, 10.0, 20.0, 50.0]
    mono = 0.0
    for d in durations:
        log.phase_started("fedavg", mono)
        assert log.phase_finished("fedavg", mono + d, T0) == d
        mono += 1000
    log.add_phase("indexeddb.checkpoint-save", 7.5, T0)
    phases = log.to_file(T0)["baseline"]["phases"]
    assert phases["fedavg"] == {"count": 4, "minMs": 10.0, "avgMs": 27.5, "p50Ms": 25.0, "maxMs": 50.0}
    assert phases["indexeddb.checkpoint-save"] == {"count": 1, "minMs": 7.5, "avgMs": 7.5, "p50Ms": 7.5, "maxMs": 7.5}
    finished = [e for e in log.events() if e["event"] == "phase.finished"]
    assert finished[0]["details"] == {"phase": "fedavg", "durationMs": 30.0}


def test_p50_is_over_the_kept_window_and_the_rest_over_all_time() -> None:
    log = DebugLog()
    log.add_phase("p", 1_000_000.0, T0)  # pushed out of the window later
    for i in range(MAX_PHASE_SAMPLES):
        log.add_phase("p", float(i % 7), T0)
    stats = log.baseline()["phases"]["p"]
    assert stats["count"] == MAX_PHASE_SAMPLES + 1
    assert stats["maxMs"] == 1_000_000.0
    assert stats["p50Ms"] == statistics.median([float(i % 7) for i in range(MAX_PHASE_SAMPLES)])
    assert stats["avgMs"] == pytest.approx((1_000_000 + sum(i % 7 for i in range(MAX_PHASE_SAMPLES))) / (MAX_PHASE_SAMPLES + 1))


@settings(max_examples=50)
@given(st.lists(st.floats(0, 1e6), min_size=1, max_size=50))
def test_p50_is_exact(durations: list[float]) -> None:
    log = DebugLog()
    for d in durations:
        log.add_phase("p", d, T0)
    assert log.baseline()["phases"]["p"]["p50Ms"] == statistics.median(durations)


def test_idle_is_the_gap_between_phases_of_a_round() -> None:
    log = DebugLog()
    log.phase_started("outside", 0)  # phases outside a round add no idle time
    log.phase_finished("outside", 5, T0)
    log.round_started(100)
    log.phase_started("collect", 150)  # 50 ms after the round start: not between phases
    log.phase_finished("collect", 200, T0)
    log.phase_started("fedavg", 230)  # idle 30
    log.phase_started("indexeddb.checkpoint-save", 240)  # overlaps: no idle
    log.phase_finished("fedavg", 260, T0)
    log.phase_finished("indexeddb.checkpoint-save", 300, T0)
    log.phase_started("broadcast", 310)  # idle 10
    log.phase_finished("broadcast", 320, T0)
    log.round_finished(400)  # 80 ms after the last phase: not between phases
    log.phase_started("collect", 500)  # next round not started: no idle
    log.phase_finished("collect", 510, T0)
    assert log.baseline()["idle"] == {"samples": 2, "totalMs": 40.0, "avgMs": 20.0}


def test_idle_without_samples() -> None:
    assert DebugLog().baseline()["idle"] == {"samples": 0, "totalMs": 0.0, "avgMs": 0.0}


def test_phase_misuse_is_a_usage_error() -> None:
    log = DebugLog()
    with pytest.raises(UsageError):
        log.phase_finished("fedavg", 0, T0)
    log.phase_started("fedavg", 0)
    with pytest.raises(UsageError):
        log.phase_started("fedavg", 1)
    with pytest.raises(UsageError):
        log.add_phase("x", -1, T0)
    with pytest.raises(UsageError):
        log.add_phase("", 1, T0)


def test_file_has_exactly_the_spec_fields() -> None:
    log = DebugLog()
    log.record(T0, "job.created", {"jobId": "j"})
    log.add_phase("fedavg", 12.0, T0)
    file = log.to_file(T0 + 60_000)
    assert set(file) == {"schemaVersion", "exportedAt", "baseline", "events"}
    assert file["schemaVersion"] == 2 and file["exportedAt"] == "2024-05-01T12:01:00.000Z"
    assert set(file["baseline"]) == {"phases", "idle"}
    assert set(file["baseline"]["idle"]) == {"samples", "totalMs", "avgMs"}
    assert all(set(e) <= {"at", "event", "details"} for e in file["events"])
    json.dumps(file, allow_nan=False)


def test_persistence_round_trip() -> None:
    log = DebugLog()
    log.round_started(0)
    log.phase_started("a", 0)
    log.phase_finished("a", 10, T0)
    log.phase_started("b", 25)
    log.phase_finished("b", 30, T0 + 1)
    log.record(T0 + 2, "note", {"nested": {"list": [1, "two", None, True]}})
    restored = DebugLog.from_json(log.to_json(), T0 + 3)
    assert restored.to_file(T0 + 3) == log.to_file(T0 + 3)
    assert DebugLog.from_json(None, T0).events() == []  # nothing stored yet: no reset event


@pytest.mark.parametrize(
    "stored",
    [
        "",
        "{not json",
        "[]",
        "null",
        '"text"',
        '{"storageVersion": 99, "events": []}',
        '{"storageVersion": true, "events": []}',
        '{"events": []}',
        "[" * 100_000,
        b"bytes",
    ],
)
def test_unreadable_storage_starts_empty_with_a_reset_event(stored: Any) -> None:
    log = DebugLog.from_json(stored, T0)
    events = log.events()
    assert len(events) == 1
    assert events[0]["event"] == "debuglog.reset" and events[0]["details"]["part"] == "all"
    assert events[0]["details"]["reason"]
    assert log.baseline()["phases"] == {}
    log.record(T0 + 1, "still.works")  # and the log goes on
    assert len(log.events()) == 2


def stored_log() -> dict[str, Any]:
    log = DebugLog()
    log.record(T0, "job.created")
    log.add_phase("fedavg", 5.0, T0)
    return json.loads(log.to_json())


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda d: d["phases"]["fedavg"].update(count="x"),
        lambda d: d["phases"]["fedavg"].update(recent=[]),
        lambda d: d["phases"]["fedavg"].update(minMs=-1),
        lambda d: d["phases"]["fedavg"].update(maxMs=1.0),  # below a kept duration
        lambda d: d.update(idle=None),
        lambda d: d.update(phases=[]),
        # Counts past float's range (valid JSON): the averages divided by them raised OverflowError (make fuzz).
        lambda d: d["phases"]["fedavg"].update(count=10**400),
        lambda d: d.update(idle={"samples": 10**400, "totalMs": 5.0}),
    ],
)
def test_corrupt_baseline_keeps_the_events(corrupt: Any) -> None:
    data = stored_log()
    corrupt(data)
    log = DebugLog.from_json(json.dumps(data), T0 + 5)
    events = log.events()
    assert [e["event"] for e in events] == ["job.created", "phase.finished", "debuglog.reset"]
    assert events[-1]["details"]["part"] == "baseline"
    assert log.baseline()["phases"] == {}


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda d: d.update(events={}),
        lambda d: d["events"].append({"at": 1, "event": "x"}),
        lambda d: d["events"].append({"at": "x", "event": "x", "details": []}),
        lambda d: d["events"].append("event"),
    ],
)
def test_corrupt_events_keep_the_baseline(corrupt: Any) -> None:
    data = stored_log()
    corrupt(data)
    log = DebugLog.from_json(json.dumps(data), T0 + 5)
    assert [e["event"] for e in log.events()] == ["debuglog.reset"]
    assert log.events()[0]["details"]["part"] == "events"
    assert log.baseline()["phases"]["fedavg"]["count"] == 1


def test_nan_in_storage_is_refused_so_it_can_be_stored_again() -> None:
    data = stored_log()
    text = json.dumps(data).replace('"totalMs":5.0', '"totalMs":NaN').replace('"totalMs": 5.0', '"totalMs": NaN')
    assert "NaN" in text
    log = DebugLog.from_json(text, T0)
    assert log.events()[0]["event"] == "debuglog.reset"
    json.loads(log.to_json())


@settings(max_examples=200)
@given(st.text(max_size=200) | st.binary(max_size=50))
def test_any_stored_value_gives_a_working_log(stored: Any) -> None:
    log = DebugLog.from_json(stored, T0)
    log.record(T0, "x")
    json.loads(log.to_json())


def test_clear_deletes_events_and_baseline() -> None:
    log = DebugLog()
    log.record(T0, "x")
    log.add_phase("fedavg", 1.0, T0)
    log.phase_started("inflight", 0)
    log.clear()
    assert log.to_file(T0)["events"] == [] and log.baseline()["phases"] == {}
    log.phase_finished("inflight", 4, T0)  # a phase in flight still finishes
    assert log.baseline()["phases"]["inflight"]["count"] == 1


# ------------------------------------------------------------ a coordinator's rounds


def test_round_phases_measure_the_gaps_between_training_aggregation_and_save() -> None:
    log = DebugLog()
    log.round_phase(1, "round.training", 0, 100, T0)
    log.round_phase(1, "fedavg", 103, 110, T0)  # idle 3
    log.round_phase(1, "indexeddb.checkpoint-save", 125, 140, T0)  # idle 15
    log.round_finished(140, 1)
    log.round_phase(2, "round.training", 150, 300, T0)  # a new round: the 10 ms before it are not idle
    log.round_finished(300, 1)  # another round's end does not end round 2
    log.round_phase(2, "fedavg", 302, 304, T0)  # idle 2
    base = log.baseline()
    assert base["idle"] == {"samples": 3, "totalMs": 20.0, "avgMs": 20.0 / 3}
    assert base["phases"]["fedavg"]["count"] == 2 and base["phases"]["fedavg"]["maxMs"] == 7.0
    assert base["phases"]["round.training"]["avgMs"] == 125.0
    with pytest.raises(UsageError) as err:
        log.round_phase(2, "fedavg", 310, 305, T0)
    assert err.value.reason == "bad-duration"


@pytest.mark.parametrize("method", ["fedavg", "fedavgm", "fedadam"])
def test_a_coordinator_times_training_and_aggregation_on_the_hosts_stopwatch(method: str) -> None:
    from sim import Sim, dataset_spec

    spec, store = dataset_spec(4, settings={"epochs": 1, "aggregation": {"method": method}})
    sim = Sim.start_job(spec, store, ["p1"], start=False)
    sim.auto_train = False
    clock = [1000.0]

    def stopwatch() -> float:  # simulated time: every reading is 1 ms after the last
        clock[0] += 1
        return clock[0]

    sim.coordinator.stopwatch = stopwatch
    sim.coordinator.start(sim.now)
    sim.pump()
    log = DebugLog()
    for round_ in (1, 2):
        clock[0] += 500  # the participant trains for half a second
        sim.finish()
        phases = [p for p in sim.phases if p.round == round_]
        assert [p.name for p in phases] == ["round.training", method]
        training, aggregation = phases
        assert training.finished - training.started == 501  # from the hand-out to the last update
        assert aggregation.started == training.finished + 1 and aggregation.finished == aggregation.started + 1
        # What the host does with it: replay into the debug log, then its own save of the checkpoint.
        for phase in phases:
            log.round_phase(phase.round, phase.name, phase.started, phase.finished, T0)
        log.round_phase(round_, "indexeddb.checkpoint-save", aggregation.finished + 4, aggregation.finished + 9, T0)
        log.round_finished(aggregation.finished + 9, round_)
    started = [l.details for _, l in sim.logs if l.event == "aggregation.started"]
    assert started == [{"round": 1, "method": method, "updates": 1}, {"round": 2, "method": method, "updates": 1}]
    base = log.baseline()
    assert base["phases"][method]["count"] == 2 and base["phases"][method]["avgMs"] == 1.0
    assert base["idle"] == {"samples": 4, "totalMs": 2 * (1 + 4), "avgMs": 2.5}
