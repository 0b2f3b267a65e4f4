"""The ServerApp and ClientApp, ``weei flower sim`` (run_simulation) and ``weei flower app`` (a Flower App
folder that ``flwr run`` runs)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TextIO

if TYPE_CHECKING:
    from ..demo.run import DemoJob
    from .client import NodeHosts
    from .server import FlowerRun

# The coordinator's and the participant's modules (wasmtime, numpy, the controller) are imported where they
# are used: a deployed node's ClientApp is a fresh process per message that only forwards to the node's
# resident participant (weei.flower.resident), and each second of imports there is a second of every round.

__all__ = ["quiet_flower", "server_app", "client_app", "module_sha256", "simulate", "write_app", "job_for"]

_HOSTS: dict[frozenset[str], NodeHosts] = {}


def quiet_flower() -> None:
    """Flower's telemetry off for whatever this process starts (Ray workers inherit the environment)."""
    os.environ["FLWR_TELEMETRY_ENABLED"] = "0"


def job_for(package_dir: Path, settings: dict[str, Any] | None = None) -> DemoJob:
    """The package's demo job (by model name, ``weei demo``'s), else a digits-like job on its data."""
    from ..demo.run import DEMO_JOBS, DemoJob

    name = package_dir.resolve().name
    base = next((j for j in DEMO_JOBS if j.model == name), DEMO_JOBS[0])
    validation = base.validation if (package_dir / "data" / str(base.validation)).is_file() else None
    return DemoJob(base.name if base.model == name else name, name, settings or base.settings,
                   validation=validation, package=package_dir)


def _hosts(accept: frozenset[str]) -> NodeHosts:
    from .client import NodeHosts

    if accept not in _HOSTS:
        _HOSTS[accept] = NodeHosts(accept)
    return _HOSTS[accept]


def module_sha256(package_dir: Path) -> str:
    """The SHA-256 of the package's model.wasm: the module hash an accept-list names."""
    return hashlib.sha256((package_dir / "model.wasm").read_bytes()).hexdigest()


def client_app(accept: frozenset[str] = frozenset(), *, resident: bool = False) -> Any:
    """The ClientApp; ``accept`` is the accept-list of a node whose config has no ``weei-accept``. With
    ``resident`` each message goes to the node's resident participant process (a deployment, where every
    message is a fresh ClientApp process: weei.flower.resident), else to participants in this process."""
    from flwr.app import Message
    from flwr.clientapp import ClientApp

    app = ClientApp()
    if resident:
        from .resident import forward

        @app.train()
        def train(message: Any, context: Any) -> Any:
            return Message(forward(context.node_id, context.node_config, message.content), reply_to=message)
    else:
        from .client import client_handler

        app.train()(client_handler(lambda: _hosts(accept)))
    return app


def server_app(job: DemoJob | None = None, *, seed: int | None = None, out: Path | None = None,
               stream: TextIO | None = None, on_run: Callable[[FlowerRun], None] | None = None,
               min_nodes: int = 1, resume: bytes | None = None) -> Any:
    """A ServerApp running ``job`` (else the run config's ``package``/``settings``/``out``/``seed``);
    ``on_run`` gets what the run did."""
    from flwr.serverapp import ServerApp

    from .server import drive

    app = ServerApp()

    @app.main()
    def main(grid: Any, context: Any) -> None:
        cfg = context.run_config
        the_job = job or job_for(Path(str(cfg["package"])),
                                 json.loads(str(cfg["settings"])) if cfg.get("settings") else None)
        the_seed = seed if job is not None else (int(cfg["seed"]) if int(cfg.get("seed", -1)) >= 0 else None)
        the_out = out if job is not None else Path(str(cfg.get("out", "checkpoints")))
        nodes = int(cfg.get("nodes", min_nodes)) if job is None else min_nodes
        run = asyncio.run(drive(grid, the_job, seed=the_seed, out=the_out, stream=stream, min_nodes=nodes,
                                resume=resume))
        if on_run is not None:
            on_run(run)

    return app


# One Ray actor serves every simulated node. A node's participant (its controller, the artifacts and compiled
# module it holds, the assignment it is training) lives in the process that handled its messages, and Flower
# hands a node's next message to whichever actor is free: with several actors a node's state is split between
# processes and the job stalls on a node that never received what it was sent.
SIM_BACKEND: dict[str, Any] = {"init_args": {"num_cpus": 1}, "client_resources": {"num_cpus": 1}}


def simulate(package_dir: Path, *, nodes: int, out: Path, stream: TextIO, settings: dict[str, Any] | None = None,
             seed: int | None = None, resume: bytes | None = None) -> FlowerRun:
    """``weei flower sim``: the package's job on ``nodes`` simulated SuperNodes (Ray), continued from the
    ``.weei-checkpoint`` bytes ``resume`` when given; what the run did."""
    quiet_flower()
    from flwr.simulation import run_simulation

    from .signals import keep_fatal_signal_handlers

    # The simulated nodes are the user's own and have no node config: they accept the module the user ran.
    job = job_for(package_dir, settings)
    accept = frozenset({module_sha256(job.package or package_dir)})
    runs: list[FlowerRun] = []
    with keep_fatal_signal_handlers():
        run_simulation(server_app(job, seed=seed, out=out, stream=stream, on_run=runs.append, min_nodes=nodes,
                                  resume=resume),
                       client_app(accept),
                       num_supernodes=nodes, backend_config=SIM_BACKEND)
    if not runs:  # the ServerApp ended without a completed run
        raise RuntimeError(f"weei flower sim: the ServerApp did not complete {job.name} (see the log above)")
    return runs[0]


_PYPROJECT = """# Written by `weei flower app`. `flwr run .` runs it (docs/flower.md).
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "weei-{name}"
version = "1.0.0"
# Deliberately no dependencies: Flower would install them on the server at each run (uv sync). Weei must
# already be installed where the SuperLink and SuperNodes run (pip install 'weei[cpython,flower]'), so the
# code that runs is the code that was reviewed, not whatever resolves at run time.
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "weei"

[tool.flwr.app.components]
serverapp = "weei_app:server"
clientapp = "weei_app:client"

[tool.flwr.app.config]
package = "{package}"
settings = ""
seed = -1
out = "{out}"
# the job starts once this many SuperNodes are connected (those present then are its participants)
nodes = 1
"""

_APP = '''"""The Weei job as a Flower App (written by `weei flower app`)."""
import os
import sys

os.environ["FLWR_TELEMETRY_ENABLED"] = "0"  # no telemetry from Weei's apps

from weei.flower.apps import client_app, server_app  # noqa: E402

server = server_app(stream=sys.stdout)  # a row per checkpoint, as `weei demo` prints (`flwr run --stream`)
client = client_app(resident=True)
'''


def write_app(package_dir: Path, out: Path) -> Path:
    """``weei flower app``: a Flower App folder for the package; returns its folder."""
    out.mkdir(parents=True, exist_ok=True)
    target = out / "package"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(package_dir, target)
    name = package_dir.resolve().name
    (out / "pyproject.toml").write_text(_PYPROJECT.format(name=name, package=target.resolve(),
                                                          out=(out / "checkpoints").resolve()))
    (out / "weei_app.py").write_text(_APP)
    return out
