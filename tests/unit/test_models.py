"""The reference models (app/static/models/*/model.wasm) through weei.runtime."""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

import numpy as np
import pytest

from weei.core.errors import ModelError
from weei.runtime import ModelRuntime, WasmtimeEngine

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "app" / "static" / "models"
DATA = MODELS / "digits-mlp" / "data"
FMT = "weei-digits-v1"


def load(model_id: str, progress: list | None = None) -> ModelRuntime:
    """The model in wasmtime, every progress report parsed: these tests check what the model reports."""
    wasm = (MODELS / model_id / "model.wasm").read_bytes()
    runtime = ModelRuntime.load(wasm, WasmtimeEngine(), on_progress=progress.append if progress is not None else None)
    runtime.progress.interval_s = 0
    return runtime


def floats(weights: bytes) -> np.ndarray:
    return np.frombuffer(weights, dtype="<f4")


def seed_of(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "big")


@pytest.fixture(scope="module")
def chunks() -> list[bytes]:
    return [p.read_bytes() for p in sorted(DATA.glob("training-*.bin"))]


@pytest.fixture(scope="module")
def validation() -> bytes:
    return (DATA / "validation.bin").read_bytes()


# -- digits-mlp ---------------------------------------------------------------------


def test_digits_info_and_weights() -> None:
    rt = load("digits-mlp")
    info = rt.model_info()
    assert info["id"] == "digits-mlp" and info["abiVersion"] == 1 and info["maxWorkers"] == 1
    assert [m["id"] for m in info["metrics"]] == ["loss", "accuracy"]
    assert [f["id"] for f in info["dataFormats"]] == [FMT]
    w = rt.create_initial_weights(5)
    assert len(w) == (64 * 64 + 64 + 64 * 10 + 10) * 4
    assert w == rt.create_initial_weights(5)
    assert w != rt.create_initial_weights(6)
    assert np.all(np.isfinite(floats(w))) and np.abs(floats(w)).max() < 0.4


def test_digits_chunks_are_described(chunks: list[bytes], validation: bytes) -> None:
    rt = load("digits-mlp")
    assert len(chunks) == 15
    assert [rt.describe_chunk(FMT, c) for c in chunks] == [100] * 15
    assert rt.describe_chunk(FMT, validation) == 1797 - 1500


def test_digits_training_lowers_loss_and_raises_accuracy(chunks: list[bytes]) -> None:
    progress: list = []
    rt = load("digits-mlp", progress)
    w0 = rt.create_initial_weights(1)
    rt.load_model(w0)
    before = rt.evaluate(data=chunks[0], format=FMT)
    assert before.examples == 100
    rt.load_model(w0)
    result = rt.train(data=chunks[0], format=FMT, seed=3, settings={"localEpochs": 5, "batchSize": 16})
    assert result.unique_examples == 100
    assert result.optimizer_steps == 5 * 7  # ceil(100 / 16) per pass
    assert len(result.weights) == len(w0)
    rt.load_model(result.weights)
    after = rt.evaluate(data=chunks[0], format=FMT)
    assert after.metrics["loss"] < 0.5 * before.metrics["loss"]
    assert after.metrics["accuracy"] > before.metrics["accuracy"] + 0.5
    # progress: examples trained so far out of epochs x examples, with metrics
    assert [p.processed_examples for p in progress][:3] == [16, 32, 48]
    assert progress[-1].processed_examples == progress[-1].total_examples == 500
    assert set(progress[-1].metrics) == {"loss", "accuracy"}
    assert progress[-1].metrics["loss"] == pytest.approx(result.metrics["loss"])


def test_digits_learns_the_task(chunks: list[bytes], validation: bytes) -> None:
    rt = load("digits-mlp")
    w = rt.create_initial_weights(2)
    for epoch in range(3):
        for k, chunk in enumerate(chunks):
            rt.load_model(w)
            w = rt.train(data=chunk, format=FMT, seed=seed_of(epoch, k), settings={"batchSize": 32}).weights
    rt.load_model(w)
    val = rt.evaluate(data=validation, format=FMT)
    assert val.examples == 297
    assert val.metrics["accuracy"] >= 0.9
    assert val.metrics["loss"] < 0.4


