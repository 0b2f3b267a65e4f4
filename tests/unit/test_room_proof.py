"""A coordinator proves the room key to a participant (issue 9, "rooms with keys"; core/links/room_proof.py).

The participant's side runs under simulated time (``now`` passed in); the
coordinator's side is a real TrainingController on the demo's in-memory
network, whose answer is read off the wire as JSON text.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os

import pytest

from weei.api import TrainingController
from weei.core.wire.messages import MessageError, RoomChallenge, RoomProof, decode_message, encode_message
from weei.core.links.room_proof import (NONCE_BYTES, PROOF_TIMEOUT_MS, PROOF_TRANSITIONS, CoordinatorProofs, ProofIgnored,
                                        ProofState, RoomProofReason, answer_challenge, proof_key, room_proof)
from weei.core.states import IllegalTransition, move
from weei.demo.network import MemoryNetwork
from weei.host.memory_storage import MemoryStorage
from weei.runtime.wasmtime_engine import WasmtimeEngine

from test_controller import DIGITS_SETTINGS, networked, on_network, package

ROOM = "mpoR7H63X6xKwHt3XTxFIA"
COORD, AGENT, OTHER = "c" * 26, "a" * 26, "o" * 26
N1, N2 = bytes(range(NONCE_BYTES)), bytes(range(100, 100 + NONCE_BYTES))
T0 = 1_000_000.0


def challenge(proofs: CoordinatorProofs, job: str = "job-1", coordinator: str = COORD, nonce: bytes = N1,
              now: float = T0) -> RoomChallenge:
    send = proofs.challenge(job, coordinator, nonce, now)
    assert send.peer == coordinator and isinstance(send.message, RoomChallenge)
    return send.message


def answer(room: str, c: RoomChallenge, coordinator: str = COORD, participant: str = AGENT) -> RoomProof:
    """What a coordinator holding ``room`` sends back to ``participant``."""
    return answer_challenge(proof_key(room), coordinator=coordinator, participant=participant, challenge=c)


def test_the_proof_is_an_hmac_under_a_key_derived_from_the_room_key() -> None:
    # Written out from docs/agent.md, independently of the module: pins the wire format.
    key = hmac.new(ROOM.encode(), b"weei-room-proof-key/1", hashlib.sha256).digest()
    assert proof_key(ROOM) == key and key != ROOM.encode()
    text = json.dumps(["weei-coordinator-proof/1", "job-1", COORD, AGENT, N1.hex()], separators=(",", ":"))
    want = hmac.new(key, text.encode(), hashlib.sha256).hexdigest()
    assert room_proof(key, job_id="job-1", coordinator=COORD, participant=AGENT, nonce=N1.hex()) == want
    # the key itself never travels: not in the challenge, not in the proof
    c = RoomChallenge("job-1", N1.hex())
    for message in (c, answer(ROOM, c)):
        text = json.dumps(encode_message(message))
        assert ROOM not in text and key.hex() not in text


def test_a_good_proof_is_accepted_once() -> None:
    proofs = CoordinatorProofs(proof_key(ROOM), AGENT)
    c = challenge(proofs)
    assert proofs.deadline("job-1") == T0 + PROOF_TIMEOUT_MS
    verdict = proofs.on_proof(COORD, answer(ROOM, c), T0 + 5)
    assert not isinstance(verdict, ProofIgnored)
    assert verdict.proven and verdict.state is ProofState.PROVEN and verdict.reason is None
    assert (verdict.job_id, verdict.coordinator) == ("job-1", COORD) and "proved the room key" in verdict.message
    # A nonce is answered once: the same proof again decides nothing, and nothing is left to time out.
    assert isinstance(proofs.on_proof(COORD, answer(ROOM, c), T0 + 6), ProofIgnored)
    assert proofs.pending() == [] and proofs.expire(T0 + 10 * PROOF_TIMEOUT_MS) == []


def test_a_proof_under_another_room_key_is_refused() -> None:
    proofs = CoordinatorProofs(proof_key(ROOM), AGENT)
    c = challenge(proofs)
    verdict = proofs.on_proof(COORD, answer("another-room-key", c), T0 + 5)
    assert not isinstance(verdict, ProofIgnored)
    assert not verdict.proven and verdict.state is ProofState.REFUSED
    assert verdict.reason == RoomProofReason.MISMATCH == "room-proof-mismatch"


@pytest.mark.parametrize("replayed", ["nonce", "participant", "coordinator", "job"])
def test_a_proof_made_for_another_nonce_peer_or_job_is_refused(replayed: str) -> None:
    """The attacker holds a genuine proof of the right key, made for another exchange, and sends it
    from the challenged coordinator's place, for the challenged job."""
    key = proof_key(ROOM)
    proofs = CoordinatorProofs(key, AGENT)
    c = challenge(proofs, nonce=N2)
    fields = {"job_id": "job-1", "coordinator": COORD, "participant": AGENT, "nonce": N2.hex()}
    fields.update({"nonce": {"nonce": N1.hex()}, "participant": {"participant": OTHER},
                   "coordinator": {"coordinator": OTHER}, "job": {"job_id": "job-0"}}[replayed])
    old = room_proof(key, **fields)
    assert old != answer(ROOM, c).proof
    verdict = proofs.on_proof(COORD, RoomProof("job-1", old), T0 + 5)
    assert not isinstance(verdict, ProofIgnored) and verdict.reason is RoomProofReason.MISMATCH


