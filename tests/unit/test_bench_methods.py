"""bench/bench_methods.py --quick: the method comparison's harness, on one epoch of digits-mlp.

Not a timing test: it checks what the JSON records and that the four runs
really differ only in the aggregation method they were configured with.
"""

from __future__ import annotations

import io
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_quick_comparison_records_every_round_of_every_method(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "app" / "py"))
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_methods.py"), "--quick", "--out", str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "reaches FedAvg final at round" in done.stdout
    assert "outer optimizer: a method reaching FedAvg's final validation loss" in done.stdout

    document = json.loads((tmp_path / "methods.json").read_text())
    assert document["quick"] is True and document["seeds"] == [1]
    digits = document["models"]["digits-mlp"]
    # 15 chunks, 4 participants, 1 epoch: rounds of 4, 4, 4 and 3 chunks.
    assert digits["participants"] == 4 and digits["chunks"] == 15 and digits["settings"]["localEpochs"] == 1
    assert [m["name"] for m in digits["methods"]] == ["FedAvg", "FedAvgM", "FedAdam", "FedAdam 0.003"]
    assert [m["aggregation"] for m in digits["methods"]] == [
        {"method": "fedavg"},
        {"method": "fedavgm", "momentum": 0.9, "serverLearningRate": 1},
        {"method": "fedadam"},
        {"method": "fedadam", "serverLearningRate": 0.003},
    ]
    loss = {}
    for method in digits["methods"]:
        (run,) = method["runs"]
        assert run["seed"] == 1 and run["rounds"] == [0, 1, 2, 3, 4]
        assert run["peers"] == [0, 4, 4, 4, 3]
        assert set(run["validation"]) == {"loss", "accuracy"}
        assert all(math.isfinite(v) for v in run["validation"]["loss"])
        loss[method["name"]] = run["validation"]["loss"]

    # The same initial weights for every method (round 0 is validated before training).
    assert len({curve[0] for curve in loss.values()}) == 1
    # FedAvgM's momentum starts at zero, so its first round is FedAvg's (up to float32 rounding of
    # start + delta); the same chunks and seeds make that visible. From round 2 momentum shows.
    assert math.isclose(loss["FedAvgM"][1], loss["FedAvg"][1], rel_tol=1e-4)
    assert loss["FedAvgM"][2] != loss["FedAvg"][2]
    # FedAdam's per-weight step differs from the first round, and its two step sizes differ.
    assert loss["FedAdam"][1] != loss["FedAvg"][1]
    assert loss["FedAdam 0.003"][1] != loss["FedAdam"][1]
    # A smaller server step moves less far from the initial weights in the first round.
    assert abs(loss["FedAdam 0.003"][1] - loss["FedAdam"][0]) < abs(loss["FedAdam"][1] - loss["FedAdam"][0])

    (summary,) = digits["summary"]
    rows = {row["method"]: row for row in summary["methods"]}
    assert rows["FedAvg"]["finalRelative"] == 1.0 and rows["FedAvg"]["reachesFedAvgFinalAt"] is not None
    for name, row in rows.items():
        assert row["final"] == loss[name][-1]
        assert math.isclose(row["finalRelative"], loss[name][-1] / loss["FedAvg"][-1])
        at = row["reachesFedAvgFinalAt"]
        assert at is None or loss[name][at] <= loss["FedAvg"][-1]
    assert set(digits["central"]["validation"]) == {"loss", "accuracy"}

    plot = (tmp_path / "methods.svg").read_text()
    assert plot.startswith("<svg") and plot.count("<polyline") == 4


def test_quick_study_compares_each_configuration_with_fedavg_and_prints_the_goal_lines(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "app" / "py"))
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_methods.py"), "--study", "--quick",
                           "--out", str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "on every seed (1): " in done.stdout and "within 1 point of central" in done.stdout
    assert done.stdout.count("MET") + done.stdout.count("not met") >= 2

    digits = json.loads((tmp_path / "methods-study.json").read_text())["study"]["digits-mlp"]
    configs = {c["label"]: c for c in digits["configs"]}
    assert list(configs) == ["FedAvg", "FedAvgM μ0.9 η1", "FedAvgM μ0.9 η0.3"]
    fedavg = configs["FedAvg"]["runs"][0]["validation"]["loss"]
    for config in configs.values():
        (row,) = config["summary"]
        loss = config["runs"][0]["validation"]["loss"]
        assert loss[0] == fedavg[0] and row["final"] == loss[-1]
        assert math.isclose(row["vsSameLocalFedAvg"], loss[-1] / fedavg[-1])
        at = row["reachesFedAvgFinalAt"]
        assert (at is None and min(loss[1:]) > fedavg[-1]) or loss[at] <= fedavg[-1] < min(loss[1:at] + [math.inf])
    # The server step changes the outcome: the two FedAvgM rows differ from round 2 on.
    assert configs["FedAvgM μ0.9 η1"]["runs"][0]["validation"]["loss"][2] != \
        configs["FedAvgM μ0.9 η0.3"]["runs"][0]["validation"]["loss"][2]


def test_study_trains_the_imported_onnx_model_with_the_local_optimizer_asked_for(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """bench/onnx_cnn.py's CNN, imported twice (local Adam, local SGD): the study's local setting
    ``optimizer`` picks the package; both start from the graph's initializers."""
    pytest.importorskip("onnx")
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    monkeypatch.delenv("WEEI_MODELS", raising=False)
    import bench_methods

    setup = bench_methods.MODELS["onnx-cnn"]
    with bench_methods._packages(setup):
        models = Path(os.environ["WEEI_MODELS"])
        adam = bench_methods.run_method("onnx-cnn", setup, {"method": "fedavg"}, 1, 1, io.StringIO())
        sgd = bench_methods.run_method("onnx-cnn", setup, {"method": "fedavg"}, 1, 1, io.StringIO(), {"optimizer": "sgd"})
    assert "WEEI_MODELS" not in os.environ and not models.exists()
    for run in (adam, sgd):
        assert run["rounds"] == [0, 1, 2, 3, 4] and all(math.isfinite(v) for v in run["validation"]["loss"])
    assert adam["validation"]["loss"][0] == sgd["validation"]["loss"][0]
    assert adam["validation"]["loss"][1] != sgd["validation"]["loss"][1]
