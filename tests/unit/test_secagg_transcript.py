"""What a curious coordinator of a securely aggregated job learns: the sum, nothing else (docs/privacy.md,
"What it protects against"), shown on a whole job in memory under simulated time.

Two worlds of one job, every party's randomness the same (each participant's random source seeded, the
coordinator's job seed fixed): the participants' updates differ, their sum does not. p1 and p2 train on each
other's data in world 2 (same chunk sizes, so their weighted, encoded vectors swap and the ring sum is the same
integers); where p5 sends its masked vector too late to count, its update differs as well. A tap on the real
Coordinator records everything it receives (messages and the bytes beside them); what it writes (checkpoint
files, log, round phases, messages, its job record and checkpoints as the job store saves them, its state) is
compared too. Five participants, t = 3; three variants: all contribute; p5 vanishes after masking (its vector
counts, its shares never come); p5's round-1 vector comes late, once the coordinator asked for the shares (it
then holds that vector and p5's secret key). Shown for each:

1. everything but the masked vectors is byte-identical across the worlds, and so is everything it writes;
2. each masked vector moves by exactly the change of its encoding (computed on the participant's side): the
   world-2 view is the world-1 view with the pairwise mask of p1 and p2 re-chosen (m -> m + x_p2 - x_p1, a
   bijection of its uniform distribution) and the late vector's self mask re-chosen likewise; the masks
   re-chosen are among those the coordinator never learns (3), so the two views have the same distribution;
3. per round, it receives self-mask-seed shares or secret-key shares of a participant, never both;
4. with everything it received it rebuilds what it may (the revealed self masks, the dropped peers' pairwise
   masks; the same computation recovers the sum exactly) and still holds nothing correlated with any update's
   encoding, and the transcript contains no update's clear bytes.
"""

from __future__ import annotations

import asyncio
import json
import random
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from secure_sim import PEERS, encoding, events, expected_round, lose, secure_spec
from sim import JOB_ID, Sim, roundtrip
from weei.api.job_store import JobStore
from weei.core.job.participant import TrainOutcome
from weei.core.job.secure_round import SECAGG_PHASE_TIMEOUT_MS, SecureTerms, round_tag
from weei.core.privacy import fixedpoint, prg, shamir
from weei.core.privacy.secagg import _pair_seed
from weei.core.privacy.x25519 import KEY_BYTES, x25519
from weei.core.wire.messages import (
    Assign, Message, SecAggKeys, SecAggMasked, SecAggReveal, SecAggRoster, SecAggShares, encode_message,
)
from weei.host.memory_storage import MemoryStorage

WEIGHTS = 1024  # a vector of 1,025 ring elements: enough for the correlation statistic to mean something
JOB_SEED = 7
A, B, LATE = "p1", "p2", "p5"
MOD = fixedpoint.MODULUS

Key = tuple[int, int]  # (round, opening)


@dataclass
class World:
    """One run of the job: what the coordinator received, and what each participant encoded (its side)."""

    sim: Sim
    received: list[tuple[float, str, Message, dict[str, bytes]]] = field(default_factory=list)
    encoded: dict[tuple[str, int, int], list[int]] = field(default_factory=dict)  # (peer, round, opening)
    outcomes: dict[str, TrainOutcome] = field(default_factory=dict)  # attempt id -> what it trained


