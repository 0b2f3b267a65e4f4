"""The issue's test matrix through the in-process fake grid (test_flower_grid.FakeGrid): CartPole's
checkpoints are the in-process run's bytes, every arrival order of four nodes' replies gives one result,
and a participant's faults are handled as over WebRTC (the in-process network), to the checkpoints' bytes."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import io
import itertools
import struct
import time
from pathlib import Path
from typing import Any, Callable

import pytest

pytest.importorskip("flwr")

from flwr.app import Message  # noqa: E402
from test_flower_grid import FakeGrid, _files, _handler  # noqa: E402

from weei.demo.run import DEMO_JOBS, run_job  # noqa: E402
from weei.flower.client import NodeHosts  # noqa: E402
from weei.core.wire.messages import ArtifactRef, Update  # noqa: E402
from weei.flower.client import node_peer  # noqa: E402
from weei.flower.codec import decode_frames, encode_frames  # noqa: E402
from weei.flower.server import FlowerRun, drive  # noqa: E402

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


# ---------------------------------------------------------------- faults: the same as over WebRTC

FAULTS = ("raises", "wrong-count", "nan", "never-answers")
FAULT_SETTINGS = {**DIGITS.settings, "epochs": 1}


class Fault:
    """One participant's fault, injected the same way on both paths: on the in-process network (peer-2,
    what the coordinator hears over a data channel) and in a ClientApp wrapper on the fake grid (node 32,
    the same participant: both are the second of three invited). It strikes the first update that
    participant sends: a ClientApp that raises (Flower's error reply; over WebRTC the channel closes),
    weights one float short, a NaN among the weights, or no reply ever (a hung participant: everything it
    sends from then on is lost).

    The coordinator's round deadline is 10 minutes of its clock: when the hung participant's attempts are
    the only ones open, the coordinator's clock jumps past it (simulated time; nothing waits 10 minutes)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.struck = False
        self.skew_ms = 0.0
        self.jumps = 0
        self.coordinator: Any = None
        self.hung: str | None = None

    def clock(self) -> float:
        return time.time() * 1000.0 + self.skew_ms

    def capture(self, make: Callable[..., Any]) -> Callable[..., Any]:
        """Wraps a module's ``_controller``: the coordinator it makes runs on this fault's clock."""
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            controller = make(*args, **kwargs)
            if controller.my_peer_id == "coordinator":
                self.coordinator = controller
                controller.clock = controller.session.clock = self.clock
                asyncio.ensure_future(self._watch())
            return controller
        return wrapped

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(0.005)
            core = self.coordinator.coordinator
            if self.hung is not None and core is not None and core.attempts.busy_peers() == {self.hung}:
                self.skew_ms += core.round_timeout_ms + 1000.0
                self.jumps += 1
                self.coordinator.executor.arm_timer()

    def spoil(self, update: Update, blobs: dict[str, bytes]) -> tuple[Update, dict[str, bytes]]:
        weights = blobs[update.weights.sha256]
        weights = weights[:-4] if self.kind == "wrong-count" else struct.pack("<I", 0x7FC00001) + weights[4:]
        sha = hashlib.sha256(weights).hexdigest()
        return dataclasses.replace(update, weights=ArtifactRef("update", sha, len(weights))), {sha: weights}

    def rejected(self) -> list[tuple[int, str]]:
        return [(r.round, r.reason.split(":")[0]) for r in self.coordinator.coordinator.rejected]


def _in_process(fault: Fault, out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import weei.demo.run as demo_run
    from weei.demo.network import MemoryNetwork

    post = MemoryNetwork.post

    def faulty_post(network: MemoryNetwork, src: str, send: Any, blobs: Any) -> None:
        if src == fault.hung:
            return
        if src == "peer-2" and isinstance(send.message, Update) and not fault.struck:
            fault.struck = True
            if fault.kind == "raises":
                asyncio.ensure_future(network.disconnect(src))
                return
            if fault.kind == "never-answers":
                fault.hung = src
                return
            message, blobs = fault.spoil(send.message, blobs)
            send = dataclasses.replace(send, message=message)
        post(network, src, send, blobs)

    monkeypatch.setattr(MemoryNetwork, "post", faulty_post)
    monkeypatch.setattr(demo_run, "_controller", fault.capture(demo_run._controller))
    run_job(DIGITS, out, stream=io.StringIO(), settings=FAULT_SETTINGS, seed=5, flat=True)


def _on_flower(fault: Fault, out: Path, monkeypatch: pytest.MonkeyPatch) -> FlowerRun:
    import weei.flower.server as server
    from flwr.app import Error

    monkeypatch.setattr(server, "_controller", fault.capture(server._controller))
    honest = NodeHosts()

    def train(node_id: int, message: Message) -> Message | None:
        """A ClientApp's train function with the fault (None: it never returns)."""
        if fault.hung == node_peer(node_id):
            return None
        content = honest.handle(node_id, {"weei-accept": "*"}, message.content)
        frames, _ = decode_frames(content)
        if node_id != 32 or fault.struck or not any(isinstance(m, Update) for _, m, _ in frames):
            return Message(content, reply_to=message)
        fault.struck = True
        if fault.kind == "raises":
            raise RuntimeError("the model's train step failed")
        if fault.kind == "never-answers":
            fault.hung = node_peer(node_id)
            return None
        frames = [(src, *fault.spoil(m, b)) if isinstance(m, Update) else (src, m, b) for src, m, b in frames]
        return Message(encode_frames(frames), reply_to=message)

    def client_app(node_id: int, message: Message) -> Message | None:
        """What Flower's runtime does around the ClientApp: an exception becomes an error reply."""
        try:
            return train(node_id, message)
        except RuntimeError as exc:
            return Message(Error(code=0, reason=f"ClientAppException: {exc}"), reply_to=message)

    return asyncio.run(drive(FakeGrid([31, 32, 33], client_app), DIGITS, settings=FAULT_SETTINGS, seed=5, out=out))


@pytest.mark.parametrize("kind", FAULTS)
def test_faults_are_handled_as_over_webrtc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """The same fault of the same participant at the same point: the coordinator rejects (or reassigns, or
    waits out) the same way on Flower as on the in-process network, and every checkpoint has the same bytes."""
    webrtc, flower = Fault(kind), Fault(kind)
    _in_process(webrtc, tmp_path / "demo", monkeypatch)
    monkeypatch.undo()
    run = _on_flower(flower, tmp_path / "flower", monkeypatch)
    assert webrtc.struck and flower.struck
    expected = {"raises": [], "wrong-count": [(1, "wrong-size")], "nan": [(1, "non-finite-weights")],
                "never-answers": []}[kind]
    assert webrtc.rejected() == flower.rejected() == expected
    assert webrtc.jumps == flower.jumps and (webrtc.jumps > 0) == (kind == "never-answers")
    assert [f.split(":")[0] for f in run.failed_nodes] == (["node-32"] if kind == "raises" else [])
    assert run.unanswered == (["node-32"] if kind == "never-answers" else [])
    _same(_files(tmp_path / "demo"), _files(tmp_path / "flower"), 4)


# ---------------------------------------------------------------- resume

RESUME = {
    "digits-fedavgm": (DIGITS, {**DIGITS.settings, "epochs": 2, "aggregation": {"method": "fedavgm", "momentum": 0.5}}),
    "cartpole": (CARTPOLE, {**CARTPOLE.settings, "epochs": 6}),
}


@pytest.mark.parametrize("name", sorted(RESUME))
def test_resume_from_checkpoint_k_equals_the_uninterrupted_run(tmp_path: Path, name: str) -> None:
    """Continuing from checkpoint 3 (``continueFromCheckpoint`` with ``datasetMode: 'resume'``: weights,
    FedAvgM's state, the dataset queue or the episode seeds) gives the uninterrupted run's checkpoints 3..N,
    byte for byte: a Flower checkpoint on Flower, an in-process checkpoint on Flower, and a Flower checkpoint
    in the in-process run."""
    job, settings = RESUME[name]

    def flower(out: str, resume: bytes | None = None) -> dict[str, bytes]:
        asyncio.run(drive(FakeGrid([81, 82, 83], _handler(NodeHosts())), job, settings=settings, seed=8,
                          out=tmp_path / out, resume=resume))
        return _files(tmp_path / out)

    def in_process(out: str, resume: bytes | None = None) -> dict[str, bytes]:
        run_job(job, tmp_path / out, stream=io.StringIO(), settings=settings, seed=8, flat=True, resume=resume)
        return _files(tmp_path / out)

    whole_demo, whole_flower = in_process("demo"), flower("flower")
    _same(whole_demo, whole_flower, 7)
    names = sorted(whole_demo)
    k = names[3]
    tail = {n: whole_demo[n] for n in names[3:]}
    _same(tail, flower("flower-from-flower", whole_flower[k]), 4)
    _same(tail, flower("flower-from-demo", whole_demo[k]), 4)
    _same(tail, in_process("demo-from-flower", whole_flower[k]), 4)