def test_a_coordinator_without_the_key_is_refused_as_missing() -> None:
    proofs = CoordinatorProofs(proof_key(ROOM), AGENT)
    c = challenge(proofs)
    no_key = answer_challenge(None, coordinator=COORD, participant=AGENT, challenge=c)
    assert no_key == RoomProof("job-1") and "proof" not in encode_message(no_key)
    verdict = proofs.on_proof(COORD, no_key, T0 + 5)
    assert not isinstance(verdict, ProofIgnored) and verdict.reason == RoomProofReason.MISSING == "room-proof-missing"


def test_no_answer_in_time_is_refused_as_timeout_and_a_late_proof_is_too() -> None:
    proofs = CoordinatorProofs(proof_key(ROOM), AGENT, timeout_ms=1000)
    challenge(proofs)
    assert proofs.expire(T0 + 1000) == []  # at the deadline itself it is still open
    [verdict] = proofs.expire(T0 + 1000.5)
    assert verdict.reason == RoomProofReason.TIMEOUT == "room-proof-timeout" and "within 1 s" in verdict.message
    assert proofs.pending() == []
    # a right proof arriving after the deadline (before anyone called expire) is a timeout as well
    c = challenge(proofs, job="job-2", nonce=N2)
    late = proofs.on_proof(COORD, answer(ROOM, c), T0 + 1001)
    assert not isinstance(late, ProofIgnored) and late.reason is RoomProofReason.TIMEOUT


def test_proofs_from_other_peers_or_for_other_jobs_decide_nothing() -> None:
    """Another member of the room cannot make the agent refuse (or accept) the real coordinator."""
    proofs = CoordinatorProofs(proof_key(ROOM), AGENT)
    c = challenge(proofs)
    good = answer(ROOM, c)
    # the right proof from the wrong peer (not the challenged coordinator)
    ignored = proofs.on_proof(OTHER, good, T0 + 1)
    assert ignored == ProofIgnored(OTHER, "job-1") and ignored.reason == "room-proof-unsolicited"
    assert proofs.on_proof(OTHER, RoomProof("job-1"), T0 + 1) == ProofIgnored(OTHER, "job-1")
    # a proof for a job nobody asked about
    assert isinstance(proofs.on_proof(COORD, RoomProof("job-9", good.proof), T0 + 2), ProofIgnored)
    assert proofs.pending() == ["job-1"]
    verdict = proofs.on_proof(COORD, good, T0 + 3)
    assert not isinstance(verdict, ProofIgnored) and verdict.proven


def test_a_new_challenge_of_the_job_replaces_the_open_one() -> None:
    proofs = CoordinatorProofs(proof_key(ROOM), AGENT)
    first = challenge(proofs, nonce=N1)
    challenge(proofs, nonce=N2, now=T0 + 10)
    verdict = proofs.on_proof(COORD, answer(ROOM, first), T0 + 11)  # the answer to the replaced nonce
    assert not isinstance(verdict, ProofIgnored) and verdict.reason is RoomProofReason.MISMATCH


def test_a_challenge_needs_a_full_nonce() -> None:
    with pytest.raises(ValueError):
        CoordinatorProofs(proof_key(ROOM), AGENT).challenge("job-1", COORD, b"\0" * 8, T0)


