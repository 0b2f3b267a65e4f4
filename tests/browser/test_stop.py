"""Stop stops: stopping a job whose Worker is mid-chunk frees the Worker for the next job at once.

With localEpochs 10^6 one chunk of digits-mlp takes hours; the Worker's
wasm call cannot be interrupted, so the pool terminates it and starts a new
one. The next job's first round must start within seconds, and no progress
of the stopped task may show in the new job's state.

"Within seconds" is measured against this page's own cold start: the
replacement Worker loads Pyodide and the module again, which takes 3-5 s on
an idle machine and far longer on a loaded CI machine. The next job's first
round must start no later than 10 s or, when the page's first Worker took
longer than that to start training, 1.5 times that cold start; the old
chunk had hours left.
"""

from __future__ import annotations

from typing import Any

from test_api import DIGITS, PRELUDE, ready  # noqa: F401 (PRELUDE: ready() evaluates it)


def test_the_next_job_trains_within_seconds_after_stopping_an_endless_chunk(weei_server: Any, page: Any) -> None:
    pg, log = page
    ready(pg, weei_server.url)
    out = pg.evaluate("""async (settings) => {
      const training = T.api();
      const me = training.getState().myPeerId;
      const pkg = await T.pkg('digits-mlp');
      const quiet = { ...settings, validationSchedule: { enabled: false, unit: 'round', every: 1 } };
      await training.createJob({ ...pkg, settings: { ...quiet, localEpochs: 1000000 } });
      const oldJob = training.getState().job.id;
      const cold = performance.now();
      await training.start();
      // The Worker is training the endless chunk (its first progress report is in).
      await T.waitFor('the endless chunk to train', () => training.getState().progress[me], 120000);
      const coldStartMs = performance.now() - cold;
      await T.sleep(500);
      const seen = [];
      // Every state told after stop() returned (subscribe() also calls back at once with the one before),
      // and every state the page's polls read: on a loaded machine the page's Python can tell a whole
      // short job in a handful of coalesced states, none of them mid-chunk (a clean-clone CI saw 3).
      let listening = false;
      const record = (how, s) => listening && seen.push({
        how, t: performance.now(), job: s.job && s.job.id, status: s.job && s.job.status,
        progress: s.progress[me] || null, activeWorkers: s.activeWorkers,
        checkpoints: s.job ? s.job.checkpoints.length : 0 });
      const unsubscribe = training.subscribe((s) => record('told', s));
      const polled = () => { const s = training.getState(); record('polled', s); return s; };
      const stopAt = performance.now();
      await training.stop();
      listening = true;
      const afterStop = training.getState();
      await T.waitFor('the Worker to be free', () => training.getState().activeWorkers === 0, 5000);
      const freedMs = performance.now() - stopAt;

      await training.createJob({ ...pkg, settings: quiet });
      const newJob = training.getState().job.id;
      const started = performance.now();
      await training.start();
      await T.waitFor('the new job to complete', () => T.done(polled()), 240000);
      unsubscribe();
      // A short round can start and end between two polls: the first state seen
      // with training under way (progress, or a round already merged) says when.
      const training1 = seen.find((e) => e.job === newJob && (e.progress || e.checkpoints > 1));
      const firstRoundMs = training1 ? training1.t - started : null;
      const s = training.getState();
      return { oldJob, newJob, freedMs, coldStartMs, firstRoundMs, seen, error: s.error,
               afterStop: { status: afterStop.job.status, progress: afterStop.progress[me] || null },
               rounds: T.rounds(s) };
    }""", DIGITS)
    assert out["error"] is None, out["error"]
    assert out["newJob"] != out["oldJob"]
    assert out["afterStop"] == {"status": "completed", "progress": None}
    assert out["freedMs"] < 5000, out["freedMs"]
    # The respawned Worker loads Pyodide and the module again: seconds, not the minutes the old chunk had left.
    limit = max(10000, 1.5 * out["coldStartMs"])
    assert out["firstRoundMs"] is not None and out["firstRoundMs"] < limit, (out["firstRoundMs"], out["coldStartMs"])
    assert out["rounds"] == list(range(16))
    # Progress shown after stop() belongs to the new job only, while it runs.
    # On an idle machine the new job's short chunks can start and end between two told states, so a
    # state with progress may never be seen (a clean-clone run saw none); what is seen must be the new job's.
    shown = [s for s in out["seen"] if s["progress"] is not None]
    assert all(s["job"] == out["newJob"] and s["status"] == "running" for s in shown), \
        [s for s in shown if s["job"] != out["newJob"]][:3]
    assert all(s["progress"]["processedExamples"] <= s["progress"]["totalExamples"] for s in shown)
    assert not log.errors, log.errors


def test_a_worker_task_past_its_deadline_fails_by_name_and_the_page_goes_on(weei_server: Any, page: Any) -> None:
    """A chunk that never ends (a hung module, as far as the page can tell) runs into the train
    deadline, shortened here to 3 s: the Worker is terminated and replaced, the assignment fails as
    `deadline-exceeded`, and the page trains the next job."""
    pg, log = page
    pg.add_init_script("window.WEEI_TASK_DEADLINES_MS = { train: 3000 }")
    ready(pg, weei_server.url)
    out = pg.evaluate("""async (settings) => {
      const training = T.api();
      const pkg = await T.pkg('digits-mlp');
      const quiet = { ...settings, validationSchedule: { enabled: false, unit: 'round', every: 1 } };
      await training.createJob({ ...pkg, settings: { ...quiet, localEpochs: 1000000 } });
      const started = performance.now();
      await training.start();
      const named = () => JSON.stringify(training.getDebugLog().events).includes('deadline-exceeded');
      await T.waitFor('the deadline to fail the chunk by name', named, 180000);
      const failedAfterMs = performance.now() - started;
      await training.stop();
      await T.waitFor('the Worker to be free', () => training.getState().activeWorkers === 0, 5000);
      await training.createJob({ ...pkg, settings: quiet });
      await training.start();
      await T.waitFor('the next job to complete', () => T.done(training.getState()), 240000);
      const s = training.getState();
      return { failedAfterMs, error: s.error, status: s.job.status, rounds: T.rounds(s) };
    }""", DIGITS)
    assert out["failedAfterMs"] >= 3000, out
    assert out["error"] is None and out["status"] == "completed", out
    assert out["rounds"] == list(range(16))
    assert not log.errors, log.errors