def test_digits_training_is_deterministic(chunks: list[bytes]) -> None:
    rt = load("digits-mlp")
    w0 = rt.create_initial_weights(1)

    def train(seed: int, settings: dict) -> bytes:
        rt.load_model(w0)
        return rt.train(data=chunks[1], format=FMT, seed=seed, settings=settings).weights

    a = train(9, {"batchSize": 10})
    assert a == train(9, {"batchSize": 10})
    assert a != train(10, {"batchSize": 10})  # the seed shuffles the batches
    assert a == train(9, {"batchSize": 10, "learningRate": 0.01})  # the default rate
    assert a != train(9, {"batchSize": 10, "learningRate": 0.02})
    # train does not change the loaded weights: evaluate after a fresh load matches
    rt.load_model(w0)
    e1 = rt.evaluate(data=chunks[1], format=FMT)
    rt.load_model(w0)
    train(9, {})
    rt.load_model(w0)
    assert rt.evaluate(data=chunks[1], format=FMT) == e1


def _with_header(n: int, records: bytes) -> bytes:
    return b"WDG1" + struct.pack("<I", n) + records


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda c: c[:-1], "bytes, but a header announcing 100 examples needs 6508"),
        (lambda c: c + b"\x00", "bytes, but a header announcing 100 examples needs 6508"),
        (lambda c: c[:5], "shorter than its 8-byte header"),
        (lambda c: b"WDG2" + c[4:], "bad magic"),
        (lambda c: _with_header(101, c[8:]), "announcing 101 examples"),
        (lambda c: c[:8 + 64] + b"\x0a" + c[8 + 65:], "label above 9"),
        (lambda c: c[:8] + b"\x11" + c[9:], "pixel intensity above 16"),
        (lambda c: _with_header(20000, b""), "more than 10000 examples"),
    ],
)
def test_digits_bad_chunk_bytes_are_refused(chunks: list[bytes], mutate, expected: str) -> None:
    rt = load("digits-mlp")
    bad = mutate(chunks[0])
    with pytest.raises(ModelError) as info:
        rt.describe_chunk(FMT, bad)
    assert info.value.reason == "operation-failed"
    assert "weei-digits-v1" in str(info.value) and expected in str(info.value)
    rt.load_model(rt.create_initial_weights(0))
    with pytest.raises(ModelError, match=expected):
        rt.train(data=bad, format=FMT, seed=1)
    rt.load_model(rt.create_initial_weights(0))
    with pytest.raises(ModelError, match=expected):
        rt.evaluate(data=bad, format=FMT)
    # the instance still works after a refused file
    assert rt.describe_chunk(FMT, chunks[0]) == 100


def test_digits_refuses_other_inputs(chunks: list[bytes]) -> None:
    rt = load("digits-mlp")
    with pytest.raises(ModelError, match="unknown data format"):
        rt.describe_chunk("weei-digits-v2", chunks[0])
    with pytest.raises(ModelError, match="must be 19240 bytes"):
        rt.load_model(b"\x00" * 456)
    with pytest.raises(ModelError, match="not finite"):
        rt.load_model(struct.pack("<f", float("nan")) * 4810)
    rt.load_model(rt.create_initial_weights(0))
    with pytest.raises(ModelError, match="batchSize"):
        rt.train(data=chunks[0], format=FMT, seed=1, settings={"batchSize": 0})
    rt.load_model(rt.create_initial_weights(0))
    with pytest.raises(ModelError, match="learningRate"):
        rt.train(data=chunks[0], format=FMT, seed=1, settings={"learningRate": -1})
    rt.load_model(rt.create_initial_weights(0))
    with pytest.raises(ModelError, match="dataset model"):
        rt.train(experience=(0, 4, 1))


# -- cartpole-reinforce ---------------------------------------------------------------


