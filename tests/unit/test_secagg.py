"""Secure aggregation (weei.core.privacy): the primitives against their published vectors, then the protocol
under simulated time: the unmasked sum is the exact sum of the encoded updates, the coordinator's view depends on
the updates only through their sum, dropouts after masking are recovered, and bad peers are named."""

from __future__ import annotations

import hashlib
import itertools
import math
import random
import struct
from collections.abc import Callable, Sequence

import pytest

from weei.core.privacy import fixedpoint, prg, shamir
from weei.core.privacy.secagg import (AdvertiseKeys, MaskedInput, Outgoing, Roster, SecAggClient, SecAggError,
                                      SecAggParams, SecAggReason, SecAggServer, ShareKeys, SharesFor, Unmask,
                                      UnmaskShares, fedavg_from_sum, mask_vector, weighted_vector)
from weei.core.privacy.x25519 import X25519, public_key, x25519

H = bytes.fromhex


# --- X25519: RFC 7748 ---------------------------------------------------------------------------------------------

def _kernel_x25519(name: str) -> X25519:
    if name == "python":
        return x25519
    if name == "native":
        from weei.kernel.native import NativeKernel

        return NativeKernel().x25519
    from weei.kernel.wasm_kernel import WasmKernel

    return WasmKernel().x25519


@pytest.fixture(scope="module", params=["python", "native", "wasm"])
def function(request: pytest.FixtureRequest) -> X25519:
    """Every X25519 the protocol runs on: the pure-Python ladder, the C kernel natively and as WebAssembly."""
    return _kernel_x25519(request.param)


@pytest.mark.parametrize("scalar,u,out", [
    ("a546e36bf0527c9d3b16154b82465edd62144c0ac1fc5a18506a2244ba449ac4",
     "e6db6867583030db3594c1a424b15f7c726624ec26b3353b10a903a6d0ab1c4c",
     "c3da55379de9c6908e94ea4df28d084f32eccf03491c71f754b4075577a28552"),
    ("4b66e9d4d1b4673c5ad22691957d6af5c11b6421e0ea01d42ca4169e7918ba0d",
     "e5210f12786811d3f4b7959d0538ae2c31dbe7106fc03c3efc4cd549c715a493",
     "95cbde9476e8907d7aade45cb4b873f88b595a68799fa152e6f8f7647aac7957"),
])
def test_x25519_rfc7748_section_5_2_vectors(function: X25519, scalar: str, u: str, out: str) -> None:
    assert function(H(scalar), H(u)).hex() == out


def test_x25519_rfc7748_iterated_1_and_1000(function: X25519) -> None:
    k = u = (9).to_bytes(32, "little")
    for i in range(1, 1001):
        k, u = function(k, u), k
        if i == 1:
            assert k.hex() == "422c8e7a6227d7bca1350b3e2bb7279f7897b87bb6854b783c60e80311ae3079"
    assert k.hex() == "684cf59ba83309552800ef566f2f4d3c1c3887c49360e3875f2eb94d99532c51"


def test_x25519_rfc7748_section_6_1_diffie_hellman(function: X25519) -> None:
    alice, bob = (H("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a"),
                  H("5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb"))
    assert public_key(alice, function).hex() == "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a"
    assert public_key(bob, function).hex() == "de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f"
    shared = "4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742"
    assert function(alice, public_key(bob, function)).hex() == function(bob, public_key(alice, function)).hex() == shared


def test_x25519_agrees_with_openssl_on_random_keys(function: X25519) -> None:
    # An independent implementation (OpenSSL through ``cryptography``, where the platform has it).
    x = pytest.importorskip("cryptography.hazmat.primitives.asymmetric.x25519")
    rng = random.Random(11)
    for _ in range(20):
        k, u = rng.randbytes(32), rng.randbytes(32)
        theirs = x.X25519PrivateKey.from_private_bytes(k).exchange(x.X25519PublicKey.from_public_bytes(public_key(u)))
        assert function(k, public_key(u)) == theirs


def test_x25519_refuses_inputs_that_are_not_32_bytes(function: X25519) -> None:
    for k, u in ((bytes(31), bytes(32)), (bytes(32), bytes(33)), (b"", b"")):
        with pytest.raises(ValueError, match="32-byte"):
            function(k, u)


# --- the PRG and the sealed channel -------------------------------------------------------------------------------

