"""FedAvgM's nesterov option (issue 25): DiLoCo's outer optimizer through the methods table.

The kernels give the same bits, and several rounds follow an independent
formula: SGD with Nesterov momentum on the outer gradient ``g = start - avg``
as PyTorch writes it (``b = μ·b + g; p = p - η·(g + μ·b)``), in float64,
which the kernels' float32 state must track to float32 rounding.
"""

from __future__ import annotations

import numpy as np
import pytest

from weei.core.aggregation.aggregate import aggregate_round
from weei.core.errors import SettingsError
from weei.core.formats.modelinfo import ModelAggregation
from weei.core.formats.settings import AggregationSettings
from weei.kernel.native import NativeKernel
from weei.kernel.numpy_kernel import NumpyKernel
from weei.kernel.wasm_kernel import WasmKernel

KERNELS = {"numpy": NumpyKernel(), "native": NativeKernel(), "wasm": WasmKernel()}
DILOCO = AggregationSettings.from_json({"method": "fedavgm", "serverLearningRate": 0.7, "momentum": 0.9,
                                        "nesterov": 1})


def _rounds(kernel, settings, n_rounds: int, model: ModelAggregation | None = None):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(3)
    weights = rng.standard_normal(1000).astype("<f4").tobytes()
    state, history = None, []
    for _ in range(n_rounds):
        w = np.frombuffer(weights, "<f4")
        updates = [("a", 3, (w + rng.standard_normal(w.size).astype("<f4") * np.float32(0.01)).astype("<f4").tobytes()),
                   ("b", 5, (w + rng.standard_normal(w.size).astype("<f4") * np.float32(0.01)).astype("<f4").tobytes())]
        result = aggregate_round(kernel, weights, updates, settings, state, model)
        history.append((weights, updates))
        weights, state = result.weights, result.state
    return weights, state, history


def test_nesterov_is_bit_identical_on_every_kernel() -> None:
    model = ModelAggregation.from_json({"methods": ["fedavgm"], "averageOnly": [{"offset": 400, "bytes": 40}]})
    out = {name: _rounds(k, DILOCO, 4, model)[:2] for name, k in KERNELS.items()}
    assert out["native"] == out["numpy"] and out["wasm"] == out["numpy"]


def test_nesterov_follows_sgd_with_nesterov_momentum_on_the_outer_gradient() -> None:
    weights, state, history = _rounds(NumpyKernel(), DILOCO, 5)
    p = np.frombuffer(history[0][0], "<f4").astype(np.float64)
    buf = np.zeros_like(p)
    for _start, updates in history:
        total = sum(c for _, c, _ in updates)
        avg = sum(c * np.frombuffer(u, "<f4").astype(np.float64) for _, c, u in updates) / total
        g = p - avg  # the outer gradient
        buf = 0.9 * buf + g
        p = p - 0.7 * (g + 0.9 * buf)
    assert np.allclose(np.frombuffer(weights, "<f4"), p, rtol=0, atol=1e-5)
    assert state is not None and np.allclose(np.frombuffer(state.data, "<f4"), -buf, rtol=0, atol=1e-5)


def test_nesterov_off_is_the_old_fedavgm_to_the_bit() -> None:
    off = AggregationSettings.from_json({"method": "fedavgm", "serverLearningRate": 0.7, "momentum": 0.9, "nesterov": 0})
    plain = AggregationSettings.from_json({"method": "fedavgm", "serverLearningRate": 0.7, "momentum": 0.9})
    assert _rounds(NumpyKernel(), off, 3)[:2] == _rounds(NumpyKernel(), plain, 3)[:2]
    assert _rounds(NumpyKernel(), DILOCO, 3)[0] != _rounds(NumpyKernel(), plain, 3)[0]
    assert plain.to_json() == {"method": "fedavgm", "serverLearningRate": 0.7, "momentum": 0.9}


@pytest.mark.parametrize("value", [0.5, 2, -1])
def test_nesterov_is_a_switch(value: float) -> None:
    with pytest.raises(SettingsError) as err:
        AggregationSettings.from_json({"method": "fedavgm", "nesterov": value})
    assert (err.value.field, err.value.reason) == ("aggregation.nesterov", "out-of-range")
    assert "0 or 1" in str(err.value)
