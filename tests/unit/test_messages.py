"""Wire messages: round trips of every type, named errors, and fuzzed input."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weei.core.wire.messages import (
    _TYPES, ArtifactMissing, ArtifactRef, Assign, AssignmentFailed, CheckpointNote, ChunkRef, Deliver, DiagnosticsReport, Direction, Invitation,
    InvitationDecision, JobFinished, Leave, MessageError, MessageReason, ModuleStatus, PauseContribution,
    Piece, Progress, RelayDone, RelayPiece, RelayPlan, RoomChallenge, RoomProof, TrainingStarted, UnitRange, Update,
    UpdateReceipt, decode_message, encode_message, Presence,
)
from weei.core.observe.peer_names import PeerCard

H1, H2, H3 = "a" * 64, "b" * 64, "0123456789abcdef" * 4
REF = ArtifactRef("checkpoint", H1, 64)
GPU_OFFER = {"shaderArchive": {"fileName": "model.wgsl.json", "bytes": 9708, "sha256": H3},
             "backend": {"id": "gpu-webgpu", "estimatedWorkingBytes": 16777216, "numericalMode": "fp32-standard",
                         "requiredFeatures": [], "minimumDeviceLimits": {"maxStorageBuffersPerShaderStage": 5}},
             "cpuBackend": "cpu-wasm-simd"}

SAMPLES = [
    Invitation("job-1", "coord", {"id": "m", "metrics": []}, {"fileName": "m.wasm", "bytes": 10, "sha256": H1}, 0,
               {"epochs": 3}),
    InvitationDecision("job-1", True),
    InvitationDecision("job-1", False),
    Deliver("job-1", ArtifactRef("module", H1, 10), {"id": "m"}),
    Deliver("job-1", ArtifactRef("module", H1, 10), {"id": "m"}, {"reward": ArtifactRef("auxiliary", H2, 16)}),
    ModuleStatus("job-1", True, None, (H1, H2)),
    ModuleStatus("job-1", False, "could not compile"),
    Assign("job-1", 1, "r1-c0", "r1-c0-a1", REF, {"localEpochs": 1, "batchSize": 2}, 2**64 - 1,
           ChunkRef("c0", "syn", 12, ArtifactRef("chunk", H2, 100))),
    Assign("job-1", 7, "r7-u32", "r7-u32-a9", REF, {"localEpochs": 1, "batchSize": 2}, 0, None,
           UnitRange(32, 8, 12345678901234567890, 98765),
           {"old": ArtifactRef("snapshot", H3, 64), "reward": ArtifactRef("auxiliary", H2, 16)}),
    TrainingStarted("job-1", "r1-c0-a1"),
    Update("job-1", 1, "r1-c0", "r1-c0-a1", H1, ArtifactRef("update", H2, 64), {"loss": 0.25, "acc": 1.0}, 12, 3),
    Update("job-1", 2, "r2-u0", "r2-u0-a3", H1, ArtifactRef("update", H2, 64), {}, 0),
    AssignmentFailed("job-1", "r1-c0-a1", "out of memory"),
    UpdateReceipt("job-1", "r1-c0-a1", True),
    UpdateReceipt("job-1", "r1-c0-a1", False, "late-update: closed"),
    PauseContribution("job-1", True),
    Leave("job-1"),
    JobFinished("job-1", False),
    DiagnosticsReport("job-1", {"schemaVersion": 1, "sequence": 3}),
    Progress("job-1", "r1-c0-a1", 5, 12, 40, {"loss": 0.5}),
    Progress("job-1", "r1-c0-a1", 12, 12, 90),
    # The WGSL archive for remote participants (docs/wire.md): announced, asked for, sent with an Assign.
    Deliver("job-1", ArtifactRef("module", H1, 10), {"id": "m"}, {}, GPU_OFFER),
    ModuleStatus("job-1", True, None, (H1,), True),
    Assign("job-1", 2, "r2-c1", "r2-c1-a1", REF, {"localEpochs": 1, "batchSize": 2}, 3,
           ChunkRef("c1", "syn", 12, ArtifactRef("chunk", H2, 100)), shader_archive=ArtifactRef("wgsl", H3, 9708)),
    # A checkpoint's summary for the participants' windows (docs/wire.md, "Checkpoint notes").
    CheckpointNote("job-1", 3, H1, 456, "m-round-3.weei-checkpoint", 300, {"loss": 0.5}, 1.7e12),
    CheckpointNote("job-1", 0, H2, 456, "m-round-0.weei-checkpoint", 0, {}, 0.0, {"acc": 0.9}, 32, None),
    CheckpointNote("job-1", 4, H3, 456, "m-round-4.weei-checkpoint", 64, {"loss": 0.4}, 1.7e12, None, None,
                   "the model failed: out of memory"),
    # The checkpoint relay (docs/wire.md, "Relayed broadcast").
    RelayPlan("job-1", 3, H1, 30, "coord", ("p2", "p3"), (Piece(H2, 20), Piece(H3, 10))),
    RelayPlan("job-1", 3, H1, 30, "p1", (), (Piece(H2, 30),)),
    RelayPiece("job-1", 3, H1, 1, ArtifactRef("checkpoint", H3, 10)),
    RelayDone("job-1", 3, H1, "p1", True),
    RelayDone("job-1", 3, H1, "p1", False, "bad-piece: piece 1 is not the one the plan lists"),
    # The coordinator proves the room key (docs/agent.md).
    RoomChallenge("job-1", H3),
    RoomProof("job-1", H2),
    RoomProof("job-1"),
    # A participant asks for an artifact a message named as held (issue 24); a decline says why.
    ArtifactMissing("job-1", H2),
    InvitationDecision("job-1", False, "this peer coordinates job job-2"),
    # Names (core/observe/peer_names.py): a peer's card; the coordinator's name in an invitation.
    Presence(PeerCard("Chrome on Linux", agent=False, activity="coordinating", job="Digits")),
    Presence(PeerCard("Weei agent on Linux", agent=True)),
    Invitation("job-2", "coord", {"id": "m", "metrics": []}, {"fileName": "m.wasm", "bytes": 10, "sha256": H1}, 0,
               {"epochs": 3}, "Ana's laptop"),
]


def test_every_type_has_a_sample() -> None:
    assert {type(m).TYPE for m in SAMPLES} == set(_TYPES)


def test_each_type_knows_its_direction() -> None:
    # Written out by hand (the spec's message flow), not derived from the classes.
    to_participant = {"invitation", "deliver", "assign", "updateReceipt", "jobFinished", "checkpoint", "relayPlan",
                      "relayPiece", "roomProof"}
    to_coordinator = {"invitationDecision", "moduleStatus", "trainingStarted", "update", "assignmentFailed",
                      "pauseContribution", "leave", "diagnostics", "progress", "relayDone", "roomChallenge", "artifactMissing"}
    any_peer = {"presence"}  # outside a job: a peer's name and what it does
    assert to_participant | to_coordinator | any_peer == set(_TYPES)
    for kind, cls in _TYPES.items():
        want = Direction.TO_PARTICIPANT if kind in to_participant else Direction.ANY_PEER if kind in any_peer \
            else Direction.TO_COORDINATOR
        assert cls.DIRECTION is want, kind


def test_errors_name_the_field_and_keep_the_wire_reason() -> None:
    obj = json.loads(json.dumps(encode_message(SAMPLES[10])))  # a copy: the message shares its dicts
    obj["weights"]["sha256"] = "A" * 64
    with pytest.raises(MessageError) as err:
        decode_message(obj)
    assert err.value.reason == "bad-field" == MessageReason.BAD_FIELD
    assert type(err.value.reason) is str
    assert err.value.message.startswith("message.weights.sha256:")
    obj = json.loads(json.dumps(encode_message(SAMPLES[10])))  # a copy: the message shares its dicts
    obj["metrics"]["loss"] = None
    with pytest.raises(MessageError) as err:
        decode_message(obj)
    assert err.value.reason == "non-finite-metric" and "message.metrics.loss:" in err.value.message


@pytest.mark.parametrize("message", SAMPLES, ids=[f"{type(m).__name__}-{i}" for i, m in enumerate(SAMPLES)])
def test_round_trip(message: Any) -> None:
    obj = encode_message(message)
    assert obj["type"] == type(message).TYPE
    text = json.dumps(obj)
    assert decode_message(json.loads(text)) == message
    # the JSON form is stable: encoding the decoded message gives the same text
    assert json.dumps(encode_message(decode_message(json.loads(text)))) == text


def test_seeds_travel_as_decimal_strings() -> None:
    obj = encode_message(SAMPLES[8])
    assert obj["seed"] == "0" and obj["experience"]["seed"] == "12345678901234567890"
    assert encode_message(SAMPLES[7])["seed"] == str(2**64 - 1)


def _valid(kind: type) -> dict[str, Any]:
    return encode_message(next(m for m in SAMPLES if isinstance(m, kind)))


def _with(kind: type, **changes: Any) -> dict[str, Any]:
    obj = _valid(kind)
    for key, value in changes.items():
        if value is _DROP:
            obj.pop(key)
        else:
            obj[key] = value
    return obj


_DROP = object()

BAD = [
    ([], "not-an-object"),
    ("update", "not-an-object"),
    ({"type": "nope"}, "unknown-type"),
    ({"type": 3}, "unknown-type"),
    ({}, "unknown-type"),
    (_with(Update, jobId=""), "bad-field"),
    (_with(Update, jobId="x" * 257), "bad-field"),
    (_with(Update, round=0), "bad-field"),
    (_with(Update, round=1.5), "bad-field"),
    (_with(Update, round=True), "bad-field"),
    (_with(Update, count=-1), "bad-field"),
    (_with(Update, baseCheckpoint="A" * 64), "bad-field"),
    (_with(Update, weights={"kind": "weird", "sha256": H1, "bytes": 4}), "bad-field"),
    (_with(Update, weights=None), "bad-field"),
    (_with(Update, metrics={"loss": "1"}), "non-finite-metric"),
    (_with(Update, metrics={"loss": 1e400}), "non-finite-metric"),
    (_with(Update, metrics={"loss": 10**400}), "non-finite-metric"),
    (_with(Update, metrics={f"m{i}": 1 for i in range(65)}), "bad-field"),
    (_with(Update, optimizerSteps=-2), "bad-field"),
    (_with(Assign, seed=5), "bad-field"),
    (_with(Assign, seed="018"), "bad-field"),
    (_with(Assign, seed=str(2**64)), "bad-field"),
    (_with(Assign, experience={"unitStart": 0, "unitCount": 8, "seed": "1"}), "bad-field"),  # chunk and range
    (_with(Assign, chunk=_DROP), "bad-field"),  # neither
    (_with(Assign, auxiliary={str(i): REF.to_json() for i in range(9)}), "bad-field"),
    (_with(Assign, chunk={"id": "c", "format": "f", "exampleCount": 1, "data": "x"}), "bad-field"),
    (_with(Assign, shaderArchive=ArtifactRef("chunk", H3, 10).to_json()), "bad-field"),  # not a wgsl artifact
    (_with(Assign, shaderArchive=ArtifactRef("wgsl", H3, 4 * 2**20 + 1).to_json()), "bad-field"),  # over 4 MiB
    (_with(Deliver, gpu=[]), "bad-field"),
    (_with(Deliver, gpu={**GPU_OFFER, "shaderArchive": {**GPU_OFFER["shaderArchive"], "sha256": "x"}}), "bad-field"),
    (_with(Deliver, gpu={**GPU_OFFER, "shaderArchive": {**GPU_OFFER["shaderArchive"], "bytes": 0}}), "bad-field"),
    (_with(Deliver, gpu={**GPU_OFFER, "backend": {**GPU_OFFER["backend"], "numericalMode": "fp16"}}), "bad-field"),
    (_with(Deliver, gpu={**GPU_OFFER, "backend": {**GPU_OFFER["backend"], "requiredFeatures": ["f"] * 33}}),
     "bad-field"),
    (_with(Deliver, gpu={**GPU_OFFER, "backend": {**GPU_OFFER["backend"], "minimumDeviceLimits": {"x": -1}}}),
     "bad-field"),
    (_with(Deliver, gpu={**GPU_OFFER, "backend": _DROP}), "bad-field"),
    (_with(ModuleStatus, fetchShaderArchive="yes"), "bad-field"),
    (_with(ModuleStatus, held="abc"), "bad-field"),
    (_with(ModuleStatus, held=["abc"]), "bad-field"),
    (_with(ModuleStatus, loaded="yes"), "bad-field"),
    (_with(Invitation, module={"sha256": "x", "bytes": 1}), "bad-field"),
    (_with(AssignmentFailed, error="e" * 2001), "bad-field"),
    (_with(UpdateReceipt, accepted=1), "bad-field"),
    (_with(JobFinished, incomplete=None), "bad-field"),
    (_with(DiagnosticsReport, snapshot=[]), "bad-field"),
    (_with(Progress, processedExamples=13), "bad-field"),  # more than the total
    (_with(Progress, processedExamples=-1), "bad-field"),
    (_with(Progress, totalExamples=_DROP), "bad-field"),
    (_with(Progress, totalExamples=2**53), "bad-field"),
    (_with(Progress, attemptId="a" * 257), "bad-field"),
    (_with(Progress, metrics={"loss": 1e400}), "non-finite-metric"),
    (_with(Progress, metrics={"loss": None}), "non-finite-metric"),
    (_with(Progress, metrics={f"m{i}": 1 for i in range(65)}), "bad-field"),
    (_with(Progress, metrics=[1]), "bad-field"),
    (_with(Progress, elapsedMs=-5), "bad-field"),
    (_with(Progress, elapsedMs=_DROP), "bad-field"),
]


@pytest.mark.parametrize("obj, reason", BAD, ids=[f"{r}-{i}" for i, (_, r) in enumerate(BAD)])
def test_bad_messages_raise_message_error(obj: Any, reason: str) -> None:
    with pytest.raises(MessageError) as err:
        decode_message(obj)
    assert err.value.reason == reason


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.sampled_from([10**400, -(10**400), 2**64, 2**53 + 1])
    | st.floats(allow_nan=False) | st.text(max_size=70),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=5),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(JSON)
def test_fuzzed_json_raises_only_message_error(value: Any) -> None:
    try:
        decode_message(value)
    except MessageError:
        pass


def _paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix] if prefix else []
    if isinstance(obj, dict):
        for key, value in obj.items():
            out += _paths(value, prefix + (key,))
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            out += _paths(value, prefix + (i,))
    return out


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(SAMPLES), st.data(), JSON)
def test_mutated_valid_messages_raise_only_message_error(message: Any, data: Any, value: Any) -> None:
    obj = encode_message(message)
    paths = _paths(obj)
    path = data.draw(st.sampled_from(paths))
    mutated = copy.deepcopy(obj)
    target = mutated
    for key in path[:-1]:
        target = target[key]
    if data.draw(st.booleans()) and isinstance(target, dict):
        del target[path[-1]]
    else:
        target[path[-1]] = value
    try:
        decoded = decode_message(json.loads(json.dumps(mutated)))
    except MessageError:
        return
    # whatever got through is a well-formed message that round-trips
    assert decode_message(json.loads(json.dumps(encode_message(decoded)))) == decoded
