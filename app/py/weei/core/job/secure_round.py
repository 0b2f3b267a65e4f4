"""Secure aggregation in a job's rounds: the coordinator's side (:class:`SecureRound`) and a participant's
(:class:`SecureContribution`), over the wire messages of docs/wire.md ("Secure aggregation").

Theory of operation
-------------------
With ``privacy.secureAggregation`` a round trains as any other, but no
update leaves a participant in the clear. Each Assign carries the round's
terms (:class:`SecureTerms`, ``settings.secureAggregation``: the clip, the
largest weight a contribution carries, the threshold and which opening of
the round this is). A participant that has trained makes the vector it
will mask, its delta from the round's checkpoint clipped to the clip norm
and times its weight, then the weight (``secagg.weighted_vector``), and
sends its two public keys (``secaggKeys``): that ends its attempt, as an
update would. Once every attempt has ended, the coordinator runs the
protocol of ``weei.core.privacy.secagg`` among those that sent keys (U1):
roster, sealed shares, masked vectors (``secaggMasked``, the ring elements
beside the message), unmasking with the survivors' shares. Out comes the
exact ring sum of the survivors' encoded vectors; :meth:`SecureRound.result`
decodes it into the weighted mean delta and the new float32 weights, and
checks it: its total weight within what the contributors could send, its
norm within the clip (each contribution's is), every weight finite.

Every peer sizes the fixed-point grid for MAX_SECAGG_PEERS contributions of
magnitude ``max(clip, 1) * maxWeight``, from the terms alone, so the grid
does not depend on who shows up. Under ``privacy.dp`` each contribution
weighs 1 (DP-FedAvg's unweighted mean) and the noise is added either by the
coordinator to the unmasked mean (``noiseAt: "coordinator"``) or, with
``noiseAt: "participants"``, by each participant to its clipped delta before
masking (distributed noise, below). The round's tag binds the protocol's commitments and
masks to the job, the round and the opening: a retried round masks with
fresh keys under a new tag. Training metrics are not sent (they depend on
each participant's data, as the update does); the total example count is
the only figure of a round besides the sum.

Distributed noise
-----------------
With ``noiseAt: "participants"`` the terms carry σ (``noiseMultiplier``).
Once the roster arrives a participant knows the round's threshold t (the
least number of survivors the round completes with, at least 2) and adds
to every weight of its clipped delta N(0, (σ·C/√t)²), drawn with
``dp_noise.gaussians`` from ``noise_key(seed, job id, round)``, ``seed`` 32
fresh bytes of its own random source, never sent and dropped once drawn.
The k >= t survivors' sum then carries N(0, k·σ²C²/t) >= N(0, σ²C²) per
weight, what the accountant assumes; the coordinator adds none. Each noise
term is at most ``dp_noise.GAUSSIAN_BOUND``·σC/√2 (t >= 2), so the grid is
sized for ``clip + GAUSSIAN_BOUND·σ·C/√2`` per coordinate and cannot wrap.
The coordinator's check of the mean's norm allows the noise's norm up to
``dp_noise.gaussian_norm_bound`` (fails an honest round with probability
2**-64): it still catches a contribution far outside its clip, but no
longer one that exceeds it by less than the noise's norm (docs/privacy.md).
The coordinator drives :class:`SecureRound` through a round's
``SecureAggregator`` (``core/job/secure_aggregator.py``: the keys as they
come, the protocol once training closed, the round's record).

Sans-I/O: both classes take messages and hand back messages to send, and
the X25519 function to compute with (``x25519``, the host's kernel's: the
coordinator's ``Kernel.x25519``, the participant's as the host hands it to
``Participant.training_finished``; the pure-Python ladder by default).
Errors are ``SecAggError`` with a named reason and, where one participant is
at fault, ``peer``.
"""

from __future__ import annotations

import math
import secrets
from array import array
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .. import verified
from ..floats import BytesLike
from ..privacy import fixedpoint, prg
from ..privacy.dp_noise import GAUSSIAN_BOUND, SEED_BYTES, gaussian_norm_bound, gaussians, noise_key
from ..privacy.dp_settings import MAX_NOISE_MULTIPLIER
from ..privacy.secagg import (
    AdvertiseKeys, MaskedInput, Outgoing, Roster, SecAggClient, SecAggError, SecAggParams, SecAggReason, SecAggServer,
    SharesFor, Unmask, UnmaskShares, fedavg_from_sum, weighted_vector,
)
from ..privacy.x25519 import X25519, x25519
from ..wire.commands import Send
from ..wire.messages import (
    MAX_SECAGG_PEERS, ArtifactRef, Message, SecAggKeys, SecAggMasked, SecAggReveal, SecAggRoster, SecAggShares,
    SecAggSharesFor, SecAggUnmask,
)