def test_shake256_fips202_empty_vector() -> None:
    # The platform's SHAKE-256 (which every expansion rests on) against the FIPS 202 known answer.
    assert hashlib.shake_256(b"").hexdigest(32) == "46b9dd2b0ba88d13233b3feb743eeb243fcd52ea62b81b82b50c27646ed5762f"


def test_a_mask_is_the_shake256_stream_read_as_little_endian_u64() -> None:
    seed = bytes(range(32))
    stream = hashlib.shake_256(b"weei-secagg-mask\x00" + seed).digest(8 * 1000)
    assert prg.mask_bytes(seed, 1000) == stream
    assert fixedpoint.from_bytes(stream) == list(struct.unpack("<1000Q", stream))
    # The length-prefixed derivation, spelled out, so a change of it (which would split peers of two versions) is seen.
    assert prg.derive("pair-mask", b"a", b"b").hex() == hashlib.shake_256(
        b"\x00\x00\x00\x09pair-mask\x00\x00\x00\x01a\x00\x00\x00\x01b").hexdigest(32)


def test_sealed_share_opens_only_unaltered_and_under_its_key() -> None:
    key, other = bytes(32), bytes([1]) * 32
    sealed = prg.seal(key, b"share bytes")
    assert prg.open_sealed(key, sealed) == b"share bytes"
    assert prg.open_sealed(other, sealed) is None
    assert prg.open_sealed(key, bytes([sealed[0] ^ 1]) + sealed[1:]) is None
    assert prg.open_sealed(key, sealed[:10]) is None


# --- Shamir and the ring ------------------------------------------------------------------------------------------

def test_any_t_of_n_shares_recover_the_secret_and_t_minus_1_do_not() -> None:
    secret = bytes(range(1, 33))
    shares = shamir.split(secret, 3, 5)
    for subset in itertools.combinations(shares, 3):
        assert shamir.combine(list(subset), 32) == secret
    with pytest.raises(ValueError):  # two shares of a degree-2 polynomial interpolate to a field element, not the key
        assert shamir.combine(shares[:2], 32) != secret


def test_fixed_point_round_trip_and_wrap() -> None:
    bits = fixedpoint.frac_bits(10.0, 5)
    values = [0.0, 1.5, -1.5, 10.0, -10.0, 1e-9, 99.0, float("nan")]
    decoded = fixedpoint.decode(fixedpoint.encode(values, bits, 10.0), bits)
    assert decoded[:6] == [pytest.approx(v, abs=2.0 ** -bits) for v in values[:6]]
    assert decoded[6:] == [10.0, 0.0]  # clamped to the bound; a NaN carries nothing
    acc = fixedpoint.RingSum(1)
    for _ in range(5):
        acc.add(fixedpoint.to_bytes(fixedpoint.encode([-10.0], bits, 10.0)))
    assert fixedpoint.decode(fixedpoint.from_bytes(acc.value()), bits) == [-50.0]


def test_each_way_of_encoding_gives_the_definition_bit_for_bit() -> None:
    # encode takes one of three ways by the vector (rounded by a float addition well inside the grid, by round()
    # near its edge, clamped one value at a time with a NaN or a value out of bound): each must give
    # round(clamp(v) * 2^bits) mod 2^64, ties to even, and clip_norm/weighted_vector must be the two-pass ones.
    def definition(values: list[float], bits: int, bound: float) -> list[int]:
        clamped = [0.0 if v != v else min(max(v, -bound), bound) for v in values]
        return [round(v * 2 ** bits) % 2 ** 64 for v in clamped]

    rng = random.Random(7)
    ties = [k / 2 for k in range(-9, 10)] + [2.0 ** 49 + 0.5, -(2.0 ** 49) - 0.5, 2.0 ** 50 - 0.5, -0.0, 5e-324]
    for _ in range(300):
        bits = rng.choice((0, 1, 20, 40))
        bound = rng.choice((1.0, 1e3, 2.0 ** 52, 2.0 ** 60)) / 2 ** bits
        pool = [rng.uniform(-bound, bound) for _ in range(6)] + [t / 2 ** bits for t in ties if abs(t) <= bound * 2 ** bits]
        values = rng.sample(pool, rng.randrange(1, len(pool)))
        if rng.random() < 0.2:
            values.append(rng.choice((float("nan"), float("inf"), -float("inf"), 2 * bound)))
        assert fixedpoint.encode(values, bits, bound) == definition(values, bits, bound), (values, bits, bound)
        acc = fixedpoint.RingSum(len(values))
        fixedpoint.encode_into(acc, values, bits, bound)
        assert acc.value() == fixedpoint.encode_bytes(values, bits, bound)
    for update in ([3.0, -4.0, float("nan")], [1e200, -1e200], [0.1] * 7, [float("inf"), 2.0]):
        finite = [v if math.isfinite(v) else 0.0 for v in update]
        norm = math.sqrt(math.fsum(v * v for v in finite))
        clipped = finite if norm <= 1.0 else [v * (1.0 / norm) for v in finite]
        assert weighted_vector(update, 3.0, 1.0) == [3.0 * v for v in clipped] + [3.0]


