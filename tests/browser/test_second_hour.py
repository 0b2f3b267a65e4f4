"""The README's second hour, walked in real headless Chromium (issue 24, "Done means").

One `weei serve --allow-origin` for a second local site, and two browser contexts that stay open throughout:
the coordinator's and the participant's, each a tab opened from the invite link.

1. The README's by-hand flow (test_readme_flow's steps): Digits MLP demo, Invite, Review, Accept, Start.
2. A second job in the same tabs, with an own model: `weei model new PATH --features N --classes K` and
   `weei model build`, chosen in the window as its folder (module, manifest, chunks and validation.bin routed),
   invited again, accepted (replacing the finished job) and started.
3. While it trains, the coordinator's tab is closed and opened again from the same link: it is the same peer
   with the same job, the participant says "coordinator offline" meanwhile and trains on after it is back,
   and hears the end.
4. The README's embed snippet, on a page of the second site: the window opens in the same room, and the
   coordinator sees that page's peer.

Each step also has its own test (test_readme_flow, test_dead_ends, test_job_continuity, test_embed_snippet);
this one checks that they hold in a row, in the same tabs, as a newcomer meets them.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect
from site_helpers import TIMEOUT_MS, start_server, stop_server
from test_embed_snippet import _page, other_origin, readme_snippet
from test_readme_flow import API, explain, follow_the_readme, open_page
from test_server_rooms import _invite

from weei.cli import main

__all__ = ["other_origin"]  # the fixture, used by name

FEATURES, CLASSES = 5, 3


def own_model(folder: Path) -> Path:
    """The README's "Bring your own model" in C: a template with sample data, built."""
    assert main(["model", "new", str(folder), "--features", str(FEATURES), "--classes", str(CLASSES)]) == 0
    assert main(["model", "build", str(folder)]) == 0
    return folder


def opened_window(pg: Any) -> None:
    pg.get_by_role("button", name="Open the Weei window", exact=True).click()
    pg.get_by_role("dialog").wait_for()


