"""A coordinator that cannot prove the room key is refused, and the window says why until the person
dismisses it (issue 9, "rooms with keys"; docs/agent.md "The coordinator proves the room key").

The coordinator is an aiortc peer in this process (``AgentTransport``): it joined the room with its key,
as the signaling server requires, but holds none to prove, as a peer the server wrongly let in would. It
invites the page and answers the page's challenge without a proof.
"""

from __future__ import annotations

import uuid
from typing import Any, Mapping

import pytest

from aiortc_peer import ThreadedPeer
from test_resilience import signal_url
from test_widget import API, open_widget

JOB = "job-unproven-coordinator"
BANNER = ".error[role=alert]:not(.hidden)"


class ProoflessCoordinator(ThreadedPeer):
    """Invites every peer whose channel opens, answers every room challenge with no proof."""

    def __init__(self, server: str, room: str) -> None:
        self.challenges: list[str] = []
        self.decisions: list[bool] = []
        super().__init__(server, room)

    # The Receiver of AgentTransport.
    async def peer_connected(self, peer: str) -> None:
        from weei.core.wire.commands import Send
        from weei.core.wire.messages import Invitation

        invitation = Invitation(JOB, self.peer_id or "", {"id": "digits-mlp", "name": "Digits MLP", "version": "1"},
                                {"fileName": "model.wasm", "bytes": 4096, "sha256": "ab" * 32}, 1000, {"epochs": 1})
        self.transport.send(Send(peer, invitation), {})

    async def on_peer_message(self, peer: str, message: Any, blobs: Mapping[str, bytes]) -> None:
        from weei.core.wire.commands import Send
        from weei.core.wire.messages import InvitationDecision
        from weei.core.wire.messages import RoomChallenge, RoomProof

        if isinstance(message, RoomChallenge):
            self.challenges.append(message.job_id)
            self.transport.send(Send(peer, RoomProof(message.job_id)), {})  # no key, no proof
        elif isinstance(message, InvitationDecision):
            self.decisions.append(message.accepted)


def test_a_refused_room_proof_stays_in_the_window_until_dismissed(weei_server: Any, page: Any) -> None:
    pytest.importorskip("aiortc")
    pg, log = page
    room = "refusal-" + uuid.uuid4().hex[:8]
    coordinator = ProoflessCoordinator(signal_url(weei_server.url), room)
    try:
        assert coordinator.joined.wait(60) and coordinator.error is None, repr(coordinator.error)
        pg.set_viewport_size({"width": 1280, "height": 900})
        open_widget(pg, f"{weei_server.url}#room={room}")
        accept = pg.locator(".card.invitation").get_by_role("button", name="Accept")
        accept.wait_for(timeout=180_000)  # the page started, joined the room and got the invitation
        accept.click()
        banner = pg.locator(BANNER)
        banner.wait_for(timeout=90_000)
        text = banner.inner_text()
        assert "could not prove it knows this room's key" in text and "room-proof-missing" in text, text
        assert "Ask them for a fresh invite link" in text, text
        assert coordinator.challenges == [JOB] and coordinator.decisions == [False]
        assert "fresh invite link" in pg.evaluate(f"Promise.resolve({API}.getState()).then((s) => s.error)")
        # The invitation's card is gone (declined); the banner is not: renders that follow keep it.
        assert pg.locator(".card.invitation").count() == 0
        pg.wait_for_timeout(2500)  # the window re-reads the state every 2 s
        assert banner.is_visible() and "fresh invite link" in banner.inner_text()
        assert pg.locator(".error[role=alert]:not(.hidden)").count() == 1  # one error surface, said once
        # Dismissed, it stays away although the state still says it.
        banner.get_by_role("button", name="Dismiss").click()
        pg.wait_for_function("""() => [...document.querySelector('[data-weei-widget]').shadowRoot
            .querySelectorAll('.error[role=alert]')].every((e) => e.classList.contains('hidden'))""")
        pg.wait_for_timeout(2500)
        assert pg.locator(BANNER).count() == 0
        assert "fresh invite link" in pg.evaluate(f"Promise.resolve({API}.getState()).then((s) => s.error)")
        assert not log.errors, log.errors
    finally:
        coordinator.close()
