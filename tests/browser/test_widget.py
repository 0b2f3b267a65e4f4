"""The built-in widget window (app/static/widget.js) in headless Chromium.

The window is one client of the public API: the test drives it like a user
(demo button, settings form, Create, Start), checks what it shows against
api.getState(), downloads a checkpoint through it, closes it and checks that
training goes on through the API alone. A screenshot of the window in the
middle of training is saved to out/screenshots/widget-training.png.
"""

from __future__ import annotations

from typing import Any

from playwright.sync_api import expect
from site_helpers import ROOT

SCREENSHOT = ROOT / "out" / "screenshots" / "widget-training.png"

API = "window.weei.widgetsApi.get('distributed-training')"
HOST = "[data-weei-widget]"


def state(pg: Any) -> dict[str, Any]:
    return pg.evaluate(f"Promise.resolve({API}.getState())")


def open_widget(pg: Any, url: str) -> None:
    pg.goto(url)
    styles = pg.evaluate("document.querySelectorAll('style, link[rel=stylesheet]').length")
    pg.evaluate(f"weeiReady.then(() => {API}.enable())")
    pg.wait_for_selector(HOST, state="attached")
    assert pg.evaluate(f"!!document.querySelector('{HOST}').shadowRoot"), "the window lives in a shadow root"
    pg.get_by_role("dialog").wait_for()
    # Our styles stay in the shadow root: nothing is added to the page's document.
    assert pg.evaluate("document.querySelectorAll('style, link[rel=stylesheet]').length") == styles


def fill(pg: Any, label: str, value: str) -> None:
    field = pg.get_by_label(label, exact=True)
    field.fill(value)
    field.dispatch_event("change")


def test_widget_runs_the_digits_demo(weei_server: Any, page: Any) -> None:
    pg, log = page
    pg.set_viewport_size({"width": 1280, "height": 1000})
    open_widget(pg, weei_server.url)

    # The host page's styles do not reach into the window, and ours do not leak out.
    assert pg.evaluate("getComputedStyle(document.body).fontFamily") != pg.evaluate(
        f"getComputedStyle(document.querySelector('{HOST}').shadowRoot.querySelector('.win')).fontFamily")

    pg.get_by_role("button", name="Digits MLP demo").click()
    pg.get_by_text("Digits MLP demo:").wait_for()
    # The demo brings the package's WGSL archive (createJob's executionFiles).
    assert "WGSL archive model.wgsl.json (GPU)" in pg.get_by_text("Digits MLP demo:").inner_text()
    fill(pg, "Epochs", "30")
    fill(pg, "Local epochs", "1")
    fill(pg, "Batch size", "50")

    # An error of createJob shows under the form, with its reason.
    fill(pg, "Learning rate (optional)", "-1")
    pg.get_by_role("button", name="Create job").click()
    form_error = pg.locator(".sec-setup .error:visible").first
    form_error.wait_for()
    assert "learningRate" in form_error.inner_text()
    assert "job" not in state(pg)
    fill(pg, "Learning rate (optional)", "")

    pg.get_by_role("button", name="Create job").click()
    start = pg.get_by_role("button", name="Start", exact=True)
    pg.wait_for_function(f"() => {API}.getState().job?.status === 'ready'")
    expect(start).to_be_enabled()
    start.click()
    pg.wait_for_function(f"() => {API}.getState().job?.status === 'running'")

    # Checkpoints appear in the table and as points in the chart.
    pg.wait_for_function(
        f"() => document.querySelector('{HOST}').shadowRoot.querySelectorAll('table.checkpoints tbody tr').length >= 8",
        timeout=120_000)
    pg.wait_for_function(
        f"() => document.querySelector('{HOST}').shadowRoot.querySelectorAll('.sec-metrics circle.pt').length >= 2")
    st = state(pg)
    job = st["job"]
    assert job["role"] == "coordinator"
    metric_ids = [m["id"] for m in job["info"]["metrics"]]
    assert pg.locator(".sec-metrics .chart").count() == len(metric_ids)

    # The diagnostics card has this browser's row.
    me = st["myPeerId"]
    row = pg.locator(f"table.diagnostics tr[data-peer='{me}']")
    row.wait_for()
    assert "this browser" in row.inner_text()
    # Which backend this peer trains on: headless Chromium without --enable-unsafe-webgpu has no adapter,
    # so 'auto' trains on the package's CPU backend and says why.
    assert "cpu-wasm-simd" in row.inner_text() and "fallback: no-adapter" in row.inner_text()
    assert "unknown" not in pg.locator("table.diagnostics").inner_text().lower(), "'unknown' is shown as —"

    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    pg.screenshot(path=str(SCREENSHOT))

    # The download button yields a .weei-checkpoint file.
    with pg.expect_download() as download:
        pg.get_by_role("button", name="Download latest checkpoint").click()
    assert download.value.suggested_filename.endswith(".weei-checkpoint")
    path = download.value.path()
    assert path is not None and path.stat().st_size > 4

    # Closing the window does not stop training; the API keeps working.
    pg.get_by_role("button", name="Close window").click()
    pg.wait_for_selector(HOST, state="detached")
    before = state(pg)["job"]
    rounds_before = len(before["checkpoints"])
    pg.wait_for_function(
        f"(n) => {{ const j = {API}.getState().job; return j.checkpoints.length > n || j.status === 'completed'; }}",
        arg=rounds_before, timeout=120_000)
    after = state(pg)["job"]
    assert len(after["checkpoints"]) > rounds_before
    if after["status"] == "running":
        pg.evaluate(f"{API}.stop()")

    # Opening it again shows the same job.
    pg.evaluate(f"{API}.enable()")
    pg.get_by_role("dialog").wait_for()
    pg.wait_for_function(
        f"() => document.querySelector('{HOST}').shadowRoot.querySelectorAll('table.checkpoints tbody tr').length > {rounds_before}")
    assert not log.errors, log.errors


