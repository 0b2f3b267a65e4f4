"""Charts of a newcomer's second hour (issue 24, item 13), driven as a user would: another package starts from
its own default settings, a short job's chart has round 0 and every round, and a job continued from a
checkpoint keeps the rounds before it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from test_widget import API, HOST, fill, open_widget, state

ROOT = Path(__file__).resolve().parents[2]


def form(pg: Any) -> dict[str, Any]:
    values = {label: pg.get_by_label(label, exact=True).input_value()
              for label in ("Epochs", "Batch size", "Learning rate (optional)", "Validate every")}
    values["Aggregation"] = method(pg).input_value()
    return values


def method(pg: Any) -> Any:
    return pg.locator("label", has=pg.locator("span", has_text="Aggregation")).locator("select")


def validated_rounds(pg: Any, metric: str) -> list[int]:
    """The rounds of the validation points the window's chart of ``metric`` draws."""
    return pg.evaluate(f"""(metric) => [...document.querySelector('{HOST}').shadowRoot
      .querySelectorAll(`.chart[data-metric="${{metric}}"] g.validation circle.pt title`)]
      .map((t) => Number(/^round (\\d+):/.exec(t.textContent)[1]))""", metric)


def test_settings_reset_per_package_and_the_chart_keeps_round_0_and_the_history(weei_server: Any, page: Any,
                                                                                 tmp_path: Path) -> None:
    pg, log = page
    pg.set_viewport_size({"width": 1280, "height": 900})
    open_widget(pg, weei_server.url)
    pg.get_by_role("button", name="Transformer demo").click()
    pg.get_by_text("Transformer demo:").wait_for()
    assert form(pg)["Batch size"] == "8"
    fill(pg, "Learning rate (optional)", "0.5")
    fill(pg, "Epochs", "3")
    method(pg).select_option("fedavgm")
    # Another demo: its own settings, nothing of the one before.
    pg.get_by_role("button", name="Digits MLP demo").click()
    pg.get_by_text("Digits MLP demo:").wait_for()
    digits = {"Epochs": "1", "Batch size": "32", "Learning rate (optional)": "", "Validate every": "1", "Aggregation": "fedavg"}
    assert form(pg) == digits
    # A package chosen as a folder: the defaults (weei train's), not the demo's edited values.
    fill(pg, "Learning rate (optional)", "0.5")
    fill(pg, "Batch size", "4")
    pg.get_by_label("Model folder").set_input_files(str(ROOT / "app" / "static" / "models" / "digits-mlp"))
    pg.get_by_text("folder digits-mlp:").wait_for()
    assert form(pg) == digits

    # A short job: every round validated, and round 0 (the initial weights) at Start.
    pg.get_by_role("button", name="Digits MLP demo").click()
    pg.get_by_text("Digits MLP demo:").wait_for()
    pg.get_by_role("button", name="Create job").click()
    pg.wait_for_function(f"() => {API}.getState().job?.status === 'ready'", timeout=60_000)
    pg.get_by_role("button", name="Start", exact=True).click()
    pg.wait_for_function(f"""() => {{ const j = {API}.getState().job;
      return j?.status === 'completed' && j.checkpoints.every((c) => c.validationMetrics) && !{API}.getState().evaluating; }}""",
                         timeout=240_000)
    last = state(pg)["job"]["checkpoints"][-1]["artifact"]["round"]
    pg.wait_for_function(f"""(n) => document.querySelector('{HOST}').shadowRoot
      .querySelectorAll('.chart[data-metric="accuracy"] g.validation circle.pt').length === n""", arg=last + 1)
    assert validated_rounds(pg, "accuracy") == list(range(last + 1))
    # The accuracy axis stays within [0, 1].
    ticks = pg.evaluate(f"""() => [...document.querySelector('{HOST}').shadowRoot
      .querySelectorAll('.chart[data-metric="accuracy"] g.axes text[text-anchor=end]:not(.unit)')].map((t) => t.textContent)""")
    assert ticks and all(0 <= float(t) <= 1 for t in ticks), ticks

    # Continued from its last checkpoint: the chart keeps the rounds before it.
    data = pg.evaluate(f"""async () => [...new Uint8Array(await (await {API}.exportCheckpoint()).arrayBuffer())]""")
    checkpoint = tmp_path / "digits.weei-checkpoint"
    checkpoint.write_bytes(bytes(data))
    pg.get_by_role("button", name="Digits MLP demo").click()
    pg.get_by_text("Digits MLP demo:").wait_for()
    pg.get_by_label("Continue from checkpoint (optional)").set_input_files(str(checkpoint))
    pg.get_by_role("button", name="Continue from checkpoint", exact=True).click()
    pg.wait_for_function(f"""(n) => {{ const j = {API}.getState().job;
      return j?.status === 'ready' && j.checkpoints[0].artifact.round === n; }}""", arg=last, timeout=60_000)
    pg.wait_for_function(f"""(n) => document.querySelector('{HOST}').shadowRoot
      .querySelectorAll('.chart[data-metric="accuracy"] g.validation circle.pt').length === n""", arg=last)
    assert validated_rounds(pg, "accuracy") == list(range(last))
    assert not log.errors, log.errors