def test_the_transitions_are_a_table_and_a_decided_challenge_moves_no_more() -> None:
    assert set(PROOF_TRANSITIONS) == {ProofState.CHALLENGED}
    assert {e: move("room proof", PROOF_TRANSITIONS, ProofState.CHALLENGED, e) for e in PROOF_TRANSITIONS[
        ProofState.CHALLENGED]} == {"valid-proof": ProofState.PROVEN, "wrong-proof": ProofState.REFUSED,
                                    "no-proof": ProofState.REFUSED, "deadline": ProofState.REFUSED}
    for done in (ProofState.PROVEN, ProofState.REFUSED):
        with pytest.raises(IllegalTransition):
            move("room proof", PROOF_TRANSITIONS, done, "valid-proof")


@pytest.mark.parametrize("obj", [
    {"type": "roomChallenge", "jobId": "job-1"},
    {"type": "roomChallenge", "jobId": "job-1", "nonce": "AB" * 32},
    {"type": "roomChallenge", "jobId": "job-1", "nonce": "ab" * 16},
    {"type": "roomChallenge", "jobId": 7, "nonce": "ab" * 32},
    {"type": "roomProof", "jobId": "job-1", "proof": "zz" * 32},
    {"type": "roomProof", "jobId": "job-1", "proof": ["ab" * 32]},
    {"type": "roomProof", "jobId": "x" * 300},
])
def test_malformed_challenges_and_proofs_are_refused_by_name(obj: dict[str, object]) -> None:
    with pytest.raises(MessageError) as err:
        decode_message(obj)
    assert err.value.reason == "bad-field"


def _controller(network: MemoryNetwork, engine: WasmtimeEngine, peer: str, room_key: str | None, *,
                storage: MemoryStorage | None = None) -> TrainingController:
    """A real controller on the in-memory network, holding ``room_key`` (None: keyless)."""
    return networked(network, engine, peer, storage=storage or MemoryStorage(), room_key=room_key)


def test_a_coordinator_in_the_room_answers_its_own_job_only_and_without_a_key_says_so() -> None:
    """The real controller's answer, as JSON text on the demo's in-memory network."""
    async def main(network: MemoryNetwork, engine: WasmtimeEngine) -> None:
        def make(peer: str, room_key: str | None) -> TrainingController:
            return _controller(network, engine, peer, room_key)

        keyed, keyless = make(COORD, ROOM), make(OTHER, None)
        network.transport(AGENT)  # the asking participant: its inbox is read here, as text off the wire
        network.transport("uninvited")
        inbox = network.inboxes[AGENT]

        async def next_message() -> tuple[str, str]:
            # Peers' presence cards (names, docs/api.md) come to every connected peer: not what this test reads.
            while True:
                src, text, _ = await asyncio.wait_for(inbox.get(), 30)
                if json.loads(text)["type"] != "presence":
                    return src, text

        def only_presence(q: asyncio.Queue) -> bool:  # type: ignore[type-arg]
            while not q.empty():
                if json.loads(q.get_nowait()[1])["type"] != "presence":
                    return False
            return True

        async def ask(coordinator: str, job_id: str, nonce: bytes, proofs: CoordinatorProofs) -> object:
            network.post(AGENT, proofs.challenge(job_id, coordinator, nonce, T0), {})
            src, text = await next_message()
            assert src == coordinator
            message = decode_message(json.loads(text))
            assert isinstance(message, RoomProof)
            return proofs.on_proof(src, message, T0 + 1)

        for c in (keyed, keyless):
            await c.init()
        job_id = await keyed.create_job(**package("digits-mlp"), settings={**DIGITS_SETTINGS, "epochs": 1})
        other_job = await keyless.create_job(**package("digits-mlp"), settings={**DIGITS_SETTINGS, "epochs": 1})
        for c in (keyed, keyless):
            c.invite(AGENT)
            src, text = await next_message()
            assert (src, json.loads(text)["type"]) == (c.my_peer_id, "invitation")
        proofs = CoordinatorProofs(proof_key(ROOM), AGENT)
        verdict = await ask(COORD, job_id, N1, proofs)
        assert not isinstance(verdict, ProofIgnored) and verdict.proven
        verdict = await ask(OTHER, other_job, N2, proofs)
        assert not isinstance(verdict, ProofIgnored) and verdict.reason is RoomProofReason.MISSING
        # a challenge for a job the coordinator does not run gets no answer, only a line in its log
        network.post(AGENT, proofs.challenge("not-its-job", COORD, N2, T0), {})
        # nor does one from a peer the coordinator never invited
        stranger = CoordinatorProofs(proof_key(ROOM), "uninvited")
        network.post("uninvited", stranger.challenge(job_id, COORD, N1, T0), {})
        await asyncio.sleep(0.2)
        assert only_presence(inbox) and only_presence(network.inboxes["uninvited"])
        assert [v.reason for v in proofs.expire(T0 + PROOF_TIMEOUT_MS + 1)] == [RoomProofReason.TIMEOUT]
        events = [(e["event"], e.get("details", {})) for e in keyed.get_debug_log()["events"]]
        answered = [d for e, d in events if e == "room.challenge.answered"]
        assert answered == [{"from": AGENT, "jobId": job_id, "proof": True}]
        ignored = [(d["from"], d["jobId"]) for e, d in events if e == "room.challenge.ignored"]
        assert ignored == [(AGENT, "not-its-job"), ("uninvited", job_id)], ignored

    on_network(main)


