"""The README's by-hand flow, literally as written, and the landing page (issue 12, items 1-3 and 8).

The test reads the numbered steps of README.md's "By hand, in two tabs" section and does what they say:
each step names its tab ("In the first tab", "In the second tab") and its buttons in **bold**, which the
test presses in order, by their accessible names, in pages opened from the invite link `weei serve`
prints. Once in two tabs of one browser context (each tab its own peer and storage), once in two
browsers (two Chromium processes). A README that names a button the window does not have, or a step
that does not work, fails here.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect
from site_helpers import CHROMIUM, CHROMIUM_ARGS, ROOT, TIMEOUT_MS, start_server, stop_server
from test_server_rooms import _invite

API = "window.weei.widgetsApi.get('distributed-training')"


def readme_steps() -> list[tuple[str, list[str]]]:
    """[(tab, [button, ...])] from the README's by-hand section."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## By hand, in two tabs", 1)[1].split("\n## ", 1)[0]
    numbered = section[section.index("\n1. ") + 1:].split("\n\n", 1)[0]  # the list ends at a blank line
    out = []
    for step in re.split(r"^\d+\. ", numbered, flags=re.M)[1:]:
        tab = re.match(r"In the (first|second) tab", step)
        assert tab, f"a README step that does not say its tab: {step!r}"
        out.append((tab.group(1), re.findall(r"\*\*(.+?)\*\*", " ".join(step.split()))))
    return out


def test_the_readme_steps_are_what_this_test_presses() -> None:
    assert readme_steps() == [
        ("first", ["Open the Weei window", "Digits MLP demo", "Create job"]),
        ("first", ["Invite"]),
        ("second", ["Open the Weei window", "Review", "Accept"]),
        ("first", ["Start"]),
    ]


def shadow(pg: Any, selector: str) -> str:
    return pg.evaluate("(s) => { const el = document.querySelector('[data-weei-widget]')?.shadowRoot"
                       "?.querySelector(s); return el ? el.textContent : null; }", selector)


def follow_the_readme(first: Any, second: Any) -> None:
    """Do the README's steps in the two pages (already opened from the invite link); check what it promises."""
    tabs = {"first": first, "second": second}
    link = first.url
    for pg in (first, second):
        pg.wait_for_function(f"() => {API}.getState().myPeerId !== ''")
    ids = {name: pg.evaluate(f"{API}.getState().myPeerId") for name, pg in tabs.items()}
    assert ids["first"] != ids["second"]
    # The page shows the room, this peer's ID and the invite link.
    for pg in (first, second):
        expect(pg.locator("#peer-id")).to_have_text(pg.evaluate(f"{API}.getState().myPeerId"), timeout=TIMEOUT_MS)
        assert pg.locator("#invite-link").input_value() == link
    for tab, buttons in readme_steps():
        pg = tabs[tab]
        for name in buttons:
            if name == "Create job":
                # Before a job exists, Invite is disabled and the window says why.
                invite = pg.get_by_role("button", name="Invite", exact=True)
                expect(invite).to_be_disabled(timeout=TIMEOUT_MS)
                assert "create one first" in (invite.get_attribute("title") or "")
                hint = pg.get_by_text("Invite offers a job to a peer: create one first")
                expect(hint).to_be_visible(timeout=TIMEOUT_MS)
            if name == "Review":
                # The invitation raised a notice at the top of the window and a live announcement.
                notice = pg.locator(".notices .notice")
                expect(notice).to_be_visible(timeout=TIMEOUT_MS)
                # It says who invited by name ("Chrome on Linux"), the peer ID in the name's title.
                assert "from Chrome on Linux" in notice.inner_text()
                assert notice.locator(f'[title="{ids["first"]}"]').count() == 1
                assert "Invitation to train" in (shadow(pg, "[role=status][aria-live]") or "")
                box = pg.evaluate("() => { const r = document.querySelector('[data-weei-widget]').shadowRoot"
                                  ".querySelector('.notices').getBoundingClientRect(); return r.top; }")
                assert box < 200, "the notice is at the top of the window"
            if name == "Open the Weei window":
                pg.get_by_role("button", name=name, exact=True).click()
                pg.get_by_role("dialog").wait_for()
                # The window shows the room, this peer's ID and the invite link with a Copy button.
                assert pg.locator("input[name=inviteLink]").input_value() == link
                expect(pg.locator("[data-field=myPeerId]")).to_have_text(ids[tab], timeout=TIMEOUT_MS)
                expect(pg.locator("button[name=copyInvite]")).to_be_visible(timeout=TIMEOUT_MS)
                continue
            pg.get_by_role("button", name=name, exact=True).click()
    # Each round trains in both tabs; checkpoints appear in the first.
    try:
        first.wait_for_function(
            "(peer) => { const s = " + API + ".getState(); return s.job && s.job.checkpoints.length >= 1"
            " && " + API + ".getDebugLog().events.some((e) => e.event === 'update.accepted'"
            " && e.details.peer === peer); }",
            arg=ids["second"], timeout=180_000)
    except Exception as exc:
        raise AssertionError(f"{exc}\n{explain(tabs)}") from None
    assert second.evaluate(f"{API}.getState().job.role") == "participant"
    first.wait_for_function(
        "() => document.querySelector('[data-weei-widget]').shadowRoot"
        ".querySelectorAll('table.checkpoints tbody tr').length >= 1")
    # The demo job is short: on a quick machine it may complete before this line, and stop() then refuses
    # by name (job-completed). Either way the job is over afterwards.
    stopped = first.evaluate(f"""async () => {{
      try {{ await {API}.stop(); return 'stopped'; }}
      catch (e) {{ if (e.reason === 'job-completed') return 'completed'; throw e; }}
    }}""")
    assert stopped in ("stopped", "completed")
    assert first.evaluate(f"{API}.getState().job.status") == "completed"  # stopped or finished


