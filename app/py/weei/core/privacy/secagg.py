"""Secure aggregation: the coordinator learns the sum of a round's updates and nothing else.

Theory of operation (Bonawitz et al., "Practical Secure Aggregation for
Privacy-Preserving Machine Learning", CCS 2017, the semi-honest protocol).
One round, participants ``u`` with distinct ids, threshold ``t``:

1. **Advertise.** Each participant makes two X25519 key pairs, ``c`` (to
   encrypt shares to a peer) and ``s`` (pairwise masks), and sends both
   public keys. The coordinator sends the roster U1 (at least t) to all.
2. **Share.** Each participant draws a self-mask seed ``b`` and splits its
   ``s`` secret key and ``b`` t-of-|U1| (Shamir), seals each peer's pair of
   shares under a key from X25519(c_sk, peer's c_pk), and sends the sealed
   shares with a salted commitment to each share and to ``b``. The
   coordinator forwards each participant its inbox and the set U2.
3. **Mask.** Each participant of U2 clips and encodes its update into
   Z_{2^64} (``fixedpoint``) and adds PRG(b) and, for every other peer v of
   U2, +PRG(s_uv) when u < v and -PRG(s_uv) otherwise; the pairwise masks
   cancel in the sum. U3 is who sent a masked vector.
4. **Unmask.** The coordinator names U3 (at least t); each survivor reveals,
   once per round, its share of ``b`` for peers in U3 and its share of
   ``s_sk`` for peers in U2 \\ U3, never both for one peer. With t revealed
   shares per peer (each checked against its dealer's commitment; a share
   that does not match names its sender) the coordinator rebuilds the
   dropped peers' pairwise masks and the survivors' self masks and removes
   them: the exact sum of U3's encoded updates is left.

What the coordinator sees of one participant's update is ``x + PRG(b) +
pairwise masks``: uniform in the ring unless it holds ``b`` (t shares, only
revealed for U3, who contributed) and all pairwise seeds (only revealed for
peers that did not contribute). Fewer than t colluding participants learn
nothing either. Not covered: a coordinator that lies about U3 to different
participants (the malicious-model consistency round of the paper), or t
colluding participants with the coordinator; docs/privacy.md says so.

Sans-I/O: ``SecAggClient`` answers the coordinator's messages;
``SecAggServer`` takes messages with ``now`` and ``handle_timer(now)`` and
hands back what to send. Both raise ``SecAggError`` with a named reason, and
``peer`` set where one participant is at fault. Both take the X25519 function
they compute with (``x25519``: a host's kernel's; the pure-Python ladder by
default): it is most of a round's fixed cost, and every implementation gives
the same bytes.
"""

from __future__ import annotations

import hmac
import math
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from ..errors import WeeiError
from . import fixedpoint, prg, shamir
from .x25519 import BASE_POINT, KEY_BYTES, X25519, x25519

__all__ = [
    "SecAggReason",
    "SecAggError",
    "SecAggParams",
    "SALT_BYTES",
    "COMMITMENT_BYTES",
    "SEALED_SHARE_BYTES",
    "AdvertiseKeys",
    "Roster",
    "ShareKeys",
    "SharesFor",
    "MaskedInput",
    "Unmask",
    "UnmaskShares",
    "Outgoing",
    "SecAggClient",
    "SecAggServer",
    "clip_norm",
    "weighted_vector",
    "fedavg_from_sum",
    "mask_vector",
    "check_keys",
]

RandomBytes = Callable[[int], bytes]
SALT_BYTES = 16
COMMITMENT_BYTES = 32
_SHARE_PLAIN = 2 * shamir.SHARE_BYTES + 2 * SALT_BYTES
#: A sealed share pair (s_sk share, b share, their salts) with its tag: what one peer deals another.
SEALED_SHARE_BYTES = _SHARE_PLAIN + prg.TAG_BYTES


