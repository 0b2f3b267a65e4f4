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
                 order: Callable[[list[Message]], list[Message]] = lambda m: m) -> None:
        self.nodes = list(nodes)
        self.handler = handler
        self.order = order
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
            m.metadata.__dict__["_message_id"] = mid
            self.pending[mid] = m
            ids.append(mid)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        wanted = [self.pending.pop(mid) for mid in list(message_ids) if mid in self.pending]
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
    run_job(DIGITS, tmp_path / "demo", stream=io.StringIO(), seed=7, flat=True)
    grid = FakeGrid([11, 12, 13], _handler(NodeHosts()))
    run = asyncio.run(drive(grid, DIGITS, seed=7, out=tmp_path / "flower"))
    demo, flower = _files(tmp_path / "demo"), _files(tmp_path / "flower")
    assert len(demo) >= 4 and demo.keys() == flower.keys()
    assert [n for n in demo if demo[n] != flower[n]] == []
    assert run.failed_nodes == [] and run.bytes_skipped > 0