def explain(tabs: dict[str, Any]) -> str:
    """What each tab's API says about its job and the last of its debug log: a timeout here is otherwise
    silent about which side stalled."""
    out = []
    for name, pg in tabs.items():
        try:
            out.append(f"--- {name} tab: " + pg.evaluate(
                "() => { const a = " + API + "; const s = a.getState(); return JSON.stringify({"
                "job: s.job && {role: s.job.role, status: s.job.status, round: s.job.round,"
                " checkpoints: s.job.checkpoints.length}, peers: s.peers, diagnostics: s.diagnostics,"
                " events: a.getDebugLog().events.slice(-40).map((e) => [e.event, e.details])}); }"))
        except Exception as exc:  # a crashed page still lets the other tab speak
            out.append(f"--- {name} tab: unreadable ({exc})")
    return "\n".join(out)


@pytest.fixture
def served(site: Path) -> Iterator[str]:
    """A `weei serve` of its own (as `make serve` starts it); yields the invite link it prints."""
    server = start_server(site)
    try:
        yield _invite(server)
    finally:
        assert stop_server(server) == 0


def open_page(context: Any, url: str, errors: list[str]) -> Any:
    pg = context.new_page()
    pg.set_default_timeout(TIMEOUT_MS)
    pg.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
    pg.goto(url)
    return pg


def test_the_readme_flow_in_two_tabs_of_one_browser(served: str, browser: Any) -> None:
    context = browser.new_context()
    errors: list[str] = []
    try:
        first = open_page(context, served, errors)
        second = open_page(context, served, errors)
        follow_the_readme(first, second)
        hooks = "window.__weeiTestHooks.get('distributed-training')"
        slots = [pg.evaluate(f"{hooks}.status().slot") for pg in (first, second)]
        assert sorted(slots) == [0, 1], "each tab has its own storage namespace"
    finally:
        context.close()
    assert not errors, errors


def test_the_readme_flow_in_two_browsers_and_the_link_joins_with_no_typing(served: str, browser: Any,
                                                                           playwright: Any) -> None:
    other = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
    contexts = [browser.new_context(), other.new_context()]
    errors: list[str] = []
    try:
        first = open_page(contexts[0], served, errors)
        # The invite link in a fresh browser: the page joins the room by itself.
        second = open_page(contexts[1], served, errors)
        key = served.split("#room=", 1)[1]
        assert second.evaluate(f"{API}.getRoom().key") == key
        expect(second.locator("#room-key")).to_have_text(key, timeout=TIMEOUT_MS)
        follow_the_readme(first, second)
    finally:
        for context in contexts:
            context.close()
        other.close()
    assert not errors, errors


def test_the_landing_page_is_a_product_page_with_the_state_behind_a_developer_toggle(weei_server: Any,
                                                                                    page: Any) -> None:
    pg, log = page
    pg.goto(weei_server.url)
    expect(pg.get_by_role("heading", name="Weei", exact=True)).to_be_visible(timeout=TIMEOUT_MS)
    for text in ("Train a neural network together", "Digits MLP demo", "CartPole demo", "Transformer demo",
                 "Train together", "not in a room"):
        expect(pg.get_by_text(text).first).to_be_visible(timeout=TIMEOUT_MS)
    expect(pg.get_by_role("button", name="Open the Weei window")).to_be_enabled(timeout=TIMEOUT_MS)
    expect(pg.locator("#peer-id")).to_have_text(re.compile(r"^peer-[0-9a-f]{16}$"), timeout=TIMEOUT_MS)
    # The state dump and the debug button wait behind the developer toggle.
    expect(pg.locator("#state")).to_be_hidden()
    expect(pg.get_by_role("button", name="Train digits-mlp on one chunk in a Worker")).to_be_hidden()
    pg.get_by_text("Developer: the API's state").click()
    expect(pg.locator("#state")).to_be_visible(timeout=TIMEOUT_MS)
    expect(pg.locator("#state")).to_contain_text('"myPeerId"', timeout=TIMEOUT_MS)

    # Start a new room: the page reloads into it and shows its invite link. Once Weei has started: the page stays
    # responsive while its Python starts in the host worker, and a reload before would abort the worker's fetches.
    pg.wait_for_function("() => __weeiTestHooks.get('distributed-training').status().api === 'ready'")
    pg.get_by_role("link", name="Start a new room").click()
    pg.wait_for_url(re.compile(r"#room=[A-Za-z0-9_-]{22}$"))
    expect(pg.locator("#in-room")).to_be_visible(timeout=TIMEOUT_MS)
    key = pg.url.split("#room=", 1)[1]
    expect(pg.locator("#room-key")).to_have_text(key, timeout=TIMEOUT_MS)
    assert pg.locator("#invite-link").input_value() == pg.url
    # named by the signaling server
    expect(pg.locator("#peer-id")).to_have_text(re.compile(r"^[a-z2-7]{26}$"), timeout=TIMEOUT_MS)
    # The window's room bar says the same, with nobody else there yet.
    pg.get_by_role("button", name="Open the Weei window").click()
    assert pg.locator("input[name=inviteLink]").input_value() == pg.url
    expect(pg.get_by_text("No other browser in this room yet")).to_be_visible(timeout=TIMEOUT_MS)
    assert not log.errors, log.errors