def run(variant: str, world: int) -> World:
    """The job of ``variant`` in ``world`` (1 or 2)."""
    chunks = {"all": 10, "vanish-after-masking": 10, "late-masked-vector": 6}[variant]
    spec, store = secure_spec(chunks, spec={"weight_count": WEIGHTS, "examples": lambda i: 10})
    out = World(Sim.create(spec, store, job_seed=JOB_SEED))
    sim = out.sim
    sim.coordinator.stopwatch = lambda: sim.now  # round phases in simulated time
    receive = sim.coordinator.receive
    held: list[tuple[Message, dict[str, bytes]]] = []  # p5's round-1 vector, late

    def tap(peer: str, message: Message, blobs: Any, now: float) -> None:
        if held and isinstance(message, SecAggReveal):  # it comes once the coordinator asked for the shares
            late, late_blobs = held.pop()
            tap(LATE, roundtrip(late), late_blobs, now)
        out.received.append((now, peer, message, {k: bytes(v) for k, v in blobs.items()}))
        receive(peer, message, blobs, now)

    sim.coordinator.receive = tap  # type: ignore[method-assign]
    # Whose data each participant trains on: world 2 swaps p1's and p2's (in every round where both train, all
    # of them here) and, where p5's round-1 vector comes late, gives p5 other data in that round.
    swap_rounds = {1} if variant == "late-masked-vector" else {1, 2}
    data = ({(A, r): B for r in swap_rounds} | {(B, r): A for r in swap_rounds}) if world == 2 else {}
    if world == 2 and variant == "late-masked-vector":
        data[(LATE, 1)] = "elsewhere"

    def trainer(peer: str) -> Callable[[Assign, bytes, TrainOutcome], TrainOutcome]:
        def train(assign: Assign, start: bytes, default: TrainOutcome) -> TrainOutcome:
            rng = np.random.default_rng(zlib.crc32(f"{data.get((peer, assign.round), peer)}/{assign.round}".encode()))
            trained = (np.frombuffer(start, "<f4") + rng.standard_normal(WEIGHTS) * 2e-3).astype("<f4").tobytes()
            terms = SecureTerms.from_settings(assign.settings)
            assert terms is not None
            out.encoded[(peer, assign.round, terms.opening)] = encoding(assign, start, trained, default.count)
            outcome = out.outcomes[assign.attempt_id] = TrainOutcome(trained, default.metrics, default.count)
            return outcome
        return train

    for peer in PEERS:
        sim.add_peer(peer, random_bytes=random.Random(f"{peer}/randomness").randbytes)
        sim.behaviour[peer] = trainer(peer)
        sim.join(peer)
    if variant == "vanish-after-masking":
        sim.tamper.update(lose(SecAggReveal, {LATE}))  # its masked vector counts; its shares never come
    elif variant == "late-masked-vector":
        def hold(message: Message, blobs: dict[str, bytes]) -> list[tuple[Message, dict[str, bytes]]]:
            if isinstance(message, SecAggMasked) and message.round == 1:
                held.append((message, blobs))
                return []
            return [(message, blobs)]
        sim.tamper[LATE] = hold
    sim.coordinator.start(sim.now)
    sim.pump()
    for _ in range(5):
        if sim.coordinator.status == "completed":
            break
        sim.advance(SECAGG_PHASE_TIMEOUT_MS)
    assert sim.coordinator.status == "completed" and not held
    return out


def wire(message: Message) -> str:
    return json.dumps(encode_message(message), sort_keys=True)


def stored(world: World) -> dict[str, Any]:
    """Everything the coordinator writes or says, with the job store's records as the host saves them."""
    sim = world.sim
    storage = MemoryStorage()

    async def save() -> dict[str, dict[str, Any]]:
        jobs = JobStore(storage)
        await jobs.load()
        for command in sim.saved:
            await jobs.save_checkpoint(JOB_ID, command)
        await jobs.save_job_record(sim.coordinator, job_seed=JOB_SEED, validation_sha256=None, now=sim.now)
        return {name: {key: await storage.get(name, key) for key in await storage.keys(name)}
                for name in ("jobs", "checkpoints", "artifacts", "settings")}

    saved = asyncio.run(save())
    assert saved["jobs"] and saved["checkpoints"]
    return {
        "checkpoints": [(s.round, s.file, s.weights_sha256, s.summary) for s in sim.saved],
        "log": [(peer, log.event, log.details) for peer, log in sim.logs if peer == sim.coordinator.my_peer_id],
        "phases": sim.phases,
        "sent": [(d.dst, d.at, wire(d.message), d.attachments) for d in sim.deliveries if d.src == "coord"],
        "storage": saved,
        "state": sim.coordinator.view(sim.now),
    }