def test_a_participant_in_a_keyed_room_accepts_only_a_coordinator_that_proves_the_key() -> None:
    """decideInvitation(job, true) in a keyed room (a page, the agent): the proof first, else a decline."""
    from weei.core.errors import UsageError

    async def main(network: MemoryNetwork, engine: WasmtimeEngine) -> None:
        def make(peer: str, room_key: str | None) -> TrainingController:
            return _controller(network, engine, peer, room_key)

        keyed, keyless = make("keyed", ROOM), make("keyless", None)
        member, stranger, member2, plain = make("member", ROOM), make("stranger", "other-room"), \
            make("member2", ROOM), make("plain", None)
        peers = (keyed, keyless, member, stranger, member2, plain)
        for c in peers:
            await c.init()
        job = await keyed.create_job(**package("digits-mlp"), settings={**DIGITS_SETTINGS, "epochs": 1})
        other = await keyless.create_job(**package("digits-mlp"), settings={**DIGITS_SETTINGS, "epochs": 1})
        for c, who in ((keyed, "member"), (keyed, "stranger"), (keyless, "member2"), (keyless, "plain")):
            c.invite(who)
        await network.settle()

        await member.decide_invitation(job, True)
        with pytest.raises(UsageError) as mismatch:
            await stranger.decide_invitation(job, True)
        with pytest.raises(UsageError) as missing:
            await member2.decide_invitation(other, True)
        await plain.decide_invitation(other, True)  # no room key, nothing to prove: as before
        await network.settle()

        assert mismatch.value.reason == "room-proof-mismatch" and missing.value.reason == "room-proof-missing"
        assert "holds no room key" in missing.value.message
        states = {p: c.get_state()["job"]["participants"][p]["state"]
                  for c, p in ((keyed, "member"), (keyed, "stranger"), (keyless, "member2"), (keyless, "plain"))}
        assert states["stranger"] == states["member2"] == "declined", states
        assert states["member"] != "declined" and states["plain"] != "declined", states
        assert member.participant is not None and stranger.participant is None and member2.participant is None
        refused = [e["details"] for e in stranger.get_debug_log()["events"] if e["event"] == "room.proof.refused"]
        assert [(d["reason"], d["coordinator"], d["jobId"]) for d in refused] == [
            ("room-proof-mismatch", "keyed", job)]
        asked = [e for c in peers for e in c.get_debug_log()["events"] if e["event"] == "room.proof.asked"]
        assert len(asked) == 3  # member, stranger, member2; plain asked nothing

    on_network(main)


def test_a_silent_coordinator_times_out_by_name() -> None:
    """The asyncio side of the check (api/room_check.py): a challenge nobody answers ends as a timeout."""
    from weei.api.room_check import RoomCheck

    sent: list[object] = []
    log: list[tuple[str, dict[str, object]]] = []
    check = RoomCheck(proof_key(ROOM), AGENT, sent.append, lambda e, d: log.append((e, dict(d))), os.urandom,
                      timeout_ms=200)
    heard: list[object] = []
    check.listeners.append(heard.append)
    verdict = asyncio.run(asyncio.wait_for(check.prove("job-1", COORD), 30))
    assert verdict.reason is RoomProofReason.TIMEOUT and heard == [verdict]
    [send] = sent
    assert isinstance(send.message, RoomChallenge) and send.peer == COORD
    assert [e for e, _ in log] == ["room.proof.asked", "room.proof.refused"]
    assert log[1][1]["reason"] == "room-proof-timeout"
    # the answer that comes too late decides nothing more
    check.received(COORD, answer(ROOM, send.message))
    assert log[-1][0] == "room.proof.ignored" and heard == [verdict]