__all__ = ["SECAGG_PHASE_TIMEOUT_MS", "ASSIGN_KEY", "SecureTerms", "SecureRound", "SecureContribution", "round_tag"]

#: How long one stage of the protocol waits for answers before it goes on with those that came (at least t).
SECAGG_PHASE_TIMEOUT_MS = 60_000
#: The key of an Assign's settings that carries the round's terms.
ASSIGN_KEY = "secureAggregation"


def round_tag(job_id: str, round_: int, opening: int) -> bytes:
    """The tag of one opening of a round: commitments, seals and masks of another round never match."""
    return prg.derive("weei-secagg-round/v1", job_id.encode(), round_.to_bytes(8, "big"), opening.to_bytes(8, "big"))


def _number(obj: Mapping[str, Any], key: str) -> float:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise SecAggError(SecAggReason.BAD_MESSAGE, f"the assignment's secureAggregation.{key} is not a number above 0")
    return float(value)


@dataclass(frozen=True)
class SecureTerms:
    """A round's secure aggregation as its assignments state it."""

    clip: float  # the L2 norm each participant clips its delta to
    max_weight: float  # the largest weight one contribution carries: an assignment's example count, or 1 under DP
    threshold: float  # the settings' fraction: t = max(2, ceil(threshold * |U1|))
    opening: int  # which opening of the round (1, then 2 for its first retry, ...)
    weighted: bool  # FedAvg's example weights; False under DP (every contribution weighs 1)
    noise: float = 0.0  # σ of the noise each participant adds (σ·C/√t per weight); 0: participants add none

    @property
    def bound(self) -> float:
        """The largest magnitude of one encoded coordinate: a clipped delta (and its noise) times the weight, or
        the weight."""
        return max(self.clip + GAUSSIAN_BOUND * self.noise * self.clip / math.sqrt(2.0), 1.0) * self.max_weight

    def noise_std(self, threshold: int) -> float:
        """The standard deviation of the noise one participant adds to each weight at threshold t: σ·C/√t."""
        return self.noise * self.clip / math.sqrt(threshold)

    def threshold_of(self, participants: int) -> int:
        return max(2, math.ceil(self.threshold * participants))

    def params(self, job_id: str, round_: int, length: int, threshold: int = 2) -> SecAggParams:
        return SecAggParams(round_tag(job_id, round_, self.opening), threshold, length, self.bound, MAX_SECAGG_PEERS)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"clip": self.clip, "maxWeight": self.max_weight, "threshold": self.threshold,
                               "opening": self.opening, "weighted": self.weighted}
        if self.noise > 0:
            out["noiseMultiplier"] = self.noise
        return out

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> SecureTerms | None:
        """The terms an Assign's settings carry (None: the round is not securely aggregated).

        Raises SecAggError(BAD_MESSAGE) when they are malformed.
        """
        obj = settings.get(ASSIGN_KEY)
        if obj is None:
            return None
        if not isinstance(obj, dict):
            raise SecAggError(SecAggReason.BAD_MESSAGE, "the assignment's secureAggregation is not an object")
        opening = obj.get("opening")
        if isinstance(opening, bool) or not isinstance(opening, int) or opening < 1:
            raise SecAggError(SecAggReason.BAD_MESSAGE, "the assignment's secureAggregation.opening is not a positive integer")
        threshold = _number(obj, "threshold")
        if not 0.5 < threshold <= 1 or not isinstance(obj.get("weighted"), bool):
            raise SecAggError(SecAggReason.BAD_MESSAGE, "the assignment's secureAggregation.threshold or weighted is invalid")
        noise = obj.get("noiseMultiplier", 0.0)
        if isinstance(noise, bool) or not isinstance(noise, (int, float)) or not 0 <= noise <= MAX_NOISE_MULTIPLIER \
                or (noise > 0 and obj["weighted"]):
            # Noise of σ·C/√t per participant assumes each contribution weighs 1 (DP-FedAvg).
            raise SecAggError(SecAggReason.BAD_MESSAGE, "the assignment's secureAggregation.noiseMultiplier is not a "
                              f"number from 0 to {MAX_NOISE_MULTIPLIER:g} of an unweighted round")
        terms = cls(_number(obj, "clip"), _number(obj, "maxWeight"), threshold, opening, obj["weighted"], float(noise))
        try:
            fixedpoint.frac_bits(terms.bound, MAX_SECAGG_PEERS)
        except ValueError as exc:
            raise SecAggError(SecAggReason.BAD_MESSAGE, f"the assignment's secureAggregation terms: {exc}") from None
        return terms


