"""The byte-transformer demo trains in the widget (headless Chromium).

Kept short: the coordinator alone trains two rounds (one chunk each) of
the built-in Transformer demo, each validated; the validation loss falls
from round to round, well below that of untrained weights (ln 256 = 5.55).
"""

from __future__ import annotations

from typing import Any

from playwright.sync_api import expect
from test_widget import API, HOST, fill, open_widget, state


def test_widget_trains_the_transformer_demo(weei_server: Any, page: Any) -> None:
    pg, log = page
    pg.set_viewport_size({"width": 1280, "height": 1000})
    open_widget(pg, weei_server.url)
    pg.get_by_role("button", name="Transformer demo").click()
    summary = pg.get_by_text("Transformer demo:")
    summary.wait_for()
    assert "55 dataset files" in summary.inner_text()
    fill(pg, "Epochs", "1")
    fill(pg, "Validate every", "1")
    pg.get_by_role("button", name="Create job").click()
    pg.wait_for_function(f"() => {API}.getState().job?.status === 'ready'")
    job = state(pg)["job"]
    assert job["info"]["id"] == "byte-transformer" and job["settings"]["batchSize"] == 8
    start = pg.get_by_role("button", name="Start", exact=True)
    expect(start).to_be_enabled()
    start.click()
    pg.wait_for_function(
        f"() => ({API}.getState().job.checkpoints || []).filter((c) => c.validationMetrics).length >= 2",
        timeout=240_000)
    pg.evaluate(f"{API}.stop()")
    checkpoints = [c for c in state(pg)["job"]["checkpoints"] if "validationMetrics" in c]
    losses = {c["artifact"]["round"]: c["validationMetrics"]["values"]["loss"] for c in checkpoints}
    # Round 0 (the initial weights, about ln 256 = 5.55) is validated at Start, then each round: training
    # lowered it from the first round on.
    assert losses[1] < min(losses[0], 5.3), losses
    rows = f"document.querySelector('{HOST}').shadowRoot.querySelectorAll('table.checkpoints tbody tr').length"
    assert pg.evaluate(rows) >= 2
    assert not log.errors, log.errors
