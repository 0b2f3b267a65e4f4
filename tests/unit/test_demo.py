"""The demo trains real models end to end through the real state machines."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from weei.core.formats.checkpoint import read_checkpoint
from weei.demo.run import DEMO_JOBS, run_demo, run_job


@pytest.fixture(scope="module")
def demo_out(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, int]:
    out = tmp_path_factory.mktemp("demo")
    stream = io.StringIO()
    code = run_demo(out, stream=stream)
    return out, stream.getvalue(), code


def test_demo_succeeds_and_prints_a_row_per_round(demo_out: tuple[Path, str, int]) -> None:
    out, text, code = demo_out
    assert code == 0, text
    assert "OK: every job's final metric is better than at round 0 (its initial weights)" in text
    assert "valid accuracy" in text and "eval episodeReturn" in text
    assert "rejected updates: 0" in text
    # The summary compares with round 0, the initial weights (issue 24, item 16).
    assert all(f"-- {name}: " in text for name in ("digits", "cartpole")) and text.count(": round 0 (initial weights) ") == 2, text


def test_digits_writes_one_checkpoint_per_round_and_completes_three_epochs(demo_out: tuple[Path, str, int]) -> None:
    out, _, _ = demo_out
    files = sorted((out / "digits").glob("*.weei-checkpoint"))
    # 15 chunks, 4 peers: 4 rounds per epoch, 3 epochs, plus checkpoint 0.
    assert len(files) == 13
    last = read_checkpoint(files[-1].read_bytes()).metadata.to_json()
    assert last["round"] == 12
    assert last["remainingChunkIds"] == []
    assert len(last["trainedChunkIds"]) == 15
    assert last["incomplete"] is False


def test_cartpole_checkpoints_carry_the_job_seed_and_next_unit(demo_out: tuple[Path, str, int]) -> None:
    out, _, _ = demo_out
    files = sorted((out / "cartpole").glob("*.weei-checkpoint"))
    assert len(files) == 31
    seeds = set()
    # Every round, all four peers contributed a full assignment (nothing failed or was retried).
    for i, path in enumerate(files):
        meta = read_checkpoint(path.read_bytes()).metadata.to_json()
        seeds.add(meta["experience"]["jobSeed"])
        # 4 peers x 32 units per round.
        assert meta["experience"]["nextUnit"] == i * 128
    assert len(seeds) == 1


def test_digits_learns_to_high_validation_accuracy(tmp_path: Path) -> None:
    digits = next(j for j in DEMO_JOBS if j.name == "digits")
    report = run_job(digits, tmp_path, stream=io.StringIO())
    accuracy = [r["validation"]["accuracy"] for r in report.rounds if r["round"] > 0]
    assert accuracy[-1] >= 0.93
    assert report.improved
