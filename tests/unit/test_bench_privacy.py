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


def test_secagg_at_several_peer_counts_keeps_a_participants_messages_and_grows_only_its_key_and_share_bytes(
        tmp_path: Path) -> None:
    # 4 peers do not divide digits' 15 chunks: the bench repeats chunks so that every round has all 4.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "app" / "py"), str(ROOT / "bench")]))
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_privacy.py"), "--secagg", "--quick",
                           "--peers", "3", "4", "--out", str(tmp_path)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    three, four = json.loads((tmp_path / "secagg.json").read_text())["results"]
    assert (three["peers"], three["rounds"], four["peers"], four["rounds"]) == (3, 5, 4, 4)
    for r in (three, four):
        # measured at each participant on the network: every one alike, 4 out and 3 in, whatever n
        assert r["messageSpread"] == 0
        assert (r["sentPerParticipantRound"], r["receivedPerParticipantRound"]) == (4, 3)
        assert r["coordinatorMessagesPerRound"] == 7 * (r["peers"] - 1)
        assert r["secaggValidation"]["loss"] == pytest.approx(r["plainValidation"]["loss"], rel=1e-5)
    assert four["vectorBytesPerParticipantRound"] == three["vectorBytesPerParticipantRound"] > 4 * 4810
    assert four["keySharesBytesPerParticipantRound"] > three["keySharesBytesPerParticipantRound"]
    text = (tmp_path / "secagg.md").read_text()
    assert "messages per participant per round constant in n: n=3 7, n=4 7, slope +0.000 per peer: MET" in text
    assert "n=5: not measured" in text


def test_secagg_goal_line_says_not_met_when_a_participant_sends_a_message_per_peer() -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    import bench_privacy

    def routes(n: int, per_peer: bool) -> dict[tuple[str, str, str], tuple[int, int]]:
        peers = [f"peer-{i}" for i in range(1, n)]
        out = {}
        for p in peers:
            out[(p, "coordinator", "secaggKeys")] = (100, 1)
            out[("coordinator", p, "secaggRoster")] = (100 * n, 1)
            for q in (peers if per_peer else []):
                if q != p:
                    out[(p, q, "secaggShares")] = (100, 1)
        return out

    def result(n: int, per_peer: bool) -> dict:
        t = bench_privacy.per_participant(routes(n, per_peer), 1)
        return {"model": "m", "peers": n, "messagesPerParticipantRound": t["sent"] + t["received"],
                "sentPerParticipantRound": t["sent"], "receivedPerParticipantRound": t["received"],
                "messageSpread": t["spread"], "keySharesBytesPerParticipantRound": t["keySharesBytes"],
                "vectorBytesPerParticipantRound": t["vectorBytes"], "bytesByTypePerParticipantRound": t["bytesByType"]}

    assert "slope +0.000 per peer: MET" in bench_privacy.secagg_goals([result(3, False), result(6, False)])[1]
    line = bench_privacy.secagg_goals([result(3, True), result(6, True)])[1]
    assert "not met (n=6: 5 sent, 5 received)" in line, line


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