def masked(world: World) -> dict[tuple[int, int, str], list[int]]:
    """(round, opening, sender) -> the masked vector received, as ring elements."""
    return {(m.round, m.attempt, peer): fixedpoint.from_bytes(blobs[m.masked.sha256])
            for _, peer, m, blobs in world.received if isinstance(m, SecAggMasked)}


def reveals(world: World, key: Key) -> tuple[dict[str, list[tuple[int, int]]], dict[str, list[tuple[int, int]]]]:
    """The shares revealed in one opening, by dealer, each at its holder's x: (of secret keys, of self-mask seeds)."""
    roster = sorted(keys(world, key))
    key_shares: dict[str, list[tuple[int, int]]] = {}
    seed_shares: dict[str, list[tuple[int, int]]] = {}
    for _, holder, m, _ in world.received:
        if isinstance(m, SecAggReveal) and (m.round, m.attempt) == key:
            for dealer, y, _ in m.reveal.key_shares:
                key_shares.setdefault(dealer, []).append((roster.index(holder) + 1, y))
            for dealer, y, _ in m.reveal.seed_shares:
                seed_shares.setdefault(dealer, []).append((roster.index(holder) + 1, y))
    return key_shares, seed_shares


def keys(world: World, key: Key) -> dict[str, bytes]:
    """U1 of one opening: each participant's published pairwise-mask key."""
    return {peer: bytes(m.keys.s_pk) for _, peer, m, _ in world.received
            if isinstance(m, SecAggKeys) and (m.round, m.attempt) == key}


def contributors(world: World) -> dict[Key, list[str]]:
    return {(e["round"], e["opening"]): e["contributors"] for e in events(world.sim, "secagg.finished")}


def known_masks(world: World, key: Key, sender: str) -> tuple[list[int] | None, list[int]]:
    """What the coordinator can rebuild of ``sender``'s masks in one opening from what it received: the self mask
    (None when no seed shares of it came) and the sum of the signed pairwise masks it knows (with each peer of
    U2 whose secret key was revealed, with all of them when the sender's own was). The pair's seed comes from
    the protocol's own derivation (``_pair_seed``), as the coordinator's unmasking computes it."""
    key_shares, seed_shares = reveals(world, key)
    tag, length, pks = round_tag(JOB_ID, *key), WEIGHTS + 1, keys(world, key)
    u2 = {peer for _, peer, m, _ in world.received if isinstance(m, SecAggShares) and (m.round, m.attempt) == key}
    seed = shamir.combine(seed_shares[sender], prg.SEED_BYTES) if sender in seed_shares else None
    self_mask = fixedpoint.from_bytes(prg.mask_bytes(seed, length)) if seed is not None else None
    pairs = [0] * length
    for peer in sorted(u2 - {sender}):
        holder = sender if sender in key_shares else peer  # whose rebuilt secret key opens the pair's agreement
        if holder not in key_shares:
            continue
        secret = shamir.combine(key_shares[holder], KEY_BYTES)
        shared = x25519(secret, pks[peer if holder == sender else sender])
        mask = fixedpoint.from_bytes(prg.mask_bytes(_pair_seed(tag, shared, sender, peer), length))
        sign = 1 if sender < peer else -1  # the smaller id adds the pair's mask, the other takes it away
        pairs = [(s + sign * m) % MOD for s, m in zip(pairs, mask)]
    return self_mask, pairs


