"""The issue's test matrix through the in-process fake grid (test_flower_grid.FakeGrid): CartPole's
checkpoints are the in-process run's bytes, and every arrival order of four nodes' replies gives one result."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import itertools
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from flwr.app import Message  # noqa: E402
from test_flower_grid import FakeGrid, _files, _handler  # noqa: E402

from weei.demo.run import DEMO_JOBS, run_job  # noqa: E402
from weei.flower.client import NodeHosts  # noqa: E402
from weei.flower.server import drive  # noqa: E402

pytestmark = pytest.mark.flower

DIGITS, CARTPOLE = DEMO_JOBS


def _same(demo: dict[str, bytes], flower: dict[str, bytes], at_least: int) -> None:
    assert len(demo) >= at_least and demo.keys() == flower.keys()
    assert [n for n in demo if demo[n] != flower[n]] == []


def test_cartpole_experience_job_bytes_equal_weei_demo(tmp_path: Path) -> None:
    """An experience job (episode seeds per unit, the environment in the module): all 31 checkpoints of the
    demo's 30 rounds, replies in reverse order."""
    run_job(CARTPOLE, tmp_path / "demo", stream=io.StringIO(), seed=4, flat=True)
    grid = FakeGrid([61, 62, 63], _handler(NodeHosts()), order=lambda ms: ms[::-1])
    run = asyncio.run(drive(grid, CARTPOLE, seed=4, out=tmp_path / "flower"))
    _same(_files(tmp_path / "demo"), _files(tmp_path / "flower"), CARTPOLE.settings["epochs"] + 1)
    assert run.failed_nodes == [] and all(len(p) == 4 for r, p in run.contributors.items() if r > 0)


NODES = (71, 72, 73, 74)
ORDER_SETTINGS = {**DIGITS.settings, "epochs": 1, "coordinatorParticipates": False}


@pytest.fixture(scope="module")
def order_reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    out = tmp_path_factory.mktemp("order-demo")
    # four training peers besides a coordinator that does not train, as on the grid
    run_job(dataclasses.replace(DIGITS, peers=5), out, stream=io.StringIO(), settings=ORDER_SETTINGS, seed=11,
            flat=True)
    return _files(out)


@pytest.mark.parametrize("perm", list(itertools.permutations(range(4))), ids=lambda p: "".join(map(str, p)))
def test_every_arrival_order_of_four_replies_gives_one_result(tmp_path: Path, perm: tuple[int, ...],
                                                              order_reference: dict[str, bytes]) -> None:
    """The four nodes' replies of a round reach the coordinator in the order ``perm`` (of node ids):
    the checkpoints are the in-process run's, whatever the order."""
    applied = {"n": 0}

    def order(ms: list[Message]) -> list[Message]:
        by_node = {m.metadata.dst_node_id: m for m in ms}
        if sorted(by_node) != list(NODES) or len(ms) != 4:
            return ms
        applied["n"] += 1
        return [by_node[NODES[i]] for i in perm]

    grid = FakeGrid(NODES, _handler(NodeHosts()), order=order)
    run = asyncio.run(drive(grid, DIGITS, settings=ORDER_SETTINGS, seed=11, out=tmp_path / "flower"))
    # the rounds of four updates (all but the last: 15 chunks) had them in one pull, in this order
    full = [r for r, peers in run.contributors.items() if len(peers) == 4]
    assert len(full) >= 3 and applied["n"] >= len(full)
    _same(order_reference, _files(tmp_path / "flower"), 4)