def _to_send(job_id: str, round_: int, opening: int, params: SecAggParams, out: list[Outgoing]) -> list[Send]:
    sends = []
    for item in out:
        message: Message
        if isinstance(item.message, Roster):
            message = SecAggRoster(job_id, round_, opening, params.threshold, params.length, item.message)
        elif isinstance(item.message, SharesFor):
            message = SecAggSharesFor(job_id, round_, opening, item.message)
        else:
            assert isinstance(item.message, Unmask)
            message = SecAggUnmask(job_id, round_, opening, item.message)
        sends.append(Send(item.to, message))
    return sends


class SecureRound:
    """The coordinator's side of one opening of a round: drives ``SecAggServer`` over the wire messages.
    ``keys``: U1's, each already through ``secagg.check_keys`` (the coordinator checks them as they arrive)."""

    def __init__(self, job_id: str, round_: int, terms: SecureTerms, weight_count: int,
                 keys: Mapping[str, AdvertiseKeys], now: float, phase_timeout: float = SECAGG_PHASE_TIMEOUT_MS,
                 x25519: X25519 = x25519) -> None:
        self.job_id, self.round, self.terms = job_id, round_, terms
        self.params = terms.params(job_id, round_, weight_count + 1, terms.threshold_of(len(keys)))
        self.server = SecAggServer(self.params, sorted(keys), now, phase_timeout, x25519, keys_checked=True)
        self._keys = dict(keys)

    @property
    def done(self) -> bool:
        return self.server.done

    @property
    def deadline(self) -> float | None:
        return None if self.done else self.server.deadline

    def start(self, now: float) -> list[Send]:
        """U1's keys (checked as they arrived) go in: the roster goes out (or the round fails below t)."""
        out: list[Outgoing] = []
        for peer in sorted(self._keys):
            out += self.server.receive(peer, self._keys[peer], now)
        return self._sends(out)

    def _sends(self, out: list[Outgoing]) -> list[Send]:
        return _to_send(self.job_id, self.round, self.terms.opening, self.params, out)

    def receive(self, peer: str, message: Message, blobs: Mapping[str, bytes], now: float) -> list[Send]:
        """A participant's message of this round. Raises SecAggError naming ``peer`` when it does not belong."""
        if getattr(message, "round", None) != self.round or getattr(message, "attempt", None) != self.terms.opening:
            raise SecAggError(SecAggReason.BAD_MESSAGE, f"{message.TYPE} from {peer} is of another round", peer)
        if isinstance(message, SecAggShares):
            return self._sends(self.server.receive(peer, message.shares, now))
        if isinstance(message, SecAggMasked):
            ref = message.masked
            data = blobs.get(ref.sha256)
            if data is None or len(data) != ref.bytes or (
                    not verified.is_verified(blobs) and verified.sha256_hex(data) != ref.sha256):
                raise SecAggError(SecAggReason.BAD_MESSAGE, f"the masked vector of {peer} did not arrive intact", peer)
            return self._sends(self.server.receive(peer, MaskedInput(bytes(data)), now))
        if isinstance(message, SecAggReveal):
            return self._sends(self.server.receive(peer, message.reveal, now))
        raise SecAggError(SecAggReason.BAD_MESSAGE, f"{message.TYPE} from {peer} is not expected now", peer)

    def drop(self, peer: str, now: float) -> list[Send]:
        """``peer`` left or its channel closed: the stage stops waiting for it."""
        return self._sends(self.server.drop(peer, now))

    def handle_timer(self, now: float) -> list[Send]:
        return self._sends(self.server.handle_timer(now))

    def noise_std(self, contributors: int) -> float:
        """The standard deviation of the participants' noise in each weight of the mean of ``contributors``
        contributions: σ·C·√(k/t) / k (0 when they add none)."""
        return self.terms.noise_std(self.params.threshold) * math.sqrt(contributors) / contributors

    def result(self, start: BytesLike) -> tuple[bytes, tuple[str, ...]]:
        """The new float32 weights ``f32(start + sum / total weight)`` and the contributors (U3), sorted.

        Raises SecAggError(SUM_OUT_OF_RANGE): the total weight is not within what U3 could send, the mean
        delta is longer than the clip (and the participants' noise) allows (one contribution ignored its
        clip), or a weight is not finite.
        """
        assert self.server.total is not None, "result() after the protocol finished"
        contributors = self.server.contributors
        mean, weight = fedavg_from_sum(self.server.total, self.params.bits, len(contributors), self.terms.max_weight)
        # Each contribution's weighted delta is at most weight * clip long, so the mean's is at most the clip; the
        # grid rounds each coordinate of each contribution by half a step at most. The participants' noise adds
        # a norm below gaussian_norm_bound but for a 2**-64 chance (triangle inequality: the bounds add).
        slack = len(contributors) * math.sqrt(len(mean)) * 2.0 ** -self.params.bits / weight
        noise = gaussian_norm_bound(len(mean), self.noise_std(len(contributors))) if self.terms.noise > 0 else 0.0
        norm = math.sqrt(math.fsum(v * v for v in mean))
        if norm > self.terms.clip + noise + slack:
            raise SecAggError(SecAggReason.SUM_OUT_OF_RANGE,
                              f"the mean delta is {norm:g} long, above the clip {self.terms.clip:g}"
                              + (f" and its noise's bound {noise:g}" if noise else "") + ": a contribution "
                              "ignored its clip")
        base = array("f", bytes(start))
        # array('f') stores a C float: f32(f64(s) + mean), rounded to nearest, the same on every platform.
        weights = array("f", [s + m for s, m in zip(base, mean, strict=True)])
        if any(not math.isfinite(w) for w in weights):
            raise SecAggError(SecAggReason.SUM_OUT_OF_RANGE, "the new weights are not finite as float32")
        return weights.tobytes(), tuple(sorted(contributors))