class SecAggReason(str, Enum):
    """Why a secure-aggregation round (or one participant's part in it) failed."""

    BELOW_THRESHOLD = "secagg-below-threshold"
    """Fewer than the threshold of participants remain at a stage: the round fails and is retried."""
    BAD_SHARE = "secagg-bad-share"
    """A revealed share does not match its dealer's commitment (``peer`` sent it)."""
    BAD_DEALER = "secagg-bad-dealer"
    """Shares that match their commitments do not rebuild the dealer's published key or seed (``peer`` dealt them)."""
    BAD_CIPHERTEXT = "secagg-bad-ciphertext"
    """A sealed share does not open under the pair's key (``peer`` sealed it, or the coordinator altered it)."""
    BAD_KEY = "secagg-bad-key"
    """A public key is malformed or of low order (``peer`` sent it)."""
    BAD_MESSAGE = "secagg-bad-message"
    """A message names unknown peers, has the wrong sizes or comes at the wrong stage."""
    UNSAFE_REQUEST = "secagg-unsafe-request"
    """The coordinator asked for shares that could unmask one participant's update: refused."""
    SUM_OUT_OF_RANGE = "secagg-sum-out-of-range"
    """The unmasked sum's total weight is not within what the contributors could have sent."""


class SecAggError(WeeiError):
    """A secure-aggregation step failed; ``peer`` names the participant at fault, when one is."""

    reasons = (SecAggReason,)

    def __init__(self, reason: SecAggReason, message: str, peer: str | None = None) -> None:
        super().__init__(reason, message)
        self.peer = peer


@dataclass(frozen=True)
class SecAggParams:
    """What every peer of a round agrees on: the round's tag, the threshold, the vector length and its grid.

    ``bound`` is the largest magnitude of one encoded coordinate (clip times the
    largest weight); ``count`` the roster size the grid is sized for.
    """

    round_tag: bytes
    threshold: int
    length: int
    bound: float
    count: int
    bits: int = field(init=False)

    def __post_init__(self) -> None:
        if not 2 <= self.threshold <= self.count or self.length < 1:
            raise ValueError("a round needs 2 <= threshold <= count and a positive length")
        object.__setattr__(self, "bits", fixedpoint.frac_bits(self.bound, self.count))


@dataclass(frozen=True)
class AdvertiseKeys:
    """Participant -> coordinator: this round's two public keys."""

    c_pk: bytes
    s_pk: bytes


@dataclass(frozen=True)
class Roster:
    """Coordinator -> participants: U1, each id with its public keys."""

    keys: tuple[tuple[str, AdvertiseKeys], ...]


@dataclass(frozen=True)
class ShareKeys:
    """Participant -> coordinator: a sealed share pair per peer, the commitments, the self-mask seed's commitment."""

    sealed: tuple[tuple[str, bytes], ...]
    commitments: tuple[tuple[str, bytes, bytes], ...]  # (holder, commitment to its s_sk share, to its b share)
    seed_commitment: bytes


@dataclass(frozen=True)
class SharesFor:
    """Coordinator -> one participant: U2 and the sealed shares its peers dealt it."""

    u2: tuple[str, ...]
    inbox: tuple[tuple[str, bytes], ...]


@dataclass(frozen=True)
class MaskedInput:
    """Participant -> coordinator: the masked, encoded update, little-endian u64 (``fixedpoint.to_bytes``)."""

    data: bytes


@dataclass(frozen=True)
class Unmask:
    """Coordinator -> survivors: U3, whose self masks to remove; the rest of U2 dropped."""

    u3: tuple[str, ...]


@dataclass(frozen=True)
class UnmaskShares:
    """Survivor -> coordinator: (dealer, y, salt) of the s_sk shares of dropped peers and the b shares of survivors."""

    key_shares: tuple[tuple[str, int, bytes], ...]
    seed_shares: tuple[tuple[str, int, bytes], ...]


Message = AdvertiseKeys | Roster | ShareKeys | SharesFor | MaskedInput | Unmask | UnmaskShares


@dataclass(frozen=True)
class Outgoing:
    """Something the coordinator sends one participant."""

    to: str
    message: Message


def _commit(tag: bytes, dealer: str, holder: str, kind: str, y: int, salt: bytes) -> bytes:
    return prg.derive("share-commit", tag, dealer.encode(), holder.encode(), kind.encode(),
                      y.to_bytes(shamir.SHARE_BYTES, "big"), salt, size=COMMITMENT_BYTES)


def _seed_commit(tag: bytes, dealer: str, seed: bytes) -> bytes:
    return prg.derive("seed-commit", tag, dealer.encode(), seed, size=COMMITMENT_BYTES)


#: Any clamped scalar maps every low-order point (and only those) to 0: the probe of a public key.
_PROBE = bytes([8]) + bytes(30) + bytes([64])


