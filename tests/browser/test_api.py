"""The 'distributed-training' API in the page: the spec's examples as page JavaScript.

Every test drives ``weei.widgetsApi.get('distributed-training')`` the way a
page would, against the served site and the reference model packages (their
files fetched from /models/<id>/ into File objects): the page's Python runs
the TrainingController over IndexedDB, localStorage and module Workers.

Tests that reload the page use a persistent Chromium profile (a temporary
user-data dir), so IndexedDB and localStorage are what a real profile keeps.
"""

from __future__ import annotations

import json
import re
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pytest

from site_helpers import CHROMIUM, CHROMIUM_ARGS, DIST, TIMEOUT_MS

#: Defines window.T: the API, File loading and waiting helpers (evaluated after every navigation).
PRELUDE = """() => {
  const T = {};
  T.api = () => weei.widgetsApi.get('distributed-training');
  // The test hooks: index.html has them under weei serve --test-hooks (site_helpers.start_server).
  T.hooks = () => __weeiTestHooks.get('distributed-training');
  T.sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  T.waitFor = async (what, predicate, timeoutMs = 60000) => {
    const t0 = performance.now();
    for (;;) {
      const value = predicate();
      if (value) return value;
      if (performance.now() - t0 > timeoutMs) {
        const s = T.api().getState();
        throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}; state: ` + JSON.stringify({
          error: s.error, busy: s.busy, status: s.job && s.job.status,
          checkpoints: s.job && s.job.checkpoints.length, activeWorkers: s.activeWorkers }));
      }
      await T.sleep(50);
    }
  };
  T.fetchFile = async (path, name, type = 'application/octet-stream') => {
    const response = await fetch(path);
    if (!response.ok) throw new Error(`GET ${path}: HTTP ${response.status}`);
    return new File([await response.arrayBuffer()], name, { type });
  };
  // The package's files, as a page's <input type=file> would give them.
  T.pkg = async (modelId) => {
    const base = `models/${modelId}/`;
    const manifest = await T.fetchFile(base + 'manifest.json', 'manifest.json', 'application/json');
    const parsed = JSON.parse(await manifest.text());
    const entries = parsed.inlineJson['dataset-manifest.json'];
    const files = await Promise.all(entries.map((e) => T.fetchFile(base + 'data/' + e.fileName, e.fileName)));
    const wasm = await T.fetchFile(base + parsed.wasm.fileName, parsed.wasm.fileName, 'application/wasm');
    const validation = entries.length ? await T.fetchFile(base + 'data/validation.bin', 'validation.bin') : undefined;
    return { wasm, manifest, files, validation };
  };
  T.rejection = async (promiseOrFn) => {
    try {
      await (typeof promiseOrFn === 'function' ? promiseOrFn() : promiseOrFn);
    } catch (e) {
      return { isError: e instanceof Error, reason: e.reason, message: e.message };
    }
    return null;
  };
  // Finished, its last checkpoint written and its last validation in.
  T.done = (s) => s.job && s.job.status === 'completed' && !s.busy && !s.transitioning && !s.evaluating;
  T.rounds = (s) => s.job.checkpoints.map((c) => c.artifact.round);
  // The spec's "Example: read a checkpoint outside Weei".
  T.readCheckpoint = async (file) => {
    const bytes = await file.arrayBuffer();
    const metadataBytes = new DataView(bytes).getUint32(0, true);
    const metadata = JSON.parse(new TextDecoder().decode(new Uint8Array(bytes, 4, metadataBytes)));
    const start = 4 + metadataBytes;
    const weights = new Float32Array(bytes.slice(start, start + metadata.checkpoint.bytes));
    return { metadata, weights };
  };
  window.T = T;
}"""

DIGITS = {"epochs": 1, "localEpochs": 1, "batchSize": 16, "coordinatorParticipates": True,
          "validationSchedule": {"enabled": True, "unit": "round", "every": 5}}


def ready(pg: Any, url: str | None = None) -> None:
    """Navigate (or not), define the helpers and wait until the page's API runs in Python."""
    if url is not None:
        pg.goto(url)
    pg.evaluate(PRELUDE)
    seconds = pg.evaluate("weeiReady.then(() => T.hooks().startApi())")
    assert seconds > 0


