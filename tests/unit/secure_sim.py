"""Securely aggregated jobs in ``Sim``: their spec, what a participant encodes, what a round must write.

Shared by the tests of a job's secure rounds (``test_secagg_rounds.py``) and of what its coordinator
sees (``test_secagg_transcript.py``).
"""

from __future__ import annotations

from array import array
from typing import Any, Callable

from sim import Sim, dataset_spec, default_outcome
from weei.core.job.participant import TrainOutcome
from weei.core.job.secure_round import SecureTerms
from weei.core.privacy import fixedpoint
from weei.core.privacy.secagg import weighted_vector
from weei.core.wire.messages import MAX_SECAGG_PEERS, Assign, Message

__all__ = ["BASE", "PEERS", "CLIP", "secure_spec", "encoding", "expected_round", "events", "lose"]

BASE: dict[str, Any] = {"epochs": 1, "localEpochs": 1, "batchSize": 4, "coordinatorParticipates": False}
PEERS = [f"p{i}" for i in range(1, 6)]
CLIP = 0.035  # the synthetic deltas are about 0.04 long: some are clipped, some not


def secure_spec(chunks: int = 10, clip: float = CLIP, *, spec: dict[str, Any] | None = None,
                **privacy: Any) -> tuple[Any, dict[str, bytes]]:
    """A dataset job under secure aggregation; ``spec``: more of ``dataset_spec``'s keywords."""
    settings = {**BASE, "privacy": {"secureAggregation": True, "clip": clip, **privacy}}
    return dataset_spec(chunks, settings=settings, **(spec or {}))


def encoding(assign: Assign, start: bytes, trained: bytes, count: int) -> list[int]:
    """What a participant masks for ``assign``, computed on its side: its delta clipped, times its weight, then
    the weight, in fixed point on the grid of the assignment's terms (each a ring element of Z_{2^64})."""
    terms = SecureTerms.from_settings(assign.settings)
    assert terms is not None
    weight = min(float(count), terms.max_weight) if terms.weighted else 1.0
    vector = weighted_vector([b - a for a, b in zip(array("f", start), array("f", trained))], weight, terms.clip)
    return fixedpoint.encode(vector, fixedpoint.frac_bits(terms.bound, MAX_SECAGG_PEERS), terms.bound)


def expected_round(sim: Sim, round_: int, contributors: list[str], clip: float = CLIP, weighted: bool = True,
                   outcome: Callable[[Assign, bytes], TrainOutcome] = default_outcome) -> bytes:
    """FedAvg of round ``round_``'s contributors as secure aggregation defines it, computed in the clear:
    each trained update's delta clipped, times its count, encoded on the round's grid, summed in the ring.
    ``outcome``: what each one trained (the ``Sim``'s default trainer unless a test trains otherwise)."""
    start = sim.checkpoint(round_ - 1).weights
    assigns = {peer: a for peer, a in sim.trained if a.round == round_}
    terms = SecureTerms.from_settings(next(iter(assigns.values())).settings)
    assert terms is not None and terms.clip == clip and terms.weighted == weighted
    total = [0] * (len(start) // 4 + 1)
    for peer in contributors:
        trained = outcome(assigns[peer], start)
        total = [(t + e) % fixedpoint.MODULUS
                 for t, e in zip(total, encoding(assigns[peer], start, trained.weights, trained.count))]
    decoded = fixedpoint.decode(total, fixedpoint.frac_bits(terms.bound, MAX_SECAGG_PEERS))
    return array("f", [a + v / decoded[-1] for a, v in zip(array("f", start), decoded[:-1])]).tobytes()


def events(sim: Sim, name: str) -> list[dict[str, Any]]:
    """The details of the coordinator's log entries named ``name``."""
    return [log.details for peer, log in sim.logs if peer == sim.coordinator.my_peer_id and log.event == name]


def lose(kind: type, peers: set[str], rounds: set[int] | None = None) -> Any:
    """Tamper hooks that lose the ``kind`` messages of ``peers`` (of ``rounds``; default every round)."""
    def hook(message: Message, blobs: dict[str, bytes]) -> list[tuple[Message, dict[str, bytes]]]:
        lost = isinstance(message, kind) and (rounds is None or getattr(message, "round", None) in rounds)
        return [] if lost else [(message, blobs)]
    return {peer: hook for peer in peers}
