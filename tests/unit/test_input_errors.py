"""Errors that name their input and its cause (issue 24, item 16): a checkpoint of another model, a file that
is not a checkpoint, a truncated checkpoint, a validation file of another model. Real controller, wasmtime."""

from __future__ import annotations

import asyncio

import pytest
from test_controller import DIGITS_SETTINGS, controller, package, run_until_done

from weei.core.errors import CheckpointError, ModelError
from weei.demo.run import models_dir

CARTPOLE_SETTINGS = {"epochs": 2, "localEpochs": 1, "batchSize": 16, "coordinatorParticipates": True,
                     "experience": {"unitsPerAssignment": 32}}


def test_a_wrong_checkpoint_or_validation_file_says_what_it_is() -> None:
    async def main() -> None:
        c = controller()
        await c.init()
        await c.create_job(**package("digits-mlp"), settings={**DIGITS_SETTINGS, "epochs": 1})
        await c.start()
        await run_until_done(c)
        _, checkpoint = c.export_checkpoint()
        last = c.get_state()["job"]["checkpoints"][-1]["artifact"]["round"]
        await c.leave()

        async def refused(data: bytes, model: str = "digits-mlp") -> CheckpointError:
            settings = CARTPOLE_SETTINGS if model == "cartpole-reinforce" else DIGITS_SETTINGS
            with pytest.raises(CheckpointError) as err:
                await c.continue_from_checkpoint(checkpoint=data, **package(model), settings=settings, dataset_mode="new")
            return err.value

        other = await refused(checkpoint, "cartpole-reinforce")
        assert other.reason == "checkpoint-of-another-model"
        assert f"this checkpoint is digits-mlp 1.0.0 round {last} (19240 bytes of weights)" in other.message
        assert "the chosen model cartpole-reinforce 1.0.0 does not load it" in other.message

        manifest = (models_dir() / "digits-mlp" / "manifest.json").read_bytes()
        foreign = await refused(manifest)
        assert "this is not a .weei-checkpoint file: it starts with b'{" in foreign.message, foreign.message

        cut = await refused(checkpoint[: len(checkpoint) - 1000])
        assert cut.reason == "weights-length-mismatch"
        assert f"the file of digits-mlp 1.0.0 round {last} is cut short" in cut.message, cut.message
        header = await refused(checkpoint[:40])
        assert header.reason == "truncated-metadata" and header.message.endswith(": the file is cut short")

        text = (models_dir() / "byte-transformer" / "data" / "validation.bin").read_bytes()
        with pytest.raises(ModelError) as err:
            await c.create_job(**package("digits-mlp"), settings=DIGITS_SETTINGS, validation=("validation.bin", text))
        assert err.value.message.startswith("the validation file validation.bin is not weei-digits-v1 data of digits-mlp: ")
        assert "job" not in c.get_state()

    asyncio.run(main())
