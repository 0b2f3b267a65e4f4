"""Trying a checkpoint through the model's own evaluate (issue 24, item 14; docs/abi.md "Trying a model").

The greedy next byte found by comparing accuracies is checked against an independent reference: the
candidate of lowest loss when all 256 are scored (loss and accuracy are different outputs of evaluate).
"""

from __future__ import annotations

import asyncio
import math

import pytest
from test_controller import DIGITS_SETTINGS, controller, models_dir, package

from weei.api.try_model import (BYTES, ModelTrial, bytes_record, digit_images, example_prompt, next_byte)
from weei.core.errors import UsageError
from weei.runtime.abi import ModelRuntime
from weei.runtime.wasmtime_engine import WasmtimeEngine


def _transformer(seed: int) -> tuple[ModelRuntime, WasmtimeEngine, bytes]:
    engine = WasmtimeEngine()
    wasm = (models_dir() / "byte-transformer" / "model.wasm").read_bytes()
    runtime = ModelRuntime.load(wasm, engine)
    weights = runtime.create_initial_weights(seed)
    runtime.load_model(weights)
    return runtime, engine, weights


@pytest.mark.parametrize("context", [b"add 9+1=", b"rev abc -> ", b"x" * 100])
def test_next_byte_is_the_lowest_loss_candidate(context: bytes) -> None:
    runtime, _, _ = _transformer(7)

    def metric(c: int, name: str) -> float:
        return float(runtime.evaluate(data=bytes_record(context, c), format=BYTES).metrics[name])

    byte, scored = next_byte(lambda c: metric(c, "accuracy"), context)
    losses = [metric(c, "loss") for c in range(256)]
    assert byte == min(range(256), key=losses.__getitem__)
    assert 2 <= scored <= 256


def test_a_trial_completes_a_prompt_and_refuses_the_wrong_kind() -> None:
    _, engine, weights = _transformer(3)
    wasm = (models_dir() / "byte-transformer" / "model.wasm").read_bytes()
    trial = ModelTrial(engine, wasm, weights, [BYTES])
    out = asyncio.run(trial.complete(b"add 2+2=", 5))
    assert 1 <= len(out["completion"].encode("utf-8", "surrogateescape")) or out["completion"]
    assert out["evaluateCalls"] >= 2
    with pytest.raises(UsageError) as err:
        asyncio.run(trial.classify(bytes(64)))
    assert err.value.reason == "not-tryable"
    with pytest.raises(UsageError) as err:
        ModelTrial(engine, wasm, weights, ["weei-tabular-f32-v1"])
    assert err.value.reason == "not-tryable"


def test_example_prompts_come_from_the_held_out_text() -> None:
    validation = (models_dir() / "byte-transformer" / "data" / "validation.bin").read_bytes()
    prompts = {example_prompt(validation, i) for i in range(5)}
    assert len(prompts) == 5 and all(p and p.endswith(("=", "= ", "-> ")) for p in prompts)
    assert example_prompt(b"WBT1\x05\x00\x00\x00", 0) is None


def test_try_checkpoint_classifies_a_held_out_digit_after_training() -> None:
    async def main() -> None:
        c = controller()
        await c.init()
        with pytest.raises(UsageError) as err:
            await c.try_checkpoint({})
        assert err.value.reason == "no-job"
        validation = (models_dir() / "digits-mlp" / "data" / "validation.bin").read_bytes()
        await c.create_job(**package("digits-mlp"), settings={**DIGITS_SETTINGS, "epochs": 3},
                           validation=("validation.bin", validation))
        await c.start()
        for _ in range(600):
            if c.get_state()["job"]["status"] == "completed":
                break
            await asyncio.sleep(0.1)
        await c.idle()
        images = digit_images(validation)
        right = 0
        for index in range(20):
            out = await c.try_checkpoint({"example": index})
            assert out["format"] == "weei-digits-v1" and out["round"] >= 1
            assert out["label"] == images[index][1] and out["pixels"] == list(images[index][0])
            assert math.isclose(sum(out["probabilities"]), 1.0, rel_tol=1e-6)
            assert out["predicted"] == max(range(10), key=out["probabilities"].__getitem__)
            right += out["predicted"] == out["label"]
        # Three passes train the MLP well past chance (10 %): most held-out digits are right.
        assert right >= 12, right
        for bad in ({"example": -1}, {"example": "3"}, []):
            with pytest.raises(UsageError):
                await c.try_checkpoint(bad)  # type: ignore[arg-type]

    asyncio.run(main())
