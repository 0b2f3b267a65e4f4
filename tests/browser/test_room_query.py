"""A room key in the query (``?room=KEY``, the older link form) moves into the fragment before anything
else the page does, and `weei serve` writes it nowhere (issue 9 §3; docs/signaling.md "Rooms and keys")."""

from __future__ import annotations

import re
import secrets
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from site_helpers import start_server, stop_server
from test_api import ready


def test_a_query_room_key_moves_into_the_fragment_and_reaches_no_log(site: Path, browser: Any) -> None:
    server = start_server(site)
    key = secrets.token_urlsafe(16)
    other = secrets.token_urlsafe(16)
    context = browser.new_context()
    try:
        requests: list[tuple[str, str]] = []
        context.on("request", lambda r: requests.append((r.url, r.headers.get("referer", ""))))
        pg = context.new_page()
        ready(pg, f"{server.url}?x=1&room={key}")
        # The page joined the keyed room (a signaling peer ID) with the key it now holds in the fragment.
        assert re.fullmatch(r"[a-z2-7]{26}", pg.evaluate("T.api().getState().myPeerId"))
        assert pg.url == f"{server.url}?x=1#room={key}"
        assert pg.evaluate("[location.search, location.hash]") == ["?x=1", f"#room={key}"]
        assert pg.evaluate("T.api().getRoom()") == {"key": key, "invite": f"{server.url}?x=1#room={key}"}
        # Only the page request itself and weei.js (asked for before any script ran) carried the key;
        # everything the page fetched afterwards (Pyodide, the Python package, Workers) did not, in its
        # URL or its Referer.
        carried = {urlsplit(url).path for url, referer in requests if key in url or key in referer}
        assert carried <= {"/", "/weei.js"}, carried
        assert len(requests) > 5 and [u for u, _ in requests if "pyodide" in u or u.endswith(".whl")], requests

        # A key already in the fragment is the one used; the query's is dropped all the same.
        second = context.new_page()
        second.goto(f"{server.url}?room={other}#room={key}")
        second.wait_for_function("() => window.weeiReady !== undefined")
        assert second.url == f"{server.url}#room={key}"
        assert second.evaluate("weei.widgetsApi.get('distributed-training').getRoom().key") == key
    finally:
        context.close()
        assert stop_server(server) == 0
    # weei serve logs no request lines: neither key is in anything it wrote.
    output = "".join(server.lines)
    assert key not in output and other not in output, output
