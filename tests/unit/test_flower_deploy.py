"""A real Flower deployment on loopback: a SuperLink with TLS certificates this test makes and SuperNode
authentication, SuperNodes registered by key, ``flwr run`` on the app ``weei flower app`` writes. A Weei job
runs to completion while an unregistered node and a node without TLS are refused, a node whose accept-list
lacks the module declines it by name, and a node killed while it holds work has that work reassigned.
Telemetry off; nothing leaves 127.0.0.1."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from weei.core.formats.checkpoint import read_checkpoint  # noqa: E402
from weei.core.formats.jsonfmt import descriptor  # noqa: E402
from weei.demo.run import DEMO_JOBS, models_dir  # noqa: E402
from weei.flower.apps import module_sha256, write_app  # noqa: E402
from weei.flower.local import LocalDeployment, make_node_key  # noqa: E402

pytestmark = pytest.mark.flower

DIGITS = DEMO_JOBS[0]


def _fewer_chunks(target: Path, chunks: int) -> Path:
    """digits-mlp with only its first ``chunks`` chunks listed: a shorter job (every round is a Flower round
    trip of seconds per node)."""
    shutil.copytree(models_dir() / DIGITS.model, target)
    manifest = json.loads((target / "manifest.json").read_text())
    entries = manifest["inlineJson"]["dataset-manifest.json"][:chunks]
    manifest["inlineJson"]["dataset-manifest.json"] = entries
    size, sha = descriptor(entries)
    manifest["execution"]["datasetManifest"].update(bytes=size, sha256=sha)
    (target / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return target


def _received(state: Path, node_id: int) -> int:
    log = state / f"node-{node_id}" / "participant.log"
    return log.read_text().count("received a message") if log.is_file() else 0


def test_deployment_tls_node_keys_accept_lists_and_a_node_killed_mid_job(tmp_path: Path) -> None:
    package = _fewer_chunks(tmp_path / "digits-mlp", 6)
    sha = module_sha256(package)
    state = tmp_path / "state"
    with LocalDeployment(tmp_path / "deploy") as d:
        d.start_superlink()
        keys = tmp_path / "keys"
        registered = {}
        for name, accept in (("a", sha), ("b", sha), ("c", "*"), ("picky", "0" * 64)):
            private, public = make_node_key(keys, name)
            registered[name] = d.register(public)
            d.start_supernode(name, private, {"weei-accept": accept, "weei-state-dir": str(state)})
        stranger, _ = make_node_key(keys, "stranger")  # never registered
        unregistered = d.start_supernode("stranger", stranger, {}, retries=2)
        # a node without TLS (and so without a key: Flower's SuperNode refuses to send a key in clear itself)
        plain = d.start_supernode("plain", None, {}, tls=False, retries=2)
        d.wait_online(list(registered.values()))

        app = write_app(package, tmp_path / "app")
        settings = {**DIGITS.settings, "epochs": 1, "coordinatorParticipates": False}
        out = tmp_path / "out"
        (tmp_path / "run.toml").write_text(f"seed = 7\nnodes = 4\nout = '{out}'\nsettings = '{json.dumps(settings)}'\n")
        run = subprocess.Popen(["flwr", "run", str(app), "--stream", "--run-config", str(tmp_path / "run.toml")],
                               env=d.env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        # Node c is killed (SuperNode, SuperExec, ClientApp and its resident participant at once) while it holds
        # a message past the invitation and validation: the coordinator is waiting for its answer.
        deadline = time.monotonic() + 180
        while _received(state, registered["c"]) < 3 and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert run.poll() is None, "the job ended before node c got work"
        log = state / f"node-{registered['c']}" / "participant.log"
        assert _received(state, registered["c"]) >= 3, log.read_text()[-2000:] if log.is_file() else "no log"
        d.kill_node("c")
        killed_at = time.monotonic()
        output, _ = run.communicate(timeout=240)
        (tmp_path / "run.out").write_text(f"{output}\n(the job ended {time.monotonic() - killed_at:.0f} s after the kill)\n")
        assert run.returncode == 0, output[-4000:]

        assert unregistered.wait(timeout=60) != 0 and "Failed to activate SuperNode" in d.log("stranger")
        assert plain.wait(timeout=60) != 0 and "could not establish a connection" in d.log("plain")
        nodes = d.online()
        assert set(nodes) == set(registered.values()), nodes  # the refused two never joined

    peers = {name: f"node-{node_id}" for name, node_id in registered.items()}
    refused = re.findall(r"^-- (node-\d+): model-not-accepted: module (\w+)", output, re.M)
    assert refused == [(peers["picky"], sha)], output[-4000:]
    assert re.search(rf"^-- {peers['c']}: flower-error", output, re.M), output[-4000:]
    checkpoints = sorted(out.glob("*.weei-checkpoint"))
    last = read_checkpoint(checkpoints[-1].read_bytes()).metadata.to_json()
    # nothing lost: the job's last checkpoint is complete and every chunk of the epoch was trained
    assert last["incomplete"] is False
    assert sorted(last["trainedChunkIds"]) == [f"chunk-{i:03d}" for i in range(1, 7)]
    assert len(checkpoints) == last["round"] + 1
