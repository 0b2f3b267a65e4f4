"""Chunk queues by pass and experience unit ranges: pure bookkeeping."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weei.core.job.schedule import MAX_ATTEMPTS, DatasetSchedule, ExperienceSchedule, UnitWork

IDS = ["a", "b", "c", "d", "e"]


def test_a_pass_in_order_then_the_next() -> None:
    s = DatasetSchedule(IDS, planned_epochs=2)
    assert [s.take() for _ in range(3)] == ["a", "b", "c"]
    assert s.remaining == IDS and s.progress == 0
    for c in "abc":
        s.mark_trained(c)
    assert s.end_round() is False
    assert s.remaining == ["d", "e"] and s.progress == pytest.approx(0.6)
    assert [s.take(), s.take(), s.take()] == ["d", "e", None]
    s.mark_trained("d")
    s.mark_trained("e")
    assert s.end_round() is True
    assert s.epoch == 1 and not s.finished and list(s.queue) == IDS and s.trained == []
    while (c := s.take()) is not None:
        s.mark_trained(c)
    assert s.end_round() and s.finished and s.remaining == [] and s.progress == 2.0
    assert s.take() is None


def test_given_back_work_goes_first_and_keeps_the_pass_open() -> None:
    s = DatasetSchedule(IDS, planned_epochs=1)
    a, b = s.take(), s.take()
    s.give_back(b, failed=False)
    assert s.take() == "b"
    s.mark_trained(a)
    s.give_back("b", failed=False)
    assert list(s.queue)[:1] == ["b"] and s.remaining == ["b", "c", "d", "e"]


def test_in_flight_work_holds_the_pass_open() -> None:
    s = DatasetSchedule(["a"], planned_epochs=1)
    s.take()
    assert s.end_round() is False and s.epoch == 0
    s.mark_trained("a")
    assert s.end_round() is True and s.finished


def test_work_failing_max_attempts_is_dropped() -> None:
    s = DatasetSchedule(["a", "b"], planned_epochs=1)
    for attempt in range(MAX_ATTEMPTS):
        assert s.take() == "a"
        s.give_back("a", failed=True)
    assert s.dropped == ["a"] and s.remaining == ["b"]
    assert s.take() == "b"


def test_disconnects_and_deadlines_do_not_count_as_failures() -> None:
    s = DatasetSchedule(["a"], planned_epochs=1)
    for _ in range(MAX_ATTEMPTS * 3):
        assert s.take() == "a"
        s.give_back("a", failed=False)
    assert s.dropped == []


def test_restored_queue_and_continue_passes() -> None:
    s = DatasetSchedule(IDS, planned_epochs=3, epoch=1, remaining=["d", "b", "zz"])
    assert list(s.queue) == ["d", "b"]  # unknown ids are ignored
    assert s.trained == ["a", "c", "e"] and s.remaining == ["b", "d"]
    done = DatasetSchedule(IDS, planned_epochs=3, epoch=2, remaining=[])
    done.continue_passes()
    assert done.epoch == 2 and list(done.queue) == IDS and done.trained == []
    finished = DatasetSchedule(IDS, planned_epochs=2, epoch=2, remaining=[])
    finished.continue_passes()
    assert list(finished.queue) == [] and finished.finished
    busy = DatasetSchedule(IDS, planned_epochs=2)
    busy.take()
    busy.continue_passes()
    assert list(busy.queue) == IDS[1:]


def test_shuffle_is_seeded_and_keeps_what_was_trained() -> None:
    s = DatasetSchedule(IDS, planned_epochs=2)
    s.take()
    s.mark_trained("a")
    s.shuffle(42)
    t = DatasetSchedule(IDS, planned_epochs=2)
    t.take()
    t.mark_trained("a")
    t.shuffle(42)
    assert s.order == t.order and sorted(s.order) == IDS and s.shuffled
    assert list(s.queue) == [c for c in s.order if c != "a"]


def test_duplicate_ids_are_refused() -> None:
    with pytest.raises(ValueError):
        DatasetSchedule(["a", "a"], planned_epochs=1)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["train", "fail", "back", "end"]), st.integers(0, 4)), max_size=60))
def test_every_chunk_is_queued_in_flight_trained_or_dropped(ops: list[tuple[str, int]]) -> None:
    s = DatasetSchedule(IDS, planned_epochs=3)
    flying: list[str] = []
    for op, i in ops:
        if op == "end":
            for c in flying:
                s.give_back(c, failed=False)
            flying = []
            s.end_round()
            continue
        c = s.take()
        if c is None:
            continue
        flying.append(c)
        if op == "train":
            s.mark_trained(flying.pop())
        elif op == "fail":
            s.give_back(flying.pop(), failed=True)
        queued, inflight = list(s.queue), s.in_flight
        assert len(queued) == len(set(queued)) and not set(queued) & inflight
        if not s.finished:
            assert set(queued) | inflight | set(s.trained) | set(s.dropped) == set(IDS)
        assert 0 <= s.progress <= s.planned_epochs


def test_experience_ranges_and_retries() -> None:
    e = ExperienceSchedule(32, next_unit=64)
    w1, w2 = e.take(), e.take()
    assert (w1, w2) == (UnitWork(64, 32), UnitWork(96, 32)) and e.next_unit == 128
    e.give_back(w2, failed=False)
    e.give_back(w1, failed=True)
    assert e.take() == w1 and e.take() == w2 and e.take() == UnitWork(128, 32)


def test_experience_range_failing_max_attempts_is_dropped() -> None:
    e = ExperienceSchedule(8)
    w = e.take()
    for _ in range(MAX_ATTEMPTS):
        e.give_back(w, failed=True)
        if e.retry:
            assert e.take() == w
    assert e.dropped == [w] and e.take() == UnitWork(8, 8)


def test_units_per_assignment_change_applies_to_new_ranges() -> None:
    e = ExperienceSchedule(8)
    w = e.take()
    e.units_per_assignment = 4
    e.give_back(w, failed=False)
    assert e.take() == w and e.take() == UnitWork(8, 4)
