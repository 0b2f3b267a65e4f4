"""The agent asks a coordinator to prove the room key (core/room_proof.py on asyncio).

``--trust-room`` accepts a coordinator because it is in the agent's room;
before the agent gives it compute, the coordinator must show it holds the
room key itself (docs/agent.md, "The coordinator proves the room key").
Every challenge and verdict goes to the debug log; the decision is the
agent's (``main.py``), this only answers "proven or not, and why".
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any, Callable, Mapping

from ..core.commands import Send
from ..core.room_proof import (NONCE_BYTES, PROOF_TIMEOUT_MS, CoordinatorProofs, ProofIgnored, ProofVerdict,
                               RoomProof, proof_key)

__all__ = ["RoomCheck"]


class RoomCheck:
    """``await prove(job_id, coordinator)`` sends a challenge and returns its verdict; ``received`` takes
    the RoomProof messages that arrive meanwhile."""

    def __init__(self, room_key: str, me: str, send: Callable[[Send], None],
                 record: Callable[[str, Mapping[str, Any]], None], *, timeout_ms: float = PROOF_TIMEOUT_MS,
                 monotonic: Callable[[], float] = lambda: time.monotonic() * 1000.0,
                 random_bytes: Callable[[int], bytes] = os.urandom) -> None:
        self.proofs = CoordinatorProofs(proof_key(room_key), me, timeout_ms=timeout_ms)
        self._send = send
        self._record = record
        self._monotonic = monotonic
        self._random_bytes = random_bytes
        self._waiting: dict[str, asyncio.Future[ProofVerdict]] = {}

    async def prove(self, job_id: str, coordinator: str) -> ProofVerdict:
        """Challenge ``coordinator`` for ``job_id`` and wait for the verdict (at most the proof timeout)."""
        previous = self._waiting.pop(job_id, None)
        if previous is not None:
            previous.cancel()  # a newer invitation of the job asks again, with a new nonce
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
        outcome = self.proofs.receive(sender, message, self._monotonic())
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
        future = self._waiting.pop(verdict.job_id, None)
        if future is not None and not future.done():
            future.set_result(verdict)
