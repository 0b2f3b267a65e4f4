"""What other peers do to this device: their messages, their channels opening and closing, and this
device's answer to their invitations.

An invitation is always either shown or answered: a device whose job is
finished (coordinated or taken part in) shows it, and accepting replaces the
finished job (it stays in Saved jobs); a device busy with a running job
declines it at once and says why; one nobody answers expires
(``INVITATION_TTL_MS``) and the inviter hears so.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, Awaitable, Callable, Mapping

from ..core.wire.commands import Send
from ..core.errors import UsageError, UsageReason
from ..core.wire.messages import (MAX_TEXT, Direction, Invitation, InvitationDecision, Message, Presence, Progress, RelayPiece,
                                  RelayPlan, RoomChallenge, RoomProof, SecAggMasked, SecAggReveal, SecAggRoster,
                                  SecAggShares, SecAggSharesFor, SecAggUnmask)
from ..core.job.participant import Participant
from ..core.links.relay import RelayNode
from ..core.job.restored_proof import Hold, RestoredProof
from ..core.job.invitations import INVITATION_TTL_MS
from ..core.links.room_proof import ProofVerdict, answer_challenge, proof_key
from ..core.states import JobStatus, PeerState, is_free
from .executor import Executor
from .peer_cards import PeerCards
from .job_store import PARTICIPATION_KEY, JobStore
from .room_check import RoomCheck, refusal_text
from .session import Session

__all__ = ["PeerEvents"]

#: What participants send the coordinator, and what it answers, between a secure round's keys and its close.
_SECAGG_STEPS = (SecAggShares, SecAggMasked, SecAggReveal)
_SECAGG_ANSWERS = (SecAggRoster, SecAggSharesFor, SecAggUnmask)


class PeerEvents:
    """Turns peer events into calls on the state machines, then drains."""

    def __init__(self, session: Session, store: JobStore, executor: Executor, room_key: str | None = None,
                 random_bytes: Callable[[int], bytes] = os.urandom) -> None:
        self.session = session
        self.store = store
        self.executor = executor
        # What this device proves the room key with when it coordinates, and asks a coordinator to prove
        # before it accepts (core/links/room_proof.py): derived from the key, never the key itself.
        self._proof_key = proof_key(room_key) if room_key else None
        self._random_bytes = random_bytes
        self.room_check: RoomCheck | None = None
        self.renamed()
        # A participation restored in a keyed room re-proves its coordinator (core/job/restored_proof.py):
        # the gate, the participant it was made for, and the challenge in flight.
        self._restored: tuple[RestoredProof, Participant] | None = None
        self._reproving: asyncio.Task[Any] | None = None
        #: Called with each message the gate held and its sender, before it is handled (the agent keeps its
        #: files on disk).
        self.on_release: Callable[[str, Message, Mapping[str, bytes]], Awaitable[None]] | None = None
        #: Puts this device's finished job away (it stays in Saved jobs) before an accepted invitation replaces it.
        self.replace_finished: Callable[[], Awaitable[None]] | None = None
        executor.holds_back = self._holds_outgoing
        self.cards: PeerCards | None = None  # who the other peers say they are (the controller sets it)

    def renamed(self) -> None:
        """This device's peer ID is ``session.my_peer_id`` (again): proofs name it."""
        s, old = self.session, self.room_check
        self.room_check = RoomCheck(self._proof_key, s.my_peer_id, self._send, s.record, self._random_bytes,
                                    monotonic=s.monotonic) if self._proof_key is not None else None
        if old is not None and self.room_check is not None:  # whoever listens to proofs goes on listening
            self.room_check.listeners.extend(old.listeners)

    def _gate(self) -> RestoredProof | None:
        """The open gate of the current participation, if it was restored in a keyed room."""
        if self._restored is None:
            return None
        gate, participant = self._restored
        if gate.closed or self.session.participant is not participant:  # released, refused, or left
            self._restored = None
            return None
        return gate

    def _holds_outgoing(self, send: Send) -> bool:
        gate = self._gate()
        return gate is not None and gate.hold_outgoing(send)

    def holds_back(self, peer: str) -> bool:
        """Whether a message from ``peer`` now waits for (or is dropped by) the restored participation's gate."""
        gate = self._gate()
        return gate is not None and peer == gate.coordinator

    async def on_peer_message(self, peer: str, message: Message, blobs: Mapping[str, bytes]) -> None:
        """A message from another peer, with its verified attachments."""
        gate = self._gate()
        if gate is not None:
            held = gate.hold(peer, message, blobs)
            reason = gate.last_dropped or ""
            if held is Hold.DROPPED and gate.dropped.get(reason) == 1:  # the first of each reason is logged
                self.session.record("room.proof.dropped", {"from": peer, "type": message.TYPE, "reason": reason})
            if held is not Hold.PASS:
                return  # not read, not stored: the coordinator has not proved the room key yet
        await self._handle(peer, message, blobs)

    async def _handle(self, peer: str, message: Message, blobs: Mapping[str, bytes]) -> None:
        s = self.session
        now = self.session.clock()
        for sha in self.store.remember(blobs):
            s.record("artifact.refused", {"from": peer, "sha256": sha, "reason": "hash-mismatch"})
        self.expire_invitations()
        quiet = isinstance(message, Progress)
        if isinstance(message, Invitation) and s.participant is not None and peer == s.participant.coordinator \
                and message.job_id == s.participant.job_id and s.participant.state is PeerState.APPROVED:
            s.participant.on_message(peer, message, now)  # asked again: it answers again (core/job/participant.py)
        elif isinstance(message, Invitation):
            busy = self._busy()
            if busy is not None:
                # Declined at once, with the reason: the inviter's window says it and may invite again later.
                self.executor.send(Send(peer, InvitationDecision(message.job_id, False, busy)))
                s.record("invitation.declined", {"from": peer, "jobId": message.job_id[:64], "reason": busy})
                await self.executor.drain()
                return
            # Kept in a bounded list, one per coordinator; one naming another coordinator is refused.
            for note in s.invitations.offer(peer, message, now):
                s.record(note.pop("event"), note)
        elif isinstance(message, (RelayPlan, RelayPiece)):
            self._relay(peer, message, blobs)
        elif isinstance(message, Presence):
            if self.cards is not None:
                self.cards.received(peer, message)
        elif isinstance(message, RoomChallenge):
            self._prove_room_key(peer, message)
        elif isinstance(message, RoomProof):
            if self.room_check is not None:
                self.room_check.received(peer, message)
            else:
                s.record("room.proof.ignored", {"from": peer, "jobId": message.job_id[:64], "reason": "no room"})
        elif s.coordinator is not None and peer != s.my_peer_id and message.DIRECTION is Direction.TO_COORDINATOR:
            s.coordinator.receive(peer, message, blobs, now)
            # A step of secure aggregation changes nothing the window shows until its round closes (a checkpoint,
            # or a failure): like a progress report, it need not build a state for every subscriber at once.
            quiet = quiet or (isinstance(message, _SECAGG_STEPS) and s.coordinator.securing)
        elif s.participant is not None:
            error = s.participant.last_error
            s.participant.on_message(peer, message, now)
            if s.participant.state is PeerState.STOPPED:
                await self.store.delete_setting(PARTICIPATION_KEY)
            quiet = quiet or (isinstance(message, _SECAGG_ANSWERS) and s.participant.last_error == error)
        await self.executor.drain(quiet=quiet)

    def _relay(self, peer: str, message: RelayPlan | RelayPiece, blobs: Mapping[str, bytes]) -> None:
        """A relayed checkpoint's plan or piece (core/links/relay.py): only for the job this device takes part in.
        What the node assembles is stored under the hash of its bytes, which it checked against the plan."""
        s = self.session
        p = s.participant
        if s.relay is None:
            s.relay = RelayNode(s.my_peer_id)
        if isinstance(message, RelayPlan):
            s.relay.plan(peer, message, job_id=p.job_id if p is not None else None,
                         coordinator=p.coordinator if p is not None else None)
        else:
            s.relay.piece(peer, message, blobs)
        self.store.remember(s.relay.take_assembled())

    async def decide_invitation(self, job_id: str, accepted: bool, now: Callable[[], float],
                                reason: str | None = None) -> None:
        """This device accepts or declines an invitation (the API's ``decideInvitation``); a decline carries
        ``reason`` (the agent's policy says which rule refused), which the coordinator's window shows.

        In a keyed room, accepting first asks the coordinator to prove the room key; one that does not
        is declined, and the refusal is raised (UsageError, reason ``room-proof-*``): no compute for it.
        """
        s = self.session
        self.expire_invitations()
        pending = s.invitations.get(job_id)
        if pending is None:
            raise UsageError(UsageReason.NO_INVITATION, f"there is no pending invitation for job {job_id} "
                                                        "(it may have expired)")
        self._check_free(accepted)
        refusal = None
        if accepted and self.room_check is not None:
            verdict = await self.room_check.prove(job_id, pending.sender)
            if s.invitations.get(job_id) is not pending:  # withdrawn or replaced meanwhile
                raise UsageError(UsageReason.NO_INVITATION, f"the invitation for job {job_id} is gone")
            self._check_free(accepted)
            if not verdict.proven:
                refusal = UsageError(UsageReason(str(verdict.reason)), refusal_text(verdict))
                s.error = refusal.message  # the window's banner says it after the invitation's card is gone
                accepted = False
        s.invitations.take(job_id)
        if accepted:
            if s.finished_job() is not None and self.replace_finished is not None:
                await self.replace_finished()
            participant = Participant(s.my_peer_id)
            participant.on_message(pending.sender, pending.invitation, now())
            participant.decide(True, now())
            s.participant = participant
            # This device takes part in one job: its coordinator hears yes, every other one hears no.
            for other in s.invitations.clear():
                self.executor.send(Send(other.sender, InvitationDecision(other.invitation.job_id, False,
                                                                         "it accepted another job")))
                s.record("invitation.dropped", {"jobId": other.invitation.job_id, "from": other.sender,
                                                "reason": "accepted-another"})
            # Kept so a restarted agent or a reloaded page takes part again when the coordinator is back.
            await self.store.put_setting(PARTICIPATION_KEY, {"invitation": pending.invitation.to_json(),
                                                             "from": pending.sender})
        else:
            why = refusal.message if refusal is not None else reason
            self.executor.send(Send(pending.sender, InvitationDecision(job_id, False,
                                                                     None if not why else why[:MAX_TEXT])))
        await self.executor.drain()
        self.executor.view.notify()
        if refusal is not None:
            raise refusal

    def _busy(self) -> str | None:
        """Why no invitation is shown or accepted now: this device coordinates a job that is not finished, or
        takes part in one. None when it is free (a finished job does not count: accepting replaces it)."""
        s = self.session
        if s.coordinator is not None and s.coordinator.status is not JobStatus.COMPLETED:
            return f"busy: it coordinates job {s.coordinator.spec.job_id}, {s.coordinator.status}"
        if s.participant is not None and not is_free(s.participant.state):
            return f"busy: it takes part in job {s.participant.job_id}"
        return None

    def _check_free(self, accepting: bool) -> None:
        if accepting and self._busy() is not None:
            raise UsageError(UsageReason.JOB_ACTIVE, "leave the current job before accepting another")

    def expire_invitations(self) -> None:
        """Forget the invitations nobody answered in ``INVITATION_TTL_MS``, and tell their coordinators."""
        s = self.session
        for stale in s.invitations.expire(s.clock()):
            reason = f"no answer in {INVITATION_TTL_MS // 60_000} min: the invitation expired"
            self.executor.send(Send(stale.sender, InvitationDecision(stale.invitation.job_id, False, reason)))
            s.record("invitation.expired", {"jobId": stale.invitation.job_id, "from": stale.sender})

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

    def rejoin(self, coordinator: str, invitation: Invitation) -> None:
        """Take part again in the job a saved participation (``stored.parse_participation``) names."""
        s = self.session
        s.participant = Participant.rejoin(s.my_peer_id, coordinator, invitation)
        # In a keyed room the coordinator proves the key again once its channel opens; a keyless room has
        # no key to prove, as at a first acceptance.
        if self.room_check is not None:
            self._restored = (RestoredProof(invitation.job_id, coordinator), s.participant)
        s.record("participation.restored", {"jobId": invitation.job_id, "coordinator": coordinator,
                                            "proof": self.room_check is not None})

    async def peer_connected(self, peer: str) -> None:
        """A peer's channel opened (again): a returning participant catches up."""
        s = self.session
        if self.cards is not None:
            self.cards.connected(peer)
        if s.coordinator is not None:
            s.coordinator.peer_connected(peer, self.session.clock())
        if s.participant is not None and peer == s.participant.coordinator:
            gate = self._gate()
            if gate is not None and gate.connected():
                self._challenge(gate, s.participant)  # it catches up once the proof is in
            else:
                s.participant.reconnected(self.session.clock())
                s.recorder.reconnected()
        await self.executor.drain()

    def _challenge(self, gate: RestoredProof, participant: Participant) -> None:
        if self._reproving is not None:
            self._reproving.cancel()  # a challenge made on an older channel decides nothing
        self._reproving = self.executor.spawn(self._reprove(gate, participant))

    async def _reprove(self, gate: RestoredProof, participant: Participant) -> None:
        """The restored participation's coordinator proves the room key: then what it sent is handed on,
        in order; else the participation ends with the named reason."""
        s = self.session
        assert self.room_check is not None
        try:
            verdict = await self.room_check.prove(gate.job_id, gate.coordinator)
        except asyncio.CancelledError:  # the channel closed or opened again: its own challenge follows
            return
        if self._gate() is not gate or not gate.decide(verdict):
            return
        if not verdict.proven:
            await self._end_refused(verdict)
            return
        for send in gate.take_outgoing():
            self.executor.send(send)
        participant.reconnected(s.clock())
        s.recorder.reconnected()
        await self.executor.drain()
        while s.participant is participant and (item := gate.take_held()) is not None:
            message, blobs = item
            if self.on_release is not None:
                await self.on_release(gate.coordinator, message, blobs)
            await self._handle(gate.coordinator, message, blobs)

    async def _end_refused(self, verdict: ProofVerdict) -> None:
        """The participation ends here: the saved participation goes, every saved job and file stays."""
        s = self.session
        s.participant = None
        self._restored = None
        s.error = refusal_text(verdict, restored=True)
        s.record("participation.refused", {"jobId": verdict.job_id, "coordinator": verdict.coordinator,
                                           "reason": str(verdict.reason)})
        await self.store.delete_setting(PARTICIPATION_KEY)
        self.executor.view.notify()

    async def transfer_failed(self, peer: str, reason: str, artifact: str = "") -> None:
        """The frame reader refused an artifact from ``peer``: a relay that sent it a bad piece is reported to
        the coordinator now (its children go direct), not when the relay's deadline passes; a message of our
        coordinator that named an artifact we lack (``missing-attachment``) makes us ask for it."""
        s = self.session
        if s.relay is not None:
            s.relay.transfer_failed(peer, reason)
        if reason == "missing-attachment" and artifact and s.participant is not None:
            s.participant.artifact_missing(peer, artifact, s.clock())
        await self.executor.drain()

    async def peer_disconnected(self, peer: str) -> None:
        s = self.session
        if self.cards is not None:
            self.cards.disconnected(peer)
        if s.coordinator is not None:
            s.coordinator.peer_disconnected(peer, self.session.clock())
            s.book.mark_disconnected(peer)
        gate = self._gate()
        if gate is not None and peer == gate.coordinator:
            gate.disconnected()  # no proof came on this channel: the next one is challenged afresh
            if self._reproving is not None and gate.deciding:
                self._reproving.cancel()
        if s.participant is not None and peer == s.participant.coordinator and peer != s.my_peer_id:
            # Our coordinator is gone (for now): on its return we are 'approved' again and
            # take the module it delivers, whatever state the job was in.
            s.participant.disconnected(self.session.clock())
            if gate is None and self.room_check is not None and s.participant.state is PeerState.DISCONNECTED:
                # Whoever comes back under its peer ID proves the room key again, as after a restart.
                self._restored = (RestoredProof(s.participant.job_id, peer), s.participant)
        await self.executor.drain()

