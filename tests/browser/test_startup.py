"""Start-up of the page and of its Workers (issue 11 P5, issue 12 item 4).

build.py site ships weei-snapshot.bin, a Pyodide memory snapshot with weei's
modules imported (tools/pyodide_snapshot.mjs); boot.mjs restores it in the
page. Training Workers start Pyodide the ordinary way: the snapshot, made in
Node without stack switching, would take JSPI (trainGpu's run_sync) from
them (test_gpu_job.py). The page's start-up is split into tasks
so the page stays responsive: every step, Pyodide's loader's included, is a task of
its own (long tasks measured by a PerformanceObserver installed before any
script runs, steps by performance marks), and until the API is up the
window's controls are disabled and say "Starting Weei…".
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
          const {{ pyodide }} = await weei._internal.core.pagePython.start();
          const worker = {HOOKS}.worker();
          await worker.ready;
          const trained = await {HOOKS}.trainOnce('digits-mlp');
          return {{ page: {HOOKS}.status().pagePythonSnapshot, worker: worker.snapshot,
                   random: pyodide.runPython('import random; random.random()'),
                   api: {HOOKS}.status().api, examples: trained.uniqueExamples }};
        }}""")
        context.close()
        assert out["page"] is True and out["worker"] is False, out
        assert out["api"] == "ready" and out["examples"] > 0
        assert not errors, errors
        draws.append(out["random"])
    # The snapshot was made once, at build time: each page reseeds `random` after restoring it.
    assert draws[0] != draws[1]


# The steps of Pyodide's loader, each marked by boot.mjs when it ends (weei:memory only when a snapshot is
# restored): evaluating pyodide.asm.mjs, loadPyodide's configuration, the runtime's factory up to the
# instance (compiled off the main thread by instantiateStreaming), linking the instance into the runtime,
# starting the runtime, copying the snapshot's memory, Python's bootstrap.
LOADER_STEPS = ["weei:fetched", "weei:asm", "weei:configured", "weei:instance", "weei:linked", "weei:runtime",
                "weei:memory", "weei:pyodide"]
MARKS = "Object.fromEntries(performance.getEntriesByType('mark').filter((m) => m.name.startsWith('weei:')).map((m) => [m.name, m.startTime]))"


def _start_up(pg: Any, url: str) -> tuple[float, list[dict[str, float]], dict[str, float]]:
    pg.add_init_script(LONG_TASKS)
    pg.goto(url)
    ready_at = pg.evaluate(f"weeiReady.then(() => {HOOKS}.startApi()).then(() => performance.now())")
    return ready_at, pg.evaluate("window.__longTasks"), pg.evaluate(MARKS)


def _marks_inside(task: dict[str, float], marks: dict[str, float]) -> list[str]:
    # Strictly inside, 1 ms from either end: long-task times are coarse, and a mark at the very end of one task
    # must not be read as being in the next.
    return [name for name, at in marks.items() if task["start"] + 1 < at < task["start"] + task["duration"] - 1]


# Every step of the start-up is a task of its own: no long task holds two of the marks. That holds at any load (it
# is about order, not time) and fails as soon as a pause between two steps is lost. What is left in one task is
# each step itself; the longest is Python's bootstrap (Pyodide's finalizeBootstrap, between weei:memory and
# weei:pyodide), measured 0.3-0.4 s at a load average of 8-12 on 2 cores, so issue 12's ~50 ms is not met there
# (docs/browser.md "Start-up"; only the page's Python in a Worker would meet it, and the controller needs
# RTCPeerConnection and storage a Worker lacks). Every task weei itself runs (its script, fetching, unpacking, each
# import) is held to 200 ms, or, where load stretches every task, to the loader's longest in the same run.
def test_start_up_is_a_series_of_tasks_one_per_step(weei_server: Any, page: Any) -> None:
    pg, log = page
    ready_at, tasks, marks = _start_up(pg, weei_server.url)
    order = ["weei:boot", *LOADER_STEPS, "weei:unpacked",
             "weei:import weei.browser.webgpu", "weei:import weei.browser.page_main"]
    assert set(order) <= set(marks), marks
    assert [marks[m] for m in order] == sorted(marks[m] for m in order), marks
    assert marks[order[-1]] <= ready_at
    during = [t for t in tasks if t["start"] < ready_at]
    assert not [(t, _marks_inside(t, marks)) for t in during if len(_marks_inside(t, marks)) > 1], (during, marks)
    loader = [t for t in during if marks["weei:fetched"] <= t["start"] + t["duration"]
              and t["start"] <= marks["weei:pyodide"]]
    ours = [t for t in during if t not in loader]
    steps = {}
    for t in during:
        before = [m for m in order if marks[m] <= t["start"] + 1]
        steps.setdefault(before[-1] if before else "(page)", []).append(round(t["duration"]))
    print(f"start-up: API ready at {ready_at:.0f} ms; long tasks after each mark {steps}")
    # Issue 12's 200 ms, or, on a machine loaded enough to stretch every task, no longer than Pyodide's own
    # loader tasks measured in the same start-up: weei's own work is never what blocks the page longest.
    bound = max([200.0] + [t["duration"] for t in loader])
    assert all(t["duration"] <= bound for t in ours), (bound, ours, marks)
    assert not log.errors, log.errors


# Without the snapshot (WEEI_NO_SNAPSHOT, or a snapshot Pyodide refuses) Python starts the ordinary way inside the
# runtime's start (weei:linked to weei:runtime is then Python's whole initialisation, one task), and the other steps
# are still split.
def test_start_up_without_the_snapshot_still_splits_the_loader(weei_server: Any, page: Any) -> None:
    pg, log = page
    pg.add_init_script("window.WEEI_NO_SNAPSHOT = true")
    ready_at, tasks, marks = _start_up(pg, weei_server.url)
    assert pg.evaluate(f"{HOOKS}.status().pagePythonSnapshot") is False
    steps = [m for m in LOADER_STEPS if m != "weei:memory"]
    assert set(steps) <= set(marks) and "weei:memory" not in marks, marks
    assert [marks[m] for m in steps] == sorted(marks[m] for m in steps), marks
    during = [t for t in tasks if t["start"] < ready_at]
    assert not [(t, _marks_inside(t, marks)) for t in during if len(_marks_inside(t, marks)) > 1], (during, marks)
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
