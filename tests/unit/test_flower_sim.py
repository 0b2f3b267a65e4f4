"""``weei flower sim`` through Flower's own ``run_simulation`` (Ray): every simulated node trains, and the
checkpoints are the bytes of Weei's in-process run of the same job and seed."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import wasmtime

pytest.importorskip("flwr")

from weei.demo.run import DEMO_JOBS, models_dir, run_job  # noqa: E402
from weei.flower.apps import simulate  # noqa: E402

pytestmark = pytest.mark.flower

DIGITS = DEMO_JOBS[0]


def test_sim_every_node_trains_and_the_bytes_are_weei_demos(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    monkeypatch.setenv("FLWR_TELEMETRY_ENABLED", "0")
    # the coordinator does not train: whatever the checkpoints hold, the simulated nodes trained
    settings = {**DIGITS.settings, "epochs": 1, "coordinatorParticipates": False}
    run_job(DIGITS, tmp_path / "demo", stream=io.StringIO(), settings=settings, seed=7, flat=True)
    out = io.StringIO()
    run = simulate(models_dir() / DIGITS.model, nodes=3, out=tmp_path / "sim", stream=out, settings=settings,
                   seed=7)
    trained: dict[str, int] = {}
    for peers in run.contributors.values():
        for peer in peers:
            trained[peer] = trained.get(peer, 0) + 1
    assert len(trained) == 3 and all(p.startswith("node-") and n > 0 for p, n in trained.items()), trained
    assert run.refused == [] and run.failed_nodes == []
    demo = {p.name: p.read_bytes() for p in sorted((tmp_path / "demo").glob("*.weei-checkpoint"))}
    sim = {p.name: p.read_bytes() for p in sorted((tmp_path / "sim").glob("*.weei-checkpoint"))}
    assert len(demo) >= 3 and demo.keys() == sim.keys()
    assert [n for n in demo if demo[n] != sim[n]] == []
    # Ray's shutdown reset the process's SIGILL handler, and wasmtime's trap then killed the whole test run.
    engine = wasmtime.Engine()
    store = wasmtime.Store(engine)
    trap = wasmtime.Instance(store, wasmtime.Module(engine, '(module (func (export "f") unreachable))'), [])
    with pytest.raises(wasmtime.Trap):
        trap.exports(store)["f"](store)


def test_sim_resume_continues_an_in_process_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """``weei flower sim --resume CHECKPOINT`` (run_simulation): the in-process run's checkpoint 4 continued
    on 3 simulated nodes gives that run's checkpoints 4..N, byte for byte."""
    import json

    from weei.cli import main

    monkeypatch.setenv("FLWR_TELEMETRY_ENABLED", "0")
    settings = {**DIGITS.settings, "epochs": 2, "coordinatorParticipates": False}
    run_job(DIGITS, tmp_path / "demo", stream=io.StringIO(), settings=settings, seed=7, flat=True)
    demo = {p.name: p.read_bytes() for p in sorted((tmp_path / "demo").glob("*.weei-checkpoint"))}
    names = sorted(demo)
    (tmp_path / "settings.json").write_text(json.dumps(settings))
    assert main(["flower", "sim", str(models_dir() / DIGITS.model), "--nodes", "3", "--seed", "7",
                 "--settings", str(tmp_path / "settings.json"), "--resume", str(tmp_path / "demo" / names[4]),
                 "--out", str(tmp_path / "sim")]) == 0
    sim = {p.name: p.read_bytes() for p in sorted((tmp_path / "sim").glob("*.weei-checkpoint"))}
    assert len(names) >= 8 and sorted(sim) == names[4:], capsys.readouterr().out[-2000:]
    assert [n for n in sim if demo[n] != sim[n]] == []
