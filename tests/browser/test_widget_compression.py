"""The widget's settings form offers compressed updates (docs/api.md, "Compressed updates") and DiLoCo's
outer optimizer (FedAvgM with Nesterov momentum), end to end.

Two tabs of one room, driven like people: the first chooses the digits demo, int4 updates with a scale per
64 weights and deflated codes, FedAvgM at η 0.7, μ 0.9 with Nesterov momentum, and creates the job; the
second reviews the invitation, which says how its updates will travel and how they are combined, and accepts; the job trains to completion. What the participant uploaded is a
compressed update: the coordinator's log records each accepted update's artifact kind and size (the bytes
its frame reader took in), the participant's diagnostics report the same size, the window's diagnostics
table shows it, and it is below the plain int4 size (the codes deflated), itself 7 times below float32's.
"""

from __future__ import annotations

from typing import Any

from playwright.sync_api import expect
from site_helpers import TIMEOUT_MS
from test_readme_flow import explain, open_page, served  # noqa: F401 (served is a fixture)
from test_widget import API, fill

from weei.core.formats.qdelta import qdelta_size

DIGITS_WEIGHTS = 4810  # digits-mlp: 64-32-10 with biases, no averageOnly ranges


def test_a_job_created_with_int4_from_the_widget_uploads_compressed_updates(served: str, browser: Any) -> None:  # noqa: F811
    context = browser.new_context()
    errors: list[str] = []
    try:
        first = open_page(context, served, errors)
        second = open_page(context, served, errors)
        for pg in (first, second):
            pg.wait_for_function(f"() => {API}.getState().myPeerId !== ''")
        participant = second.evaluate(f"{API}.getState().myPeerId")

        first.get_by_role("button", name="Open the Weei window", exact=True).click()
        first.get_by_role("dialog").wait_for()
        first.get_by_role("button", name="Digits MLP demo").click()
        first.get_by_text("Digits MLP demo:").wait_for()
        block = first.get_by_label("Weights per scale (8–65536)", exact=True)
        deflate = first.get_by_label("Deflate the codes", exact=True)
        assert not block.is_visible() and not deflate.is_visible()  # only once updates are compressed
        first.get_by_label("Updates sent as", exact=True).select_option("int4")
        expect(block).to_be_visible(timeout=TIMEOUT_MS)
        fill(first, "Weights per scale (8–65536)", "64")
        deflate.check()
        # DiLoCo's outer optimizer (docs/api.md, "nesterov"): the switch shows only with FedAvgM.
        nesterov = first.get_by_label("Nesterov momentum", exact=True)
        assert not nesterov.is_visible()
        first.locator("select[name=method]").select_option("fedavgm")
        expect(nesterov).to_be_visible(timeout=TIMEOUT_MS)
        fill(first, "Server learning rate (0–10)", "0.7")
        fill(first, "Momentum (0–<1)", "0.9")
        nesterov.check()
        # reviewSettings' note on the deflate trade-off shows under the form; it needs no confirmation.
        first.get_by_role("button", name="Create job", exact=True).click()
        first.wait_for_function(f"() => {API}.getState().job?.status === 'ready'")
        settings = first.evaluate(f"{API}.getState().job.settings")
        assert settings["compression"] == {"kind": "int4", "block": 64, "deflate": True}
        assert settings["aggregation"] == {"method": "fedavgm", "serverLearningRate": 0.7, "momentum": 0.9, "nesterov": 1}
        expect(first.locator("[data-review] [data-field='compression.deflate']")).to_be_visible(timeout=TIMEOUT_MS)

        invite = first.get_by_role("button", name="Invite", exact=True)
        expect(invite).to_be_enabled(timeout=TIMEOUT_MS)
        invite.click()
        second.get_by_role("button", name="Open the Weei window", exact=True).click()
        second.get_by_role("dialog").wait_for()
        second.get_by_role("button", name="Review", exact=True).click()
        card = second.locator(".card.invitation")
        expect(card).to_contain_text("updates sent as int4, a scale per 64 weights, deflated", timeout=TIMEOUT_MS)
        expect(card).to_contain_text("fedavgm serverLearningRate 0.7 momentum 0.9 Nesterov")
        second.get_by_role("button", name="Accept", exact=True).click()
        start = first.get_by_role("button", name="Start", exact=True)
        # Started once the participant's module has loaded, so that it takes part from the first round.
        first.wait_for_function(f"(peer) => {API}.getState().job?.participants?.[peer]?.state === 'modelLoaded'",
                                arg=participant)
        expect(start).to_be_enabled(timeout=TIMEOUT_MS)
        start.click()
        try:
            first.wait_for_function(f"() => {API}.getState().job?.status === 'completed'", timeout=300_000)
        except Exception as exc:
            raise AssertionError(f"{exc}\n{explain({'first': first, 'second': second})}") from None

        events = first.evaluate(f"{API}.getDebugLog().events")
        sent = [e["details"] for e in events if e["event"] == "update.accepted" and e["details"]["peer"] == participant]
        assert sent, "the participant's updates were accepted"
        plain = qdelta_size(4, 64, DIGITS_WEIGHTS, 0)
        assert all(d["artifact"] == "qdelta" and 0 < d["bytes"] < plain for d in sent), (plain, sent)
        assert plain * 7 < 4 * DIGITS_WEIGHTS
        # The participant's own diagnostics (as the coordinator's state carries them) name the last update's size.
        uploaded = first.evaluate(f"(peer) => {API}.getState().diagnostics[peer].performance.uploadBytes",
                                  participant)
        assert uploaded == sent[-1]["bytes"]
        row = first.locator(f"table.diagnostics tr[data-peer='{participant}']")
        expect(row).to_contain_text(f"update sent: {uploaded:,} B", timeout=TIMEOUT_MS)  # fmtNum's en-US grouping
    finally:
        context.close()
    assert not errors, errors
