"""One limit for a metric id, in one place: what getModelInfo may declare, every update may carry (issue 20)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sim import Sim, dataset_info, dataset_spec

from weei.core.errors import ManifestError
from weei.core.limits import MAX_METRIC_ID_CHARS
from weei.core.formats.modelinfo import ModelInfo


def info_with_metric(metric_id: str) -> dict[str, object]:
    return dataset_info(metrics=[{"id": metric_id, "label": "Long", "direction": "minimize"}])


def test_a_metric_id_over_the_limit_is_refused_when_the_model_info_is_read() -> None:
    with pytest.raises(ManifestError, match=r"modelInfo\.metrics\[0\]\.id: at most 64 characters") as refused:
        ModelInfo.from_json(info_with_metric("m" * (MAX_METRIC_ID_CHARS + 1)))
    assert refused.value.reason == "invalid-model-info"


def test_a_metric_id_at_the_limit_works_end_to_end() -> None:
    metric = "m" * MAX_METRIC_ID_CHARS
    spec, store = dataset_spec(4, info=info_with_metric(metric))
    sim = Sim.create(spec, store)
    for peer in ("p1", "p2"):
        sim.join(peer)
        # Each update reports the declared metric, through the wire codec like every message.
        sim.behaviour[peer] = lambda assign, start, default: replace(default, metrics={metric: 0.25})
    sim.coordinator.start(sim.now)
    sim.pump()
    assert sim.coordinator.status == "completed" and sim.coordinator.rejected == []
    assert sim.checkpoint(sim.coordinator.checkpoint_round).metadata.to_json()["metrics"]["values"] == {metric: 0.25}