def _agree(function: X25519, secret: bytes, peer_pk: bytes, peer: str) -> bytes:
    shared = function(secret, peer_pk)
    if shared == bytes(KEY_BYTES):  # a low-order point: the "secret" would be known to everyone
        raise SecAggError(SecAggReason.BAD_KEY, f"{peer}'s public key is of low order", peer)
    return shared


def _seal_key(tag: bytes, shared: bytes, dealer: str, holder: str) -> bytes:
    return prg.derive("seal-key", tag, shared, dealer.encode(), holder.encode())


def _pair_seed(tag: bytes, shared: bytes, a: str, b: str) -> bytes:
    lo, hi = sorted((a, b))
    return prg.derive("pair-mask", tag, shared, lo.encode(), hi.encode())


def check_keys(sender: str, keys: AdvertiseKeys, x25519: X25519 = x25519) -> None:
    """Refuse public keys that are malformed or of low order, naming ``sender``: raises SecAggError(BAD_KEY).
    The coordinator checks them as they arrive, rather than every peer aborting the round later."""
    if len(keys.c_pk) != KEY_BYTES or len(keys.s_pk) != KEY_BYTES:
        raise SecAggError(SecAggReason.BAD_KEY, f"{sender}'s public keys are not 32 bytes each", sender)
    _agree(x25519, _PROBE, keys.c_pk, sender)
    _agree(x25519, _PROBE, keys.s_pk, sender)


def _rebuild(shares: list[tuple[int, int]], size: int) -> bytes | None:
    try:
        return shamir.combine(shares, size)
    except ValueError:  # shares of a dealer that dealt no polynomial of a secret that size
        return None