def test_widget_runs_cartpole_and_manages_saved_jobs(weei_server: Any, page: Any) -> None:
    pg, log = page
    pg.set_viewport_size({"width": 1280, "height": 1000})
    open_widget(pg, weei_server.url)
    pg.get_by_role("button", name="CartPole demo").click()
    pg.get_by_text("CartPole demo:").wait_for()
    # An experience model: Rounds and Episodes per round instead of epochs and files.
    fill(pg, "Rounds", "200")
    fill(pg, "Episodes per round", "4")
    fill(pg, "Validate every", "1")
    pg.get_by_role("button", name="Create job").click()
    pg.wait_for_function(f"() => {API}.getState().job?.status === 'ready'")
    settings = state(pg)["job"]["settings"]
    assert settings["epochs"] == 200 and settings["experience"] == {"unitsPerAssignment": 4}
    start = pg.get_by_role("button", name="Start", exact=True)
    expect(start).to_be_enabled()
    start.click()
    pg.wait_for_function(
        f"() => document.querySelector('{HOST}').shadowRoot.querySelectorAll('.sec-metrics .train circle.pt').length >= 3",
        timeout=120_000)
    pg.wait_for_function(
        f"() => document.querySelector('{HOST}').shadowRoot.querySelectorAll('.sec-metrics .validation circle.pt').length >= 1")
    assert "↑ better" in pg.locator(".sec-metrics .chart").first.inner_text()
    expect(pg.get_by_role("progressbar", name="Rounds")).to_have_attribute("aria-valuemax", "200")
    pause = pg.get_by_role("button", name="Pause", exact=True)
    expect(pause).to_be_enabled()
    pause.click()
    pg.wait_for_function(f"() => {API}.getState().job?.status === 'paused'")
    expect(pg.get_by_role("button", name="Resume", exact=True)).to_be_enabled()

    # Debug log: count, download as JSON.
    pg.locator(".sec-debug summary").click()
    pg.wait_for_function(f"() => /\\d+ events?/.test(document.querySelector('{HOST}').shadowRoot.querySelector('.sec-debug .row').textContent)")
    with pg.expect_download() as download:
        pg.locator(".sec-debug").get_by_role("button", name="Download").click()
    assert download.value.suggested_filename.endswith(".json")

    # Leave: the job stays in Saved jobs, where it can be opened again and deleted.
    job_id = state(pg)["job"]["id"]
    pg.locator(".sec-saved summary").click()
    pg.get_by_role("button", name="Leave job").click()
    pg.wait_for_function(f"() => !{API}.getState().job")
    row = pg.locator(f"table.saved tr[data-job='{job_id}']")
    row.get_by_role("button", name="Open").click()
    pg.wait_for_function(f"(id) => {API}.getState().job?.id === id", arg=job_id)
    pg.get_by_role("button", name="Leave job").click()
    pg.wait_for_function(f"() => !{API}.getState().job")
    pg.once("dialog", lambda dialog: dialog.accept())
    pg.locator(f"table.saved tr[data-job='{job_id}']").get_by_role("button", name="Delete").click()
    pg.wait_for_function(f"(id) => !{API}.getState().savedJobs.some((s) => s.id === id)", arg=job_id)
    assert not log.errors, log.errors