@pytest.fixture
def profile(browser: Any) -> Iterator[tuple[Any, list[str]]]:
    """A page in a persistent Chromium profile (temporary user-data dir), and its error log."""
    with tempfile.TemporaryDirectory(prefix="weei-profile-") as user_data:
        context = browser.browser_type.launch_persistent_context(
            user_data, executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        pg = context.pages[0] if context.pages else context.new_page()
        pg.set_default_timeout(TIMEOUT_MS)
        errors: list[str] = []
        pg.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
        yield pg, errors
        context.close()


def test_run_a_job_from_your_own_interface_then_continue_from_its_checkpoint(weei_server: Any, page: Any) -> None:
    pg, log = page
    ready(pg, weei_server.url)
    out = pg.evaluate("""async (settings) => {
      // The spec's "Example: run a job from your own interface".
      const weei = await window.weeiReady;
      const training = weei.widgetsApi.get('distributed-training');
      const { wasm, manifest, files, validation } = await T.pkg('digits-mlp');
      const seen = [];
      const stop = training.subscribe((state) => {
        const job = state.job;
        if (!job) return;
        const passes = job.progress ? job.progress.datasetEpoch + ' / ' + job.progress.plannedEpochs : '';
        const last = job.checkpoints.at(-1);
        seen.push([job.status, passes, last?.metrics.values, Object.keys(job.participants)]);
      });
      await training.createJob({ wasm, manifest, files, validation, settings });
      for (const peerId of training.getState().peers) training.invite(peerId);
      await training.start();
      await T.waitFor('the job to complete', () => T.done(training.getState()), 90000);
      await T.sleep(100);  // the last notification goes out on the next turn of the event loop
      stop();
      const state = training.getState();
      return { seen: seen.length, statuses: [...new Set(seen.map((s) => s[0]))], job: state.job, error: state.error,
               saved: state.savedJobs };
    }""", DIGITS)
    job = out["job"]
    assert out["error"] is None, out["error"]
    assert job["status"] == "completed" and job["role"] == "coordinator"
    assert job["progress"]["datasetEpoch"] == 1
    # 15 chunks, one training peer: 15 rounds, checkpoint 0 included.
    assert [c["artifact"]["round"] for c in job["checkpoints"]] == list(range(16))
    assert {"ready", "running", "completed"} <= set(out["statuses"]) and out["seen"] > 16
    validated = [c for c in job["checkpoints"] if c.get("validationMetrics")]
    # every 5, but 15 rounds is a short job (SHORT_JOB_ROUNDS): every round, and round 0 at Start
    assert [c["artifact"]["round"] for c in validated] == list(range(16))
    first, last = validated[0]["validationMetrics"]["values"], validated[-1]["validationMetrics"]["values"]
    assert last["loss"] < first["loss"] and last["accuracy"] >= first["accuracy"], (first, last)
    assert last["accuracy"] > 0.8
    train_loss = [c["metrics"]["values"]["loss"] for c in job["checkpoints"][1:]]
    assert sum(train_loss[-3:]) < sum(train_loss[:3]), train_loss
    assert [j["status"] for j in out["saved"]] == ["completed"]

    out = pg.evaluate("""async (settings) => {
      // The spec's "Continue from a checkpoint", in both dataset modes.
      const training = T.api();
      const { manifest, files } = await T.pkg('digits-mlp');
      const checkpoint = training.exportCheckpoint(); // the latest checkpoint, as a File
      const wasm = training.exportModule();           // the job's model, if this browser keeps it
      const exported = { name: checkpoint.name, type: checkpoint.type, bytes: checkpoint.size,
                         round: (await T.readCheckpoint(checkpoint)).metadata.round,
                         module: [wasm.name, wasm.size] };
      await training.leave();                          // the current job stays in Saved jobs
      const afterLeave = training.getState();
      const runs = {};
      for (const [datasetMode, epochs] of [['new', 1], ['resume', 2]]) {
        await training.continueFromCheckpoint({
          checkpoint, wasm, manifest, files, settings: { ...settings, epochs }, datasetMode });
        const first = T.rounds(training.getState());
        await training.start();
        await T.waitFor(`the ${datasetMode} job to complete`, () => T.done(training.getState()), 90000);
        const s = training.getState();
        runs[datasetMode] = { first, rounds: T.rounds(s), error: s.error,
                              losses: s.job.checkpoints.map((c) => c.validationMetrics && c.validationMetrics.values.loss) };
        await training.leave();
      }
      return { exported, afterLeave: { job: afterLeave.job, saved: afterLeave.savedJobs }, runs,
               saved: (await training.listSavedJobs()).map((j) => [j.status, j.active]) };
    }""", DIGITS)
    exported = out["exported"]
    assert exported["name"].endswith(".weei-checkpoint") and exported["type"] == "application/octet-stream"
    assert exported["round"] == 15 and exported["bytes"] > 19240
    manifest = json.loads((DIST / "models" / "digits-mlp" / "manifest.json").read_text())
    assert exported["module"] == ["model.wasm", manifest["wasm"]["bytes"]]
    assert out["afterLeave"].get("job") is None
    assert [(j["status"], j["active"]) for j in out["afterLeave"]["saved"]] == [("completed", False)]
    for mode in ("new", "resume"):
        run = out["runs"][mode]
        assert run["error"] is None, (mode, run["error"])
        assert run["first"] == [15], (mode, run)
        # 'new': one fresh pass; 'resume': the finished pass restored, one more of two planned.
        assert run["rounds"] == list(range(15, 31)), (mode, run["rounds"])
    assert out["saved"] == [["completed", False]] * 3
    assert not log.errors, log.errors


def test_cartpole_experience_job_uses_two_local_workers(weei_server: Any, page: Any) -> None:
    pg, log = page
    ready(pg, weei_server.url)
    cores = pg.evaluate("navigator.hardwareConcurrency")
    if cores < 2:
        pytest.skip(f"this machine reports {cores} logical core(s); the split needs 2")
    out = pg.evaluate("""async () => {
      const training = T.api();
      await training.setMaxLocalWorkers(2);
      const { wasm, manifest } = await T.pkg('cartpole-reinforce');
      let maxActive = 0, maxJobActive = 0;
      const note = (s) => {
        maxActive = Math.max(maxActive, s.activeWorkers);
        if (s.job) maxJobActive = Math.max(maxJobActive, s.job.localWorkers.active);
      };
      const stop = training.subscribe(note);
      await training.createJob({ wasm, manifest, files: [], settings: {
        epochs: 4, localEpochs: 1, batchSize: 16, coordinatorParticipates: true,
        experience: { unitsPerAssignment: 32 }, validationSchedule: { enabled: true, unit: 'round', every: 2 } } });
      const before = training.getState();
      await training.start();
      await T.waitFor('the CartPole job to complete', () => { const s = training.getState(); note(s); return T.done(s); }, 90000);
      stop();
      const s = training.getState();
      return { maxLocalWorkers: before.maxLocalWorkers, localWorkers: before.job.localWorkers, maxActive, maxJobActive,
               rounds: T.rounds(s), error: s.error,
               units: s.job.checkpoints.slice(1).map((c) => c.metrics.examplesProcessed),
               evals: s.job.checkpoints.filter((c) => c.validationMetrics).map((c) => c.artifact.round),
               diagnostics: s.diagnostics[s.myPeerId] };
    }""")
    assert out["error"] is None, out["error"]
    assert out["maxLocalWorkers"] == 2
    assert out["localWorkers"]["effective"] == 2 and out["localWorkers"]["requested"] == 2, out["localWorkers"]
    assert out["maxActive"] == 2, f"activeWorkers never reached 2 (max {out['maxActive']})"
    assert out["maxJobActive"] == 2
    assert out["rounds"] == [0, 1, 2, 3, 4]
    assert out["units"] == [32, 32, 32, 32]  # both halves of every assignment were played
    assert out["evals"] == [0, 1, 2, 3, 4]  # every 2, but a 4-round job is short: every round, and round 0
    env = out["diagnostics"]["environment"]
    assert env["browser"] == "Chrome" and env["os"] == "Linux" and env["logicalCores"] == 2
    assert not log.errors, log.errors


def test_a_reload_mid_job_continues_from_the_last_checkpoint(weei_server: Any, profile: Any) -> None:
    pg, errors = profile
    ready(pg, weei_server.url)
    before = pg.evaluate("""async (settings) => {
      const training = T.api();
      const { wasm, manifest, files } = await T.pkg('digits-mlp');
      const id = await training.createJob({ wasm, manifest, files, settings });
      await training.start();
      await T.waitFor('4 checkpoints', () => training.getState().job.checkpoints.length >= 4, 60000);
      const s = training.getState();
      return { id, myPeerId: s.myPeerId, rounds: T.rounds(s), status: s.job.status };
    }""", {**DIGITS, "epochs": 2, "validationSchedule": {"enabled": False, "unit": "round", "every": 1}})
    assert before["status"] == "running" and len(before["rounds"]) >= 4
    pg.reload()
    ready(pg)
    after = pg.evaluate("""async (id) => {
      const training = T.api();
      const s = training.getState();
      const reopened = { job: s.job && s.job.id, status: s.job && s.job.status, rounds: s.job && T.rounds(s),
                         saved: s.savedJobs, myPeerId: s.myPeerId };
      await T.waitFor('the reopened job to complete', () => T.done(training.getState()), 90000);
      const done = training.getState();
      return { reopened, rounds: T.rounds(done), error: done.error,
               keys: await T.hooks().storageKeys('checkpoints'),
               events: training.getDebugLog().events.map((e) => e.event) };
    }""", before["id"])
    reopened = after["reopened"]
    assert reopened["job"] == before["id"] and reopened["myPeerId"] == before["myPeerId"]
    assert reopened["status"] == "running"
    assert [(j["id"], j["active"]) for j in reopened["saved"]] == [(before["id"], True)]
    assert reopened["rounds"][: len(before["rounds"])] == before["rounds"]
    assert after["error"] is None, after["error"]
    # Nothing lost, nothing trained twice into a checkpoint: every round once.
    assert after["rounds"] == list(range(31))
    assert after["keys"] == [f"{before['id']}/{r:08d}" for r in range(31)]
    assert "job.reopened" in after["events"]
    assert not errors, errors


def test_bad_inputs_are_refused_by_name_and_nothing_saved_changes(weei_server: Any, page: Any) -> None:
    pg, log = page
    ready(pg, weei_server.url)
    out = pg.evaluate("""async (settings) => {
      const training = T.api();
      const refusals = {};
      refusals.startWithoutJob = await T.rejection(() => training.start());
      refusals.exportWithoutJob = await T.rejection(() => training.exportCheckpoint());
      const pkg = await T.pkg('digits-mlp');
      await training.createJob({ ...pkg, settings });
      await training.start();
      refusals.secondJob = await T.rejection(() => training.createJob({ ...pkg, settings }));
      await T.waitFor('the job to complete', () => T.done(training.getState()), 90000);
      const checkpoint = training.exportCheckpoint();
      await training.leave();
      const snapshot = async () => ({ saved: await training.listSavedJobs(),
        checkpoints: await T.hooks().storageKeys('checkpoints'),
        jobs: await T.hooks().storageKeys('jobs'), artifacts: await T.hooks().storageKeys('artifacts') });
      const before = await snapshot();

      const flipped = new Uint8Array(await pkg.files[2].arrayBuffer());
      flipped[10] ^= 0xff;
      const wrongHash = pkg.files.slice();
      wrongHash[2] = new File([flipped], pkg.files[2].name);
      refusals.wrongHash = await T.rejection(() => training.createJob({ ...pkg, files: wrongHash, settings }));
      refusals.missingFile = await T.rejection(() => training.createJob({
        ...pkg, files: pkg.files.filter((f) => f.name !== 'training-007.bin'), settings }));
      refusals.malformedManifest = await T.rejection(() => training.createJob({
        ...pkg, manifest: new File(['{not json'], 'manifest.json'), settings }));
      refusals.noWasm = await T.rejection(() => training.createJob({ ...pkg, wasm: undefined, settings }));
      refusals.badSettings = await T.rejection(() => training.createJob({ ...pkg, settings: { ...settings, epochs: -1 } }));
      let deep = 0;
      for (let i = 0; i < 5000; i += 1) deep = [deep];  // JSON.stringify writes it; Python's json.loads recursed
      refusals.deepArguments = await T.rejection(() => training.createJob({ ...pkg, settings: { ...settings, deep } }));
      refusals.gpu = await T.rejection(() => training.createJob({ ...pkg, executionFiles: [pkg.wasm], settings }));

      const corrupt = new Uint8Array(await checkpoint.arrayBuffer());
      corrupt[corrupt.length - 2] ^= 0x01;  // a weight's low bit: finite, but not the recorded SHA-256
      refusals.corruptCheckpoint = await T.rejection(() => training.continueFromCheckpoint({
        ...pkg, checkpoint: new File([corrupt], checkpoint.name), settings, datasetMode: 'new' }));
      refusals.badMode = await T.rejection(() => training.continueFromCheckpoint({
        ...pkg, checkpoint, settings, datasetMode: 'sideways' }));

      // Over 256 MB without filling memory: one 1 MiB part, referenced 245 times.
      const mib = new Blob([new Uint8Array(1 << 20)]);
      const huge = new File(Array(245).fill(mib), 'huge.bin');
      refusals.hugeCheckpoint = await T.rejection(() => training.continueFromCheckpoint({
        ...pkg, checkpoint: huge, settings, datasetMode: 'new' }));
      refusals.hugeWasm = await T.rejection(() => training.createJob({ ...pkg, wasm: huge, settings }));
      refusals.hugeDataFile = await T.rejection(() => training.createJob({ ...pkg, files: [...pkg.files, huge], settings }));
      refusals.setWorkers = await T.rejection(() => training.setMaxLocalWorkers(0.5));
      refusals.backend = await T.rejection(() => training.setBackendPreference('quantum'));
      refusals.unknownSaved = await T.rejection(() => training.openSavedJob('job-nope'));

      const after = await snapshot();
      const s = training.getState();
      return { refusals, before, after, hugeSize: huge.size, job: s.job === undefined, error: s.error };
    }""", DIGITS)
    refusals = out["refusals"]
    expected = {
        "startWithoutJob": "no-job", "exportWithoutJob": "no-checkpoint", "secondJob": "job-active",
        "wrongHash": "file-sha256-mismatch", "missingFile": "missing-file", "malformedManifest": "invalid-json",
        "noWasm": "missing-file", "badSettings": "invalid-setting", "deepArguments": "invalid-argument", "gpu": "not-shader-archive",
        "corruptCheckpoint": "weights-sha256-mismatch", "badMode": "bad-dataset-mode",
        "hugeCheckpoint": "file-too-large", "hugeWasm": "file-too-large", "hugeDataFile": "file-too-large",
        "setWorkers": "bad-worker-count", "backend": "bad-backend", "unknownSaved": "unknown-job",
    }
    assert {k: (v or {}).get("reason") for k, v in refusals.items()} == expected, json.dumps(refusals, indent=1)
    for name, refusal in refusals.items():
        assert refusal["isError"] and refusal["message"] and "Traceback" not in refusal["message"], (name, refusal)
    assert "training-003.bin" in refusals["wrongHash"]["message"]
    assert "training-007.bin" in refusals["missingFile"]["message"]
    assert "huge.bin" in refusals["hugeWasm"]["message"]
    assert out["hugeSize"] > 256 * 1000 * 1000
    assert out["after"] == out["before"]
    assert [j["status"] for j in out["after"]["saved"]] == ["completed"]
    assert out["job"] is True
    assert not log.errors, log.errors


def test_get_state_is_a_copy_without_weights_and_exists_before_python(weei_server: Any, page: Any) -> None:
    pg, log = page
    pg.add_init_script("window.WEEI_NO_BACKGROUND_PYTHON = true")
    pg.goto(weei_server.url)
    pg.evaluate(PRELUDE)
    early = pg.evaluate("T.api().getState()")
    # Without a room this tab names itself before its Python starts (a room's server names it later).
    assert early["ready"] is True and early["myPeerId"].startswith("peer-") and early["busy"] is True
    assert early["savedJobs"] == [] and early["peers"] == [] and "job" not in early
    out = pg.evaluate("""async () => {
      const training = T.api();
      const firstCalls = [];
      const stop = training.subscribe((s) => firstCalls.push([s.myPeerId, T.hooks().status().api]));  // starts Python
      await T.hooks().startApi();
      const { wasm, manifest, files } = await T.pkg('digits-mlp');
      const a = [], b = [];
      const stopA = training.subscribe((s) => { a.push(s); s.mutatedByA = true; if (s.job) s.job.checkpoints.length = 0; });
      const stopB = training.subscribe((s) => b.push(s));
      await training.createJob({ wasm, manifest, files, settings: { epochs: 1, localEpochs: 1, batchSize: 16,
                                                                     coordinatorParticipates: true } });
      await T.sleep(100);
      stop(); stopA(); stopB();
      const calls = [a.length, b.length];
      const state = training.getState();
      state.job.checkpoints.push('x');
      state.job.settings.epochs = 99;
      state.myPeerId = 'changed';
      state.savedJobs.length = 0;
      const again = training.getState();
      const binary = [];
      const walk = (v, path) => {
        if (v instanceof ArrayBuffer || ArrayBuffer.isView(v) || v instanceof Blob) binary.push(path);
        else if (v && typeof v === 'object') for (const [k, x] of Object.entries(v)) walk(x, path + '.' + k);
      };
      walk(again, 'state');
      const lastB = b.at(-1);
      return { firstCalls: firstCalls.slice(0, 2), calls,
               again: { checkpoints: again.job.checkpoints.length, epochs: again.job.settings.epochs,
                        myPeerId: again.myPeerId, saved: again.savedJobs.length },
               bSawJob: !!(lastB.job && lastB.job.checkpoints.length === 1 && !lastB.mutatedByA),
               binary, jsonBytes: JSON.stringify(again).length, keys: Object.keys(again),
               afterUnsubscribe: [a.length, b.length] };
    }""")
    # subscribe() starts Python (taking this tab's storage slot first), and calls the listener at once, before
    # Python is ready.
    assert out["firstCalls"][0][0] == early["myPeerId"] and out["firstCalls"][0][1] in ("not-started", "starting"), \
        out["firstCalls"]
    assert out["again"] == {"checkpoints": 1, "epochs": 1, "myPeerId": early["myPeerId"], "saved": 1}
    assert pg.evaluate("T.api().getState().myPeerId") == early["myPeerId"]
    assert out["again"]["myPeerId"].startswith("peer-")
    assert out["bSawJob"], "each listener gets its own copy"
    assert out["calls"][0] == out["calls"][1] >= 2
    assert out["binary"] == [] and out["jsonBytes"] < 20_000, out["jsonBytes"]
    for key in ("ready", "myPeerId", "busy", "preparing", "transitioning", "evaluating", "peers", "invitations",
                "progress", "liveMetrics", "transfers", "transferErrors", "pausedContribution", "activeWorkers",
                "backendPreference", "execution", "maxLocalWorkers", "gpuMemoryBudgetMiB", "diagnostics", "job"):
        assert key in out["keys"], key
    assert set(early) <= set(out["keys"]) | {"job"}
    assert not log.errors, log.errors


def test_debug_log_persists_across_reloads_and_clears(weei_server: Any, profile: Any) -> None:
    pg, errors = profile
    ready(pg, weei_server.url)
    first = pg.evaluate("""async () => {
      const training = T.api();
      const { wasm, manifest, files } = await T.pkg('digits-mlp');
      await training.createJob({ wasm, manifest, files, settings: { epochs: 1, localEpochs: 1, batchSize: 16,
                                                                     coordinatorParticipates: true } });
      const log = training.getDebugLog();
      return { schemaVersion: log.schemaVersion, exportedAt: log.exportedAt, events: log.events.map((e) => e.event),
               stored: (localStorage.getItem('weei.debugLog') || '').length };
    }""")
    assert first["schemaVersion"] == 2 and first["exportedAt"].endswith("Z")
    assert "job.created" in first["events"] and first["stored"] > 0
    pg.reload()
    ready(pg)
    second = pg.evaluate("""async () => {
      const training = T.api();
      const log = training.getDebugLog();
      const events = log.events.map((e) => e.event);
      training.clearDebugLog();
      const cleared = training.getDebugLog();
      return { events, baseline: Object.keys(log.baseline), cleared: cleared.events.length,
               clearedPhases: Object.keys(cleared.baseline.phases).length };
    }""")
    assert second["events"][: len(first["events"])] == first["events"], "events survive the reload"
    assert "job.reopened" in second["events"]
    assert second["baseline"] == ["phases", "idle"]
    assert second["cleared"] == 0 and second["clearedPhases"] == 0
    pg.reload()
    ready(pg)
    third = pg.evaluate("T.api().getDebugLog().events.map((e) => e.event)")
    assert "job.created" not in third, "clearDebugLog() deletes the stored events too"
    assert not errors, errors


def test_enable_opens_the_window_or_says_why(weei_server: Any, page: Any) -> None:
    pg, log = page
    ready(pg, weei_server.url)
    out = pg.evaluate("""async () => {
      let widget = null;
      const refusal = await T.rejection(async () => { widget = await T.api().enable(); });
      const opened = !!document.querySelector('[data-weei-widget]');
      if (widget && widget.close) widget.close();
      return refusal || { opened };
    }""")
    if (DIST / "widget.js").is_file():
        assert out == {"opened": True}, out
    else:
        assert out["reason"] == "widget-unavailable" and "widget.js" in out["message"]
    assert not log.errors, log.errors


def test_methods_wait_for_python_and_the_api_lists_every_method(weei_server: Any, page: Any) -> None:
    pg, log = page
    pg.add_init_script("window.WEEI_NO_BACKGROUND_PYTHON = true")
    pg.goto(weei_server.url)
    pg.evaluate(PRELUDE)
    t0 = time.monotonic()
    out = pg.evaluate("""async () => {
      const training = T.api();
      const early = training.getDebugLog();  // before the page's Python: a Promise of the log
      const notReady = { promise: early instanceof Promise, status: T.hooks().status().api, log: await early };
      const saved = await training.listSavedJobs();  // waits for the page's Python
      await training.pauseContribution(true);
      await training.setGpuMemoryBudgetMiB(1024);
      await training.setBackendPreference('cpu');
      const device = training.getState();
      await training.pauseContribution(false);
      return { notReady, saved, methods: Object.keys(training).sort(), state: training.getState().myPeerId,
               device: [device.pausedContribution, device.gpuMemoryBudgetMiB, device.backendPreference],
               resumed: training.getState().pausedContribution };
    }""")
    assert time.monotonic() - t0 < TIMEOUT_MS / 1000
    assert out["notReady"]["promise"] is True and out["notReady"]["status"] == "starting"
    assert out["notReady"]["log"]["schemaVersion"] == 2 and isinstance(out["notReady"]["log"]["events"], list)
    assert out["saved"] == [] and out["state"].startswith("peer-")
    assert out["device"] == [True, 1024, "cpu"] and out["resumed"] is False
    assert out["methods"] == sorted([
        "getState", "getRoom", "subscribe", "createJob", "continueFromCheckpoint", "invite", "decideInvitation", "start",
        "pause", "resume", "stop", "updateSettings", "reviewSettings", "runValidation", "shuffleChunks", "exportCheckpoint",
        "exportModule", "leave", "getDebugLog", "exportDebugLog", "clearDebugLog", "setMaxLocalWorkers",
        "setGpuMemoryBudgetMiB", "setBackendPreference", "pauseContribution", "listSavedJobs", "openSavedJob",
        "deleteSavedJob", "enable", "importOnnx", "exportOnnx", "setDisplayName", "tryCheckpoint",
        "setCheckpointRetention", "getStorageUse"])
    assert not log.errors, log.errors


def test_every_method_answers_right_after_weei_ready(weei_server: Any, page: Any) -> None:
    """After a reload, the synchronous methods are called the moment weeiReady resolves (the page's
    Python still starting): each returns a Promise of its answer, given in call order by the
    controller that restored the job; once it runs they answer synchronously."""
    pg, log = page
    ready(pg, weei_server.url)
    job = pg.evaluate("""async () => {
      const { wasm, manifest, files } = await T.pkg('digits-mlp');
      const id = await T.api().createJob({ wasm, manifest, files, settings: { epochs: 1, localEpochs: 1, batchSize: 16,
                                                                               coordinatorParticipates: true } });
      await T.hooks().idle();
      const s = T.api().getState();
      return { id, peer: s.myPeerId, checkpoints: s.job.checkpoints.length };
    }""")
    assert job["checkpoints"] == 1, "createJob writes the initial checkpoint"
    pg.reload()
    pg.evaluate(PRELUDE)
    out = pg.evaluate("""async () => {
      const training = (await weeiReady).widgetsApi.get('distributed-training');
      const status = __weeiTestHooks.get('distributed-training').status().api;
      const peer = training.getState().myPeerId;
      const calls = {
        invite: training.invite('peer-nobody'), checkpoint: training.exportCheckpoint(),
        module: training.exportModule(), log: training.getDebugLog(), file: training.exportDebugLog(),
        clear: training.clearDebugLog(), after: training.getDebugLog(),
      };
      const promises = Object.entries(calls).filter(([, v]) => v instanceof Promise).map(([k]) => k).sort();
      const invite = await T.rejection(calls.invite);
      const checkpoint = await calls.checkpoint;
      const module = await calls.module;
      const file = await calls.file;
      const text = await file.text();
      const log = await calls.log;
      const after = await calls.after;
      const moduleBytes = new Uint8Array(await module.arrayBuffer());
      const served = new Uint8Array(await (await fetch('models/digits-mlp/model.wasm')).arrayBuffer());
      const now = training.exportDebugLog();
      return {
        status, peer, promises, invite, cleared: await calls.clear,
        checkpoint: { isFile: checkpoint instanceof File, name: checkpoint.name, type: checkpoint.type,
                      jobId: (await T.readCheckpoint(checkpoint)).metadata.jobId },
        module: { isFile: module instanceof File, name: module.name, type: module.type,
                  same: moduleBytes.length === served.length && moduleBytes.every((b, i) => b === served[i]) },
        file: { isFile: file instanceof File, name: file.name, type: file.type, size: file.size, bytes: text.length,
                json: JSON.parse(text) },
        log: log.events.map((e) => e.event), after: after.events.map((e) => e.event),
        syncNow: now instanceof File && !(training.getDebugLog() instanceof Promise),
      };
    }""")
    assert out["status"] in ("not-started", "starting"), "the calls were made before the controller ran"
    assert out["peer"] == job["peer"]
    assert out["promises"] == ["after", "checkpoint", "clear", "file", "invite", "log", "module"]
    assert out["invite"]["reason"] == "peer-not-connected", out["invite"]  # the restored job's coordinator answered
    assert out["cleared"] is None
    assert out["checkpoint"]["isFile"] and out["checkpoint"]["jobId"] == job["id"]
    assert out["checkpoint"]["name"].endswith(".weei-checkpoint") and out["checkpoint"]["type"] == "application/octet-stream"
    assert out["module"] == {"isFile": True, "name": "model.wasm", "type": "application/wasm", "same": True}
    f = out["file"]
    assert f["isFile"] and f["type"] == "application/json" and f["size"] == f["bytes"]
    assert re.fullmatch(r"weei-debug-log-\d{4}-\d\d-\d\dT\d\d-\d\d-\d\d-\d{3}Z\.json", f["name"]), f["name"]
    assert f["name"] == "weei-debug-log-" + re.sub(r"[:.]", "-", f["json"]["exportedAt"]) + ".json"
    assert f["json"]["schemaVersion"] == 2 and set(f["json"]) == {"schemaVersion", "exportedAt", "baseline", "events"}
    assert set(f["json"]["baseline"]) == {"phases", "idle"}
    assert [e["event"] for e in f["json"]["events"]] == out["log"], "the file holds what getDebugLog() returns"
    assert "job.created" in out["log"] and "job.created" not in out["after"], "calls are answered in call order"
    assert out["syncNow"], "once the controller runs, the methods answer synchronously"
    assert not log.errors, log.errors


def test_each_tab_is_its_own_peer_and_a_later_tab_continues_the_saved_job(weei_server: Any, page: Any) -> None:
    """Tabs of one browser profile: each runs its own controller over a storage namespace of its own
    (so two never continue the same saved job); a reload keeps the tab's namespace; a tab opened after
    the first closed takes the first namespace and continues its saved job."""
    first, log = page
    ready(first, weei_server.url)
    job_id = first.evaluate("""async () => {
      const { wasm, manifest, files } = await T.pkg('digits-mlp');
      return T.api().createJob({ wasm, manifest, files, settings: { epochs: 1, localEpochs: 1, batchSize: 16,
                                                                     coordinatorParticipates: true } });
    }""")
    errors: list[str] = []

    def tab() -> Any:
        pg = first.context.new_page()
        pg.set_default_timeout(TIMEOUT_MS)
        pg.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
        ready(pg, weei_server.url)
        return pg

    look = """async () => {
      const training = T.api();
      const s = training.getState();
      return { slot: T.hooks().status().slot, peer: s.myPeerId, job: s.job ? s.job.id : null, error: s.error || null,
               saved: (await training.listSavedJobs()).map((j) => j.id) };
    }"""
    second = tab()
    mine = second.evaluate(look)
    theirs = first.evaluate(look)
    assert theirs["slot"] == 0 and theirs["job"] == job_id
    assert mine["slot"] == 1 and mine["job"] is None and mine["saved"] == [] and mine["error"] is None
    assert mine["peer"] and mine["peer"] != theirs["peer"]
    # The second tab runs a job of its own, in its own storage (its debug log under its namespace).
    create = """async () => {
      const { wasm, manifest, files } = await T.pkg('digits-mlp');
      return T.api().createJob({ wasm, manifest, files, settings: { epochs: 1, localEpochs: 1, batchSize: 16,
                                                                     coordinatorParticipates: true } });
    }"""
    second_job = second.evaluate(create)
    assert second_job != job_id
    assert second_job in second.evaluate("() => localStorage.getItem('weei-tab-1:weei.debugLog') || ''")
    assert second_job not in json.dumps(first.evaluate("() => T.api().getDebugLog().events"))
    assert first.evaluate(look)["saved"] == [job_id]
    second.reload()
    ready(second)
    assert second.evaluate(look) == {**mine, "job": second_job, "saved": [second_job]}, \
        "a reload keeps the tab's namespace and peer ID"

    released = """async () => !(await navigator.locks.query()).held.some(
      (lock) => lock.name === 'weei.distributed-training.slot-0')"""
    assert not second.evaluate(released), "the first tab holds slot 0 while it is open"
    first.close()
    # Closed means its locks are let go, which the browser does after close() returns (a loaded
    # clean-clone CI opened the next tab first, and it rightly took slot 2).
    deadline = time.monotonic() + TIMEOUT_MS / 1000
    while not second.evaluate(released):
        assert time.monotonic() < deadline, "the closed tab's slot lock was never released"
        time.sleep(0.1)
    third = tab()
    assert third.evaluate(look)["slot"] == 0
    took_over = third.evaluate("""async () => {
      const s = T.api().getState();
      return { job: s.job && s.job.id, status: s.job && s.job.status, error: s.error || null,
               saved: (await T.api().listSavedJobs()).map((j) => j.id) };
    }""")
    assert took_over == {"job": job_id, "status": "ready", "error": None, "saved": [job_id]}
    assert second.evaluate(look)["job"] == second_job, "the second tab never took the first one's job"
    assert not log.errors and not errors, log.errors + errors


def test_a_duplicated_tab_is_a_peer_of_its_own(weei_server: Any, page: Any) -> None:
    """Duplicating a tab copies its sessionStorage, with the tab's slot and its local peer ID (a page without a
    room names itself). The copy, seeing both held by the original, takes another slot and makes its own peer
    ID, and keeps them across its reloads."""
    first, log = page
    ready(first, weei_server.url)
    look = "() => ({ slot: T.hooks().status().slot, peer: T.api().getState().myPeerId })"
    original = first.evaluate(look)
    assert original["slot"] == 0 and original["peer"].startswith("peer-")
    copied = first.evaluate("() => ({ ...sessionStorage })")
    assert copied.get("weei.peerId") == original["peer"] and copied.get("weei.tabSlot") == "0", copied
    duplicate = first.context.new_page()
    duplicate.set_default_timeout(TIMEOUT_MS)
    errors: list[str] = []
    duplicate.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
    # What the browser does when it duplicates a tab: the new tab starts with a copy of the original's
    # sessionStorage (once: not again on the copy's own reloads).
    duplicate.add_init_script(f"""
      if (!sessionStorage.getItem('test.duplicated')) {{
        for (const [k, v] of Object.entries({json.dumps(copied)})) sessionStorage.setItem(k, v);
        sessionStorage.setItem('test.duplicated', '1');
      }}""")
    ready(duplicate, weei_server.url)
    own = duplicate.evaluate(look)
    assert own["slot"] == 1 and own["peer"].startswith("peer-") and own["peer"] != original["peer"], own
    # The controller (the page's Python) took the same new ID, and the original kept its own.
    assert duplicate.evaluate("() => sessionStorage.getItem('weei.peerId')") == own["peer"]
    assert first.evaluate(look) == original
    duplicate.reload()
    ready(duplicate)
    assert duplicate.evaluate(look) == own, "a reload of the copy keeps its slot and peer ID"
    assert not log.errors and not errors, log.errors + errors
