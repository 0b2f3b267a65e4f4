"""What other peers do to this device: their messages, their channels opening and closing, and this
device's answer to their invitations."""

from __future__ import annotations

import os
from typing import Any, Callable, Mapping

from ..core.commands import Send
from ..core.errors import UsageError, WeeiError
from ..core.messages import Direction, Invitation, Message, Progress, decode_message
from ..core.participant import Participant
from ..core.relay import RelayNode
from ..core.relay_messages import RelayPiece, RelayPlan
from ..core.room_proof import RoomChallenge, RoomProof, answer_challenge, proof_key
from .executor import Executor
from .job_store import PARTICIPATION_KEY, JobStore
from .room_check import RoomCheck
from .session import Session

__all__ = ["PeerEvents"]


class PeerEvents:
    """Turns peer events into calls on the state machines, then drains."""

    def __init__(self, session: Session, store: JobStore, executor: Executor, room_key: str | None = None,
                 random_bytes: Callable[[int], bytes] = os.urandom) -> None:
        self.session = session
        self.store = store
        self.executor = executor
        # What this device proves the room key with when it coordinates, and asks a coordinator to prove
        # before it accepts (core/room_proof.py): derived from the key, never the key itself.
        self._proof_key = proof_key(room_key) if room_key else None
        self.room_check = RoomCheck(self._proof_key, session.my_peer_id, self._send, session.record,
                                    random_bytes) if self._proof_key is not None else None

    async def receive(self, peer: str, message: Message, blobs: Mapping[str, bytes]) -> None:
        """A message from another peer, with its verified attachments."""
        s = self.session
        now = self.session.clock()
        for sha, data in blobs.items():
            self.store.remember(sha, data)
        if isinstance(message, Invitation):
            if s.coordinator is not None or (s.participant is not None and s.participant.state not in (
                    "declined", "stopped")):
                s.record("invitation.ignored", {"from": peer, "reason": "busy with another job"})
                return
            s.participant = Participant(s.my_peer_id)
            s.participant.receive(peer, message, now)
            s.invitations[message.job_id] = {"invitation": {
                "coordinator": message.coordinator, "modelInfo": message.model_info, "module": message.module,
                "dataBytes": message.data_bytes, "settings": message.settings}, "receivedAt": now}
        elif isinstance(message, (RelayPlan, RelayPiece)):
            self._relay(peer, message, blobs)
        elif isinstance(message, RoomChallenge):
            self._prove_room_key(peer, message)
        elif isinstance(message, RoomProof):
            if self.room_check is not None:
                self.room_check.received(peer, message)
            else:
                s.record("room.proof.ignored", {"from": peer, "jobId": message.job_id[:64], "reason": "no room"})
        elif s.coordinator is not None and peer != s.my_peer_id and message.DIRECTION is Direction.TO_COORDINATOR:
            s.coordinator.receive(peer, message, blobs, now)
        elif s.participant is not None:
            s.participant.receive(peer, message, now)
            if s.participant.state == "stopped":
                await self.store.delete_setting(PARTICIPATION_KEY)
        await self.executor.drain(quiet=isinstance(message, Progress))

    def _relay(self, peer: str, message: RelayPlan | RelayPiece, blobs: Mapping[str, bytes]) -> None:
        """A relayed checkpoint's plan or piece (core/relay.py): only for the job this device takes part in."""
        s = self.session
        p = s.participant
        if s.relay is None:
            s.relay = RelayNode(s.my_peer_id)
        if isinstance(message, RelayPlan):
            s.relay.plan(peer, message, job_id=p.job_id if p is not None else None,
                         coordinator=p.coordinator if p is not None else None)
        else:
            s.relay.piece(peer, message, blobs)
        for sha, data in s.relay.take_assembled().items():
            self.store.remember(sha, data)

    async def decide_invitation(self, job_id: str, accepted: bool, now: Callable[[], float]) -> None:
        """This device accepts or declines an invitation (the API's ``decideInvitation``).

        In a keyed room, accepting first asks the coordinator to prove the room key; one that does not
        is declined, and the refusal is raised (UsageError, reason ``room-proof-*``): no compute for it.
        """
        s = self.session
        participant = s.participant
        if job_id not in s.invitations or participant is None:
            raise UsageError("no-invitation", f"there is no pending invitation for job {job_id}")
        refusal = None
        if accepted and self.room_check is not None and participant.coordinator is not None:
            verdict = await self.room_check.prove(job_id, participant.coordinator)
            if s.participant is not participant or job_id not in s.invitations:  # withdrawn meanwhile
                raise UsageError("no-invitation", f"the invitation for job {job_id} is gone")
            if not verdict.proven:
                refusal = UsageError(str(verdict.reason), verdict.message)
                accepted = False
        invitation = participant.invitation
        participant.decide(accepted, now())
        del s.invitations[job_id]
        if accepted and invitation is not None:
            # Kept so a restarted agent or a reloaded page takes part again when the coordinator is back.
            await self.store.put_setting(PARTICIPATION_KEY, {"invitation": invitation.to_json(),
                                                             "from": participant.coordinator})
        await self.executor.drain()  # the decision must leave before a declined machine is dropped
        if not accepted:
            s.participant = None
            self.executor.view.notify()
        if refusal is not None:
            raise refusal

    def _send(self, send: Send) -> None:
        if self.session.transport is not None:
            self.session.transport.send(send, {})

    def _prove_room_key(self, peer: str, challenge: RoomChallenge) -> None:
        """A participant asks this coordinator to prove the room key for its job (no proof without a key)."""
        s = self.session
        if s.coordinator is None or s.coordinator.spec.job_id != challenge.job_id or peer not in s.coordinator.peers:
            s.record("room.challenge.ignored", {"from": peer, "jobId": challenge.job_id[:64],
                                                "reason": "not invited to a job this device coordinates"})
            return
        answer = answer_challenge(self._proof_key, coordinator=s.my_peer_id, participant=peer, challenge=challenge)
        s.record("room.challenge.answered", {"from": peer, "jobId": challenge.job_id,
                                             "proof": answer.proof is not None})
        self._send(Send(peer, answer))

    def rejoin(self, record: Any) -> None:
        s = self.session
        try:
            invitation = decode_message(record["invitation"])
            assert isinstance(invitation, Invitation)
            s.participant = Participant.rejoin(s.my_peer_id, record["from"], invitation)
        except (WeeiError, KeyError, TypeError, AssertionError) as exc:
            s.record("participation.unreadable", {"error": str(exc)[:200]})
            return
        s.record("participation.restored", {"jobId": invitation.job_id, "coordinator": record["from"]})

    async def peer_connected(self, peer: str) -> None:
        """A peer's channel opened (again): a returning participant catches up."""
        s = self.session
        if s.coordinator is not None:
            s.coordinator.peer_connected(peer, self.session.clock())
        if s.participant is not None and peer == s.participant.coordinator:
            s.participant.reconnected(self.session.clock())
            s.recorder.reconnected()
        await self.executor.drain()

    async def peer_disconnected(self, peer: str) -> None:
        s = self.session
        if s.coordinator is not None:
            s.coordinator.peer_disconnected(peer, self.session.clock())
            s.book.mark_disconnected(peer)
        if s.participant is not None and peer == s.participant.coordinator and peer != s.my_peer_id:
            # Our coordinator is gone (for now): on its return we are 'approved' again and
            # take the module it delivers, whatever state the job was in.
            s.participant.disconnected(self.session.clock())
        await self.executor.drain()