def test_ring_sums_of_packed_vectors_match_python_integers_mod_2_64() -> None:
    # The lanes' edges: 0, 2^32 - 1, 2^32, 2^63, 2^64 - 1, where a carry or a borrow would cross into the next lane.
    rng = random.Random(12)
    edges = [0, 1, 2 ** 32 - 1, 2 ** 32, 2 ** 63, 2 ** 64 - 1]
    for _ in range(200):
        vectors = [[rng.choice(edges + [rng.randrange(2 ** 64)]) for _ in range(9)] for _ in range(rng.randrange(1, 9))]
        signs = [rng.choice((1, -1)) for _ in vectors]
        acc = fixedpoint.RingSum(9)
        for v, sign in zip(vectors, signs, strict=True):
            (acc.add if sign > 0 else acc.sub)(fixedpoint.to_bytes(v))
        assert fixedpoint.from_bytes(acc.value()) == [sum(s * v[i] for v, s in zip(vectors, signs, strict=True)) % 2 ** 64
                                                      for i in range(9)]
    with pytest.raises(ValueError):
        acc.add(bytes(8))


# --- the protocol, under simulated time ---------------------------------------------------------------------------

IDS = ("p1", "p2", "p3", "p4", "p5")
TIMEOUT = 30.0


def seeded(seed: int) -> Callable[[int], bytes]:
    return random.Random(seed).randbytes


def make_vectors(n: int, length: int, seed: int) -> list[list[float]]:
    rng = random.Random(seed)
    return [weighted_vector([rng.uniform(-1, 1) for _ in range(length)], rng.randint(1, 50), 2.0) for _ in range(n)]


def params(n: int = 5, t: int = 3, length: int = 17, tag: bytes = b"job/round-1/attempt-1") -> SecAggParams:
    return SecAggParams(round_tag=tag, threshold=t, length=length + 1, bound=2.0 * 50, count=n)


class Run:
    """Coordinator and participants in memory; messages move when ``step`` is called, time only by ``now += tick``."""

    def __init__(self, p: SecAggParams, vectors: Sequence[Sequence[float]], ids: Sequence[str] = IDS,
                 seeds: Sequence[int] | None = None) -> None:
        self.p, self.now = p, 0.0
        self.server = SecAggServer(p, list(ids), self.now, TIMEOUT)
        self.clients = {pid: SecAggClient(pid, p, seeded(seeds[i]) if seeds else seeded(1000 + i)) for i, pid in enumerate(ids)}
        self.vectors = dict(zip(ids, vectors, strict=True))
        self.gone: set[str] = set()
        self.transcript: list[tuple[str, object]] = []  # everything the coordinator receives, in order
        self.tamper: Callable[[str, UnmaskShares], UnmaskShares] = lambda _, m: m

    def deliver(self, pid: str, message: object) -> None:
        self.transcript.append((pid, message))
        self.route(self.server.receive(pid, message, self.now))  # type: ignore[arg-type]

    def route(self, outgoing: list[Outgoing]) -> None:
        for out in outgoing:
            if out.to in self.gone:
                continue
            client, msg = self.clients[out.to], out.message
            if isinstance(msg, Roster):
                self.deliver(out.to, client.share(msg))
            elif isinstance(msg, SharesFor):
                self.deliver(out.to, client.mask(msg, self.vectors[out.to]))
            elif isinstance(msg, Unmask):
                self.deliver(out.to, self.tamper(out.to, client.unmask(msg)))

    def drop_when(self, pid: str, stage: str) -> None:
        """``pid`` vanishes once the coordinator opens ``stage`` (it answered every stage before)."""
        self.drops = getattr(self, "drops", {}) | {pid: stage}

    def run(self) -> SecAggServer:
        drops = getattr(self, "drops", {})
        original = self.route

        def route(outgoing: list[Outgoing]) -> None:
            self.gone |= {pid for pid, stage in drops.items() if self.server.stage == stage}
            original(outgoing)

        self.route = route  # type: ignore[method-assign]
        for pid, client in self.clients.items():
            if pid not in {d for d, s in drops.items() if s == "advertise"}:
                self.deliver(pid, client.advertise())
        while not self.server.done:
            self.now += 1.0
            self.route(self.server.handle_timer(self.now))
            assert self.now < 10 * TIMEOUT
        return self.server


