"""`weei serve` hands out an invite link; two pages opened from it meet in its
room, the key never leaves the pages in a URL or a Referer, and the window
shows the link (issue 9 §3)."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from site_helpers import start_server, stop_server
from test_api import ready


def _invite(server: Any) -> str:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        for line in list(server.lines):
            found = re.search(r"Invite link of a new room \(open it, share it\): (\S+)", line)
            if found:
                return found.group(1)
        time.sleep(0.1)
    raise AssertionError("no invite link in:\n" + "".join(server.lines))


def test_invite_link_puts_pages_in_a_keyed_room_and_the_key_stays_in_the_page(site: Path, browser: Any) -> None:
    server = start_server(site)
    contexts = [browser.new_context(), browser.new_context()]  # two profiles: one controller each
    try:
        link = _invite(server)
        assert link.startswith(server.url + "#room=")
        key = link.split("#room=", 1)[1]
        assert len(key) == 22
        requests: list[tuple[str, str]] = []
        for context in contexts:
            context.on("request", lambda r: requests.append((r.url, r.headers.get("referer", ""))))
        first, second = contexts[0].new_page(), contexts[1].new_page()
        for pg in (first, second):
            ready(pg, link)
        ids = [pg.evaluate("T.api().getState().myPeerId") for pg in (first, second)]
        assert all(re.fullmatch(r"[a-z2-7]{26}", i) for i in ids), ids  # peer IDs from the signaling server
        first.evaluate("(id) => T.waitFor('the other page connected', () => T.api().getState().peers.includes(id))",
                       ids[1])
        assert first.evaluate("T.api().getRoom()") == {"key": key, "invite": link}
        # the window shows the invite link with a Copy button
        first.evaluate("T.api().enable()")
        assert first.locator("input[name=inviteLink]").input_value() == link
        assert first.locator("button[name=copyInvite]").is_visible()
        assert requests and not [r for r in requests if key in r[0] or key in r[1]]
    finally:
        for context in contexts:
            context.close()
        assert stop_server(server) == 0
