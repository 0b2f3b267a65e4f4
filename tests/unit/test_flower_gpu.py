"""GPU agents on Flower nodes (lavapipe here and in CI): node config ``weei-backend`` is the agent's
``--backend``; a node trains on its GPU only when its accept-list holds the WGSL archive's SHA-256, and the
GPU backend's admission gate runs as on an agent. Skipped without a Vulkan adapter."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("flwr")

from test_flower_grid import FakeGrid, _files  # noqa: E402
from test_gpu_lavapipe import pytestmark as needs_vulkan  # noqa: E402

from flwr.app import Message  # noqa: E402

from weei.demo.run import DEMO_JOBS, models_dir  # noqa: E402
from weei.flower.client import NodeHosts  # noqa: E402
from weei.flower.server import drive  # noqa: E402

pytestmark = [pytest.mark.flower, needs_vulkan]

DIGITS = DEMO_JOBS[0]
PACKAGE = models_dir() / DIGITS.model
ARCHIVE_NAME = "model.wgsl.json"
ARCHIVE = (PACKAGE / ARCHIVE_NAME).read_bytes()
MODULE_SHA = hashlib.sha256((PACKAGE / "model.wasm").read_bytes()).hexdigest()
ARCHIVE_SHA = hashlib.sha256(ARCHIVE).hexdigest()
# the nodes train, the coordinator does not: every update comes from a node's backend
SETTINGS = {**DIGITS.settings, "epochs": 1, "coordinatorParticipates": False}


def _run(out: Path, config: dict[str, str]) -> tuple[NodeHosts, Any]:
    hosts = NodeHosts()

    def handle(node_id: int, m: Message) -> Message:
        return Message(hosts.handle(node_id, config, m.content), reply_to=m)

    run = asyncio.run(drive(FakeGrid([91, 92], handle), DIGITS, settings=SETTINGS, seed=2, out=out,
                            execution_files={ARCHIVE_NAME: ARCHIVE}))
    return hosts, run


def _events(hosts: NodeHosts, name: str) -> list[dict[str, Any]]:
    return [e for h in hosts.hosts.values() for e in h.controller.get_debug_log()["events"] if e["event"] == name]


def test_gpu_nodes_train_on_the_gpu_behind_the_gate_with_the_cpus_bytes(tmp_path: Path) -> None:
    gpu, run = _run(tmp_path / "gpu", {"weei-accept": f"{MODULE_SHA},{ARCHIVE_SHA}", "weei-backend": "gpu"})
    assert run.failed_nodes == [] and run.refused == []
    trained = _events(gpu, "gpu.trained")
    assert trained and {e["details"]["gate"] for e in trained if "gate" in e["details"]} == {"bit-identical"}
    assert {h.controller.get_state()["execution"]["actual"] for h in gpu.hosts.values()} == {"gpu"}
    cpu, _ = _run(tmp_path / "cpu", {"weei-accept": f"{MODULE_SHA},{ARCHIVE_SHA}", "weei-backend": "cpu"})
    assert _events(cpu, "gpu.trained") == []
    # every kernel keeps the CPU's order on lavapipe (test_gpu_controller): the same checkpoints, to the byte
    on_gpu, on_cpu = _files(tmp_path / "gpu"), _files(tmp_path / "cpu")
    assert len(on_gpu) >= 4 and on_gpu.keys() == on_cpu.keys()
    assert [n for n in on_gpu if on_gpu[n] != on_cpu[n]] == []


def test_an_archive_outside_the_accept_list_trains_on_the_cpu_by_name(tmp_path: Path) -> None:
    hosts, run = _run(tmp_path / "flower", {"weei-accept": MODULE_SHA, "weei-backend": "gpu"})
    assert run.failed_nodes == [] and run.checkpoints
    refused = _events(hosts, "gpu.archive-refused")
    assert refused and {e["details"]["reason"] for e in refused} == {"archive-not-accepted"}
    assert _events(hosts, "gpu.trained") == []