def test_the_readme_second_hour(site: Path, browser: Any, other_origin: tuple[str, dict[str, str]],
                                tmp_path: Path) -> None:
    if shutil.which("clang") is None:
        pytest.skip("clang is not installed (make setup)")
    origin, pages = other_origin
    server = start_server(site, "--allow-origin", origin)
    contexts = [browser.new_context(), browser.new_context()]
    errors: list[str] = []
    try:
        link = _invite(server)
        key = link.split("#room=", 1)[1]
        first = open_page(contexts[0], link, errors)
        second = open_page(contexts[1], link, errors)

        # 1. The first hour's README flow, to its end.
        follow_the_readme(first, second)
        ids = {"first": first.evaluate(f"{API}.getState().myPeerId"),
               "second": second.evaluate(f"{API}.getState().myPeerId")}
        first_job = first.evaluate(f"{API}.getState().job.id")

        # 2. The next job in the same tabs: an own model, chosen as the folder `weei model new` made.
        folder = own_model(tmp_path / "mymodel")
        first.get_by_label("Model folder").set_input_files(str(folder))
        summary = first.get_by_text("folder mymodel:")
        summary.wait_for()
        assert "validation validation.bin" in summary.inner_text(), summary.inner_text()
        epochs = first.get_by_label("Epochs", exact=True)
        epochs.fill("10")  # 6 chunks, 2 peers: some 30 rounds, time to close the tab while it trains
        epochs.dispatch_event("change")
        create = first.get_by_role("button", name="Create job", exact=True)
        expect(create).to_be_visible(timeout=TIMEOUT_MS)
        create.click()
        first.wait_for_function(f"() => {API}.getState().job?.info.id === 'mymodel' "
                                f"&& {API}.getState().job.status === 'ready'", timeout=TIMEOUT_MS)
        job = first.evaluate(f"{API}.getState().job.id")
        assert job != first_job
        invite = first.locator(f".peerrow[data-peer='{ids['second']}'] button[name=invite]")
        expect(invite).to_be_enabled(timeout=TIMEOUT_MS)
        invite.click()
        # The participant still shows the finished job: the invitation says accepting replaces it.
        second.get_by_role("button", name="Review", exact=True).click()
        expect(second.locator("[data-field=replaces]")).to_contain_text(first_job, timeout=TIMEOUT_MS)
        second.get_by_role("button", name="Accept", exact=True).click()
        second.wait_for_function(f"(id) => {API}.getState().job?.id === id", arg=job, timeout=TIMEOUT_MS)
        first.wait_for_function(f"""(peer) => {{ const p = {API}.getState().job.participants[peer];
          return p && p.approved && p.state !== 'approved'; }}""", arg=ids["second"], timeout=120_000)
        first.get_by_role("button", name="Start", exact=True).click()
        try:
            first.wait_for_function(f"""(peer) => {API}.getState().job.checkpoints.length >= 3
              && {API}.getDebugLog().events.some((e) => e.event === 'update.accepted' && e.details.peer === peer)""",
                                    arg=ids["second"], timeout=180_000)
        except Exception as exc:
            raise AssertionError(f"{exc}\n{explain({'first': first, 'second': second})}") from None
        before = first.evaluate(f"{API}.getState().job.checkpoints.length")

        # 3. The coordinator's tab closed while it trains, and opened again from the same link.
        first.close()
        second.wait_for_function(f"""() => {{ const j = {API}.getState().job;
          return j && j.coordinatorOffline && typeof j.coordinatorOffline.since === 'number'; }}""", timeout=60_000)
        assert second.evaluate(f"{API}.getState().job.status") != "completed"
        first = open_page(contexts[0], link, errors)
        first.wait_for_function(f"() => {API}.getState().myPeerId !== ''", timeout=TIMEOUT_MS)
        opened_window(first)
        assert first.evaluate(f"{API}.getState().myPeerId") == ids["first"]
        assert first.evaluate(f"{API}.getState().job?.id") == job
        try:
            first.wait_for_function(f"() => {API}.getState().job.status === 'completed'", timeout=240_000)
            second.wait_for_function(f"() => {API}.getState().job.status === 'completed' "
                                     f"&& !{API}.getState().job.coordinatorOffline", timeout=60_000)
        except Exception as exc:
            raise AssertionError(f"{exc}\n{explain({'first': first, 'second': second})}") from None
        out = first.evaluate(f"""() => {{ const s = {API}.getState();
          return {{ rounds: s.job.checkpoints.map((c) => c.artifact.round), incomplete: s.job.incomplete,
                    participant: s.job.participants[{ids['second']!r}],
                    accepted: {API}.getDebugLog().events
                      .slice({API}.getDebugLog().events.findIndex((e) => e.event === 'job.created' && e.details.jobId === {job!r}))
                      .filter((e) => e.event === 'update.accepted' && e.details.peer === {ids['second']!r})
                      .map((e) => e.details.attempt) }}; }}""")
        print(f"job 2: {len(out['rounds'])} checkpoints, {before} before the tab closed, the participant's accepted updates: {len(out['accepted'])}")
        assert out["rounds"] == list(range(len(out["rounds"]))) and not out["incomplete"], out
        late = [a for a in out["accepted"] if int(a[1:].split("-")[0]) >= before]
        assert late, f"the participant trained after the coordinator came back: {out}"
        assert "stuck" not in out["participant"] and not out["participant"].get("missedEnd"), out

        # 4. The README's embed snippet on a page of another origin, which the server allows.
        snippet = readme_snippet().replace("http://127.0.0.1:8000/", server.url).replace("KEY", key)
        pages["/mine"] = _page(snippet)
        embed = contexts[1].new_page()
        embed.set_default_timeout(TIMEOUT_MS)
        embed.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
        embed.goto(f"{origin}/mine")
        embed.get_by_role("dialog").wait_for()
        assert embed.evaluate(f"{API}.getRoom().key") == key
        embed.wait_for_function(f"() => {API}.getState().myPeerId !== ''", timeout=TIMEOUT_MS)
        embedded = embed.evaluate(f"{API}.getState().myPeerId")
        first.wait_for_function(f"(id) => {API}.getState().peers.includes(id)", arg=embedded, timeout=TIMEOUT_MS)
        embed.wait_for_function(f"(ids) => ids.every((id) => {API}.getState().peers.includes(id))",
                                arg=[ids["first"], ids["second"]], timeout=TIMEOUT_MS)
    finally:
        for context in contexts:
            context.close()
        assert stop_server(server) == 0
    assert not errors, errors
