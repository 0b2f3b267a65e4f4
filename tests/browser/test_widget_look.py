"""The window's look and keyboard: charts, dark mode, narrow layouts, copy buttons, accessibility.

One digits-demo job is trained to completion through the window; then the
test drives the charts like a TensorBoard user (hover, smoothing, log
scale, drag to zoom, time axis), copies IDs and hashes through the copy
buttons and reads them back from the clipboard, saves screenshots at 1280,
800 and 390 px in light and dark mode to out/screenshots/widget-<width>-<scheme>[-diagnostics].png
(the Metrics and the Execution diagnostics sections; checking that
nothing overflows sideways), runs axe-core (node_modules, pinned in
package-lock.json) on the open window, and closes it with Escape.
"""

from __future__ import annotations

import math
import re
from typing import Any

from playwright.sync_api import expect
from site_helpers import ROOT
from test_widget import API, HOST, fill, open_widget, state

SHOTS = ROOT / "out" / "screenshots"
AXE = ROOT / "node_modules" / "axe-core" / "axe.min.js"
SR = f"document.querySelector('{HOST}').shadowRoot"


def shadow(pg: Any, expr: str) -> Any:
    return pg.evaluate(f"(() => {{ const r = {SR}; return {expr}; }})()")


def first_chart_svg(pg: Any) -> dict[str, Any]:
    return shadow(pg, """(() => { const s = r.querySelector('.sec-metrics .chart svg');
      return { x0: Number(s.dataset.x0), x1: Number(s.dataset.x1), scale: s.dataset.scale, axis: s.dataset.axis,
        line: s.querySelector('path.line.train')?.getAttribute('d') || null,
        raw: s.querySelector('path.raw.train')?.getAttribute('d') || null,
        ticks: [...s.querySelectorAll('g.axes text')].map((t) => t.textContent) }; })()""")


