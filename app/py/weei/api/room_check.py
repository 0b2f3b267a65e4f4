"""A participant in a keyed room asks the coordinator to prove the room key (core/links/room_proof.py on asyncio).

Accepting an invitation gives a coordinator this device's compute; in a
room, every member entered with the room key, but only the signaling
server checked it. ``decide_invitation(job, True)`` therefore first asks
the coordinator itself (docs/agent.md, "The coordinator proves the room
key"). Every challenge and verdict goes to the debug log and to the
``listeners`` (the agent prints them); the decision is the controller's.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Mapping

from ..core.wire.commands import Send
from ..core.links.room_proof import NONCE_BYTES, PROOF_TIMEOUT_MS, CoordinatorProofs, ProofIgnored, ProofVerdict

__all__ = ["RoomCheck", "refusal_text"]


def refusal_text(verdict: ProofVerdict, *, restored: bool = False) -> str:
    """What the person reads (the window's error banner, the agent's output) when a coordinator is refused."""
    outcome = "this device no longer takes part in it" if restored else "the invitation was declined"
    return (f"Job {verdict.job_id}: the coordinator could not prove it knows this room's key, so {outcome} "
            f"({verdict.reason}: {verdict.message}). Ask them for a fresh invite link.")


class RoomCheck:
    """``await prove(job_id, coordinator)`` sends a challenge and returns its verdict; ``received`` takes
    the RoomProof messages that arrive meanwhile. ``key`` is ``proof_key(room key)``."""

    def __init__(self, key: bytes, me: str, send: Callable[[Send], None],
                 record: Callable[[str, Mapping[str, Any]], None], random_bytes: Callable[[int], bytes], *,
                 timeout_ms: float = PROOF_TIMEOUT_MS,
                 monotonic: Callable[[], float] = lambda: time.monotonic() * 1000.0) -> None:
        self.proofs = CoordinatorProofs(key, me, timeout_ms=timeout_ms)
        self.listeners: list[Callable[[ProofVerdict], None]] = []
        self._send = send
        self._record = record
        self._monotonic = monotonic
        self._random_bytes = random_bytes
        self._waiting: dict[str, asyncio.Future[ProofVerdict]] = {}

    async def prove(self, job_id: str, coordinator: str) -> ProofVerdict:
        """Challenge ``coordinator`` for ``job_id`` and wait for the verdict (at most the proof timeout)."""
        previous = self._waiting.pop(job_id, None)
        if previous is not None:
            previous.cancel()  # a newer decision on the job asks again, with a new nonce
        future: asyncio.Future[ProofVerdict] = asyncio.get_running_loop().create_future()
        self._waiting[job_id] = future
        self._send(self.proofs.challenge(job_id, coordinator, self._random_bytes(NONCE_BYTES), self._monotonic()))
        self._record("room.proof.asked", {"jobId": job_id, "coordinator": coordinator})
        while not future.done():
            deadline = self.proofs.deadline(job_id)
            wait_s = max(0.0, ((deadline or 0.0) - self._monotonic()) / 1000.0) + 0.05
            await asyncio.wait({future}, timeout=wait_s)
            if not future.done():
                for verdict in self.proofs.expire(self._monotonic()):
                    self._settle(verdict)
        return future.result()

    def received(self, sender: str, message: RoomProof) -> None:
        """A RoomProof from peer ``sender``."""
        outcome = self.proofs.on_proof(sender, message, self._monotonic())
        if isinstance(outcome, ProofIgnored):
            self._record("room.proof.ignored", {"from": sender, "jobId": message.job_id[:64],
                                                "reason": str(outcome.reason)})
            return
        self._settle(outcome)

    def _settle(self, verdict: ProofVerdict) -> None:
        event = "room.proof.accepted" if verdict.proven else "room.proof.refused"
        details = {"jobId": verdict.job_id, "coordinator": verdict.coordinator, "message": verdict.message}
        if verdict.reason is not None:
            details["reason"] = str(verdict.reason)
        self._record(event, details)
        for listener in list(self.listeners):
            listener(verdict)
        future = self._waiting.pop(verdict.job_id, None)
        if future is not None and not future.done():
            future.set_result(verdict)
