"""bench/bench_privacy.py --quick: the DP cost table's harness on one epoch of digits-mlp.

Not a timing test: it checks that every run trained the same rounds from the same start, that each DP
job's last checkpoint reports the ε it was planned for, and that the clip-only run reports no guarantee.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_quick_privacy_table_reports_the_planned_epsilon_of_every_run(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "app" / "py"), str(ROOT / "bench")]))
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_privacy.py"), "--quick", "--out", str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    result, = json.loads((tmp_path / "privacy.json").read_text())["results"]
    runs = result["runs"]
    assert [r["name"] for r in runs] == ["no DP", "clip only", "ε=8", "ε=4", "ε=1"]
    assert {r["rounds"] for r in runs} == {result["rounds"]} and result["rounds"] == 4  # 15 chunks over 4 peers
    assert len({json.dumps(r["firstValidation"], sort_keys=True) for r in runs}) == 1  # the same initial weights
    assert runs[0]["epsilon"] is None and runs[1]["epsilon"] is None  # no DP; σ = 0: infinite
    for run in runs[2:]:
        assert run["epsilon"] == pytest.approx(run["target"], rel=1e-5) and run["epsilon"] <= run["target"]
    assert "| ε=1 |" in (tmp_path / "privacy.md").read_text()


def test_quick_secagg_round_time_line_trains_the_same_model_with_seven_messages_a_participant(tmp_path: Path) -> None:
    # Not a timing test: the round times are printed, not asserted. With nothing clipped, the securely
    # aggregated job validates as the plain one does (to the fixed-point grid, far below the printed digits).
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "app" / "py"), str(ROOT / "bench")]))
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_privacy.py"), "--secagg", "--quick",
                           "--out", str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    result, = json.loads((tmp_path / "secagg.json").read_text())["results"]
    assert result["rounds"] == 3  # 15 chunks over 5 peers
    # keys, shares, masked, reveal out; roster, sharesFor, unmask in: O(1) messages, each O(n) in size
    assert result["messagesPerParticipantRound"] == 7
    assert result["secaggValidation"]["loss"] == pytest.approx(result["plainValidation"]["loss"], rel=1e-5)
    assert result["plainRoundSeconds"] > 0 and result["secaggRoundSeconds"] > 0


def test_quick_noise_at_table_runs_each_epsilon_with_the_noise_at_the_coordinator_and_at_the_participants(
        tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "app" / "py"), str(ROOT / "bench")]))
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_privacy.py"), "--noise-at", "--quick",
                           "--out", str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    result, = json.loads((tmp_path / "privacy-noise-at.json").read_text())["results"]
    runs = result["runs"]
    assert [r["name"] for r in runs] == ["no DP"] + [f"ε={e}, {where}" for e in (8, 4, 1)
                                                     for where in ("coordinator", "participants")]
    assert {r["rounds"] for r in runs} == {result["rounds"]}
    assert len({json.dumps(r["firstValidation"], sort_keys=True) for r in runs}) == 1
    for run in runs[1:]:
        assert run["recordedNoiseAt"] == run["noiseAt"]  # the checkpoints say where the noise was added
        assert run["epsilon"] == pytest.approx(run["target"], rel=1e-5) and run["epsilon"] <= run["target"]
