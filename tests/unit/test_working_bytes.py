"""estimatedWorkingBytes is measured at build time (weei.modelkit.package.measure_working_bytes).

The CPU backend's estimate bounds a task's module memory (weei.runtime.sandbox),
so it must cover what the model really uses: each committed manifest's
estimate is the measured peak with its margin, and on a device whose cap
is below the transformer's working set the measured estimate refuses the
task by name before it runs, where the old fixed 4 MiB let it in to run out
of memory halfway through a step.
"""

from __future__ import annotations

import asyncio
import json
import math

import pytest

from weei.api.ports import WorkerTask
from weei.runtime import sandbox
from weei.core.errors import ModelError
from weei.demo.run import models_dir
from weei.host.worker_pool import ThreadWorkerPool
from weei.modelkit.package import WORKING_MARGIN, measure_working_bytes
from weei.runtime import ModelRuntime, WasmtimeEngine

MiB = 1 << 20
OLD_FIXED_ESTIMATE = 4 * MiB  # what every manifest said before it was measured


def _cpu_estimate(name: str) -> int:
    manifest = json.loads((models_dir() / name / "manifest.json").read_text(encoding="utf-8"))
    return max(b["estimatedWorkingBytes"] for b in manifest["execution"]["backends"] if b["kind"] == "cpu")


@pytest.mark.parametrize("name", ["digits-mlp", "cartpole-reinforce", "byte-transformer"])
def test_the_committed_estimate_covers_the_measured_peak(name: str) -> None:
    root = models_dir() / name
    wasm = (root / "model.wasm").read_bytes()
    info = ModelRuntime.load(wasm, WasmtimeEngine()).model_info()
    chunk = None if "workSource" in info else (root / "data" / "training-001.bin").read_bytes()
    peak = measure_working_bytes(wasm, info, chunk)
    estimate = _cpu_estimate(name)
    assert peak > 1 * MiB  # the module's own memory at least (its 1 MiB stack)
    assert estimate == math.ceil(peak * WORKING_MARGIN / MiB) * MiB >= peak
    print(f"\n{name}: measured peak {peak:,} bytes, estimatedWorkingBytes {estimate:,}")


def test_a_working_set_over_a_wrong_estimate_fails_inside_the_step_and_the_measured_one_is_refused_first() -> None:
    root = models_dir() / "byte-transformer"
    wasm = (root / "model.wasm").read_bytes()
    chunk = (root / "data" / "training-001.bin").read_bytes()
    weights = ModelRuntime.load(wasm, WasmtimeEngine()).create_initial_weights(1)
    cap = 24 * MiB  # a device below the transformer's working set (about 30 MiB to train)
    estimate = _cpu_estimate("byte-transformer")
    assert estimate > cap > OLD_FIXED_ESTIMATE + len(weights) + len(chunk)

    def task(working: int) -> WorkerTask:
        return WorkerTask("train", weights, {}, data=chunk, format="weei-bytes-v1", seed=1,
                          settings={"localEpochs": 1, "batchSize": 8}, working_bytes=working)

    async def main() -> None:
        pool = ThreadWorkerPool(WasmtimeEngine(memory_limit_bytes=cap), 1)
        # The measured estimate: refused by name before the module is even instantiated.
        with pytest.raises(ModelError) as err:
            await pool.run(0, "tfm", wasm, task(estimate))
        assert err.value.reason == "memory-over-limit" and "estimatedWorkingBytes" in err.value.message
        assert 0 not in pool._runtimes
        # The old fixed 4 MiB: admitted under the cap, the module's allocations fail in train.
        with pytest.raises(ModelError) as err:
            await pool.run(0, "tfm", wasm, task(OLD_FIXED_ESTIMATE))
        assert "out of memory" in err.value.message
        # Under a cap the estimate fits, the same task trains.
        roomy = ThreadWorkerPool(WasmtimeEngine(memory_limit_bytes=sandbox.DEFAULT_MEMORY_CAP), 1)
        result = await roomy.run(0, "tfm", wasm, task(estimate))
        assert result.weights is not None and len(result.weights) == len(weights)

    asyncio.run(main())