def test_cartpole_info_matches_the_spec() -> None:
    info = load("cartpole-reinforce").model_info()
    assert info == {
        "id": "cartpole-reinforce",
        "version": "1.0.0",
        "name": "CartPole policy (REINFORCE)",
        "abiVersion": 1,
        "weightFormat": "float32-le",
        "maxWorkers": 4,
        "dataFormats": [],
        "metrics": [{"id": "episodeReturn", "label": "Episode return", "direction": "maximize"}],
        "capabilities": {"evaluation": True},
        "workSource": {
            "kind": "experience",
            "inputs": "none",
            "unit": {"id": "episode", "label": "Episodes"},
            "unitsPerAssignment": {"default": 32, "minimum": 1, "maximum": 4096},
            "evaluationUnits": 32,
        },
        "auxiliaryWeights": [],
    }


def test_cartpole_same_seed_same_weights() -> None:
    progress: list = []
    rt = load("cartpole-reinforce", progress)
    w0 = rt.create_initial_weights(1)
    assert len(w0) == 456

    def train(unit_start: int, seed: int, count: int = 32):
        rt.load_model(w0)
        return rt.train(experience=(unit_start, count, seed), settings={"localEpochs": 1, "batchSize": 16})

    a = train(0, 42)
    assert a.completed_units == 32 and a.unique_examples is None
    assert a.optimizer_steps == 2  # an update every 16 episodes
    assert 8 <= a.metrics["episodeReturn"] <= 500
    assert [p.processed_examples for p in progress] == list(range(1, 33))
    assert {p.total_examples for p in progress} == {32}
    b = train(0, 42)
    assert a.weights == b.weights and a.metrics == b.metrics
    c = train(0, 43)
    assert c.weights != a.weights
    assert train(32, 42).weights != a.weights  # another unit range plays other episodes
    assert not np.array_equal(floats(a.weights), floats(w0))
    d = train(0, 42, count=20)  # the last group may be smaller
    assert d.completed_units == 20 and d.optimizer_steps == 2


def test_cartpole_evaluation_is_deterministic() -> None:
    rt = load("cartpole-reinforce")
    rt.load_model(rt.create_initial_weights(3))
    e1 = rt.evaluate(experience=(0, 32, 77))
    assert e1.examples == 32
    assert e1 == rt.evaluate(experience=(0, 32, 77))
    assert 8 <= e1.metrics["episodeReturn"] <= 500
    others = {rt.evaluate(experience=(0, 32, s)).metrics["episodeReturn"] for s in range(78, 84)}
    assert len(others | {e1.metrics["episodeReturn"]}) > 1  # the seed sets the start states


def test_cartpole_federated_training_balances_the_pole() -> None:
    """4 participants x 32 episodes per round, FedAvg of the weights, default
    learning rate: the greedy return on fixed evaluation episodes reaches 475."""
    rt = load("cartpole-reinforce")
    w = rt.create_initial_weights(1)
    rt.load_model(w)
    start = rt.evaluate(experience=(0, 32, 99)).metrics["episodeReturn"]
    unit = 0
    best = start
    for _ in range(30):
        updates = []
        for _participant in range(4):
            rt.load_model(w)
            result = rt.train(experience=(unit, 32, seed_of(1, unit)))
            unit += 32
            updates.append(floats(result.weights).astype(np.float64))
        w = (sum(updates) / 4).astype("<f4").tobytes()
        rt.load_model(w)
        best = max(best, rt.evaluate(experience=(0, 32, 99)).metrics["episodeReturn"])
        if best >= 475:
            break
    assert start < 100
    assert best >= 475


def test_cartpole_refuses_dataset_inputs() -> None:
    rt = load("cartpole-reinforce")
    with pytest.raises(ModelError, match="experience model"):
        rt.describe_chunk("weei-digits-v1", b"WDG1\x00\x00\x00\x00")
    with pytest.raises(ModelError, match="456 bytes"):
        rt.load_model(b"\x00" * 460)
    rt.load_model(rt.create_initial_weights(0))
    with pytest.raises(ModelError, match="needs experience"):
        rt.train(data=b"x", format="weei-digits-v1")
    rt.load_model(rt.create_initial_weights(0))
    with pytest.raises(ModelError, match="unitCount must be 1..4096"):
        rt.train(experience=(0, 4097, 1))
    rt.load_model(rt.create_initial_weights(0))
    with pytest.raises(ModelError, match="unitCount must be 1..4096"):
        rt.evaluate(experience=(0, 0, 1))
