"""TrainProgress reports are parsed only as often as anyone looks, and the last one always arrives
(weei/runtime/progress_reports.py; docs/abi.md, "TrainProgress").

The thinning runs under a clock passed in; then the real digits model in
wasmtime, which reports after every batch: with thinning it trains to the
same bits, hands on its first and its final report, and parses a few
reports instead of 47.
"""

from __future__ import annotations

import json

import pytest

from weei.core.errors import ModelError, ModelReason
from weei.demo.run import models_dir
from weei.runtime import ModelRuntime, WasmtimeEngine
from weei.runtime.progress_reports import PARSE_INTERVAL_S, ProgressReports
from weei.runtime.results import TrainProgress


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def raw(processed: int, total: int = 10, **extra: object) -> bytes:
    return json.dumps({"processedExamples": processed, "totalExamples": total, **extra}).encode()


def test_the_first_report_is_parsed_at_once_then_one_per_interval_and_the_newest_at_the_end() -> None:
    clock = Clock()
    reports = ProgressReports(0.02, clock)
    reports.start()
    assert reports.report("train", raw(1)) == TrainProgress(1, 10, {})
    clock.now += 0.01
    assert reports.report("train", raw(2)) is None  # kept, not parsed
    assert reports.report("train", raw(3)) is None
    clock.now += 0.011
    assert reports.report("train", raw(4, metrics={"loss": 0.5})) == TrainProgress(4, 10, {"loss": 0.5})
    clock.now += 0.001
    assert reports.report("train", raw(9)) is None
    assert reports.report("train", raw(10)) is None
    assert reports.flush() == TrainProgress(10, 10, {})  # the newest kept one: the final report arrives
    assert reports.flush() is None  # once
    reports.start()  # the next operation's first report goes at once, however soon
    assert reports.report("evaluate", raw(1)) == TrainProgress(1, 10, {})


def test_a_malformed_report_is_recorded_when_parsed_and_never_when_superseded() -> None:
    clock = Clock()
    reports = ProgressReports(0.02, clock)
    reports.start()
    assert reports.report("train", b"{not json") is None  # parsed at once: malformed, recorded
    assert reports.report("train", raw(11)) is None  # processed > total, but superseded before it is parsed
    assert reports.report("train", raw(5)) is None
    assert reports.flush() == TrainProgress(5, 10, {})
    assert len(reports.rejections) == 1 and "malformed-result" in reports.rejections[0]
    reports.start()
    reports.report("train", raw(1))
    reports.report("train", raw(12))
    assert reports.flush() is None  # the last one is malformed: recorded, not delivered
    assert len(reports.rejections) == 2 and "progress-invalid" in reports.rejections[1]
    reports.reject("train", ModelError(ModelReason.REGION_OUT_OF_BOUNDS, "progress at 9+9"))
    assert reports.rejections[-1] == "train: progress at 9+9 [region-out-of-bounds]"


def test_an_interval_of_zero_parses_every_report() -> None:
    reports = ProgressReports(0.0, Clock())
    reports.start()
    assert [reports.report("train", raw(i)) for i in range(1, 4)] == [TrainProgress(i, 10, {}) for i in range(1, 4)]
    assert reports.flush() is None


@pytest.fixture(scope="module")
def digits() -> tuple[bytes, bytes]:
    """The digits model and one chunk of all three committed chunks' examples (batches of 32: 47 reports)."""
    folder = models_dir() / "digits-mlp"
    files = [p.read_bytes() for p in sorted((folder / "data").glob("training-*.bin"))]
    records = b"".join(f[8:] for f in files)
    return (folder / "model.wasm").read_bytes(), b"WDG1" + (len(records) // 65).to_bytes(4, "little") + records


@pytest.mark.parametrize("interval", [0.0, 3600.0, PARSE_INTERVAL_S])
def test_thinned_progress_trains_the_same_bits_and_the_final_report_arrives(digits: tuple[bytes, bytes],
                                                                            interval: float) -> None:
    wasm, chunk = digits
    seen: list[TrainProgress] = []
    runtime = ModelRuntime.load(wasm, WasmtimeEngine(), on_progress=seen.append)
    runtime.progress.interval_s = interval
    weights = runtime.create_initial_weights(1)
    runtime.load_model(weights)
    result = runtime.train(data=chunk, format="weei-digits-v1", seed=7, settings={"localEpochs": 1, "batchSize": 32})
    examples = len(chunk[8:]) // 65
    assert seen[-1].processed_examples == seen[-1].total_examples == examples
    assert [p.processed_examples for p in seen] == sorted(p.processed_examples for p in seen)
    if interval == 0.0:
        assert len(seen) == -(-examples // 32)  # every batch's report
    elif interval == 3600.0:
        assert len(seen) == 2 and seen[0].processed_examples == 32  # the first, and the last
    reference = ModelRuntime.load(wasm, WasmtimeEngine())
    reference.progress.interval_s = 0.0
    reference.load_model(weights)
    assert reference.train(data=chunk, format="weei-digits-v1", seed=7,
                           settings={"localEpochs": 1, "batchSize": 32}).weights == result.weights
