"""Who the other peers of the room are: their display names, agent markers and what each does.

Every peer sends its card (``Presence``, core/observe/peer_names.py) to each
peer whose channel opens, and to all of them again when its card changes
(after a drain: a job created, accepted, finished or left; a new name).
The cards of connected peers are kept, cleaned and bounded by the parser,
and dropped when a peer's channel closes. This device's own name is the
``profile`` setting (``setDisplayName``), or a default from its environment
("Chrome on Linux").
"""

from __future__ import annotations

from typing import Any, Mapping

from ..core.errors import UsageError, UsageReason
from ..core.observe.peer_names import PeerCard, clean_name, default_name, labels
from ..core.states import is_free
from ..core.wire.commands import Send
from ..core.wire.messages import Presence
from .job_store import JobStore
from .session import Session

__all__ = ["PeerCards", "PROFILE_KEY"]

PROFILE_KEY = "profile"
#: More cards than a room holds peers (signaling's max_peers_per_room is 64) are never kept.
_MAX_CARDS = 256


def _parse_profile(value: Any) -> str | None:
    return clean_name(value.get("displayName")) or None if isinstance(value, dict) else None


class PeerCards:
    """This device's card and the cards other peers sent."""

    def __init__(self, session: Session, store: JobStore, environment: Mapping[str, Any] | None) -> None:
        self.session = session
        self.store = store
        self.agent = bool(environment) and (environment or {}).get("browser") == "agent"
        self.default = default_name(environment)
        self.chosen: str | None = None
        self.cards: dict[str, PeerCard] = {}
        self._sent: PeerCard | None = None

    async def load(self) -> None:
        self.chosen = await self.store.read_setting(PROFILE_KEY, _parse_profile)

    @property
    def name(self) -> str:
        return self.chosen or self.default

    def mine(self) -> PeerCard:
        s = self.session
        coordinator, participant = s.coordinator, s.participant
        if coordinator is not None and coordinator.status != "completed":
            return PeerCard(self.name, self.agent, "coordinating", clean_name(coordinator.spec.info.raw.get("name")))
        if participant is not None and participant.job_id is not None and not is_free(participant.state):
            return PeerCard(self.name, self.agent, "training", clean_name((participant.model_info or {}).get("name")))
        return PeerCard(self.name, self.agent)

    async def set_name(self, raw: Any) -> None:
        """setDisplayName(name): cleaned (peer_names.clean_name); an empty name goes back to the default."""
        if not isinstance(raw, str):
            raise UsageError(UsageReason.INVALID_ARGUMENT, "the display name must be a string")
        name = clean_name(raw)
        self.chosen = name or None
        if name:
            await self.store.put_setting(PROFILE_KEY, {"displayName": name})
        else:
            await self.store.delete_setting(PROFILE_KEY)
        self.sync()

    def received(self, peer: str, message: Presence) -> None:
        if peer in self.cards or len(self.cards) < _MAX_CARDS:
            self.cards[peer] = message.card

    def connected(self, peer: str) -> None:
        self._send(peer, self.mine())

    def disconnected(self, peer: str) -> None:
        self.cards.pop(peer, None)

    def sync(self) -> None:
        """Tell every connected peer this device's card when it changed since the last time."""
        card = self.mine()
        if card == self._sent or self.session.transport is None:
            return
        self._sent = card
        for peer in self.session.transport.peers():
            self._send(peer, card)

    def _send(self, peer: str, card: PeerCard) -> None:
        if self.session.transport is not None and peer != self.session.my_peer_id:
            self.session.transport.send(Send(peer, Presence(card)), {})

    def state(self) -> dict[str, Any]:
        """``state.displayName`` and ``state.peerNames`` (peer ID -> card with its ``label``, this device's too)."""
        cards = {**self.cards, self.session.my_peer_id: self.mine()}
        shown = labels(cards)
        return {"displayName": self.name,
                "peerNames": {peer: {**card.to_json(), "label": shown[peer]} for peer, card in cards.items()}}