def test_window_look_keyboard_charts_copy_and_axe(weei_server: Any, page: Any) -> None:
    pg, log = page
    pg.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=weei_server.url.rstrip("/"))
    pg.set_viewport_size({"width": 1280, "height": 900})
    open_widget(pg, weei_server.url)
    # Focus moves into the window when it opens.
    assert pg.evaluate(f"document.activeElement === document.querySelector('{HOST}')")
    assert shadow(pg, "r.activeElement && r.activeElement.classList.contains('win')")

    pg.get_by_role("button", name="Digits MLP demo").click()
    pg.get_by_text("Digits MLP demo:").wait_for()
    fill(pg, "Epochs", "3")
    fill(pg, "Local epochs", "1")
    fill(pg, "Batch size", "50")
    pg.get_by_role("button", name="Create job").click()
    pg.wait_for_function(f"() => {API}.getState().job?.status === 'ready'")
    pg.get_by_role("button", name="Start", exact=True).click()
    pg.wait_for_function(f"() => {API}.getState().job?.status === 'completed'", timeout=180_000)
    # The status change is announced in the live region.
    pg.wait_for_function(f"() => {SR}.querySelector('[role=status][aria-live]').textContent.includes('completed')")
    assert shadow(pg, "r.querySelector('[role=status][aria-live]').getAttribute('aria-live')") == "polite"

    st = state(pg)
    job, me = st["job"], st["myPeerId"]
    cps = [c for c in job["checkpoints"] if c.get("metrics") and c["metrics"].get("values")]
    metric = job["info"]["metrics"][0]["id"]
    train = {c["artifact"]["round"]: c["metrics"]["values"][metric] for c in cps if metric in c["metrics"]["values"]}
    assert len(train) >= 3, train

    # ---- copy buttons: exactly the ID or hash on the clipboard --------------------------------
    def copied(button: Any) -> str:
        button.click()
        expect(button).to_have_text("Copied")  # after the clipboard write resolved
        return str(pg.evaluate("navigator.clipboard.readText()"))

    row = pg.locator(f"table.diagnostics tr[data-peer='{me}']")
    row.wait_for()
    assert copied(row.get_by_role("button", name=re.compile(r"^Cop(y|ied) peer ID$"))) == me
    assert copied(pg.locator(".sec-setup").get_by_role("button", name=re.compile(r"^Cop(y|ied) job ID$"))) == job["id"]
    sha = st["diagnostics"][me]["model"]["wasmSha256"]
    assert copied(pg.locator(".consistency").get_by_role("button", name=re.compile(r"^Cop(y|ied) model hash$"))) == sha
    assert len(sha) == 64

    # ---- charts ---------------------------------------------------------------------------------
    chart = pg.locator(".sec-metrics .chart").first
    chart.scroll_into_view_if_needed()
    hit = chart.locator("rect.hit")
    box = hit.bounding_box()
    assert box is not None
    # Hover shows the value of the nearest round, as the state has it.
    pg.mouse.move(box["x"] + box["width"] - 2, box["y"] + box["height"] / 2)
    tip = chart.locator(".tip")
    tip.wait_for()
    text = tip.inner_text()
    last_round = max(train)
    assert f"round {last_round}" in text, text
    shown = float(re.search(r"training (\S+)", text).group(1).replace(",", ""))  # type: ignore[union-attr]
    assert math.isclose(shown, train[last_round], rel_tol=1e-3), (shown, train[last_round])
    pg.mouse.move(0, 0)
    tip.wait_for(state="hidden")
    # The keyboard reads the values too (and says them in the live region).
    chart.focus()
    pg.keyboard.press("ArrowRight")
    # The chart starts at the first round it has a value of: round 0's validation when it ran (issue 24, item 13).
    validated = {c["artifact"]["round"] for c in job["checkpoints"]
                 if (c.get("validationMetrics") or {}).get("values", {}).get(metric) is not None}
    first_round = min(set(train) | validated)
    assert f"round {first_round}" in tip.inner_text()
    assert f"round {first_round}" in shadow(pg, "r.querySelector('[role=status][aria-live]').textContent")

    # Smoothing changes the drawn line; the raw values stay drawn behind it.
    before = first_chart_svg(pg)
    assert before["line"] and before["raw"] is None
    pg.get_by_label("Smoothing").fill("0.9")
    after = first_chart_svg(pg)
    assert after["line"] != before["line"] and after["raw"] == before["line"]
    # The hover value of the smoothed line is TensorBoard's debiased moving average of the raw values.
    last, norm = 0.0, 0.0
    for r in sorted(train):
        last, norm = last * 0.9 + 0.1 * train[r], norm * 0.9 + 0.1
    box = chart.locator("rect.hit").bounding_box()
    assert box is not None
    pg.mouse.move(box["x"] + box["width"] - 2, box["y"] + box["height"] / 2)
    smoothed = float(re.search(r"training \S+ \(smoothed (\S+)\)", tip.inner_text()).group(1).replace(",", ""))  # type: ignore[union-attr]
    assert math.isclose(smoothed, last / norm, rel_tol=1e-3), (smoothed, last / norm)
    assert not math.isclose(smoothed, train[last_round], rel_tol=1e-3)
    pg.mouse.move(0, 0)
    pg.get_by_label("Smoothing").fill("0")
    assert first_chart_svg(pg)["line"] == before["line"]

    # Log scale: the y ticks become 1, 2, 5 × a power of ten; off again gives the linear ticks back.
    pg.get_by_label("Log scale").check()
    logged = first_chart_svg(pg)
    assert logged["scale"] == "log" and logged["ticks"] != before["ticks"]
    ys = [float(t.replace(",", "")) for t in shadow(pg, "[...r.querySelector('.sec-metrics .chart svg g.axes').querySelectorAll('text[text-anchor=end]:not(.unit)')].map((t) => t.textContent)")]
    for y in ys:
        mant = y / 10 ** math.floor(math.log10(y) + 1e-9)
        assert any(math.isclose(mant, m, rel_tol=1e-6) for m in (1, 2, 5)), ys
    pg.get_by_label("Log scale").uncheck()
    assert first_chart_svg(pg)["scale"] == "linear" and first_chart_svg(pg)["ticks"] == before["ticks"]

    # Drag across the chart zooms into that range of rounds; Reset zoom shows them all again.
    box = chart.locator("rect.hit").bounding_box()
    assert box is not None
    y = box["y"] + box["height"] / 2
    pg.mouse.move(box["x"] + box["width"] * 0.3, y)
    pg.mouse.down()
    pg.mouse.move(box["x"] + box["width"] * 0.8, y, steps=5)
    pg.mouse.up()
    zoomed = first_chart_svg(pg)
    assert before["x0"] < zoomed["x0"] < zoomed["x1"] < before["x1"], (before, zoomed)
    reset = pg.get_by_role("button", name="Reset zoom")
    assert reset.is_enabled()
    reset.click()
    assert (first_chart_svg(pg)["x0"], first_chart_svg(pg)["x1"]) == (before["x0"], before["x1"])
    # The keyboard zooms too, and the focus stays on the (redrawn) chart.
    chart.focus()
    pg.keyboard.press("+")
    keyed = first_chart_svg(pg)
    assert keyed["x1"] - keyed["x0"] < before["x1"] - before["x0"], keyed
    assert shadow(pg, "r.activeElement && r.activeElement.dataset.metric") == metric
    pg.keyboard.press("0")
    assert (first_chart_svg(pg)["x0"], first_chart_svg(pg)["x1"]) == (before["x0"], before["x1"])

    # Time axis: elapsed time since checkpoint 0, in seconds.
    pg.get_by_label("Horizontal axis").select_option("time")
    timed = first_chart_svg(pg)
    elapsed = (cps[-1]["createdAt"] - job["checkpoints"][0]["createdAt"]) / 1000
    assert timed["axis"] == "time" and timed["x0"] >= 0 and math.isclose(timed["x1"], elapsed, rel_tol=1e-6, abs_tol=1e-3)
    pg.get_by_label("Horizontal axis").select_option("round")

    # ---- layout and colours: screenshots, no sideways overflow, axe ------------------------------
    shadow(pg, "r.querySelectorAll('details').forEach((d) => { d.open = true; })")
    # The page's policy refuses inline scripts (a script tag of axe's text is one); a DevTools evaluation is
    # the test's own instrument and runs outside it.
    pg.evaluate(AXE.read_text())
    SHOTS.mkdir(parents=True, exist_ok=True)
    backgrounds = {}
    for scheme in ("light", "dark"):
        pg.emulate_media(color_scheme=scheme)
        backgrounds[scheme] = shadow(pg, "getComputedStyle(r.querySelector('.win')).backgroundColor")
        for width, height in ((1280, 900), (800, 900), (390, 844)):
            pg.set_viewport_size({"width": width, "height": height})
            pg.wait_for_timeout(100)
            shadow(pg, "r.querySelector('.sec-metrics').scrollIntoView()")
            pg.screenshot(path=str(SHOTS / f"widget-{width}-{scheme}.png"))
            shadow(pg, "r.querySelector('.sec-diagnostics').scrollIntoView()")
            pg.screenshot(path=str(SHOTS / f"widget-{width}-{scheme}-diagnostics.png"))
            sizes = pg.evaluate(f"""(() => {{ const r = {SR}; const win = r.querySelector('.win');
              const body = r.querySelector('.body'); const rect = win.getBoundingClientRect();
              const wrap = r.querySelector('.sec-diagnostics .tablewrap').getBoundingClientRect();
              return {{ page: document.scrollingElement.scrollWidth, inner: innerWidth,
                win: [win.scrollWidth, win.clientWidth], body: [body.scrollWidth, body.clientWidth],
                left: rect.left, right: rect.right, wrap: [wrap.left, wrap.right] }}; }})()""")
            where = f"{width} px {scheme}: {sizes}"
            assert sizes["page"] <= sizes["inner"], where
            assert sizes["win"][0] <= sizes["win"][1] and sizes["body"][0] <= sizes["body"][1], where
            assert 0 <= sizes["left"] and sizes["right"] <= sizes["inner"], where
            assert sizes["left"] <= sizes["wrap"][0] and sizes["wrap"][1] <= sizes["right"], where
        pg.set_viewport_size({"width": 1280, "height": 900})
        result = pg.evaluate(f"""axe.run(document.querySelector('{HOST}'), {{ resultTypes: ['violations'] }})
          .then((r) => r.violations.map((v) => ({{ id: v.id, impact: v.impact, nodes: v.nodes.length,
            targets: v.nodes.slice(0, 3).map((n) => JSON.stringify(n.target)) }})))""")
        bad = [v for v in result if v["impact"] in ("serious", "critical")]
        print(f"axe {scheme}: {len(result)} violations ({len(bad)} serious or critical): {result}")
        assert not bad, f"{scheme}: {bad}"
    assert backgrounds["light"] != backgrounds["dark"], backgrounds

    # ---- Escape closes the window; focus moves into it again when it reopens -------------------
    pg.get_by_label("Smoothing").focus()
    assert shadow(pg, "r.activeElement && r.activeElement.getAttribute('aria-label')") == "Smoothing"
    pg.keyboard.press("Escape")
    pg.wait_for_selector(HOST, state="detached")
    pg.evaluate(f"{API}.enable()")
    pg.get_by_role("dialog").wait_for()
    assert shadow(pg, "!!r.activeElement && !!r.activeElement.closest('.win')")
    assert not log.errors, log.errors
