"""The coordinator's secure aggregation of one round: the keys its participants send, the protocol among them,
and the unmasked mean as the round's record (docs/privacy.md, "In a job's rounds").

Theory of operation
-------------------
A round under ``privacy.secureAggregation`` (:class:`~weei.core.job.round.Round` holds one of these as
``secure``) trains as any other. A participant that trained sends its keys instead of its update:
:meth:`SecureAggregator.add_keys` checks them and keeps them with the attempt they end. When every attempt
has ended the coordinator calls :meth:`~SecureAggregator.start`: the protocol
(:class:`~weei.core.job.secure_round.SecureRound`) runs among those that sent keys, and each of its steps
(:meth:`~SecureAggregator.receive`, :meth:`~SecureAggregator.drop`, :meth:`~SecureAggregator.handle_timer`)
hands back the Sends to emit. Once it is :attr:`~SecureAggregator.done` the coordinator reads the conclusion
(``failure``, ``bad_peers``, ``contributors``, ``dropped()``) and, when the sum came, asks for the round's
:meth:`~SecureAggregator.record`.

The seam: this object owns the round's protocol state and answers with messages and a record; the coordinator
owns the job: it ends attempts, gives work back, excludes peers, closes the round and writes the log. Nothing
here touches the coordinator, its peers or its schedule.

Why a module of its own, not ``secure_round.py``: that module holds the protocol's per-round pieces both sides
use (the terms, the coordinator's ``SecureRound``, a participant's ``SecureContribution``), and ``round_rules``,
``round`` and ``participant`` import it. This driver sits above them (it builds a ``RoundRecord`` from the
round's attempts) and is the coordinator's alone, as ``round.py`` is; in ``secure_round.py`` it would make an
import cycle.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Collection, Iterable, Mapping

from ..aggregation.aggregate import DpRound
from ..privacy.dp_noise import DpReport, gaussians
from ..privacy.secagg import AdvertiseKeys, SecAggError, SecAggReason, check_keys
from ..privacy.x25519 import X25519
from ..wire.commands import Send
from ..wire.messages import Message, SecAggKeys
from .attempts import Attempt
from .round_rules import Kernel, RoundRecord
from .secure_round import SecureRound, SecureTerms

__all__ = ["SecureAggregator"]


class SecureAggregator:
    """One opening of a secure round at the coordinator: the keys (U1), the protocol, its record."""

    def __init__(self, job_id: str, round_: int, terms: SecureTerms, weight_count: int) -> None:
        self.job_id, self.round, self.terms, self.weight_count = job_id, round_, terms, weight_count
        #: The participants that trained and sent keys (U1), with the attempt their keys ended.
        self.keyed: dict[str, tuple[Attempt, AdvertiseKeys]] = {}
        self.protocol: SecureRound | None = None  # once the training phase closed
        self.started_at = 0.0  # the host's stopwatch when the protocol started

    # ------------------------------------------------------------- keys (training)

    def takes_keys(self, message: SecAggKeys) -> bool:
        """Whether ``message`` is of this round and opening and keys are still taken (the protocol has not started)."""
        return self.protocol is None and message.round == self.round and message.attempt == self.terms.opening

    def add_keys(self, peer: str, attempt: Attempt, keys: AdvertiseKeys, x25519: X25519) -> None:
        """``peer`` trained under ``attempt`` and holds its update: its keys put it in the protocol.

        Raises SecAggError (``secagg.check_keys``): they are not keys to agree with.
        """
        check_keys(peer, keys, x25519)
        self.keyed[peer] = (attempt, keys)

    def attempts_of(self, peers: Iterable[str]) -> list[Attempt]:
        """The attempts the keys of ``peers`` (keyed, in that order) ended."""
        return [self.keyed[p][0] for p in peers]

    # ------------------------------------------------------------- the protocol

    def start(self, now: float, gone: Collection[str], phase_timeout: float, x25519: X25519,
              stopwatch: Callable[[], float]) -> list[Send]:
        """Every attempt ended and some sent keys: the protocol runs among them. The roster goes out; ``gone``
        (keyed peers whose channel closed or that stopped) are dropped at once."""
        secure = self.protocol = SecureRound(self.job_id, self.round, self.terms, self.weight_count,
                                             {p: k for p, (_, k) in self.keyed.items()},
                                             now, phase_timeout, x25519)
        self.started_at = stopwatch()
        sends = secure.start(now)
        for peer in sorted(self.keyed):
            if peer in gone:
                sends += secure.drop(peer, now)
        return sends

    @property
    def running(self) -> bool:
        """The protocol started and has not concluded."""
        return self.protocol is not None and not self.protocol.done

    @property
    def done(self) -> bool:
        """The protocol concluded: with the sum, or with a ``failure``."""
        return self.protocol is not None and self.protocol.done

    @property
    def deadline(self) -> float | None:
        """When the protocol's current stage stops waiting (None: not running)."""
        return self.protocol.deadline if self.protocol is not None else None

    def receive(self, peer: str, message: Message, blobs: Mapping[str, bytes], now: float) -> list[Send]:
        """Raises SecAggError as ``SecureRound.receive``: the message is dropped, the protocol goes on."""
        assert self.protocol is not None, "a protocol message before the protocol started"
        return self.protocol.receive(peer, message, blobs, now)

    def drop(self, peer: str, now: float) -> list[Send]:
        assert self.protocol is not None
        return self.protocol.drop(peer, now)

    def handle_timer(self, now: float) -> list[Send]:
        assert self.protocol is not None
        return self.protocol.handle_timer(now)

    # ------------------------------------------------------------- its conclusion

    @property
    def failure(self) -> SecAggError | None:
        """Why the protocol failed (fewer than t left, a bad dealer), or None."""
        assert self.protocol is not None
        return self.protocol.server.failure

    @property
    def bad_peers(self) -> list[str]:
        """Peers that sent a share failing its commitment, sorted."""
        assert self.protocol is not None
        return sorted(self.protocol.server.bad_peers)

    @property
    def contributors(self) -> tuple[str, ...]:
        """U3: the peers whose masked vector is in the sum, in the protocol's order."""
        assert self.protocol is not None
        return self.protocol.server.contributors

    def dropped(self) -> list[str]:
        """Peers that sent keys but vanished before their masked vector came, sorted."""
        contributors = self.contributors
        return sorted(p for p in self.keyed if p not in contributors)

    def record(self, start: bytes, kernel: Kernel, dp: DpRound | None, *, digest: Callable[[bytes], str],
               assigned_count: Callable[[Attempt], int]) -> RoundRecord:
        """The round's record from the unmasked mean over ``start`` (the round's checkpoint): FedAvg's (the
        settings allow nothing else with secure aggregation), under DP with the noise of σ·C/n added to the
        mean here, at the coordinator, unless the participants added theirs (``noiseAt: "participants"``). ``digest`` names the new weights; ``assigned_count`` is an attempt's
        examples (or units).

        Raises SecAggError(SUM_OUT_OF_RANGE): as ``SecureRound.result``, or the noised weights are not finite.
        """
        assert self.protocol is not None
        weights, contributors = self.protocol.result(start)
        attempts = sorted(self.attempts_of(contributors), key=lambda a: a.assignment_id)
        report = None
        if dp is not None:
            std = dp.settings.noise_multiplier * dp.settings.clip / len(contributors)
            if dp.settings.participants_noise:
                std = self.protocol.noise_std(len(contributors))
            elif std > 0:
                noise = gaussians(dp.key, len(weights) // 4)
                weights = array("f", [v + std * z for v, z in zip(array("f", weights), noise, strict=True)]).tobytes()
                if kernel.first_non_finite(weights) >= 0:
                    raise SecAggError(SecAggReason.SUM_OUT_OF_RANGE, "the noised weights are not finite as float32")
            report = DpReport((), (), std)
        return RoundRecord(
            round=self.round, weights=weights, weights_sha256=digest(weights),
            aggregation_state=None, metrics={}, examples=sum(assigned_count(a) for a in attempts),
            contributors=sorted(contributors),
            trained_chunks=[a.chunk_id for a in attempts if a.chunk_id is not None], dp=report)