def signed(values: list[int]) -> np.ndarray:
    return np.array([v - MOD if v >= MOD // 2 else v for v in values], dtype=np.float64)


VARIANTS = ["all", "vanish-after-masking", "late-masked-vector"]


@pytest.fixture(scope="module", params=VARIANTS)
def worlds(request: pytest.FixtureRequest) -> tuple[str, World, World]:
    return request.param, run(request.param, 1), run(request.param, 2)


def test_the_two_worlds_have_the_same_sums_of_different_updates(worlds: tuple[str, World, World]) -> None:
    variant, one, two = worlds
    assert one.sim.rounds == two.sim.rounds and len(one.sim.rounds) >= 3
    for world in (one, two):
        for (round_, _), who in contributors(world).items():
            # Each checkpoint is the FedAvg of this world's updates, computed in the clear on the participants' side.
            assert world.sim.checkpoint(round_).weights == expected_round(
                world.sim, round_, who, outcome=lambda assign, _, w=world: w.outcomes[assign.attempt_id])
    differ = {k for k in one.encoded if one.encoded[k] != two.encoded[k]}
    swapped = {(A, 1, 1), (B, 1, 1)} | ({(A, 2, 1), (B, 2, 1)} if variant != "late-masked-vector" else set())
    assert one.encoded.keys() == two.encoded.keys()
    assert differ == swapped | ({(LATE, 1, 1)} if variant == "late-masked-vector" else set())
    for peer, round_, opening in swapped:
        assert peer in contributors(one)[(round_, opening)]
    if variant == "vanish-after-masking":
        assert all(LATE in c for c in contributors(one).values())  # its vectors counted; its shares never came
        assert {m.threshold for m in one.sim.messages(SecAggRoster, dst=A)} == {3}
        assert not [m for _, peer, m, _ in one.received if peer == LATE and isinstance(m, SecAggReveal)]
    if variant == "late-masked-vector":
        assert LATE not in contributors(one)[(1, 1)] and (1, 1, LATE) in masked(one)
        assert [(e["peer"], e["reason"]) for e in events(one.sim, "secagg.refused")] == [(LATE, "secagg-bad-message")]


def test_everything_but_the_masked_vectors_is_byte_identical_and_so_is_all_the_coordinator_writes(
        worlds: tuple[str, World, World]) -> None:
    _, one, two = worlds

    def transcript(world: World) -> list[tuple[float, str, str, dict[str, bytes]]]:
        # A masked vector's message without its hash (that of the vector), and without the vector.
        return [(now, peer, wire(m).replace(m.masked.sha256, ""), {}) if isinstance(m, SecAggMasked)
                else (now, peer, wire(m), blobs) for now, peer, m, blobs in world.received]

    assert transcript(one) == transcript(two)
    assert {"secaggKeys", "secaggShares", "secaggMasked", "secaggReveal"} <= {m.TYPE for _, _, m, _ in one.received}
    assert masked(one) != masked(two)
    assert stored(one) == stored(two)


def test_the_masked_vectors_differ_by_a_re_choice_of_masks_the_coordinator_never_learns(
        worlds: tuple[str, World, World]) -> None:
    variant, one, two = worlds
    y1, y2 = masked(one), masked(two)
    assert y1.keys() == y2.keys()
    # Every masked vector moved by exactly its encoding's change (the masks are the same draws in both worlds) ...
    for (round_, opening, peer), y in y1.items():
        x1, x2 = one.encoded[(peer, round_, opening)], two.encoded[(peer, round_, opening)]
        assert [(b - a) % MOD for a, b in zip(y, y2[(round_, opening, peer)])] == [(b - a) % MOD for a, b in zip(x1, x2)]
    # ... so the world-2 view is the world-1 view with masks re-chosen: in a round where p1 and p2 swapped, their
    # pairwise mask m (p1 adds it, p2 takes it away) becomes m + x_p2 - x_p1; p5's late vector's self mask
    # PRG(b) becomes PRG(b) + x'_p5 - x_p5. Each is a bijection of a uniform mask in Z_{2^64}^n, so both views
    # have the same distribution, as long as the coordinator cannot compute the mask re-chosen: it never gets the
    # secret key of p1 or p2 (their pairwise mask) nor a share of p5's late self-mask seed.
    rechosen = dict(y1)
    for peer, round_, opening in sorted(k for k in one.encoded if one.encoded[k] != two.encoded[k]):
        key_shares, seed_shares = reveals(one, (round_, opening))
        if peer == A:
            assert not {A, B} & set(key_shares)
            shift = [(b - a) % MOD for a, b in zip(one.encoded[(A, round_, opening)], one.encoded[(B, round_, opening)])]
            rechosen[(round_, opening, A)] = [(v + d) % MOD for v, d in zip(rechosen[(round_, opening, A)], shift)]
            rechosen[(round_, opening, B)] = [(v - d) % MOD for v, d in zip(rechosen[(round_, opening, B)], shift)]
        elif peer == LATE:
            assert variant == "late-masked-vector" and LATE not in seed_shares
            change = [(b - a) % MOD for a, b in zip(one.encoded[(LATE, round_, opening)], two.encoded[(LATE, round_, opening)])]
            rechosen[(round_, opening, LATE)] = [(v + d) % MOD for v, d in zip(rechosen[(round_, opening, LATE)], change)]
        else:
            assert peer == B  # re-chosen with p1's
    assert rechosen == y2


def test_the_coordinator_never_gets_both_kinds_of_share_of_one_participant(worlds: tuple[str, World, World]) -> None:
    variant, one, _ = worlds
    openings = {(m.round, m.attempt) for _, _, m, _ in one.received if isinstance(m, SecAggKeys)}
    assert openings == set(contributors(one))  # every opening completed
    for key in openings:
        key_shares, seed_shares = reveals(one, key)
        assert not set(key_shares) & set(seed_shares)
        # Self-mask seeds of those whose vector counts, secret keys of those who shared but sent none in time.
        assert set(seed_shares) == set(contributors(one)[key])
        assert set(key_shares) == set(keys(one, key)) - set(contributors(one)[key])
    assert (LATE in reveals(one, (1, 1))[0]) == (variant == "late-masked-vector")


def test_what_the_coordinator_can_rebuild_leaves_nothing_of_any_update(worlds: tuple[str, World, World]) -> None:
    _, one, two = worlds
    for world in (one, two):
        vectors = masked(world)
        for (round_, opening, peer), y in vectors.items():
            x = world.encoded[(peer, round_, opening)]
            self_mask, pairs = known_masks(world, (round_, opening), peer)
            rests = [y, [(v - p) % MOD for v, p in zip(y, pairs)]]
            if self_mask is not None:
                rests += [[(r - s) % MOD for r, s in zip(rest, self_mask)] for rest in rests]
            for rest in rests:
                # Uniform in the ring: no element equal to the encoding's, no correlation with it.
                assert not any(r == e for r, e in zip(rest, x))
                assert abs(np.corrcoef(signed(rest), signed(x))[0, 1]) < 0.2
        for key, who in contributors(world).items():
            # Removing what it rebuilt from the contributors' vectors leaves the exact sum of their encodings:
            # known_masks rebuilds as the coordinator does, and all it can.
            total = [0] * (WEIGHTS + 1)
            for peer in who:
                self_mask, pairs = known_masks(world, key, peer)
                assert self_mask is not None
                total = [(t + y - s - p) % MOD for t, y, s, p in zip(total, vectors[(*key, peer)], self_mask, pairs)]
            assert total == [sum(col) % MOD for col in zip(*(world.encoded[(p, *key)] for p in who))]
        # Nor do an update's clear bytes travel: neither its weights nor its encoding.
        received = [blob for _, _, _, blobs in world.received for blob in blobs.values()]
        received += [wire(m).encode() for _, _, m, _ in world.received]
        clear = [o.weights for o in world.outcomes.values()] + [fixedpoint.to_bytes(x) for x in world.encoded.values()]
        assert not any(c in r for c in clear for r in received)