def exact_sum(p: SecAggParams, vectors: Sequence[Sequence[float]]) -> list[int]:
    # Plain Python integers, no mask and no packing: the reference the protocol's sum must equal.
    encoded = [fixedpoint.encode(v, p.bits, p.bound) for v in vectors]
    return [sum(column) % fixedpoint.MODULUS for column in zip(*encoded, strict=True)]


def test_the_unmasked_sum_is_the_exact_sum_of_the_encoded_updates() -> None:
    p, vectors = params(), make_vectors(5, 17, seed=1)
    server = Run(p, vectors).run()
    assert server.failure is None and server.contributors == IDS
    # Bit for bit on the grid: the coordinator's ring sum is the integer sum (mod 2^64) of each participant's
    # fixed-point encoding, computed here without any mask; no rounding happens anywhere in between.
    assert server.total == exact_sum(p, vectors)
    mean, weight = fedavg_from_sum(server.total, p.bits, 5, 50)
    # Against the plain FedAvg of the same clipped updates in floats: only the grid's rounding differs
    # (each participant's encoding is within half a step, and there are five).
    plain_weight = math.fsum(v[-1] for v in vectors)
    assert weight == plain_weight
    for i, got in enumerate(mean):
        assert abs(got - math.fsum(v[i] for v in vectors) / plain_weight) <= 5 * 2.0 ** -p.bits / plain_weight


def test_the_coordinators_transcript_depends_on_the_updates_only_through_their_sum() -> None:
    p = params(length=8)
    a = make_vectors(5, 8, seed=2)
    # Another set of updates with the same encoded sum: move whole grid steps between participants (the values
    # stay exact floats, on the grid, inside the bound).
    rng = random.Random(3)
    step = 2.0 ** -p.bits
    a = [[round(x / step) * step for x in v] for v in a]
    moves = [[rng.randrange(-2 ** 36, 2 ** 36) for _ in range(p.length - 1)] + [0] for _ in range(4)]
    moves.append([-sum(m[i] for m in moves) for i in range(p.length)])
    b = [[x + k * step for x, k in zip(v, m, strict=True)] for v, m in zip(a, moves, strict=True)]
    assert exact_sum(p, a) == exact_sum(p, b) and a != b
    run_a, run_b = Run(p, a, seeds=range(5)), Run(p, b, seeds=range(5))
    run_a.drop_when("p4", "unmask")
    run_b.drop_when("p4", "unmask")
    assert run_a.run().total == run_b.run().total == exact_sum(p, a)
    # (1) Everything but the masked vectors is byte-identical: keys, sealed shares, commitments and revealed
    # shares carry nothing of the updates.
    masked_a = [m for _, m in run_a.transcript if isinstance(m, MaskedInput)]
    masked_b = [m for _, m in run_b.transcript if isinstance(m, MaskedInput)]
    rest_a = [(pid, m) for pid, m in run_a.transcript if not isinstance(m, MaskedInput)]
    rest_b = [(pid, m) for pid, m in run_b.transcript if not isinstance(m, MaskedInput)]
    assert rest_a == rest_b and masked_a != masked_b
    # (2) The masked vectors: with the pairwise masks uniform in Z_{2^64} (the PRG's promise), moving d_i from one
    # participant to the next along the chain p1-p2-...-p5 (shifting the mask of each adjacent pair by the running
    # total) is a bijection of the masks that turns the masked vectors of A into exactly those of B. So for every
    # mask draw under A there is one, equally likely, under B with the same view: the views' distributions are
    # equal. Checked here with uniform masks drawn at random, not the PRG's, since the claim is about them.
    n, mod = 5, fixedpoint.MODULUS
    enc_a = [fixedpoint.encode(v, p.bits, p.bound) for v in a]
    enc_b = [fixedpoint.encode(v, p.bits, p.bound) for v in b]
    masks = {(i, j): [rng.randrange(mod) for _ in range(p.length)] for i in range(n) for j in range(i + 1, n)}
    selfs = [[rng.randrange(mod) for _ in range(p.length)] for _ in range(n)]
    running = [0] * p.length
    shifted = dict(masks)
    for i in range(n - 1):
        running = [(r + eb - ea) % mod for r, ea, eb in zip(running, enc_a[i], enc_b[i], strict=True)]
        shifted[(i, i + 1)] = [(m + r) % mod for m, r in zip(masks[(i, i + 1)], running, strict=True)]

    def view(encoded: list[list[int]], pair: dict[tuple[int, int], list[int]]) -> list[bytes]:
        return [mask_vector(fixedpoint.to_bytes(encoded[i]), fixedpoint.to_bytes(selfs[i]),
                            [(1 if i < j else -1, fixedpoint.to_bytes(pair[min(i, j), max(i, j)])) for j in range(n) if j != i])
                for i in range(n)]

    assert view(enc_a, shifted) == view(enc_b, masks)


