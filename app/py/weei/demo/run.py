"""``weei demo``: the built-in demo jobs, trained for real in one process.

Each peer is a full ``TrainingController`` — the same API object the
browser exposes — with its own storage, wasmtime Worker pool and
aggregation kernel, connected over the in-memory transport. The
coordinator creates the job from the reference package, invites the
others, they accept, and the job runs to completion. A per-round table is
printed as checkpoints are validated, the .weei-checkpoint files are
written to ``out/<job>/``, and the run fails when the final validation (or
evaluation) metric is not better than round 0's (the initial weights, validated before Start).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, NoReturn, TextIO

from ..api.controller import TrainingController
from ..host.memory_storage import MemoryKeyValue, MemoryStorage
from ..host.worker_pool import ThreadWorkerPool
from ..runtime.wasmtime_engine import WasmtimeEngine
from .network import MemoryNetwork

__all__ = ["DemoJob", "DEMO_JOBS", "JobReport", "run_job", "run_demo", "models_dir", "seeded_bytes", "package_inputs"]


def models_dir() -> Path:
    """The reference model packages (``app/static/models``; ``WEEI_MODELS`` overrides)."""
    env = os.environ.get("WEEI_MODELS")
    return Path(env) if env else Path(__file__).resolve().parents[3] / "static" / "models"


@dataclass(frozen=True)
class DemoJob:
    name: str
    model: str
    settings: dict[str, Any]
    peers: int = 4  # training peers, the coordinator included
    validation: str | None = None  # validation file in the package's data folder
    package: Path | None = None  # the package folder (weei train); default: models_dir() / model
    data: Path | None = None  # the folder of its data files; default: the package's data/


DEMO_JOBS = (
    DemoJob("digits", "digits-mlp", {
        "epochs": 3, "localEpochs": 2, "batchSize": 16, "coordinatorParticipates": True,
        "validationSchedule": {"enabled": True, "unit": "round", "every": 1},
    }, validation="validation.bin"),
    DemoJob("cartpole", "cartpole-reinforce", {
        "epochs": 30, "localEpochs": 1, "batchSize": 16, "coordinatorParticipates": True,
        "experience": {"unitsPerAssignment": 32},
        "validationSchedule": {"enabled": True, "unit": "round", "every": 1},
    }),
)


@dataclass
class JobReport:
    """What a demo job did, for the closing verdict."""

    name: str
    metric: str
    direction: str
    rounds: list[dict[str, Any]] = field(default_factory=list)
    rejected: int = 0
    #: What the participants' updates took on the network: (bytes, messages); the coordinator's own don't travel.
    updates_sent: tuple[int, int] = (0, 0)
    #: Every message type that travelled: (bytes, messages), as the network counted them.
    traffic: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: The same by (sender, receiver, message type).
    routes: dict[tuple[str, str, str], tuple[int, int]] = field(default_factory=dict)

    def values(self) -> list[float]:
        return [r["validation"][self.metric] for r in self.rounds
                if r["round"] > 0 and self.metric in r.get("validation", {})]

    @property
    def improved(self) -> bool:
        return improved(self.rounds, self.metric, self.direction)

    def summary(self) -> str:
        return metric_summary(self.rounds, self.metric, self.direction)


def _validated(rounds: list[dict[str, Any]], metric: str) -> list[tuple[int, float]]:
    return [(r["round"], r["validation"][metric]) for r in rounds if metric in r.get("validation", {})]


def improved(rounds: list[dict[str, Any]], metric: str, direction: str) -> bool:
    """Whether the last validated round beats the first one validated: round 0, the initial weights, when
    it was validated (the demo validates it before Start)."""
    values = _validated(rounds, metric)
    if len(values) < 2:
        return False
    (_, first), (_, last) = values[0], values[-1]
    return last < first if direction == "minimize" else last > first


def metric_summary(rounds: list[dict[str, Any]], metric: str, direction: str) -> str:
    """'accuracy (maximize): round 0 (initial weights) 0.0943 -> round 12 0.9461, best 0.9495 at round 10'."""
    values = _validated(rounds, metric)
    if not values:
        return f"{metric} ({direction}): not validated"
    (r0, v0), (rn, vn) = values[0], values[-1]
    start = f"round {r0} (initial weights)" if r0 == 0 else f"round {r0}"
    best = (min if direction == "minimize" else max)(values, key=lambda rv: rv[1])
    tail = f", best {best[1]:.4f} at round {best[0]}" if best[1] != vn else ""
    return f"{metric} ({direction}): {start} {v0:.4f} -> round {rn} {vn:.4f}{tail}"


def seeded_bytes(seed: int) -> Callable[[int], bytes]:
    """A deterministic stand-in for ``os.urandom``: SHA-256 of (seed, call number).

    Given to the coordinator it fixes the job id (hence every assignment's
    training seed) and the initial weights' seed, so runs that differ only
    in their settings start from the same weights and train the same way.
    """
    calls = 0

    def draw(n: int) -> bytes:
        nonlocal calls
        calls += 1
        out = b""
        block = 0
        while len(out) < n:
            out += hashlib.sha256(f"weei-demo-seed/{seed}/{calls}/{block}".encode()).digest()
            block += 1
        return out[:n]

    return draw


def _kernel() -> Any:
    from ..kernel.native import NativeKernel

    return NativeKernel()


def _controller(peer_id: str, network: MemoryNetwork, engine: WasmtimeEngine,
                random_bytes: Callable[[int], bytes] = os.urandom) -> TrainingController:
    controller = TrainingController(
        my_peer_id=peer_id, storage=MemoryStorage(), kv=MemoryKeyValue(), pool=ThreadWorkerPool(engine, 1),
        kernel=_kernel(), engine=engine, clock=lambda: time.time() * 1000.0,
        monotonic=lambda: time.monotonic() * 1000.0, random_bytes=random_bytes, transport=network.transport(peer_id))
    network.attach(controller)
    return controller


def package_inputs(package_dir: Path, data_dir: Path, validation: str | None) -> dict[str, Any]:
    """create_job's model arguments from a package folder: model.wasm, manifest.json and the data
    files its dataset manifest names, read from ``data_dir`` (the controller checks them against it).
    Raises: UsageError (no-manifest, bad-manifest, missing-data-file)."""
    from ..core._check import parse_json
    from ..core.errors import UsageError, UsageReason

    def bad(message: str) -> NoReturn:
        raise UsageError(UsageReason.BAD_MANIFEST, f"{package_dir / 'manifest.json'} {message}")

    try:
        manifest = (package_dir / "manifest.json").read_bytes()
        wasm = (package_dir / "model.wasm").read_bytes()
    except OSError as exc:
        raise UsageError(UsageReason.NO_MANIFEST, f"{package_dir} is not a model package (manifest.json and model.wasm: "
                                        f"weei model build or weei model import write them): {exc}") from None
    parsed = parse_json(manifest, bad)
    entries = parsed.get("inlineJson", {}).get("dataset-manifest.json") if isinstance(parsed, dict) else None
    if not isinstance(entries, list) or not all(isinstance(e, dict) and isinstance(e.get("fileName"), str)
                                                for e in entries):
        bad("has no inlineJson dataset-manifest.json list of files")
    files: dict[str, bytes] = {}
    for e in entries:
        path = data_dir / Path(e["fileName"]).name  # a name, never a path out of the data folder
        if not path.is_file():
            raise UsageError(UsageReason.MISSING_DATA_FILE, f"{path} is missing (the package's dataset manifest lists it)")
        files[e["fileName"]] = path.read_bytes()
    inputs: dict[str, Any] = {"wasm_name": "model.wasm", "wasm": wasm, "manifest": manifest, "files": files}
    if validation is not None:
        inputs["validation"] = (validation, (data_dir / validation).read_bytes())
    return inputs


def _package_inputs(job: DemoJob) -> dict[str, Any]:
    package_dir = job.package or models_dir() / job.model
    return package_inputs(package_dir, job.data or package_dir / "data", job.validation)


class _Table:
    """Prints a row per checkpoint once its validation is in."""

    def __init__(self, stream: TextIO, info: dict[str, Any], experience: bool, report: JobReport) -> None:
        self.stream = stream
        self.metric_ids = [m["id"] for m in info["metrics"]]
        self.report = report
        self.printed: set[int] = set()
        self.last_at: float | None = None
        unit = "units" if experience else "examples"
        kind = "eval" if experience else "valid"
        print(f"{'round':>5} {'peers':>5} {unit:>8}  " + "  ".join(f"train {m:>8}" for m in self.metric_ids)
              + "  " + "  ".join(f"{kind} {m:>8}" for m in self.metric_ids) + f"  {'seconds':>7}", file=stream)

    def update(self, state: dict[str, Any], contributors: dict[int, int]) -> None:
        for cp in state.get("job", {}).get("checkpoints", []):
            round_ = cp["artifact"]["round"]
            if round_ in self.printed or ("validationMetrics" not in cp and "validationError" not in cp):
                continue
            self.printed.add(round_)
            seconds = (cp["createdAt"] - self.last_at) / 1000 if self.last_at is not None else 0.0
            self.last_at = cp["createdAt"]
            train = cp["metrics"]["values"]
            valid = cp.get("validationMetrics", {}).get("values", {})
            self.report.rounds.append({"round": round_, "train": train, "validation": valid, "seconds": seconds,
                                       "peers": contributors.get(round_, 0)})
            cells = "  ".join(f"{train.get(m, float('nan')):>14.4f}" for m in self.metric_ids)
            vcells = "  ".join(f"{valid.get(m, float('nan')):>14.4f}" for m in self.metric_ids)
            print(f"{round_:>5} {contributors.get(round_, 0):>5} {cp['metrics']['examplesProcessed']:>8}  {cells}  "
                  f"{vcells}  {seconds:>7.2f}", file=self.stream, flush=True)


async def _run_job(job: DemoJob, target: Path, stream: TextIO, settings: dict[str, Any] | None,
                   seed: int | None, resume: bytes | None = None) -> JobReport:
    engine = WasmtimeEngine()
    network = MemoryNetwork()
    coordinator = _controller("coordinator", network, engine,
                              os.urandom if seed is None else seeded_bytes(seed))
    others = [_controller(f"peer-{i}", network, engine) for i in range(1, job.peers)]
    try:
        for c in (coordinator, *others):
            await c.init()
        if resume is None:
            job_id = await coordinator.create_job(**_package_inputs(job), settings=settings or job.settings)
        else:
            job_id = await coordinator.continue_from_checkpoint(checkpoint=resume, **_package_inputs(job),
                                                                settings=settings or job.settings,
                                                                dataset_mode="resume")
        state = coordinator.get_state()["job"]
        info = state["info"]
        metric = info["metrics"][0]
        experience = "workSource" in info
        report = JobReport(job.name, metric["id"], metric["direction"])
        print(f"\n== {job.name}: {info['name']} — {job.peers} peers, {state['settings']['epochs']} "
              f"{'rounds' if experience else 'epochs'}, {len(state.get('queue', []))} chunks", file=stream)
        table = _Table(stream, info, experience, report)
        contributors: dict[int, int] = {}
        ended = asyncio.Event()

        def on_state(s: dict[str, Any]) -> None:
            core = coordinator.coordinator
            if core is not None and core.checkpoint_round not in contributors:
                contributors[core.checkpoint_round] = len(core.last_contributors)
            table.update(s, contributors)
            if s.get("job", {}).get("status") in ("completed", "paused"):
                ended.set()

        stop = coordinator.subscribe(on_state)
        for peer in others:
            coordinator.invite(peer.my_peer_id)
        await network.settle()
        for peer in others:
            await peer.decide_invitation(job_id, True)
        await network.settle()
        await coordinator.run_validation()
        await network.settle()
        await coordinator.start()
        # Woken by the subscription, not a poll: a state view costs about as much as a message's handling, and
        # polling every 10 ms took a share of every job's CPU time that grew with its length. The timeout
        # is for an end that no notification told.
        while (status := coordinator.get_state()["job"]["status"]) != "completed":
            if status == "paused":
                raise RuntimeError(f"{job.name}: the job paused: {coordinator.get_state().get('error')}")
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(ended.wait(), 0.5)
        await network.settle()
        stop()
        table.update(coordinator.get_state(), contributors)
        report.rejected = len(coordinator.coordinator.rejected) if coordinator.coordinator else 0
        report.updates_sent = (network.bytes_by_type.get("update", 0), network.count_by_type.get("update", 0))
        report.traffic = {kind: (network.bytes_by_type[kind], count) for kind, count in network.count_by_type.items()}
        report.routes = {route: (size, count) for route, (size, count) in network.routes.items()}
        target.mkdir(parents=True, exist_ok=True)
        files = 0
        for key in await coordinator.storage.keys("checkpoints"):
            entry = await coordinator.storage.get("checkpoints", key)
            (target / entry["summary"]["artifact"]["fileName"]).write_bytes(entry["file"])
            files += 1
        print(f"-- {job.name}: {files} checkpoints in {target}; {report.summary()}; rejected updates: {report.rejected}; "
              f"{network.bytes_moved / 1e6:.1f} MB moved between peers", file=stream)
        return report
    finally:
        await network.close()


def run_job(job: DemoJob, out_dir: Path, *, stream: TextIO, settings: dict[str, Any] | None = None,
            seed: int | None = None, flat: bool = False, resume: bytes | None = None) -> JobReport:
    """Train one demo job to completion; returns its per-round report.

    With ``seed`` the job id and initial weights are a function of it (see
    :func:`seeded_bytes`); without, they are random. The checkpoints go to
    ``out_dir/<job name>``, or into ``out_dir`` itself when ``flat``. With ``resume`` (a
    ``.weei-checkpoint`` file's bytes) the job continues from it (``continueFromCheckpoint``,
    ``datasetMode: 'resume'``).
    """
    return asyncio.run(_run_job(job, out_dir if flat else out_dir / job.name, stream, settings, seed, resume))


def run_demo(out_dir: Path, *, stream: TextIO, jobs: tuple[DemoJob, ...] = DEMO_JOBS) -> int:
    """Run every demo job; 0 when each final metric beat round 0's, else 1."""
    failed = []
    for job in jobs:
        report = run_job(job, out_dir, stream=stream)
        if not report.improved:
            failed.append(job.name)
    if failed:
        print(f"FAILED: the final metric did not improve for {', '.join(failed)}", file=stream)
        return 1
    print("OK: every job's final metric is better than at round 0 (its initial weights)", file=stream)
    return 0