class SecureContribution:
    """A participant's side of one opening of a round: its masked vector and its part of the protocol.
    ``random_bytes``: its secrets, the noise seed (when the terms ask for noise: the first draw) and then the
    protocol's keys."""

    def __init__(self, me: str, job_id: str, round_: int, terms: SecureTerms, start: BytesLike, trained: BytesLike,
                 count: int, random_bytes: Callable[[int], bytes] = secrets.token_bytes, x25519: X25519 = x25519) -> None:
        s, x = array("f", bytes(start)), array("f", bytes(trained))
        if len(s) != len(x) or len(bytes(start)) % 4:
            raise ValueError("start and trained weights must be float32 buffers of the same length")
        weight = min(float(count), terms.max_weight) if terms.weighted else 1.0
        self.job_id, self.round, self.terms = job_id, round_, terms
        self._vector = weighted_vector([b - a for a, b in zip(s, x)], weight, terms.clip)
        # The noise needs t, which the roster brings; the seed is drawn now, from this participant's source only.
        self._noise_seed: bytes | None = random_bytes(SEED_BYTES) if terms.noise > 0 else None
        self.client = SecAggClient(me, terms.params(job_id, round_, len(self._vector)), random_bytes, x25519)

    def matches(self, message: Message) -> bool:
        return getattr(message, "round", None) == self.round and getattr(message, "attempt", None) == self.terms.opening

    def keys(self) -> SecAggKeys:
        return SecAggKeys(self.job_id, self.round, self.terms.opening, self.client.advertise())

    def on_roster(self, message: SecAggRoster) -> SecAggShares:
        """Raises SecAggError: the roster's length is not this update's, its threshold is below the terms', or
        as ``SecAggClient.share``."""
        n = len(message.roster.keys)
        if message.length != len(self._vector) or message.threshold < self.terms.threshold_of(n):
            raise SecAggError(SecAggReason.BAD_MESSAGE,
                              f"the roster asks for {message.length} elements at threshold {message.threshold}; this "
                              f"update has {len(self._vector)} and the terms need {self.terms.threshold_of(n)} of {n}")
        params = self.terms.params(self.job_id, self.round, len(self._vector), message.threshold)
        shares = self.client.share(message.roster, params)
        if self._noise_seed is not None:
            self._add_noise(self._noise_seed, self.terms.noise_std(message.threshold))
            self._noise_seed = None  # used once: nothing this participant keeps or sends could give it away
        return SecAggShares(self.job_id, self.round, self.terms.opening, shares)

    def _add_noise(self, seed: bytes, std: float) -> None:
        """N(0, std²) on every weight of the clipped delta (not on its weight, the vector's last element)."""
        vector = self._vector
        noise = gaussians(noise_key(seed, self.job_id, self.round), len(vector) - 1)
        vector[:-1] = [v + std * z for v, z in zip(vector[:-1], noise, strict=True)]

    def on_shares_for(self, message: SecAggSharesFor) -> tuple[SecAggMasked, bytes]:
        """The masked vector, and the bytes that travel beside it. Raises SecAggError as ``SecAggClient.mask``."""
        data = self.client.mask(message.shares, self._vector).data
        ref = ArtifactRef("update", verified.sha256_hex(data), len(data))
        return SecAggMasked(self.job_id, self.round, self.terms.opening, ref), data

    def on_unmask(self, message: SecAggUnmask) -> SecAggReveal:
        """Raises SecAggError as ``SecAggClient.unmask``."""
        shares: UnmaskShares = self.client.unmask(message.unmask)
        return SecAggReveal(self.job_id, self.round, self.terms.opening, shares)
