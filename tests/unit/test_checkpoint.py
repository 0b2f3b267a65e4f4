"""weei.core.formats.checkpoint: the .weei-checkpoint format, every reader check, and the spec's JS reader."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Any

import pytest
from core_samples import dataset_info, experience_info, info_aux
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weei.core.formats.checkpoint import (
    MAX_CHECKPOINT_FILE_BYTES,
    MAX_METADATA_BYTES,
    CheckpointMetadata,
    checkpoint_summary,
    read_checkpoint,
    write_checkpoint,
)
from weei.core.errors import CheckpointError

NODE = shutil.which("node")
N = 114  # float32 values: 456 bytes, the spec's CartPole size
WEIGHTS = struct.pack(f"<{N}f", *[i / 7 - 3 for i in range(N)])


def metadata(**changes: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "version": 1,
        "jobId": "job-1",
        "module": {"artifactId": "m", "fileName": "model.wasm", "bytes": 123351, "sha256": "a" * 64},
        "modelInfo": experience_info(info_aux()),
        "settings": {"epochs": 30, "localEpochs": 1, "batchSize": 16, "coordinatorParticipates": True,
                     "experience": {"unitsPerAssignment": 32}},
        "round": 3,
        "checkpoint": {"artifactId": "c3", "kind": "checkpoint", "fileName": "job-1-round-3.weei-checkpoint",
                       "format": "float32-le", "round": 3},
        "metrics": {"values": {"episodeReturn": 21.5}, "examplesProcessed": 96},
        "incomplete": False,
        "experience": {"jobSeed": "18446744073709551615", "nextUnit": 96},
        "auxiliaryWeights": {"reward": "b" * 64},
    }
    meta.update(changes)
    return meta


def state_of(method: str) -> bytes:
    copies = {"fedavgm": 1, "fedadam": 2}[method]
    return struct.pack(f"<{N * copies}f", *[(i % 13) / 100 for i in range(N * copies)])


def v2_metadata(method: str = "fedadam") -> dict[str, Any]:
    meta = metadata(version=2, aggregationState={"method": method, "step": 2})
    meta["settings"] = {**meta["settings"], "aggregation": {"method": method}}
    return meta


def assemble(meta: dict[str, Any], weights: bytes, state: bytes = b"", fill: bool = True) -> bytes:
    """A file built by hand (no writer checks), with hashes filled in unless told."""
    meta = copy.deepcopy(meta)
    if fill:
        meta["checkpoint"].setdefault("bytes", len(weights))
        meta["checkpoint"].setdefault("sha256", hashlib.sha256(weights).hexdigest())
        if "aggregationState" in meta:
            meta["aggregationState"].setdefault("bytes", len(state))
            meta["aggregationState"].setdefault("sha256", hashlib.sha256(state).hexdigest())
    text = json.dumps(meta).encode()
    return struct.pack("<I", len(text)) + text + weights + state


def reason(data: bytes) -> str:
    with pytest.raises(CheckpointError) as info:
        read_checkpoint(data)
    return info.value.reason


# --------------------------------------------------------------------------- round trips


def test_v1_round_trip() -> None:
    data = write_checkpoint(metadata(), WEIGHTS)
    ck = read_checkpoint(data)
    assert ck.weights == WEIGHTS and ck.state is None
    m = ck.metadata
    assert (m.version, m.round, m.job_id, m.weight_bytes) == (1, 3, "job-1", len(WEIGHTS))
    assert m.weight_sha256 == hashlib.sha256(WEIGHTS).hexdigest()
    assert m.model_info.id == "cartpole-reinforce" and m.settings.epochs == 30
    assert m.experience == {"jobSeed": "18446744073709551615", "nextUnit": 96}
    assert m.auxiliary_weights == {"reward": "b" * 64} and m.aggregation_state is None
    # Writing what was read gives the same bytes.
    assert write_checkpoint(m, ck.weights) == data
    (meta_len,) = struct.unpack_from("<I", data)
    assert data[4 + meta_len:] == WEIGHTS


@pytest.mark.parametrize("method", ["fedavgm", "fedadam"])
def test_v2_round_trip(method: str) -> None:
    state = state_of(method)
    data = write_checkpoint(v2_metadata(method), WEIGHTS, state)
    ck = read_checkpoint(data)
    assert ck.metadata.version == 2 and ck.weights == WEIGHTS and ck.state == state
    agg = ck.metadata.aggregation_state
    assert agg == {"method": method, "step": 2, "bytes": len(state), "sha256": hashlib.sha256(state).hexdigest()}
    assert write_checkpoint(ck.metadata, ck.weights, ck.state) == data
    # Without state the writer writes version 1 and drops aggregationState.
    v1 = read_checkpoint(write_checkpoint(ck.metadata, ck.weights))
    assert v1.metadata.version == 1 and v1.metadata.aggregation_state is None


def test_unknown_metadata_fields_survive() -> None:
    meta = metadata(futureField={"x": [1, 2]}, chunkOrder=["b", "a"], trainedChunkIds=["a"], remainingChunkIds=["b"])
    ck = read_checkpoint(write_checkpoint(meta, WEIGHTS))
    assert ck.metadata.to_json()["futureField"] == {"x": [1, 2]}
    assert ck.metadata.trained_chunk_ids == ["a"] and ck.metadata.remaining_chunk_ids == ["b"]


def test_rounds_alias_in_settings_loads() -> None:
    meta = metadata()
    meta["settings"] = {"rounds": 5, "localEpochs": 1, "batchSize": 2, "coordinatorParticipates": False}
    assert read_checkpoint(assemble(meta, WEIGHTS)).metadata.settings.epochs == 5


def test_dataset_checkpoint_with_work_items() -> None:
    info = dataset_info()
    info["aggregation"] = {"averageOnly": [{"offset": 0, "bytes": 16}]}
    meta = metadata(modelInfo=info, trainedChunkIds=["c1"], remainingChunkIds=["c2", "c3#0"],
                    remainingWorkItems={"c3#0": {"partitionId": "c3#0", "sourceChunkId": "c3", "recordStart": 0, "recordCount": 5}})
    del meta["experience"]
    meta["settings"] = {"epochs": 3, "localEpochs": 1, "batchSize": 2, "coordinatorParticipates": True}
    ck = read_checkpoint(write_checkpoint(meta, WEIGHTS))
    assert ck.metadata.model_info.id == "my-model"


# --------------------------------------------------------------------------- the spec's own reader


SPEC_READER = r"""
async function readCheckpoint(file) {
  const bytes = await file.arrayBuffer();
  const metadataBytes = new DataView(bytes).getUint32(0, true);
  const metadata = JSON.parse(new TextDecoder().decode(new Uint8Array(bytes, 4, metadataBytes)));
  const start = 4 + metadataBytes;
  const weights = new Float32Array(bytes.slice(start, start + metadata.checkpoint.bytes));
  const state = metadata.version === 2
    ? new Float32Array(bytes.slice(start + metadata.checkpoint.bytes))
    : undefined;
  return { metadata, weights, state };
}
"""

NODE_MAIN = r"""
const fs = require('fs');
(async () => {
  const out = [];
  for (const path of process.argv.slice(1)) {
    const buf = fs.readFileSync(path);
    const ab = buf.buffer.slice(buf.byteOffset, buf.byteOffset + buf.byteLength);
    const r = await readCheckpoint({ arrayBuffer: async () => ab });
    out.push({
      metadata: r.metadata,
      weights: Buffer.from(r.weights.buffer).toString('base64'),
      state: r.state === undefined ? null : Buffer.from(r.state.buffer).toString('base64'),
      first: r.weights[0],
    });
  }
  process.stdout.write(JSON.stringify(out));
})();
"""


@pytest.mark.skipif(NODE is None, reason="node is not installed")
def test_spec_reader_reads_our_files(tmp_path: Path) -> None:
    cases = [
        (metadata(), WEIGHTS, None),
        (v2_metadata("fedavgm"), WEIGHTS, state_of("fedavgm")),
        (v2_metadata("fedadam"), WEIGHTS, state_of("fedadam")),
        # Non-ASCII and escapes in the metadata must decode the same in JavaScript.
        (metadata(jobId="jöb-\u2028-\U0001f600-\"\\\n"), WEIGHTS, None),
    ]
    paths = []
    for i, (meta, weights, state) in enumerate(cases):
        path = tmp_path / f"c{i}.weei-checkpoint"
        path.write_bytes(write_checkpoint(meta, weights, state))
        paths.append(str(path))
    result = subprocess.run([NODE, "-e", SPEC_READER + NODE_MAIN, *paths], capture_output=True, text=True, check=True, timeout=60)
    for (meta, weights, state), got, path in zip(cases, json.loads(result.stdout), paths, strict=True):
        ours = read_checkpoint(Path(path).read_bytes())
        assert got["metadata"] == ours.metadata.to_json()
        assert base64.b64decode(got["weights"]) == weights
        assert got["state"] is None if state is None else base64.b64decode(got["state"]) == state
        assert got["first"] == struct.unpack_from("<f", weights)[0]


# --------------------------------------------------------------------------- every reader check


def test_header_and_metadata_checks() -> None:
    good = write_checkpoint(metadata(), WEIGHTS)
    assert reason(b"") == "truncated-header"
    assert reason(good[:3]) == "truncated-header"
    assert reason(struct.pack("<I", MAX_METADATA_BYTES + 1) + b"{}") == "metadata-too-large"
    assert reason(struct.pack("<I", 100) + b"{}") == "truncated-metadata"
    assert reason(struct.pack("<I", 2) + b"\xff\xfe") == "invalid-metadata-json"
    assert reason(struct.pack("<I", 3) + b"{x}") == "invalid-metadata-json"
    assert reason(struct.pack("<I", 2) + b"[]") == "invalid-metadata"
    nan = b'{"version": NaN}'
    assert reason(struct.pack("<I", len(nan)) + nan) == "invalid-metadata-json"


def test_metadata_at_exactly_one_mib() -> None:
    meta = metadata(padding="")
    base = len(write_checkpoint(meta, WEIGHTS)) - len(WEIGHTS) - 4
    meta["padding"] = "x" * (MAX_METADATA_BYTES - base)
    data = write_checkpoint(meta, WEIGHTS)
    assert struct.unpack_from("<I", data)[0] == MAX_METADATA_BYTES
    read_checkpoint(data)
    meta["padding"] += "x"
    with pytest.raises(CheckpointError) as err:
        write_checkpoint(meta, WEIGHTS)
    assert err.value.reason == "metadata-too-large"
    assert reason(assemble(meta, WEIGHTS)) == "metadata-too-large"


def test_file_size_limit() -> None:
    huge = bytearray(MAX_CHECKPOINT_FILE_BYTES + 1)
    assert reason(huge) == "file-too-large"


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"version": 3}, "unsupported-version"),
        ({"version": "1"}, "unsupported-version"),
        ({"version": True}, "unsupported-version"),
        ({"round": -1}, "invalid-round"),
        ({"round": 1.5}, "invalid-round"),
        ({"round": "3"}, "invalid-round"),
        ({"round": None}, "invalid-round"),
        ({"round": 4}, "invalid-round"),  # differs from checkpoint.round
        ({"modelInfo": {**experience_info(info_aux()), "abiVersion": 2}}, "invalid-model-info"),
        ({"modelInfo": None}, "invalid-model-info"),
        ({"settings": {"epochs": 0, "localEpochs": 1, "batchSize": 1, "coordinatorParticipates": True}}, "invalid-settings"),
        ({"settings": {"epochs": 2, "rounds": 3, "localEpochs": 1, "batchSize": 1, "coordinatorParticipates": True}}, "invalid-settings"),
        ({"metrics": {"values": {"loss": None}, "examplesProcessed": 1}}, "invalid-metrics"),
        ({"metrics": {"values": {}, "examplesProcessed": -1}}, "invalid-metrics"),
        ({"metrics": {"values": {}}}, "invalid-metrics"),
        ({"trainedChunkIds": ["a"]}, "chunk-ids-unpaired"),
        ({"remainingChunkIds": ["a"]}, "chunk-ids-unpaired"),
        ({"trainedChunkIds": ["a", "a"], "remainingChunkIds": []}, "duplicate-chunk-id"),
        ({"trainedChunkIds": [], "remainingChunkIds": ["b", "b"]}, "duplicate-chunk-id"),
        ({"trainedChunkIds": ["a"], "remainingChunkIds": ["a"]}, "chunk-ids-overlap"),
        ({"trainedChunkIds": [], "remainingChunkIds": ["b"],
          "remainingWorkItems": {"c": {"partitionId": "c", "sourceChunkId": "c", "recordStart": 0, "recordCount": 1}}},
         "work-item-not-remaining"),
        ({"remainingWorkItems": {"c": {"partitionId": "c", "sourceChunkId": "c", "recordStart": 0, "recordCount": 1}}},
         "work-item-not-remaining"),
        ({"experience": {"jobSeed": "18446744073709551616", "nextUnit": 0}}, "invalid-metadata"),
        ({"experience": {"jobSeed": 5, "nextUnit": 0}}, "invalid-metadata"),
        ({"auxiliaryWeights": {"reward": "x"}}, "invalid-metadata"),
        ({"aggregationState": {"method": "fedavgm", "step": 1, "bytes": 456, "sha256": "0" * 64}}, "unexpected-aggregation-state"),
    ],
)
def test_metadata_checks(change: dict[str, Any], expected: str) -> None:
    assert reason(assemble(metadata(**change), WEIGHTS)) == expected


def test_weight_checks() -> None:
    meta = metadata()
    bad_format = copy.deepcopy(meta)
    bad_format["checkpoint"]["format"] = "float16"
    assert reason(assemble(bad_format, WEIGHTS)) == "unsupported-weight-format"
    assert reason(assemble(meta, WEIGHTS)[:-1]) == "weights-length-mismatch"
    assert reason(assemble(meta, WEIGHTS) + b"\0\0\0\0") == "weights-length-mismatch"
    nan_weights = WEIGHTS[:40] + struct.pack("<f", float("nan")) + WEIGHTS[44:]
    with pytest.raises(CheckpointError) as err:
        read_checkpoint(assemble(meta, nan_weights))
    assert err.value.reason == "weights-non-finite" and "10" in str(err.value)
    wrong = copy.deepcopy(meta)
    wrong["checkpoint"]["sha256"] = "0" * 64
    assert reason(assemble(wrong, WEIGHTS)) == "weights-sha256-mismatch"
    odd = copy.deepcopy(meta)
    odd["checkpoint"]["bytes"] = 6
    assert reason(assemble(odd, WEIGHTS[:6])) == "invalid-metadata"
    # averageOnly must lie within the weights; source slots must have their size.
    small = WEIGHTS[:448]
    assert reason(assemble(meta, small)) == "invalid-model-info"


def test_state_checks() -> None:
    meta = v2_metadata("fedadam")
    state = state_of("fedadam")
    assert reason(assemble(meta, WEIGHTS, state)[:-4]) == "state-length-mismatch"
    assert reason(assemble(meta, WEIGHTS, state) + b"x") == "state-length-mismatch"
    one_copy = copy.deepcopy(meta)
    one_copy["aggregationState"]["bytes"] = len(WEIGHTS)
    assert reason(assemble(one_copy, WEIGHTS, state[: len(WEIGHTS)])) == "state-size-mismatch"
    avgm = v2_metadata("fedavgm")
    assert reason(assemble(avgm, WEIGHTS, state)) == "state-size-mismatch"
    inf_state = state[:8] + struct.pack("<f", float("-inf")) + state[12:]
    assert reason(assemble(meta, WEIGHTS, inf_state)) == "state-non-finite"
    wrong = copy.deepcopy(meta)
    wrong["aggregationState"]["sha256"] = "0" * 64
    assert reason(assemble(wrong, WEIGHTS, state)) == "state-sha256-mismatch"
    missing = copy.deepcopy(meta)
    del missing["aggregationState"]
    assert reason(assemble(missing, WEIGHTS, state)) == "missing-aggregation-state"
    for bad in ({"method": "fedavg", "step": 1}, {"method": "fedadam", "step": 0}, {"method": "fedadam"}):
        m = copy.deepcopy(meta)
        m["aggregationState"] = bad
        assert reason(assemble(m, WEIGHTS, state)) == "invalid-aggregation-state", bad


def test_writer_refuses_what_the_reader_would() -> None:
    with pytest.raises(CheckpointError) as err:
        write_checkpoint(metadata(), WEIGHTS[:4] + struct.pack("<f", float("inf")) + WEIGHTS[8:])
    assert err.value.reason == "weights-non-finite"
    with pytest.raises(CheckpointError) as err:
        write_checkpoint(v2_metadata(), WEIGHTS, struct.pack("<f", float("nan")) * (2 * N))
    assert err.value.reason == "state-non-finite"
    with pytest.raises(CheckpointError) as err:
        write_checkpoint(metadata(metrics={"values": {"loss": float("nan")}, "examplesProcessed": 1}), WEIGHTS)
    assert err.value.reason == "invalid-metrics"
    with pytest.raises(CheckpointError) as err:
        write_checkpoint(v2_metadata("fedavgm"), WEIGHTS, state_of("fedadam"))
    assert err.value.reason == "state-size-mismatch"
    with pytest.raises(CheckpointError):
        write_checkpoint(metadata(), WEIGHTS, state_of("fedavgm"))  # state without aggregationState.method


def test_metadata_object_api() -> None:
    m = CheckpointMetadata.from_json(json.loads(json.dumps(metadata(checkpoint={
        "artifactId": "c", "kind": "checkpoint", "fileName": "f", "format": "float32-le", "round": 3,
        "bytes": len(WEIGHTS), "sha256": "c" * 64}))))
    j = m.to_json()
    j["jobId"] = "changed"
    assert m.job_id == "job-1"  # to_json gives a copy


# --------------------------------------------------------------------------- truncation and fuzz


@pytest.mark.parametrize("method", [None, "fedadam"])
def test_every_truncation_is_a_checkpoint_error(method: str | None) -> None:
    data = write_checkpoint(metadata(), WEIGHTS) if method is None else write_checkpoint(v2_metadata(method), WEIGHTS, state_of(method))
    for cut in range(len(data)):
        with pytest.raises(CheckpointError):
            read_checkpoint(data[:cut])
    read_checkpoint(data)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_fuzz_corrupted_files_only_checkpoint_errors(data: st.DataObject) -> None:
    base = bytearray(write_checkpoint(v2_metadata("fedavgm"), WEIGHTS, state_of("fedavgm")))
    for _ in range(data.draw(st.integers(1, 6))):
        pos = data.draw(st.integers(0, len(base) - 1))
        base[pos] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        base = base[: data.draw(st.integers(0, len(base)))]
    try:
        read_checkpoint(bytes(base))
    except CheckpointError as exc:
        assert exc.reason


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 2**65) | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=10), c, max_size=3),
    max_leaves=8,
)
meta_keys = st.sampled_from(
    ["version", "round", "checkpoint", "modelInfo", "settings", "metrics", "trainedChunkIds", "remainingChunkIds",
     "remainingWorkItems", "experience", "auxiliaryWeights", "aggregationState", "chunkOrder", "jobId", "incomplete"]
)


@settings(max_examples=500, deadline=None)
@given(meta_keys, json_values)
def test_fuzz_metadata_only_checkpoint_errors(key: str, value: Any) -> None:
    meta = metadata()
    meta[key] = value
    fill_ok = isinstance(meta.get("checkpoint"), dict) and isinstance(meta.get("aggregationState", {}), dict)
    for fill in (True, False) if fill_ok else (False,):
        try:
            read_checkpoint(assemble(meta, WEIGHTS, fill=fill))
        except CheckpointError as exc:
            assert exc.reason


# ------------------------------------------------------------ the one summary builder


def test_summary_of_a_read_file_names_the_file_even_when_the_metadata_does_not() -> None:
    ck = {k: v for k, v in metadata()["checkpoint"].items() if k != "fileName"}
    read = read_checkpoint(write_checkpoint(metadata(checkpoint=ck), WEIGHTS))
    summary = checkpoint_summary(read.metadata.to_json(), 5.0)
    assert summary["artifact"] == {"round": 3, "sha256": hashlib.sha256(WEIGHTS).hexdigest(), "bytes": len(WEIGHTS),
                                   "fileName": "cartpole-reinforce-round-0003.weei-checkpoint"}
    assert summary["metrics"] == {"values": {"episodeReturn": 21.5}, "examplesProcessed": 96}
    assert summary["createdAt"] == 5.0 and summary["remaining"] == [] and "aggregation" not in summary


def test_the_coordinator_and_a_reader_build_the_same_summary() -> None:
    """A checkpoint the coordinator wrote, read back from its file, summarises as the coordinator did."""
    from sim import Sim, dataset_spec

    spec, store = dataset_spec(4)
    sim = Sim.start_job(spec, store, ["p1", "p2"])
    assert len(sim.saved) >= 2
    for saved in sim.saved:
        meta = read_checkpoint(saved.file).metadata.to_json()
        from_file = checkpoint_summary(meta, saved.summary["createdAt"],
                                       dataset_progress=saved.summary.get("datasetProgress"))
        assert from_file == saved.summary
        assert from_file["artifact"]["fileName"] == meta["checkpoint"]["fileName"]