@pytest.mark.parametrize("dropped", [("p2",), ("p2", "p5")])
def test_dropouts_after_masking_with_n5_t3_complete(dropped: tuple[str, ...]) -> None:
    # Vanished after sending their masked vectors: their updates are in the sum, their self masks rebuilt by the rest.
    p, vectors = params(), make_vectors(5, 17, seed=4)
    run = Run(p, vectors)
    for pid in dropped:
        run.drop_when(pid, "unmask")
    server = run.run()
    assert server.failure is None and server.contributors == IDS
    assert server.total == exact_sum(p, vectors)


@pytest.mark.parametrize("dropped", [("p3",), ("p1", "p4")])
def test_dropouts_before_their_masked_input_leave_them_out_and_their_pairwise_masks_removed(dropped: tuple[str, ...]) -> None:
    p, vectors = params(), make_vectors(5, 17, seed=5)
    run = Run(p, vectors)
    for pid in dropped:
        run.drop_when(pid, "mask")
    server = run.run()
    assert server.failure is None
    assert server.contributors == tuple(pid for pid in IDS if pid not in dropped)
    assert server.total == exact_sum(p, [v for pid, v in zip(IDS, vectors, strict=True) if pid not in dropped])


def test_below_threshold_fails_by_name_and_a_retry_completes() -> None:
    p, vectors = params(), make_vectors(5, 17, seed=6)
    run = Run(p, vectors)
    for pid in ("p1", "p2", "p3"):
        run.drop_when(pid, "unmask")
    server = run.run()
    assert server.total is None and server.failure is not None
    assert server.failure.reason == SecAggReason.BELOW_THRESHOLD
    # The retry is a fresh attempt: new tag, new keys, new seeds (nothing of the failed one is reused).
    retry = Run(params(tag=b"job/round-1/attempt-2"), vectors, seeds=range(50, 55))
    server = retry.run()
    assert server.failure is None and server.total == exact_sum(retry.p, vectors)


def test_a_participant_that_reveals_a_bad_share_is_named_and_the_round_still_completes() -> None:
    p, vectors = params(), make_vectors(5, 17, seed=7)
    run = Run(p, vectors)
    run.drop_when("p5", "mask")

    def corrupt(pid: str, m: UnmaskShares) -> UnmaskShares:
        if pid != "p3":
            return m
        return UnmaskShares(tuple((d, (y + 1) % shamir.PRIME, s) for d, y, s in m.key_shares), m.seed_shares)

    run.tamper = corrupt
    server = run.run()
    assert server.bad_peers == {"p3"}
    assert server.failure is None and server.total == exact_sum(p, vectors[:4])


def test_bad_shares_that_leave_fewer_than_t_good_ones_fail_naming_the_sender() -> None:
    p, vectors = params(), make_vectors(5, 17, seed=8)
    run = Run(p, vectors)
    run.drop_when("p5", "unmask")
    run.drop_when("p4", "unmask")

    def corrupt(pid: str, m: UnmaskShares) -> UnmaskShares:
        if pid != "p2":
            return m
        return UnmaskShares(m.key_shares, tuple((d, y, bytes(16)) for d, y, _ in m.seed_shares))

    run.tamper = corrupt
    server = run.run()
    assert server.failure is not None and server.failure.reason == SecAggReason.BAD_SHARE
    assert server.failure.peer == "p2"


