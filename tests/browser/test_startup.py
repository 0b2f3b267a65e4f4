"""Start-up of the page and of its Workers (issue 11 P5, issue 12 item 4).

build.py site ships weei-snapshot.bin, a Pyodide memory snapshot with weei's
modules imported (tools/pyodide_snapshot.mjs); the host worker (host.js, where
the page's Python runs) restores it. Training Workers start Pyodide the
ordinary way: the snapshot, made in Node without stack switching, would take
JSPI (trainGpu's run_sync) from them (test_gpu_job.py). Nothing of Pyodide runs
on the page's main thread, so start-up never blocks the page: no long task
above 200 ms from navigation until the API answers (long tasks measured by a
PerformanceObserver installed before any script runs), and until the API is up
the window's controls are disabled and say "Starting Weei…".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

HOOKS = "__weeiTestHooks.get('distributed-training')"
API = "window.weei.widgetsApi.get('distributed-training')"
HOST = "[data-weei-widget]"

# Installed before any script of the page: every long task from navigation on.
LONG_TASKS = """
window.__longTasks = [];
new PerformanceObserver((list) => {
  for (const e of list.getEntries()) window.__longTasks.push({ start: e.startTime, duration: e.duration });
}).observe({ type: 'longtask', buffered: true });
"""


def test_site_ships_the_snapshot_and_the_boot_module(site: Path) -> None:
    snapshot = site / "weei-snapshot.bin"
    # A copy of Pyodide's memory after start-up: tens of MB, never an empty or truncated file.
    assert snapshot.is_file() and snapshot.stat().st_size > (site / "pyodide" / "pyodide.asm.wasm").stat().st_size
    assert (site / "boot.mjs").is_file()


def test_the_page_starts_from_the_snapshot_with_its_own_randomness_and_workers_train(
        weei_server: Any, browser: Any) -> None:
    draws = []
    for _ in range(2):
        context = browser.new_context()
        pg = context.new_page()
        errors: list[str] = []
        pg.on("pageerror", lambda e: errors.append(str(e)))
        pg.goto(weei_server.url)
        out = pg.evaluate(f"""async () => {{
          await weeiReady;
          await {HOOKS}.startApi();
          const worker = await {HOOKS}.worker();
          await worker.ready;
          const trained = await {HOOKS}.trainOnce('digits-mlp');
          return {{ page: {HOOKS}.status().pagePythonSnapshot, worker: worker.snapshot,
                   random: await {HOOKS}.hostPython('import random; random.random()'),
                   api: {HOOKS}.status().api, examples: trained.uniqueExamples }};
        }}""")
        context.close()
        assert out["page"] is True and out["worker"] is False, out
        assert out["api"] == "ready" and out["examples"] > 0
        assert not errors, errors
        draws.append(out["random"])
    # The snapshot was made once, at build time: each page reseeds `random` after restoring it.
    assert draws[0] != draws[1]


# The steps of Pyodide's loader in the host worker, each marked by boot.mjs when it ends (weei:memory only when a
# snapshot is restored): evaluating pyodide.asm.mjs, loadPyodide's configuration, the runtime's factory up to the
# instance, linking the instance into the runtime, starting the runtime, copying the snapshot's memory, Python's
# bootstrap.
LOADER_STEPS = ["weei:fetched", "weei:asm", "weei:configured", "weei:instance", "weei:linked", "weei:runtime",
                "weei:memory", "weei:pyodide"]
# The host worker's marks, on the page's timeline.
MARKS = f"{HOOKS}.hostMarks().then((marks) => Object.fromEntries(marks.map(([name, at]) => [name, at - performance.timeOrigin])))"

# Issue 12's bound on every main-thread task of the start-up (the page stays responsive).
LONG_TASK_MS = 200


def _start_up(pg: Any, url: str) -> tuple[float, list[dict[str, float]], dict[str, float], dict[str, Any]]:
    pg.add_init_script(LONG_TASKS)
    pg.goto(url)
    out = pg.evaluate(f"""async () => {{
      await weeiReady;
      const seen = [];
      const stop = {API}.subscribe((s) => seen.push(s.busy));
      await {HOOKS}.startApi();
      const readyAt = performance.now();
      const state = {API}.getState();
      state.peers.push('changed');
      stop();
      return {{ readyAt, tasks: window.__longTasks, copy: {API}.getState().peers.length, myPeerId: state.myPeerId,
               busy: state.busy, seen }};
    }}""")
    return out["readyAt"], [t for t in out["tasks"] if t["start"] < out["readyAt"]], pg.evaluate(MARKS), out


# The page's Python starts in the host worker, every step of Pyodide's loader in order there, and the main thread
# runs no task longer than 200 ms from navigation until the API answers (it fails as soon as any step of Pyodide's
# start-up, each 0.2-0.5 s, runs on the main thread again). getState() answers from the state the host worker
# published, a copy each time; subscribe() hears the placeholder, then the controller's state.
def test_start_up_runs_in_the_host_worker_and_never_blocks_the_page(weei_server: Any, page: Any) -> None:
    pg, log = page
    ready_at, tasks, marks, out = _start_up(pg, weei_server.url)
    order = ["weei:boot", *LOADER_STEPS, "weei:unpacked",
             "weei:import weei.browser.webgpu", "weei:import weei.browser.page_main"]
    assert set(order) <= set(marks), marks
    assert [marks[m] for m in order] == sorted(marks[m] for m in order), marks
    assert marks[order[-1]] <= ready_at
    assert pg.evaluate("performance.getEntriesByType('mark').filter((m) => m.name.startsWith('weei:')).length") == 0
    print(f"start-up: API ready at {ready_at:.0f} ms; main-thread long tasks {[round(t['duration']) for t in tasks]}")
    assert all(t["duration"] <= LONG_TASK_MS for t in tasks), tasks
    assert out["copy"] == 0 and out["myPeerId"].startswith("peer-") and out["busy"] is False, out
    assert out["seen"][0] is True and out["seen"][-1] is False, out
    assert not log.errors, log.errors


# Without the snapshot (WEEI_NO_SNAPSHOT, or a snapshot Pyodide refuses) Python starts the ordinary way inside the
# runtime's start, in the host worker too: the page's main thread stays as free.
def test_start_up_without_the_snapshot_never_blocks_the_page(weei_server: Any, page: Any) -> None:
    pg, log = page
    pg.add_init_script("window.WEEI_NO_SNAPSHOT = true")
    ready_at, tasks, marks, _out = _start_up(pg, weei_server.url)
    assert pg.evaluate(f"{HOOKS}.status().pagePythonSnapshot") is False
    steps = [m for m in LOADER_STEPS if m != "weei:memory"]
    assert set(steps) <= set(marks) and "weei:memory" not in marks, marks
    assert [marks[m] for m in steps] == sorted(marks[m] for m in steps), marks
    print(f"start-up without the snapshot: API ready at {ready_at:.0f} ms; "
          f"main-thread long tasks {[round(t['duration']) for t in tasks]}")
    assert all(t["duration"] <= LONG_TASK_MS for t in tasks), tasks
    assert pg.evaluate(f"{HOOKS}.status().api") == "ready"
    assert not log.errors, log.errors


def test_window_controls_say_starting_until_the_api_is_ready(weei_server: Any, page: Any) -> None:
    pg, log = page
    # Nothing starts Python in the background: opening the window does, so "starting" is observable.
    pg.add_init_script("window.WEEI_NO_BACKGROUND_PYTHON = true")
    pg.goto(weei_server.url)
    early = pg.evaluate(f"""async () => {{
      await weeiReady;
      await {API}.enable();
      await new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
      const root = document.querySelector('{HOST}').shadowRoot;
      const create = Array.from(root.querySelectorAll('button.primary')).find((b) => /Starting|Create/.test(b.textContent));
      return {{ api: {HOOKS}.status().api, create: create.textContent, disabled: create.disabled,
               chip: root.querySelector('.chip').textContent }};
    }}""")
    # Two frames after enable(): Pyodide takes far longer than that to start anywhere.
    assert early["api"] == "starting", early
    assert early["create"] == "Starting Weei…" and early["disabled"] is True, early
    assert early["chip"] == "Starting Weei…", early
    pg.evaluate(f"{HOOKS}.startApi()")
    pg.wait_for_function(f"""() => {{
      const root = document.querySelector('{HOST}').shadowRoot;
      const create = Array.from(root.querySelectorAll('button.primary')).find((b) => /Starting|Create/.test(b.textContent));
      return create.textContent === 'Create job' && !create.disabled && root.querySelector('.chip').textContent === 'no job';
    }}""")
    assert not log.errors, log.errors

