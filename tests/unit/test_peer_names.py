"""Peers have names (issue 24, item 9): cleaned untrusted text, numbered repeats, cards between real
controllers on the in-memory network, the coordinator's name in its invitation, a name that persists."""

from __future__ import annotations

import asyncio

import pytest
from test_controller import DIGITS_SETTINGS, networked, package

from weei.core.errors import UsageError
from weei.core.observe.peer_names import MAX_NAME_CHARS, PeerCard, clean_name, default_name, labels
from weei.core.wire.messages import MessageError, Presence, decode_message
from weei.demo.network import MemoryNetwork
from weei.host.memory_storage import MemoryStorage
from weei.runtime.wasmtime_engine import WasmtimeEngine


@pytest.mark.parametrize("raw, clean", [
    ("Ana's laptop", "Ana's laptop"),
    ("  two   spaces\tand\nlines  ", "two spaces and lines"),
    ("evil\u202egpj.exe", "evilgpj.exe"),            # a bidirectional override is dropped, not shown
    ("zero\u200bwidth\u2028line", "zerowidth line"),
    ("<img src=x onerror=alert(1)>", "<img src=x onerror=alert(1)>"),  # text: the window never parses it
    ("\x00\x07\x1b[31m", "[31m"),
    ("\ue000\ue001", ""),                             # private use only: nothing printable
    (42, ""), (None, ""),
    ("x" * 10_000, "x" * MAX_NAME_CHARS),
])
def test_clean_name_keeps_printable_text_only(raw: object, clean: str) -> None:
    assert clean_name(raw) == clean


def test_default_names_and_numbered_repeats() -> None:
    assert default_name({"browser": "Chrome", "os": "Linux"}) == "Chrome on Linux"
    assert default_name({"browser": "agent", "os": "Linux-6.1.0-x86_64-with-glibc2.36"}) == "Weei agent on Linux"
    assert default_name({"browser": "unknown", "os": "unknown"}) == "A browser"
    assert default_name(None) == "A browser"
    cards = {"p3": PeerCard("Chrome on Linux"), "p1": PeerCard("chrome on linux"), "p2": PeerCard("Firefox")}
    # By peer ID, which every peer sees alike; the same name whatever its case.
    assert labels(cards) == {"p1": "chrome on linux", "p2": "Firefox", "p3": "Chrome on Linux #2"}


def test_presence_is_parsed_at_the_boundary() -> None:
    message = decode_message({"type": "presence", "card": {"name": "A\u202eB", "agent": "yes", "activity": "hacking",
                                                          "job": "x" * 100}})
    assert isinstance(message, Presence)
    assert message.card == PeerCard("AB", agent=False, activity="idle", job="x" * MAX_NAME_CHARS)
    for card in ({"name": "\u200b"}, {"name": "x" * 1000}, {}, {"name": "ok", "job": 3}):
        with pytest.raises(MessageError) as err:
            decode_message({"type": "presence", "card": card})
        assert err.value.reason == "bad-field"
    # An invitation's coordinator name is cleaned too; an older peer's invitation has none.
    invitation = {"type": "invitation", "jobId": "j", "coordinator": "c", "modelInfo": {}, "dataBytes": 1,
                  "module": {"sha256": "0" * 64, "bytes": 1}, "settings": {}}
    assert decode_message(invitation).coordinator_name is None  # type: ignore[union-attr]
    named = decode_message({**invitation, "coordinatorName": "Bob\x00\u202e"})
    assert named.coordinator_name == "Bob"  # type: ignore[union-attr]


def test_peers_know_each_others_names_states_and_invitations_carry_them() -> None:
    async def main() -> None:
        network, engine = MemoryNetwork(), WasmtimeEngine()
        storage = MemoryStorage()
        coordinator = networked(network, engine, "a-coord", environment={"browser": "Chrome", "os": "Linux"},
                                storage=storage)
        tab = networked(network, engine, "b-tab", environment={"browser": "Chrome", "os": "Linux"})
        agent = networked(network, engine, "c-agent", environment={"browser": "agent", "os": "Linux-6.1"})
        for c in (coordinator, tab, agent):
            await c.init()
        await network.settle()
        names = tab.get_state()["peerNames"]
        assert names["a-coord"] == {"name": "Chrome on Linux", "label": "Chrome on Linux", "agent": False,
                                    "activity": "idle", "job": ""}
        assert names["b-tab"]["label"] == "Chrome on Linux #2", "this tab too, numbered as the others see it"
        assert names["c-agent"]["agent"] is True and names["c-agent"]["name"] == "Weei agent on Linux"

        with pytest.raises(UsageError):
            await coordinator.set_display_name(3)  # type: ignore[arg-type]
        await coordinator.set_display_name("  Ana's\u202e laptop ")
        job_id = await coordinator.create_job(**package("digits-mlp"), settings={**DIGITS_SETTINGS, "epochs": 1})
        await network.settle()
        seen = agent.get_state()["peerNames"]["a-coord"]
        assert (seen["name"], seen["activity"], seen["job"]) == ("Ana's laptop", "coordinating", "Handwritten digits MLP (8x8)")
        assert tab.get_state()["peerNames"]["b-tab"]["label"] == "Chrome on Linux", "no repeat left"

        coordinator.invite("b-tab")
        await network.settle()
        [[jid, entry]] = tab.get_state()["invitations"]
        assert jid == job_id and entry["invitation"]["coordinatorName"] == "Ana's laptop"
        await tab.decide_invitation(job_id, True)
        await network.settle()
        assert coordinator.get_state()["peerNames"]["b-tab"]["activity"] == "training"

        await network.disconnect("c-agent")
        assert "c-agent" not in coordinator.get_state()["peerNames"]

        # The name is this device's setting: a controller on the same storage keeps it.
        again = networked(network, engine, "a-coord", storage=storage, environment={"browser": "Chrome", "os": "Linux"})
        await again.init()
        assert again.get_state()["displayName"] == "Ana's laptop"
        await again.set_display_name("   ")  # empty: back to the default
        assert again.get_state()["displayName"] == "Chrome on Linux"
        await network.close()

    asyncio.run(main())
