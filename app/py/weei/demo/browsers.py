"""``weei demo --browsers``: the main job, with real browsers and an agent.

Starts ``weei serve`` (static site + signaling), a coordinator page and two
participant pages, each in a headless Chromium process of its own, and one
``weei agent`` process, all in one room. For the digits and the CartPole
package the coordinator page creates the job through the public API,
invites everyone, the pages accept, the agent accepts by its
``--accept-model`` and ``--trust-room`` policy, and the job trains to completion over WebRTC.
A row is printed per checkpoint, then each participant's diagnostics; the
final checkpoint is saved to ``out/<job>/``. Exits 1 when a job's final
validation (or evaluation) metric is not better than round 0's (the initial weights).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from ..server.invite import fresh_key, invite_url
from .run import DEMO_JOBS, DemoJob, improved, metric_summary, models_dir

__all__ = ["run_browser_demo"]

ROOT = Path(__file__).resolve().parents[4]
CHROMIUM = os.environ.get("WEEI_CHROMIUM", "/usr/bin/chromium")
# --disable-dev-shm-usage: containers often mount a 64 MB /dev/shm, too small for several Pyodide
# renderers; Chromium then kills a renderer ("Target crashed"). /tmp has no such cap.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]
JOB_TIMEOUT_S = 600

# Page-side helpers: the package's files as File objects, and a compact state for the table.
PRELUDE = """() => {
  window.D = {
    api: () => weei.widgetsApi.get('distributed-training'),
    file: async (path, name, type) => {
      const r = await fetch(path);
      if (!r.ok) throw new Error(`GET ${path}: HTTP ${r.status}`);
      return new File([await r.arrayBuffer()], name, { type: type || 'application/octet-stream' });
    },
    pkg: async (model, validation) => {
      const base = `models/${model}/`;
      const manifest = await D.file(base + 'manifest.json', 'manifest.json', 'application/json');
      const parsed = JSON.parse(await manifest.text());
      const files = await Promise.all(parsed.inlineJson['dataset-manifest.json'].map(
        (e) => D.file(base + 'data/' + e.fileName, e.fileName)));
      const wasm = await D.file(base + 'model.wasm', 'model.wasm', 'application/wasm');
      const out = { wasm, manifest, files };
      if (validation) out.validation = await D.file(base + 'data/' + validation, validation);
      return out;
    },
  };
}"""


class _Server:
    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "weei.cli", "serve", "--port", "0", "--test-hooks"], cwd=ROOT,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert self.proc.stdout is not None
        first = self.proc.stdout.readline()
        if "http://" not in first:
            self.proc.kill()
            raise RuntimeError(f"weei serve did not start: {first}{self.proc.stdout.read()}")
        self.url = first[first.index("http://"):].split()[0]
        threading.Thread(target=lambda: [None for _ in self.proc.stdout or ()], daemon=True).start()

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=15)


def _wait(page: Any, what: str, predicate: str, timeout_s: float = 90, arg: Any = None) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = page.evaluate(predicate, arg)
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.2)


def _job_rows(state: dict[str, Any], printed: set[int], metric_ids: list[str], started: list[float],
              stream: TextIO, rows: list[dict[str, Any]]) -> None:
    for cp in state["job"]["checkpoints"]:
        round_ = cp["artifact"]["round"]
        if round_ in printed or ("validationMetrics" not in cp and "validationError" not in cp):
            continue
        printed.add(round_)
        # Seconds between checkpoints, by the coordinator's clock (rows are polled, not timed here).
        now = cp["createdAt"] / 1000
        train = cp["metrics"]["values"]
        valid = cp.get("validationMetrics", {}).get("values", {})
        rows.append({"round": round_, "validation": valid})
        cells = "  ".join(f"{train.get(m, float('nan')):>14.4f}" for m in metric_ids)
        vcells = "  ".join(f"{valid.get(m, float('nan')):>14.4f}" for m in metric_ids)
        seconds = now - started[0] if started[0] else 0.0
        print(f"{round_:>5} {cp['metrics']['examplesProcessed']:>8}  {cells}  {vcells}  {seconds:>7.2f}",
              file=stream, flush=True)
        started[0] = now


def _diagnostics_summary(state: dict[str, Any], stream: TextIO) -> None:
    def show(value: Any) -> str:
        if value in ("unknown", None):
            return "—"
        return f"{value:.0f}" if isinstance(value, float) else str(value)

    print(f"   {'peer':<28} {'browser':<18} {'mode':<6} {'workers':>7} {'training ms':>11} {'ex/s':>9} {'fresh':<8}",
          file=stream)
    for peer, d in sorted(state["diagnostics"].items()):
        speed = d["performance"]["averageExamplesPerSecond"]
        training_ms = d["timings"]["trainingMs"]
        print(f"   {peer[:28]:<28} {show(d['environment']['browser']) + ' ' + show(d['environment']['browserVersion']):<18.18} "
              f"{show(d['execution']['actual']):<6} {d['execution']['workerLimit']:>7} "
              f"{show(training_ms):>11} {show(speed):>9} "
              f"{'stale' if d['stale'] else 'live':<8}", file=stream)


def _run_job(job: DemoJob, coordinator: Any, participants: list[Any], peers: list[str], out_dir: Path,
             stream: TextIO) -> bool:
    coordinator.evaluate("""async ([model, validation, settings]) => {
      const training = D.api();
      if (training.getState().job) await training.leave();
      const files = await D.pkg(model, validation);
      await training.createJob({ ...files, settings });
    }""", [job.model, job.validation, job.settings])
    state = coordinator.evaluate("D.api().getState()")
    metric_ids = [m["id"] for m in state["job"]["info"]["metrics"]]
    metric = state["job"]["info"]["metrics"][0]
    experience = "workSource" in state["job"]["info"]
    print(f"\n== {job.name}: {state['job']['info']['name']} — coordinator + {len(peers)} participants "
          f"({len(participants)} browsers, {len(peers) - len(participants)} agent), "
          f"{job.settings['epochs']} {'rounds' if experience else 'epochs'}", file=stream)
    job_id = state["job"]["id"]
    coordinator.evaluate("(peers) => peers.forEach((p) => D.api().invite(p))", peers)
    for page in participants:
        _wait(page, "the invitation", "(id) => D.api().getState().invitations.some(([j]) => j === id)", 60, job_id)
        page.evaluate("(id) => D.api().decideInvitation(id, true)", job_id)
    _wait(coordinator, "every participant to load the model", """(peers) => {
      const p = D.api().getState().job.participants;
      return peers.every((id) => p[id] && ['modelLoaded', 'assigned', 'training', 'resultReceived'].includes(p[id].state));
    }""", 120, peers)
    coordinator.evaluate("D.api().runValidation()")
    kind = "eval" if experience else "valid"
    unit = "units" if experience else "examples"
    print(f"{'round':>5} {unit:>8}  " + "  ".join(f"train {m:>8}" for m in metric_ids) + "  "
          + "  ".join(f"{kind} {m:>8}" for m in metric_ids) + f"  {'seconds':>7}", file=stream)
    coordinator.evaluate("D.api().start()")
    printed: set[int] = set()
    rows: list[dict[str, Any]] = []
    started = [0.0]
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while True:
        state = coordinator.evaluate("D.api().getState()")
        _job_rows(state, printed, metric_ids, started, stream, rows)
        job_state = state["job"]
        if job_state["status"] == "completed" and not state["busy"] and not state["transitioning"] \
                and not state["evaluating"]:
            _job_rows(state, printed, metric_ids, started, stream, rows)
            break
        if job_state["status"] == "paused":
            raise RuntimeError(f"{job.name}: the job paused: {state.get('error')}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{job.name}: not finished after {JOB_TIMEOUT_S} s")
        time.sleep(0.25)
    _diagnostics_summary(state, stream)
    target = out_dir / job.name
    target.mkdir(parents=True, exist_ok=True)
    exported = coordinator.evaluate("""async () => {
      const file = D.api().exportCheckpoint();
      return { name: file.name, bytes: Array.from(new Uint8Array(await file.arrayBuffer())) };
    }""")
    (target / exported["name"]).write_bytes(bytes(exported["bytes"]))
    print(f"-- {job.name}: {len(state['job']['checkpoints'])} checkpoints; "
          f"{metric_summary(rows, metric['id'], metric['direction'])}; final checkpoint saved to "
          f"{target / exported['name']}", file=stream)
    return improved(rows, metric["id"], metric["direction"])


def run_browser_demo(out_dir: Path, *, stream: TextIO, jobs: tuple[DemoJob, ...] = DEMO_JOBS) -> int:
    """Run the demo jobs across browsers and an agent; 0 when every final metric beat its first."""
    from playwright.sync_api import sync_playwright

    server = _Server()
    invite = invite_url(server.url, fresh_key())  # a fresh room; its key in the fragment
    shas = [json.loads((models_dir() / j.model / "manifest.json").read_text())["wasm"]["sha256"] for j in jobs]
    agent_dir = tempfile.TemporaryDirectory(prefix="weei-agent-")
    agent = subprocess.Popen([sys.executable, "-m", "weei.cli", "agent", "--room", invite, "--trust-room",
                              "--data-dir", agent_dir.name, *sum((["--accept-model", s] for s in shas), [])],
                             cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    print(f"weei serve at {server.url} · invite {invite} · agent pid {agent.pid}", file=stream)
    failed: list[str] = []
    try:
        with sync_playwright() as pw:
            processes = [pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS) for _ in range(3)]
            pages = []
            for process in processes:
                page = process.new_page()
                page.set_default_timeout(120_000)
                page.goto(invite)
                page.evaluate(PRELUDE)
                page.evaluate("weeiReady.then(() => __weeiTestHooks.get('distributed-training').startApi())")
                pages.append(page)
            coordinator, participants = pages[0], pages[1:]
            ids = [p.evaluate("D.api().getState().myPeerId") for p in participants]
            peers = _wait(coordinator, "two browsers and the agent to connect", """(ids) => {
              const peers = D.api().getState().peers;
              return ids.every((id) => peers.includes(id)) && peers.length >= ids.length + 1 && peers;
            }""", 90, ids)
            print(f"coordinator {coordinator.evaluate('D.api().getState().myPeerId')} sees {len(peers)} peers",
                  file=stream)
            for job in jobs:
                if not _run_job(job, coordinator, participants, peers, out_dir, stream):
                    failed.append(job.name)
            for process in processes:
                process.close()
    finally:
        agent.send_signal(signal.SIGTERM)
        try:
            agent.wait(timeout=15)
        except subprocess.TimeoutExpired:
            agent.kill()
        server.stop()
        agent_dir.cleanup()
    if failed:
        print(f"FAILED: the final metric did not improve for {', '.join(failed)}", file=stream)
        return 1
    print("OK: every job's final metric is better than at round 0 (its initial weights)", file=stream)
    return 0