def test_a_participant_refuses_to_reveal_both_shares_of_one_peer() -> None:
    p, vectors = params(), make_vectors(5, 17, seed=9)
    run = Run(p, vectors)
    run.run()
    client = SecAggClient("p1", p, seeded(1))
    with pytest.raises(SecAggError) as err:  # asked before masking: nothing to reveal yet
        client.unmask(Unmask(IDS))
    assert err.value.reason == SecAggReason.UNSAFE_REQUEST
    done = run.clients["p1"]
    with pytest.raises(SecAggError) as err:  # a second request (e.g. naming a survivor "dropped") is refused
        done.unmask(Unmask(("p1", "p2", "p3")))
    assert err.value.reason == SecAggReason.UNSAFE_REQUEST


def test_a_sealed_share_altered_in_transit_names_its_dealer() -> None:
    p = params()
    clients = {pid: SecAggClient(pid, p, seeded(i)) for i, pid in enumerate(IDS)}
    roster = Roster(tuple((pid, c.advertise()) for pid, c in clients.items()))
    shared = {pid: c.share(roster) for pid, c in clients.items()}
    inbox = tuple((d, dict(shared[d].sealed)["p1"]) for d in IDS[1:])
    inbox = ((inbox[0][0], inbox[0][1][:-1] + bytes([inbox[0][1][-1] ^ 1])),) + inbox[1:]
    with pytest.raises(SecAggError) as err:
        clients["p1"].mask(SharesFor(IDS, inbox), [0.0] * p.length)
    assert err.value.reason == SecAggReason.BAD_CIPHERTEXT and err.value.peer == "p2"


def test_the_coordinator_refuses_messages_out_of_stage_and_low_order_keys() -> None:
    p = params()
    server = SecAggServer(p, list(IDS), 0.0, TIMEOUT)
    with pytest.raises(SecAggError) as err:
        server.receive("p1", MaskedInput(bytes(8 * p.length)), 0.0)
    assert err.value.reason == SecAggReason.BAD_MESSAGE and err.value.peer == "p1"
    with pytest.raises(SecAggError) as err:
        server.receive("stranger", AdvertiseKeys(bytes(32), bytes(32)), 0.0)
    assert err.value.peer == "stranger"
    # A low-order key (here u = 1, of order 1; RFC 7748's list of such points) is refused as it arrives.
    one = (1).to_bytes(32, "little")
    with pytest.raises(SecAggError) as err:
        server.receive("p2", AdvertiseKeys(SecAggClient("p2", p, seeded(2)).advertise().c_pk, one), 0.0)
    assert err.value.reason == SecAggReason.BAD_KEY and err.value.peer == "p2"
    client = SecAggClient("p1", p, seeded(1))
    mine = client.advertise()
    zero = AdvertiseKeys(bytes(32), bytes(32))  # u = 0 is of low order: every secret agrees on 0 with it
    with pytest.raises(SecAggError) as err:
        client.share(Roster((("p1", mine), ("p2", zero), ("p3", zero))))
    assert err.value.reason == SecAggReason.BAD_KEY and err.value.peer == "p2"


def test_the_sum_check_refuses_an_impossible_total_weight() -> None:
    p = params()
    with pytest.raises(SecAggError) as err:
        fedavg_from_sum([0] * p.length, p.bits, 5, 50)
    assert err.value.reason == SecAggReason.SUM_OUT_OF_RANGE


def test_share_keys_that_miss_a_peer_are_refused_naming_the_sender() -> None:
    p = params()
    server = SecAggServer(p, list(IDS[:3]), 0.0, TIMEOUT)
    clients = {pid: SecAggClient(pid, p, seeded(i)) for i, pid in enumerate(IDS[:3])}
    out: list[Outgoing] = []
    for pid, c in clients.items():
        out = server.receive(pid, c.advertise(), 0.0)
    roster = out[0].message
    assert isinstance(roster, Roster)
    good = clients["p1"].share(roster)
    with pytest.raises(SecAggError) as err:
        server.receive("p1", ShareKeys(good.sealed[:1], good.commitments, good.seed_commitment), 0.0)
    assert err.value.reason == SecAggReason.BAD_MESSAGE and err.value.peer == "p1"
