"""The ServerApp and ClientApp, ``weei flower sim`` (run_simulation) and ``weei flower app`` (a Flower App
folder that ``flwr run`` runs)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path
from typing import Any, TextIO

from ..demo.run import DEMO_JOBS, DemoJob, models_dir
from .client import NodeHosts, client_handler
from .server import drive

__all__ = ["quiet_flower", "server_app", "client_app", "simulate", "write_app", "job_for"]

_HOSTS: list[NodeHosts] = []


def quiet_flower() -> None:
    """Flower's telemetry off for whatever this process starts (Ray workers inherit the environment)."""
    os.environ["FLWR_TELEMETRY_ENABLED"] = "0"


def job_for(package_dir: Path, settings: dict[str, Any] | None = None) -> DemoJob:
    """The package's demo job (by model name, ``weei demo``'s), else a digits-like job on its data."""
    name = package_dir.resolve().name
    base = next((j for j in DEMO_JOBS if j.model == name), DEMO_JOBS[0])
    validation = base.validation if (package_dir / "data" / str(base.validation)).is_file() else None
    return DemoJob(base.name if base.model == name else name, name, settings or base.settings,
                   validation=validation, package=package_dir)


def _hosts() -> NodeHosts:
    if not _HOSTS:
        _HOSTS.append(NodeHosts())
    return _HOSTS[0]


def client_app() -> Any:
    from flwr.clientapp import ClientApp

    app = ClientApp()
    app.train()(client_handler(_hosts))
    return app


def server_app(job: DemoJob | None = None, *, seed: int | None = None, out: Path | None = None,
               stream: TextIO | None = None) -> Any:
    """A ServerApp running ``job`` (else the run config's ``package``/``settings``/``out``/``seed``)."""
    from flwr.serverapp import ServerApp

    app = ServerApp()

    @app.main()
    def main(grid: Any, context: Any) -> None:
        cfg = context.run_config
        the_job = job or job_for(Path(str(cfg["package"])),
                                 json.loads(str(cfg["settings"])) if cfg.get("settings") else None)
        the_seed = seed if job is not None else (int(cfg["seed"]) if int(cfg.get("seed", -1)) >= 0 else None)
        the_out = out if job is not None else Path(str(cfg.get("out", "checkpoints")))
        asyncio.run(drive(grid, the_job, seed=the_seed, out=the_out, stream=stream))

    return app


def simulate(package_dir: Path, *, nodes: int, out: Path, stream: TextIO, settings: dict[str, Any] | None = None,
             seed: int | None = None) -> None:
    """``weei flower sim``: the package's job on ``nodes`` simulated SuperNodes (Ray)."""
    quiet_flower()
    from flwr.simulation import run_simulation

    run_simulation(server_app(job_for(package_dir, settings), seed=seed, out=out, stream=stream), client_app(),
                   num_supernodes=nodes, backend_config={"client_resources": {"num_cpus": 1}})


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

[tool.flwr.federations]
default = "local-simulation"

[tool.flwr.federations.local-simulation]
options.num-supernodes = 4
"""

_APP = '''"""The Weei job as a Flower App (written by `weei flower app`)."""
import os

os.environ["FLWR_TELEMETRY_ENABLED"] = "0"  # no telemetry from Weei's apps

from weei.flower.apps import client_app, server_app  # noqa: E402

server = server_app()
client = client_app()
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
