"""The widget's settings form offers robust aggregation (docs/api.md, "Robust aggregation").

Driven like a user: the digits demo, the robust fields filled, Create job;
the job's settings (api.getState()) carry them, a refused combination shows
its named error under the form.
"""

from __future__ import annotations

from typing import Any

from test_widget import API, fill, open_widget, state


def test_the_setup_form_sends_the_robust_options(weei_server: Any, page: Any) -> None:
    pg, log = page
    open_widget(pg, weei_server.url)
    pg.get_by_role("button", name="Digits MLP demo").click()
    pg.get_by_text("Digits MLP demo:").wait_for()
    assert "Robust aggregation against bad updates" in pg.locator(".sec-setup").inner_text()
    trim = pg.get_by_label("Trim per end (0–<0.5)", exact=True)
    assert not trim.is_visible()  # only with the trimmed mean

    # Exclusion alone (no clip, plain mean) is refused by name, under the form.
    fill(pg, "Exclude outlier after (rounds)", "3")
    pg.get_by_role("button", name="Create job").click()
    form_error = pg.locator(".sec-setup .error:visible").first
    form_error.wait_for()
    assert "excludeOutliersAfter" in form_error.inner_text()
    assert "job" not in state(pg)

    fill(pg, "Norm clip (× median, 1–1000)", "3")
    pg.get_by_label("Combine", exact=True).select_option("trimmedMean")
    assert trim.is_visible()
    fill(pg, "Trim per end (0–<0.5)", "0.3")
    pg.get_by_role("button", name="Create job").click()
    pg.wait_for_function(f"() => {API}.getState().job?.status === 'ready'")
    assert state(pg)["job"]["settings"]["aggregation"] == {
        "method": "fedavg", "normClip": 3, "combine": "trimmedMean", "trim": 0.3, "excludeOutliersAfter": 3}
    assert not log.errors, log.errors
