"""Weei's coordinator over a Flower grid: the same bytes as ``weei demo``. FakeGrid is Flower's ``Grid``
interface in this process, the ClientApp's handler called on pull (so a test can reorder, fail or drop replies)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from flwr.app import Message  # noqa: E402

from weei.demo.run import DEMO_JOBS, run_job  # noqa: E402
from weei.flower.client import NodeHosts  # noqa: E402
from weei.flower.server import drive  # noqa: E402

import uuid  # noqa: E402
from typing import Any, Callable, Iterable  # noqa: E402

from flwr.serverapp import Grid  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

pytestmark = pytest.mark.flower

Handler = Callable[[int, Message], Message | None]


class FakeGrid(Grid):
    def __init__(self, nodes: Iterable[int], handler: Handler,
                 order: Callable[[list[Message]], list[Message]] = lambda m: m, per_pull: int | None = None) -> None:
        self.nodes = list(nodes)
        self.handler = handler
        self.order = order
        self.per_pull = per_pull  # answer at most this many messages a pull; the others stay pending
        self.overlaps = 0  # messages pushed to a node that had one pending
        self.pending: dict[str, Message] = {}
        self._run: Any = None
        # What Flower's runtime sets for a ServerApp before main(): Message() reads it.
        TaskIdentity.run_id = 1
        TaskIdentity.node_id = 0
        TaskIdentity.task_id = 1

    def set_run(self, run: Any) -> None:
        self._run = run

    @property
    def run(self) -> Any:
        return self._run

    def create_message(self, content: Any, message_type: str, dst_node_id: int, group_id: str,
                       ttl: float | None = None) -> Message:
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> list[int]:
        return list(self.nodes)

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        ids = []
        for m in messages:
            mid = str(uuid.uuid4())
            busy = {p.metadata.dst_node_id for p in self.pending.values()}
            self.overlaps += m.metadata.dst_node_id in busy
            m.metadata.__dict__["_message_id"] = mid
            self.pending[mid] = m
            ids.append(mid)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        ids = [mid for mid in list(message_ids) if mid in self.pending][:self.per_pull]
        wanted = [self.pending.pop(mid) for mid in ids]
        replies = []
        for m in self.order(wanted):
            reply = self.handler(m.metadata.dst_node_id, m)
            if reply is not None:
                replies.append(reply)
        return replies

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        return self.pull_messages(self.push_messages(messages))

DIGITS = DEMO_JOBS[0]


def _handler(hosts: NodeHosts, config: dict[str, str] | None = None):
    def handle(node_id: int, m: Message) -> Message:
        return Message(hosts.handle(node_id, config or {"weei-accept": "*"}, m.content), reply_to=m)
    return handle


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.glob("*.weei-checkpoint"))}


def test_digits_fedavg_bytes_equal_weei_demo(tmp_path: Path) -> None:
    import io
    demo_out, flower_out = io.StringIO(), io.StringIO()
    run_job(DIGITS, tmp_path / "demo", stream=demo_out, seed=7, flat=True)
    grid = FakeGrid([11, 12, 13], _handler(NodeHosts()))
    run = asyncio.run(drive(grid, DIGITS, seed=7, out=tmp_path / "flower", stream=flower_out))
    demo, flower = _files(tmp_path / "demo"), _files(tmp_path / "flower")
    assert len(demo) >= 4 and demo.keys() == flower.keys()
    assert [n for n in demo if demo[n] != flower[n]] == []
    assert run.failed_nodes == [] and run.bytes_skipped > 0
    # A row per checkpoint as `weei demo` prints it: the same rounds, peers, examples and metrics (not the seconds).
    rows = [[line.split()[:-1] for line in out.getvalue().splitlines() if line.split()[:1] and line.split()[0].isdigit()]
            for out in (demo_out, flower_out)]
    assert len(rows[1]) == len(demo) and rows[1] == rows[0]


def test_one_message_in_flight_per_node_when_replies_come_one_at_a_time(tmp_path: Path) -> None:
    """Flower does not order two messages to one node (a simulation may run them in two processes at
    once): the coordinator's next frames for a node wait for its reply, and the bytes stay weei demo's."""
    import io
    settings = {**DIGITS.settings, "epochs": 1}
    run_job(DIGITS, tmp_path / "demo", stream=io.StringIO(), settings=settings, seed=9, flat=True)
    grid = FakeGrid([51, 52, 53], _handler(NodeHosts()), per_pull=1)
    asyncio.run(drive(grid, DIGITS, settings=settings, seed=9, out=tmp_path / "flower"))
    assert grid.overlaps == 0
    demo, flower = _files(tmp_path / "demo"), _files(tmp_path / "flower")
    assert len(demo) >= 3 and demo.keys() == flower.keys()
    assert [n for n in demo if demo[n] != flower[n]] == []


METHODS = {
    "fedavgm": {"method": "fedavgm", "momentum": 0.5},
    "fedadam": {"method": "fedadam"},
    "normclip-trimmed": {"method": "fedavg", "normClip": 5, "combine": "trimmedMean", "trim": 0.25},
}


@pytest.mark.parametrize("name", sorted(METHODS))
def test_methods_bytes_equal_weei_demo_in_any_reply_order(tmp_path: Path, name: str) -> None:
    import io
    settings = {**DIGITS.settings, "epochs": 2, "aggregation": METHODS[name]}
    run_job(DIGITS, tmp_path / "demo", stream=io.StringIO(), settings=settings, seed=3, flat=True)
    # replies arrive in reverse push order: the coordinator's result must not depend on it
    grid = FakeGrid([21, 22, 23], _handler(NodeHosts()), order=lambda ms: ms[::-1])
    asyncio.run(drive(grid, DIGITS, settings=settings, seed=3, out=tmp_path / "flower"))
    demo, flower = _files(tmp_path / "demo"), _files(tmp_path / "flower")
    assert len(demo) >= 3 and demo.keys() == flower.keys()
    assert [n for n in demo if demo[n] != flower[n]] == []


def test_a_node_that_raises_is_a_closed_channel(tmp_path: Path) -> None:
    """A ClientApp that fails (Flower's error reply) loses the node, as a closed data channel does;
    the coordinator reassigns its work and the job completes every round (the reassigned attempts are
    recorded in the checkpoints, so their bytes are not the undisturbed run's)."""
    import io
    from flwr.app import Error
    run_job(DIGITS, tmp_path / "demo", stream=io.StringIO(), seed=5, flat=True)
    hosts = NodeHosts()
    ok = _handler(hosts)
    calls = {"n": 0}

    def handle(node_id: int, m: Message) -> Message:
        calls["n"] += 1
        if node_id == 32 and calls["n"] > 6:
            return Message(Error(code=0, reason="ClientAppException: boom"), reply_to=m)
        return ok(node_id, m)

    run = asyncio.run(drive(FakeGrid([31, 32, 33], handle), DIGITS, seed=5, out=tmp_path / "flower"))
    assert run.failed_nodes and run.failed_nodes[0].startswith("node-32: flower-error")
    demo, flower = _files(tmp_path / "demo"), _files(tmp_path / "flower")
    assert set(demo) <= set(flower)  # fewer peers per round: as many rounds as the work needs


def test_accept_list_refuses_other_modules_by_name(tmp_path: Path) -> None:
    hosts = NodeHosts()
    grid = FakeGrid([41, 42], _handler(hosts, {"weei-accept": "00" * 32}))
    settings = {**DIGITS.settings, "epochs": 1}
    run = asyncio.run(drive(grid, DIGITS, settings=settings, seed=1, out=tmp_path / "flower"))
    # both nodes declined by name; the coordinator (it participates) trained the job alone
    assert sorted(r.split(":")[0] for r in run.refused) == ["node-41", "node-42"]
    assert all(": model-not-accepted: " in r for r in run.refused) and run.checkpoints
