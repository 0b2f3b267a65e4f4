"""``weei demo``: the built-in demo jobs, trained for real in one process.

Each job runs the real job preparation, the real coordinator and
participant state machines and one wasmtime model runtime per peer, over
the in-memory transport. The coordinator participates, so N peers train.
A per-round table is printed as checkpoints land, the .weei-checkpoint
files are written to ``out/<job>/``, and the run fails when the final
validation (or evaluation) metric is not better than the first.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TextIO

from ..core.commands import SaveCheckpoint
from ..core.coordinator import Coordinator
from ..core.messages import Invitation
from ..host.coordinator_host import CoordinatorHost
from ..host.participant_host import ParticipantHost
from ..host.store import ArtifactStore
from ..core.participant import Participant
from ..prepare import prepare_job
from ..runtime.wasmtime_engine import WasmtimeEngine
from .network import Endpoint, MemoryNetwork

__all__ = ["DemoJob", "DEMO_JOBS", "run_job", "run_demo", "models_dir"]


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

    def values(self) -> list[float]:
        return [r["validation"][self.metric] for r in self.rounds
                if r["round"] > 0 and self.metric in r.get("validation", {})]

    @property
    def improved(self) -> bool:
        values = self.values()
        if len(values) < 2:
            return False
        first, last = values[0], values[-1]
        return last < first if self.direction == "minimize" else last > first


def _kernel() -> Any:
    from ..kernel.native import NativeKernel

    return NativeKernel()


def run_job(job: DemoJob, out_dir: Path, *, stream: TextIO, clock: Callable[[], float] | None = None,
            settings: dict[str, Any] | None = None) -> JobReport:
    """Train one demo job to completion; returns its per-round report."""
    clock = clock or (lambda: time.time() * 1000.0)
    package_dir = models_dir() / job.model
    manifest = json.loads((package_dir / "manifest.json").read_text())
    entries = manifest["inlineJson"]["dataset-manifest.json"]
    files = {e["fileName"]: (package_dir / "data" / e["fileName"]).read_bytes() for e in entries}
    validation = None
    if job.validation is not None:
        validation = (job.validation, (package_dir / "data" / job.validation).read_bytes())
    engine = WasmtimeEngine()
    prepared = prepare_job(engine, job_id=f"demo-{job.name}", wasm_name="model.wasm",
                           wasm=(package_dir / "model.wasm").read_bytes(), manifest=manifest, files=files,
                           settings=settings or job.settings, random_bytes=os.urandom(16), validation=validation)
    info = prepared.spec.info
    metric = info.metrics[0]
    report = JobReport(job.name, metric.id, metric.direction)
    coordinator = Coordinator.create(prepared.spec, prepared.initial_weights, my_peer_id="coordinator",
                                     kernel=_kernel(), now=clock(), job_seed=prepared.job_seed)
    store = ArtifactStore()
    for sha, data in prepared.artifacts.items():
        store.put(data, sha)

    network = MemoryNetwork(clock)
    started = [time.perf_counter()]
    metric_ids = [m.id for m in info.metrics]
    unit = "units" if prepared.spec.is_experience else "examples"
    header = f"{'round':>5} {'peers':>5} {unit:>8}  " + "  ".join(f"train {m:>8}" for m in metric_ids) + \
             "  " + "  ".join(f"{'eval' if prepared.spec.is_experience else 'valid'} {m:>8}" for m in metric_ids) + \
             f"  {'seconds':>7}"
    print(f"\n== {job.name}: {info.name} — {job.peers} peers, "
          f"{prepared.spec.settings.epochs} {'rounds' if prepared.spec.is_experience else 'epochs'}, "
          f"{len(prepared.spec.chunks)} chunks, {prepared.spec.weight_bytes} weight bytes", file=stream)
    print(header, file=stream)

    pending: dict[int, dict[str, Any]] = {}

    def on_checkpoint(save: SaveCheckpoint) -> None:
        now = time.perf_counter()
        row = {"round": save.round, "peers": len(coordinator.last_contributors) if save.round else 0,
               "count": save.summary["metrics"]["examplesProcessed"],
               "train": dict(save.summary["metrics"]["values"]), "seconds": now - started[0]}
        started[0] = now
        pending[save.round] = row

    def print_row(round_: int) -> None:
        row = pending.pop(round_)
        summary = next(c for c in coordinator.checkpoints if c["artifact"]["round"] == round_)
        row["validation"] = dict(summary.get("validationMetrics", {}).get("values", {}))
        report.rounds.append(row)
        train = "  ".join(f"{row['train'].get(m, float('nan')):>14.4f}" for m in metric_ids)
        valid = "  ".join(f"{row['validation'].get(m, float('nan')):>14.4f}" for m in metric_ids)
        print(f"{row['round']:>5} {row['peers']:>5} {row['count']:>8}  {train}  {valid}  {row['seconds']:>7.2f}",
              file=stream, flush=True)

    host = CoordinatorHost(coordinator, prepared.runtime, store, clock, validation=prepared.validation,
                           out_dir=out_dir / job.name, on_checkpoint=on_checkpoint)
    original_validate = host._validate

    def validate_and_print(command: Any) -> None:
        original_validate(command)
        if command.round in pending:
            print_row(command.round)

    host._validate = validate_and_print  # type: ignore[method-assign]
    network.attach(Endpoint("coordinator", coordinator=host,
                            participant=ParticipantHost("coordinator", engine, clock)))
    network.endpoints["coordinator"].participant.participant = Participant.local("coordinator", prepared.spec.job_id)  # type: ignore[union-attr]

    def accept(peer_host: ParticipantHost, invitation: Invitation) -> None:
        peer_host.participant.decide(True, clock())

    for i in range(1, job.peers):
        network.attach(Endpoint(f"peer-{i}", participant=ParticipantHost(f"peer-{i}", engine, clock),
                                on_invitation=accept))
    network.kick()
    for i in range(1, job.peers):
        coordinator.invite(f"peer-{i}", clock())
    network.kick()
    coordinator.request_validation(clock())
    network.kick()
    coordinator.start(clock())
    network.kick()
    for round_ in sorted(pending):
        print_row(round_)
    if coordinator.status != "completed":
        raise RuntimeError(f"{job.name}: the job stopped at round {coordinator.checkpoint_round} "
                           f"with status {coordinator.status}: {coordinator.error}")
    values = report.values()
    print(f"-- {job.name}: {len(coordinator.checkpoints)} checkpoints in {out_dir / job.name}; "
          f"{metric.id} ({metric.direction}) {values[0]:.4f} -> {values[-1]:.4f}; "
          f"rejected updates: {len(coordinator.rejected)}", file=stream)
    return report


def run_demo(out_dir: Path, *, stream: TextIO, jobs: tuple[DemoJob, ...] = DEMO_JOBS) -> int:
    """Run every demo job; 0 when each final metric beat its first, else 1."""
    failed = []
    for job in jobs:
        report = run_job(job, out_dir, stream=stream)
        if not report.improved:
            failed.append(job.name)
    if failed:
        print(f"FAILED: the final metric did not improve for {', '.join(failed)}", file=stream)
        return 1
    print("OK: every job's final metric is better than its first", file=stream)
    return 0