def mask_vector(encoded: bytes, self_mask: bytes, pair_masks: Sequence[tuple[int, bytes]]) -> bytes:
    """``encoded + self_mask + sum(sign * mask)`` in Z_{2^64}, all as little-endian u64 bytes
    (``fixedpoint.encode_bytes``); sign is +1 or -1 per pairwise mask."""
    acc = fixedpoint.RingSum(len(encoded) // 8)
    acc.add(encoded)
    return _masked(acc, self_mask, pair_masks)


def _masked(acc: fixedpoint.RingSum, self_mask: bytes, pair_masks: Sequence[tuple[int, bytes]]) -> bytes:
    acc.add(self_mask)
    for sign, mask in pair_masks:
        (acc.add if sign > 0 else acc.sub)(mask)
    return acc.value()


def _clipped(update: Sequence[float], clip: float, weight: float | None) -> list[float]:
    # The common case in one pass: every entry finite (then the sum of squares is; an infinite or NaN entry, or
    # squares past the float range, take the careful way). Each entry is the same v * (clip / norm), then
    # times the weight, as in two passes.
    try:
        squares = math.fsum(v * v for v in update)
    except (OverflowError, ValueError):
        squares = math.inf
    values = update if math.isfinite(squares) else [v if math.isfinite(v) else 0.0 for v in update]
    norm = math.sqrt(squares if math.isfinite(squares) else math.fsum(v * v for v in values))
    if norm <= clip:
        return list(values) if weight is None else [weight * v for v in values]
    k = clip / norm
    return [v * k for v in values] if weight is None else [weight * (v * k) for v in values]


def clip_norm(update: Sequence[float], clip: float) -> list[float]:
    """The update scaled down to L2 norm ``clip`` when it is longer (non-finite entries become 0 first)."""
    return _clipped(update, clip, None)


def weighted_vector(update: Sequence[float], weight: float, clip: float) -> list[float]:
    """What a participant masks for FedAvg: its clipped update times its example count, then the count."""
    vector = _clipped(update, clip, weight)
    vector.append(float(weight))
    return vector


def fedavg_from_sum(total: Sequence[int], bits: int, contributors: int, max_weight: float) -> tuple[list[float], float]:
    """The unmasked ring sum of ``weighted_vector``s -> (the weighted mean update, the total weight).

    Raises SecAggError(SUM_OUT_OF_RANGE) when the total weight is not in (0, contributors * max_weight].
    """
    decoded = fixedpoint.decode(total, bits)
    weight = decoded[-1]
    if not 0 < weight <= contributors * max_weight:
        raise SecAggError(SecAggReason.SUM_OUT_OF_RANGE,
                          f"the sum's total weight {weight:g} is outside (0, {contributors * max_weight:g}]")
    return [v / weight for v in decoded[:-1]], weight


class SecAggClient:
    """One participant's side of one round. Call, in order: ``advertise``, ``share``, ``mask``, ``unmask``."""

    def __init__(self, me: str, params: SecAggParams, random_bytes: RandomBytes = secrets.token_bytes,
                 x25519: X25519 = x25519) -> None:
        self.me = me
        self.params = params
        self._random = random_bytes
        self._x25519 = x25519
        self._c_sk = random_bytes(KEY_BYTES)
        self._s_sk = random_bytes(KEY_BYTES)
        self._seed = random_bytes(prg.SEED_BYTES)
        self._roster: dict[str, AdvertiseKeys] = {}
        self._u2: tuple[str, ...] = ()
        self._held: dict[str, tuple[int, int, bytes, int, bytes]] = {}  # dealer -> (x, y_sk, salt_sk, y_b, salt_b)
        # X25519 is most of a peer's cost: its own public keys and each pair's c-agreement are computed once.
        self._keys = AdvertiseKeys(x25519(self._c_sk, BASE_POINT), x25519(self._s_sk, BASE_POINT))
        self._c_shared: dict[str, bytes] = {}
        self._stage = 0

    def _step(self, stage: int, name: str) -> None:
        if self._stage != stage:
            raise SecAggError(SecAggReason.BAD_MESSAGE, f"{name} comes at the wrong stage of the round")
        self._stage = stage + 1

    def _randbelow(self, bound: int) -> int:
        # Rejection sampling from the injected source, so a seeded test replays a round exactly.
        size = (bound.bit_length() + 7) // 8
        while True:
            value = int.from_bytes(self._random(size), "big") >> (8 * size - bound.bit_length())
            if value < bound:
                return value

    def advertise(self) -> AdvertiseKeys:
        """This round's public keys."""
        self._step(0, "advertise")
        return self._keys

    def share(self, roster: Roster, params: SecAggParams | None = None) -> ShareKeys:
        """Split and seal this participant's s_sk and self-mask seed to every peer of U1.

        ``params``: the round's, when the roster is what settles them (a job's rounds learn the threshold
        with U1); the round tag and the length must be those the keys were made for.

        Raises SecAggError: BAD_MESSAGE (this participant missing or its keys altered, an id twice, other
        params), BELOW_THRESHOLD, BAD_KEY (a peer's key of low order).
        """
        self._step(1, "share")
        if params is not None:
            if params.round_tag != self.params.round_tag or params.length != self.params.length:
                raise SecAggError(SecAggReason.BAD_MESSAGE, "the roster's round or vector length is not this round's")
            self.params = params
        ids = [peer for peer, _ in roster.keys]
        if len(set(ids)) != len(ids) or ids != sorted(ids) or dict(roster.keys).get(self.me) != self._keys:
            raise SecAggError(SecAggReason.BAD_MESSAGE, "the roster is not sorted and distinct, or does not hold this participant's keys")
        if len(ids) < self.params.threshold:
            raise SecAggError(SecAggReason.BELOW_THRESHOLD, f"{len(ids)} participants advertised, below {self.params.threshold}")
        if any(len(k.c_pk) != KEY_BYTES or len(k.s_pk) != KEY_BYTES for _, k in roster.keys):
            raise SecAggError(SecAggReason.BAD_KEY, "a public key is not 32 bytes")
        self._roster = dict(roster.keys)
        tag, t = self.params.round_tag, self.params.threshold
        sk_shares = shamir.split(self._s_sk, t, len(ids), self._randbelow)
        b_shares = shamir.split(self._seed, t, len(ids), self._randbelow)
        sealed, commitments = [], []
        for index, peer in enumerate(ids):
            salt_sk, salt_b = self._random(SALT_BYTES), self._random(SALT_BYTES)
            (_, y_sk), (_, y_b) = sk_shares[index], b_shares[index]
            commitments.append((peer, _commit(tag, self.me, peer, "sk", y_sk, salt_sk), _commit(tag, self.me, peer, "b", y_b, salt_b)))
            if peer == self.me:
                self._held[peer] = (index + 1, y_sk, salt_sk, y_b, salt_b)
                continue
            plain = (y_sk.to_bytes(shamir.SHARE_BYTES, "big") + salt_sk + y_b.to_bytes(shamir.SHARE_BYTES, "big") + salt_b)
            shared = self._c_shared[peer] = _agree(self._x25519, self._c_sk, self._roster[peer].c_pk, peer)
            sealed.append((peer, prg.seal(_seal_key(tag, shared, self.me, peer), plain)))
        return ShareKeys(tuple(sealed), tuple(commitments), _seed_commit(tag, self.me, self._seed))

    def mask(self, shares: SharesFor, vector: Sequence[float]) -> MaskedInput:
        """Open the shares dealt to this participant and mask ``vector`` (already clipped and weighted).

        Raises SecAggError: BAD_MESSAGE (U2 not within U1 or without this participant, inbox not U2's peers,
        wrong length), BELOW_THRESHOLD, BAD_CIPHERTEXT (naming the dealer).
        """
        self._step(2, "mask")
        u2, tag = tuple(shares.u2), self.params.round_tag
        if self.me not in u2 or not set(u2) <= set(self._roster) or len(set(u2)) != len(u2) or len(vector) != self.params.length:
            raise SecAggError(SecAggReason.BAD_MESSAGE, "U2 is not a set within U1 holding this participant, or the vector's length is wrong")
        if len(u2) < self.params.threshold:
            raise SecAggError(SecAggReason.BELOW_THRESHOLD, f"{len(u2)} participants shared keys, below {self.params.threshold}")
        inbox = dict(shares.inbox)
        if set(inbox) != set(u2) - {self.me} or len(inbox) != len(shares.inbox):
            raise SecAggError(SecAggReason.BAD_MESSAGE, "the inbox does not hold exactly one sealed share per peer of U2")
        ids = sorted(self._roster)
        for dealer, sealed in inbox.items():
            key = _seal_key(tag, self._c_shared[dealer], dealer, self.me)
            plain = prg.open_sealed(key, sealed)
            if plain is None or len(plain) != _SHARE_PLAIN:
                raise SecAggError(SecAggReason.BAD_CIPHERTEXT, f"the share {dealer} sealed does not open", dealer)
            n = shamir.SHARE_BYTES
            self._held[dealer] = (ids.index(self.me) + 1, int.from_bytes(plain[:n], "big"), plain[n:n + SALT_BYTES],
                                  int.from_bytes(plain[n + SALT_BYTES:2 * n + SALT_BYTES], "big"), plain[2 * n + SALT_BYTES:])
        self._u2 = u2
        length = self.params.length
        pairs = []
        for peer in u2:
            if peer != self.me:
                seed = _pair_seed(tag, _agree(self._x25519, self._s_sk, self._roster[peer].s_pk, peer), self.me, peer)
                pairs.append((1 if self.me < peer else -1, prg.mask_bytes(seed, length)))
        acc = fixedpoint.RingSum(length)
        fixedpoint.encode_into(acc, vector, self.params.bits, self.params.bound)  # as mask_vector, the encoding added in place
        return MaskedInput(_masked(acc, prg.mask_bytes(self._seed, length), pairs))

    def unmask(self, request: Unmask) -> UnmaskShares:
        """Reveal b shares of U3's peers and s_sk shares of U2 \\ U3's, once.

        Raises SecAggError: UNSAFE_REQUEST (asked twice, U3 not within U2), BELOW_THRESHOLD.
        """
        if self._stage != 3:
            raise SecAggError(SecAggReason.UNSAFE_REQUEST, "shares are revealed once per round, after masking")
        self._stage = 4
        u3 = tuple(request.u3)
        if self.me not in u3 or not set(u3) <= set(self._u2) or len(set(u3)) != len(u3):
            raise SecAggError(SecAggReason.UNSAFE_REQUEST, "U3 must be a set within U2 holding this participant")
        if len(u3) < self.params.threshold:
            raise SecAggError(SecAggReason.BELOW_THRESHOLD, f"{len(u3)} participants sent masked input, below {self.params.threshold}")
        dropped = [peer for peer in self._u2 if peer not in u3]
        return UnmaskShares(tuple((d, self._held[d][1], self._held[d][2]) for d in dropped),
                            tuple((s, self._held[s][3], self._held[s][4]) for s in u3))


class SecAggServer:
    """The coordinator's side of one round: collects, forwards, sums and unmasks.

    Each stage closes when every expected participant has answered, or at
    ``now >= deadline`` (``phase_timeout`` after the stage opened) with at
    least ``threshold`` answers; with fewer it fails BELOW_THRESHOLD. After
    ``done``: ``total`` is the exact ring sum of U3's encoded vectors,
    ``contributors`` is U3, ``bad_peers`` who sent shares that failed their
    commitments. After a failure: ``failure``. ``keys_checked``: the caller
    refused bad keys with ``check_keys`` as they arrived (a job's coordinator
    does, to end that participant's attempt at once), so they are not checked
    a second time.
    """

    def __init__(self, params: SecAggParams, invited: Sequence[str], now: float, phase_timeout: float,
                 x25519: X25519 = x25519, *, keys_checked: bool = False) -> None:
        if len(set(invited)) != len(invited):
            raise ValueError("invited ids must be distinct")
        self.params = params
        self._x25519 = x25519
        self._keys_checked = keys_checked
        self.phase_timeout = phase_timeout
        self.stage = "advertise"
        self.deadline = now + phase_timeout
        self._expected: set[str] = set(invited)
        self._got: dict[str, Message] = {}
        self._keys: dict[str, AdvertiseKeys] = {}
        self._shared: dict[str, ShareKeys] = {}
        self._masked: dict[str, MaskedInput] = {}
        self.total: list[int] | None = None
        self.contributors: tuple[str, ...] = ()
        self.bad_peers: set[str] = set()
        self.failure: SecAggError | None = None

    @property
    def done(self) -> bool:
        """Whether the round finished (``total`` set) or failed (``failure`` set)."""
        return self.stage in ("done", "failed")

    def receive(self, sender: str, message: Message, now: float) -> list[Outgoing]:
        """A message from ``sender`` (the transport's identity of the peer). Returns what to send.

        A message from a peer not expected at this stage, of the wrong type, or a second one, is dropped
        (an error names it, the round goes on without that peer's message).
        """
        wanted = {"advertise": AdvertiseKeys, "share": ShareKeys, "mask": MaskedInput, "unmask": UnmaskShares}.get(self.stage)
        if wanted is None or sender not in self._expected or sender in self._got or not isinstance(message, wanted):
            raise SecAggError(SecAggReason.BAD_MESSAGE, f"{type(message).__name__} from {sender} is not expected now", sender)
        self._check(sender, message)
        self._got[sender] = message
        if set(self._got) == self._expected:
            return self._close(now)
        return []

    def drop(self, peer: str, now: float) -> list[Outgoing]:
        """``peer`` is gone (its channel closed, it left): the stage stops waiting for it. Returns what to send."""
        if self.done or peer not in self._expected or peer in self._got:
            return []
        self._expected.discard(peer)
        return self._close(now) if set(self._got) == self._expected else []

    def handle_timer(self, now: float) -> list[Outgoing]:
        """Close the stage at its deadline. Returns what to send."""
        if self.done or now < self.deadline:
            return []
        return self._close(now)

    def _check(self, sender: str, message: Message) -> None:
        length = self.params.length
        if isinstance(message, AdvertiseKeys):
            if not self._keys_checked:
                check_keys(sender, message, self._x25519)
        elif isinstance(message, ShareKeys):
            peers = set(self._keys) - {sender}
            if ({p for p, _ in message.sealed} != peers or len(message.sealed) != len(peers)
                    or [c[0] for c in message.commitments] != sorted(self._keys)
                    or any(len(c[1]) != COMMITMENT_BYTES or len(c[2]) != COMMITMENT_BYTES for c in message.commitments)
                    or len(message.seed_commitment) != COMMITMENT_BYTES
                    or any(len(s) != SEALED_SHARE_BYTES for _, s in message.sealed)):
                raise SecAggError(SecAggReason.BAD_MESSAGE, f"{sender}'s shares do not cover U1 exactly", sender)
        elif isinstance(message, MaskedInput):
            if len(message.data) != 8 * length:
                raise SecAggError(SecAggReason.BAD_MESSAGE, f"{sender}'s masked vector is not {length} ring elements", sender)

    def _fail(self, reason: SecAggReason, message: str, peer: str | None = None) -> list[Outgoing]:
        self.stage = "failed"
        self.failure = SecAggError(reason, message, peer)
        return []

    def _open(self, stage: str, expected: set[str], now: float) -> None:
        self.stage, self._expected, self._got, self.deadline = stage, expected, {}, now + self.phase_timeout

    def _close(self, now: float) -> list[Outgoing]:
        t = self.params.threshold
        if len(self._got) < t:
            return self._fail(SecAggReason.BELOW_THRESHOLD, f"{len(self._got)} answered at stage {self.stage}, below {t}")
        got = dict(self._got)
        if self.stage == "advertise":
            self._keys = {p: m for p, m in sorted(got.items()) if isinstance(m, AdvertiseKeys)}
            roster = Roster(tuple(self._keys.items()))
            self._open("share", set(self._keys), now)
            return [Outgoing(p, roster) for p in self._keys]
        if self.stage == "share":
            self._shared = {p: m for p, m in sorted(got.items()) if isinstance(m, ShareKeys)}
            u2 = tuple(self._shared)
            self._open("mask", set(u2), now)
            return [Outgoing(p, SharesFor(u2, tuple((d, dict(self._shared[d].sealed)[p]) for d in u2 if d != p)))
                    for p in u2]
        if self.stage == "mask":
            self._masked = {p: m for p, m in sorted(got.items()) if isinstance(m, MaskedInput)}
            u3 = tuple(self._masked)
            self._open("unmask", set(u3), now)
            return [Outgoing(p, Unmask(u3)) for p in u3]
        self._finish({p: m for p, m in got.items() if isinstance(m, UnmaskShares)})
        return []

    def _revealed(self, answers: Mapping[str, UnmaskShares], dealer: str, kind: str) -> list[tuple[int, int]]:
        """The shares of ``dealer``'s secret that match their commitments, each sender's x; bad ones name their sender."""
        ids = sorted(self._keys)
        committed = {holder: (c_sk, c_b) for holder, c_sk, c_b in self._shared[dealer].commitments}
        good = []
        for holder, answer in sorted(answers.items()):
            entries = [(y, salt) for d, y, salt in (answer.key_shares if kind == "sk" else answer.seed_shares) if d == dealer]
            commitment = committed[holder][0 if kind == "sk" else 1]
            if (len(entries) != 1 or not 0 <= entries[0][0] < shamir.PRIME
                    or not hmac.compare_digest(_commit(self.params.round_tag, dealer, holder, kind, *entries[0]), commitment)):
                self.bad_peers.add(holder)
                continue
            good.append((ids.index(holder) + 1, entries[0][0]))
        return good

    def _finish(self, answers: dict[str, UnmaskShares]) -> None:
        t, tag, length = self.params.threshold, self.params.round_tag, self.params.length
        u2, u3 = list(self._shared), list(self._masked)
        total = fixedpoint.RingSum(length)
        for masked in self._masked.values():
            total.add(masked.data)
        for survivor in u3:
            shares = self._revealed(answers, survivor, "b")
            if len(shares) < t:
                self._fail(SecAggReason.BAD_SHARE if self.bad_peers else SecAggReason.BELOW_THRESHOLD,
                           f"{len(shares)} good shares of {survivor}'s self mask, below {t}", min(self.bad_peers, default=None))
                return
            seed = _rebuild(shares[:t], prg.SEED_BYTES)
            if seed is None or _seed_commit(tag, survivor, seed) != self._shared[survivor].seed_commitment:
                self._fail(SecAggReason.BAD_DEALER, f"{survivor}'s shares do not rebuild its committed seed", survivor)
                return
            total.sub(prg.mask_bytes(seed, length))
        for dropped in (p for p in u2 if p not in u3):
            shares = self._revealed(answers, dropped, "sk")
            if len(shares) < t:
                self._fail(SecAggReason.BAD_SHARE if self.bad_peers else SecAggReason.BELOW_THRESHOLD,
                           f"{len(shares)} good shares of {dropped}'s key, below {t}", min(self.bad_peers, default=None))
                return
            s_sk = _rebuild(shares[:t], KEY_BYTES)
            if s_sk is None or self._x25519(s_sk, BASE_POINT) != self._keys[dropped].s_pk:
                self._fail(SecAggReason.BAD_DEALER, f"{dropped}'s shares do not rebuild its published key", dropped)
                return
            for survivor in u3:
                seed = _pair_seed(tag, _agree(self._x25519, s_sk, self._keys[survivor].s_pk, survivor), dropped, survivor)
                # The survivor added +PRG when survivor < dropped: take it back out.
                (total.sub if survivor < dropped else total.add)(prg.mask_bytes(seed, length))
        self.total, self.contributors, self.stage = fixedpoint.from_bytes(total.value()), tuple(u3), "done"
