"""One fuzz target per parser of outside input: valid samples, a mutator, the call, and the named errors.

A target's input is what the parser is handed: ``bytes`` for the parsers of
files, frames and stored text (``kind="bytes"``), or a JSON-like value for
those handed an object from the page or a document another parser already
read (``kind="value"``: settings, manifests, model info, job records,
diagnostics, device programs). Values are mutated as values, so no time
goes into writing and reading them back; :func:`to_file` and
:func:`from_file` turn any input into bytes and back, to save and replay it.

The oracle (:func:`check`): the call either returns, or raises one of the
target's named error classes with a non-empty string ``reason``. Anything
else (TypeError, KeyError, RecursionError, ValueError, OverflowError,
UnicodeEncodeError, SystemError, MemoryError, ...) is a failure. A few
targets also check what they return (a debug log must write itself back;
the server's replies must be JSON).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import pickle
import random
import shutil
import struct
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
for extra in (ROOT / "app" / "py", ROOT / "tests" / "unit"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from mutate import deep, mutate_bytes, mutate_json_bytes, mutate_text, mutate_value  # noqa: E402

from weei.core._check import parse_json  # noqa: E402
from weei.core.errors import WeeiError  # noqa: E402

__all__ = ["Target", "TARGETS", "check", "generate", "to_file", "from_file"]

#: Inputs stay under 1 MiB, the cap on checkpoint metadata and model results (a larger input only
#: takes longer to parse: every check is linear, and the size caps come before the parse).
_MAX_INPUT = 1 << 20


@dataclass
class Target:
    """A parser under test."""

    name: str
    call: Callable[[bytes], Any]
    named: tuple[type[BaseException], ...]
    samples: list[bytes]
    mutate: Callable[[random.Random, bytes], bytes]
    about: str = ""
    kind: str = "bytes"  # "bytes": call takes bytes; "value": a JSON-like value (see to_file)


def _lenient(data: bytes) -> Any:
    """JSON text to a value for targets that take values (NaN/1e400 allowed: a JavaScript object can hold them)."""
    return json.loads(data.decode("utf-8", "surrogatepass"))


def _value_target(name: str, parse: Callable[[Any], Any], named: tuple[type[BaseException], ...],
                  samples: list[Any], about: str, objects: bool = True) -> Target:
    """A parser handed a value (an object from the page, or JSON another parser already read).

    ``objects``: NaN and infinities may come in too (a JavaScript object can hold them).
    """
    donors = tuple(samples)

    def mutate(rng: random.Random, value: Any) -> Any:
        return mutate_value(rng, value, objects=objects, donors=donors)

    return Target(name, parse, named, list(samples), mutate, about, kind="value")


def _json_mutator(samples: list[Any]) -> Callable[[random.Random, bytes], bytes]:
    donors = tuple(samples)
    known = {_dumps(v): v for v in samples}  # the samples' text, read once

    def mutate(rng: random.Random, data: bytes) -> bytes:
        try:
            value = known[data] if data in known else _lenient(data)
        except (ValueError, RecursionError):
            return mutate_bytes(rng, data)
        return mutate_json_bytes(rng, value, donors)

    return mutate


def _text(data: bytes) -> str:
    """Bytes as the text a JavaScript string could hold (lone surrogates kept; bad UTF-8 replaced)."""
    try:
        return data.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return data.decode("utf-8", "replace")


def _dumps(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode()


# --------------------------------------------------------------------------- the targets


def _settings() -> Target:
    from weei.core.errors import SettingsError
    from weei.core.formats.settings import TrainingSettings

    samples = [
        {"epochs": 3, "localEpochs": 1, "batchSize": 16, "coordinatorParticipates": True,
         "experience": {"unitsPerAssignment": 32}},
        {"epochs": 2, "localEpochs": 2, "batchSize": 32, "learningRate": 0.01, "coordinatorParticipates": False,
         "aggregation": {"method": "fedadam", "serverLearningRate": 0.1, "normClip": 3, "combine": "trimmedMean",
                         "trim": 0.25},
         "validation": {"every": 1}, "maxParticipants": 8, "minParticipants": 1},
    ]
    ok = [s for s in samples if _accepts(TrainingSettings.from_json, s)]
    return _value_target("settings", TrainingSettings.from_json, (SettingsError,), ok,
                         "TrainingSettings.from_json (createJob, updateSettings)")


def _accepts(parse: Callable[[Any], Any], value: Any) -> bool:
    try:
        parse(value)
    except WeeiError:
        return False
    return True


def _model_info() -> Target:
    from core_samples import dataset_info, experience_info, info_aux

    from weei.core.errors import ManifestError
    from weei.core.formats.modelinfo import ModelInfo

    samples = [dataset_info(), experience_info(), experience_info(info_aux())]
    return _value_target("model-info", ModelInfo.from_json, (ManifestError,), samples,
                         "ModelInfo.from_json (getModelInfo's JSON, a peer's Invitation)")


def _package() -> Target:
    from core_samples import chunks, package, package_aux

    from weei.core.errors import ManifestError
    from weei.core.formats.manifest import parse_manifest_file

    samples = [package(), package(experience=False, chunks=chunks()), package(aux=package_aux()), package(gpu=True)]
    samples += [json.loads((ROOT / "app/static/models" / m / "manifest.json").read_text())
                for m in ("digits-mlp", "cartpole-reinforce")]
    return _value_target("package", parse_manifest_file, (ManifestError,), samples,
                         "parse_manifest_file: the package manifest (model.json)", objects=False)


def _dataset_manifest() -> Target:
    from core_samples import chunks

    from weei.core.errors import ManifestError
    from weei.core.formats.manifest import parse_dataset_manifest

    samples = [chunks(), chunks()[:1]]
    return _value_target("dataset-manifest", parse_dataset_manifest, (ManifestError,), samples, objects=False,
                         about="parse_dataset_manifest: a dataset's chunk list")


def _checkpoint_parts() -> tuple[bytes, list[dict[str, Any]]]:
    from core_samples import dataset_info, experience_info, info_aux
    from test_parser_hostile import WEIGHTS, metadata

    plain = metadata()
    info = dataset_info()
    del info["aggregation"]["averageOnly"]  # its ranges lie past these 456 bytes of weights
    chunked = metadata(modelInfo=info, trainedChunkIds=["chunk-001"], remainingChunkIds=["chunk-002"])
    del chunked["experience"]
    aux = metadata(modelInfo=experience_info(info_aux()))
    return WEIGHTS, [plain, chunked, aux]


def _checkpoint() -> Target:
    from weei.core.formats.checkpoint import read_checkpoint
    from weei.core.errors import CheckpointError

    weights, metas = _checkpoint_parts()

    def pack(meta: bytes, tail: bytes) -> bytes:
        return struct.pack("<I", len(meta)) + meta + tail

    samples = [pack(_dumps(m), weights) for m in metas]
    donors = tuple(metas)

    def mutate(rng: random.Random, data: bytes) -> bytes:
        if rng.random() < 0.25 or len(data) < 4:
            return mutate_bytes(rng, data)
        (length,) = struct.unpack_from("<I", data)
        meta, tail = data[4:4 + length], data[4 + length:]
        try:
            value = _lenient(meta)
        except (ValueError, RecursionError):
            return mutate_bytes(rng, data)
        meta = mutate_json_bytes(rng, value, donors)
        if rng.random() < 0.1:
            tail = mutate_bytes(rng, tail)
        return pack(meta, tail)

    return Target("checkpoint", read_checkpoint, (CheckpointError,), samples, mutate,
                  "read_checkpoint: a checkpoint file (metadata JSON, weights, optimizer state)")


def _message() -> Target:
    from test_messages import SAMPLES

    from weei.core.wire.framing.frames import FrameError, FrameReason
    from weei.core.wire.messages import MessageError, decode_message, encode_message

    def fail(message: str) -> Any:
        raise FrameError(FrameReason.BAD_MESSAGE, message)

    samples = [encode_message(m) for m in SAMPLES]
    return Target("message", lambda data: decode_message(parse_json(data, fail)), (MessageError, FrameError),
                  [_dumps(s) for s in samples], _json_mutator(samples),
                  "decode_message: a peer's wire message (JSON after the frames)")


def _frames_of(data: bytes) -> list[bytes]:
    """A wire input: frames, each after its u32 length (a cut length takes what is left)."""
    out, at = [], 0
    while at + 4 <= len(data):
        (n,) = struct.unpack_from("<I", data, at)
        out.append(data[at + 4:at + 4 + n])
        at += 4 + n
    return out


def _join_frames(frames: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(f)) + f for f in frames)


def _wire_samples() -> list[list[bytes]]:
    from weei.core.wire.framing.writer import FrameWriter
    from weei.core.wire.messages import ArtifactRef, Leave, Update

    blob = bytes(range(256)) * 3
    ref = ArtifactRef("update", hashlib.sha256(blob).hexdigest(), len(blob))
    out = []
    for message, attachments in ((Leave("job-1"), ()),
                                 (Update("job-1", 1, "r1-c0", "r1-c0-a1", "a" * 64, ref, {"loss": 0.25}, 12, 3),
                                  ((ref, blob),))):
        writer = FrameWriter("p", max_frame_bytes=4096)
        writer.enqueue(message, attachments)
        out.append(list(writer.frames(0.0)))
    return out


def _frame() -> Target:
    from weei.core.wire.framing.frames import FrameError, abort_frame, parse_frame

    samples = [f for frames in _wire_samples() for f in frames] + [abort_frame(7, "cancelled")]

    def mutate(rng: random.Random, data: bytes) -> bytes:
        return mutate_bytes(rng, data)

    return Target("frame", parse_frame, (FrameError,), samples, mutate, "parse_frame: one wire frame")


def _wire() -> Target:
    from weei.core.wire.framing.frames import MessageReceived
    from weei.core.wire.framing.reader import FrameReader, ReaderLimits

    samples = _wire_samples()

    def call(data: bytes) -> Any:
        reader = FrameReader("peer", limits=ReaderLimits(max_buffered_bytes=1 << 22))
        events = []
        for i, frame in enumerate(_frames_of(data)):
            events += reader.feed(frame, float(i))
            if reader.broken is not None:
                break
        events += reader.expire(1e9, 1000.0)
        events += reader.close()
        for event in events:  # a message that got through is a checked one
            if isinstance(event, MessageReceived):
                json.dumps(event.message.to_json() if hasattr(event.message, "to_json") else {}, allow_nan=False)
        return events

    def mutate(rng: random.Random, data: bytes) -> bytes:
        frames = _frames_of(data)
        if not frames:
            return mutate_bytes(rng, data)
        kind = rng.randrange(7)
        i = rng.randrange(len(frames))
        if kind == 0:
            frames[i] = mutate_bytes(rng, frames[i])
        elif kind == 1:
            del frames[i]
        elif kind == 2:
            frames.insert(i, frames[rng.randrange(len(frames))])
        elif kind == 3:
            j = rng.randrange(len(frames))
            frames[i], frames[j] = frames[j], frames[i]
        elif kind == 4:
            frames = _reframe_message(rng, frames)
        elif kind == 5:
            frames += rng.choice(samples)
        else:
            return mutate_bytes(rng, data)
        return _join_frames(frames)

    return Target("wire", call, (), [_join_frames(f) for f in samples], mutate,
                  "FrameReader.feed: a peer's stream of frames (never raises; refusals are events)")


def _reframe_message(rng: random.Random, frames: list[bytes]) -> list[bytes]:
    """The frames with the message's JSON mutated in structure and framed again (lengths right)."""
    from weei.core.wire.framing.frames import Data, MessageBegin, data_frame, message_begin_frame, parse_frame
    from weei.core.wire.framing.frames import FrameError

    parsed = []
    for f in frames:
        try:
            parsed.append(parse_frame(f))
        except FrameError:
            parsed.append(None)
    begin = next((k for k, p in enumerate(parsed) if isinstance(p, MessageBegin)), None)
    if begin is None:
        return frames
    tid = parsed[begin].transfer_id
    body = b"".join(bytes(p.payload) for p in parsed if isinstance(p, Data) and p.transfer_id == tid)
    try:
        value = _lenient(body)
    except (ValueError, RecursionError):
        return frames
    new = mutate_json_bytes(rng, value)
    kept = [f for f, p in zip(frames, parsed) if not (isinstance(p, Data) and p.transfer_id == tid)
            and not isinstance(p, MessageBegin)]
    out = kept + [message_begin_frame(tid, len(new), parsed[begin].attachments)]
    for at in range(0, len(new), 3000):
        out.append(data_frame(tid, at, new[at:at + 3000]))
    return out


def _debuglog() -> Target:
    from weei.core.observe.debuglog import DebugLog

    log = DebugLog()
    log.record(1_700_000_000_000, "job.created", {"jobId": "job-1", "rounds": 3})
    log.add_phase("round", 1234.5, 1_700_000_000_500)
    log.add_phase("train", 10.0, 1_700_000_000_600)
    log.add_phase("train", 30.0, 1_700_000_000_700)
    log.record(1_700_000_001_000, "peer.joined", {"peer": "p1", "nested": {"a": [1, 2, {"b": None}]}})
    samples = [log.to_json().encode(), DebugLog().to_json().encode()]

    def call(data: bytes) -> Any:
        read = DebugLog.from_json(_text(data), 1_700_000_002_000)
        read.to_json()
        read.to_file(1_700_000_002_000)
        return read

    return Target("debuglog", call, (), samples, _json_mutator([json.loads(s) for s in samples]),
                  "DebugLog.from_json: the debug log read back from localStorage (never raises; resets by name)")


def _storage() -> Target:
    from weei.agent.storage import DiskKeyValue, DiskStorage
    from weei.api.ports import StorageError

    # run.py points WEEI_FUZZ_TMP at a folder it deletes (pool workers skip atexit).
    folder = Path(tempfile.mkdtemp(prefix="weei-fuzz-storage-", dir=os.environ.get("WEEI_FUZZ_TMP")))
    atexit.register(shutil.rmtree, folder, True)
    storage = DiskStorage(folder)
    blob = b"weights" * 10
    sha = hashlib.sha256(blob).hexdigest()
    (folder / "blobs").mkdir(exist_ok=True)
    (folder / "blobs" / sha).write_bytes(blob)
    path = folder / "record.json"
    samples = [
        {"summary": {"round": 3, "artifact": {"fileName": "c.bin", "sha256": sha}}, "file": {"$blob": sha, "bytes": 70}},
        {"id": "job-1", "chunks": [{"id": "c", "bytes": 1}], "status": "running", "active": True},
        {"participation": "job-1", "nested": [[{"$blob": sha, "bytes": 70}]]},
    ]

    def call(data: bytes) -> Any:
        path.write_bytes(data)
        value = storage._get(path)  # DiskStorage.get's read, without the thread hop
        try:
            DiskKeyValue(path)
        except StorageError:
            pass
        return value

    return Target("agent-storage", call, (StorageError,), [_dumps(s) for s in samples], _json_mutator(samples),
                  "DiskStorage.get and DiskKeyValue: the agent's records read back from disk")


def _model_result() -> Target:
    from weei.core.errors import ModelError
    from weei.runtime.results import field_count, field_metrics, parse_result_json

    samples = [
        {"metrics": {"loss": 0.25, "accuracy": 0.9}, "examples": 128, "uniqueExamples": 128, "optimizerSteps": 8,
         "weights": {"ptr": 1024, "bytes": 456}},
        {"metrics": {"episodeReturn": 21.5}, "examples": 32, "completedUnits": 32},
        {"processedExamples": 12, "totalExamples": 40, "metrics": {"loss": 1.5}},
        {"error": "out of memory"},
        {"exampleCount": 100},
    ]

    def call(data: bytes) -> Any:
        result = parse_result_json("train", data)
        for key in ("examples", "uniqueExamples", "completedUnits", "processedExamples", "exampleCount"):
            field_count("train", result, key, required=False)
        if "metrics" in result:
            field_metrics("train", result)
        region = result.get("weights")
        if isinstance(region, dict):
            field_count("train", region, "ptr")
            field_count("train", region, "bytes")
        return result

    return Target("model-result", call, (ModelError,), [_dumps(s) for s in samples], _json_mutator(samples),
                  "parse_result_json + field_count/field_metrics: a model's train/evaluate/progress JSON")


def _job_record() -> Target:
    from core_samples import WASM, WEIGHT_BYTES, chunks, dataset_info, experience_info, info_aux, sha
    from test_messages import GPU_OFFER

    from weei.api.records import spec_from_record, spec_to_record
    from weei.core.job.spec import ChunkInfo, GpuOffer, JobSpec, ModuleInfo
    from weei.core.wire.messages import ArtifactRef
    from weei.core.formats.modelinfo import ModelInfo
    from weei.core.formats.settings import TrainingSettings

    settings = TrainingSettings.from_json({"epochs": 3, "localEpochs": 1, "batchSize": 16,
                                           "coordinatorParticipates": True})
    module = ModuleInfo("model.wasm", len(WASM), sha(WASM))
    dataset = JobSpec("job-1", ModelInfo.from_json(dataset_info()), module, settings, WEIGHT_BYTES,
                      tuple(ChunkInfo(c["id"], c["fileName"], c["bytes"], c["sha256"], c["format"], c["exampleCount"])
                            for c in chunks()),
                      has_validation=True, validation_format="my-binary", gpu=GpuOffer.from_json(GPU_OFFER))
    experience = JobSpec("job-2", ModelInfo.from_json(experience_info(info_aux())), module,
                         TrainingSettings.from_json({"epochs": 2, "localEpochs": 1, "batchSize": 8,
                                                     "coordinatorParticipates": True,
                                                     "experience": {"unitsPerAssignment": 32}}), WEIGHT_BYTES,
                         auxiliary_files={"reward": ArtifactRef("auxiliary", "c" * 64, 16)})
    samples = [spec_to_record(dataset, job_seed=None, validation_sha256="d" * 64),
               spec_to_record(experience, job_seed=2**64 - 1, validation_sha256=None)]
    named = (WeeiError,)
    return _value_target("job-record", spec_from_record, named, samples,
                         "spec_from_record: a saved job's record read back from storage")


def _stored_job() -> Target:
    from weei.api.ports import StorageError
    from weei.api.stored import parse_job_record

    samples = []
    for record in _job_record().samples:
        samples.append({**record, "status": "running", "active": True, "createdAt": 1_700_000_000_000,
                        "updatedAt": 1_700_000_001_000.5, "lastRound": 2, "participants": ["p1", "p2"],
                        "robust": {"p1": {"outliers": 1}}})
    samples.append({**_job_record().samples[0], "status": "completed"})
    # A continued job's chart history (api/metric_history.py).
    samples.append({**_job_record().samples[0], "history": [
        {"artifact": {"round": 0}, "createdAt": 1_700_000_000_000, "metrics": {"values": {"loss": 2.3}},
         "validationMetrics": {"values": {"accuracy": 0.1, "loss": 2.2}}},
        {"artifact": {"round": 1}, "metrics": {"values": {"loss": 1.9}}}]})

    def call(value: Any) -> Any:
        return parse_job_record(value.get("id") if isinstance(value, dict) and isinstance(value.get("id"), str)
                                else "job-1", value)

    return _value_target("stored-job", call, (StorageError,), samples,
                         "parse_job_record: a saved job's whole record read back (spec, status, times, peers, history)")


def _stored_device_settings() -> Target:
    from weei.api.ports import StorageError
    from weei.api.stored import parse_device_settings

    samples = [{"maxLocalWorkers": 4, "gpuMemoryBudgetMiB": 512, "backendPreference": "auto"},
               {"maxLocalWorkers": 64, "gpuMemoryBudgetMiB": 0, "backendPreference": "hybrid"}, {}]
    return _value_target("stored-device-settings", lambda v: parse_device_settings(v, default_workers=8),
                         (StorageError,), samples, "parse_device_settings: settings/device read back")


def _stored_participation() -> Target:
    from weei.api.ports import StorageError
    from weei.api.stored import parse_participation

    invitation = {"type": "invitation", "jobId": "job-1", "coordinator": "c" * 26,
                  "modelInfo": {"id": "digits-mlp", "name": "Digits"},
                  "module": {"fileName": "model.wasm", "bytes": 4096, "sha256": "ab" * 32}, "dataBytes": 1 << 20,
                  "settings": {"epochs": 2, "batchSize": 16}}
    samples = [{"from": "c" * 26, "invitation": invitation}]
    return _value_target("stored-participation", parse_participation, (StorageError,), samples,
                         "parse_participation: settings/participation (the job this device accepted) read back")


def _stored_checkpoint() -> Target:
    from weei.api.ports import StorageError
    from weei.api.stored import stored_checkpoint

    # A value input holds no bytes: a string "file" stands for the stored Uint8Array (anything else stays
    # as it is, and must be refused).
    samples = [{"summary": {"artifact": {"round": 3, "fileName": "job-1-round-3.weeickpt", "sha256": "cd" * 32},
                            "metrics": {"loss": 0.5}, "createdAt": 1_700_000_000_000}, "file": "WEEICKPT..."},
               {"summary": {"artifact": {"round": 0, "fileName": "c0.weeickpt", "sha256": "00" * 32}}, "file": ""}]

    def call(value: Any) -> Any:
        if isinstance(value, dict) and isinstance(value.get("file"), str):
            value = {**value, "file": value["file"].encode("utf-8", "surrogatepass")}
        round_ = 3
        if isinstance(value, dict) and isinstance(value.get("summary"), dict):
            artifact = value["summary"].get("artifact")
            if isinstance(artifact, dict) and type(artifact.get("round")) is int and artifact["round"] >= 0:
                round_ = artifact["round"] % 10**8  # mostly the key it was saved under, now and then not
        return stored_checkpoint(value, f"job-1/{round_:08d}")

    return _value_target("stored-checkpoint", call, (StorageError,), samples,
                         "stored_checkpoint: a checkpoint entry (summary and file) read back")


def _diagnostics() -> Target:
    from test_diagnostics import WALL0, recorder

    from weei.core.observe.diagnostics.records import DiagnosticsError, parse_diagnostics

    rec = recorder()
    rec.join_job("job-1", 0)
    samples = [rec.snapshot(WALL0, 0)]
    return _value_target("diagnostics", parse_diagnostics, (DiagnosticsError,), samples,
                         "parse_diagnostics: a peer's diagnostics snapshot", objects=False)


def _shader_archive() -> Target:
    from weei.gpu import GpuError, parse_archive

    samples = [(ROOT / "app/static/models" / m / "model.wgsl.json").read_bytes()
               for m in ("digits-mlp", "cartpole-reinforce")]
    small = json.loads(samples[0])
    small["modules"] = small["modules"][:1]
    samples.append(_dumps(small))
    return Target("shader-archive", parse_archive, (GpuError,), samples,
                  _json_mutator([json.loads(s) for s in samples]), "parse_archive: a package's WGSL archive")


def _device_program() -> Target:
    from test_gpu_program import _program

    from weei.gpu import DeviceLimits, GpuError, parse_archive, parse_program

    archive = parse_archive((ROOT / "app/static/models/digits-mlp/model.wgsl.json").read_bytes())
    samples = [_program()]

    def parse(value: Any) -> Any:
        return parse_program(value, archive=archive, limits=DeviceLimits(), weight_bytes=16, budget_bytes=64 << 20,
                             estimated_working_bytes=16 << 20)

    return _value_target("device-program", parse, (GpuError,), samples,
                         "parse_program: the device program a model's gpu_begin returns")


def _qdelta() -> Target:
    """A compressed update as the coordinator decodes one: parse, then dequantize over the round's weights."""
    import struct as _struct

    from weei.core.aggregation.compression import compress_update, decompress_update, layout
    from weei.core.formats.qdelta import QDeltaError
    from weei.core.formats.settings import CompressionSettings
    from weei.kernel.numpy_kernel import NumpyKernel

    kernel = NumpyKernel()
    n = 97
    start = _struct.pack(f"<{n}f", *(i / 9 - 2 for i in range(n)))
    trained = _struct.pack(f"<{n}f", *(i / 9 - 2 + ((i * 7) % 5 - 2) / 100 for i in range(n)))
    shape = layout(4 * n, [(8, 12)])  # 3 averageOnly values travel raw
    settings = {(bits, deflate): CompressionSettings(kind, 8, deflate)
                for kind, bits in (("int8", 8), ("int4", 4)) for deflate in (False, True)}
    samples = [compress_update(kernel, start, trained, s, shape, None)[0] for s in settings.values()]
    assert [data[5] for data in samples] == [0, 1, 0, 1]  # plain and deflated codes of each width

    def decode(data: bytes) -> Any:
        # The width and codec the input claims pick the settings, so every decoder is reached past the header.
        chosen = settings.get((data[4], data[5] == 1) if len(data) > 5 else (8, False), settings[8, False])
        return decompress_update(kernel, start, data, chosen, shape)

    return Target("qdelta", decode, (QDeltaError,), samples, lambda rng, data: mutate_bytes(rng, data),
                  "decompress_update: a participant's compressed update")


def _signaling_client() -> Target:
    from weei.core.wire.signaling_session import (Answer, Closed, Peers, ServerError, Signal, SignalingSession,
                                              Unreadable, Welcome)

    named_events = (Answer, Closed, Peers, ServerError, Signal, Unreadable, Welcome)
    samples = [
        {"type": "welcome", "version": 1, "peerId": "p" * 22, "token": "t.x", "resumed": False,
         "iceServers": [{"urls": ["stun:stun.example:3478"]}], "limits": {"idleTimeout": 60, "maxFrameBytes": 65536}},
        {"type": "peers", "room": "lab", "peers": ["p" * 22, "q" * 22]},
        {"type": "signal", "from": "q" * 22, "kind": "offer", "payload": "v=0\r\n"},
        {"type": "signal", "from": "q" * 22, "kind": "candidate", "payload": {"candidate": "candidate:1 1 udp 1 h 9 typ host", "sdpMid": "0"}},
        {"type": "error", "reason": "rate-limited", "message": "slow down", "refused": "join"},
        {"type": "pong"},
    ]

    def call(data: bytes) -> Any:
        session = SignalingSession()
        session.hello()
        session.join("lab")
        text = data.decode("utf-8", "replace")
        items = session.on_server_message(text)
        session.ping_interval_s()
        for item in items:
            if not isinstance(item, named_events):
                raise AssertionError(f"receive gave {type(item).__name__}")
        return items

    return Target("signaling-client", call, (), [_dumps(s) for s in samples], _json_mutator(samples),
                  "SignalingSession.on_server_message: the signaling server's frames, read by a page or an agent")


def _signaling_server() -> Target:
    from weei.server.rooms import Hub, RoomSend
    from weei.server.signaling_rules import Limits

    samples = [
        {"type": "hello", "version": 1},
        {"type": "join", "room": "lab"},
        {"type": "signal", "to": "", "kind": "offer", "payload": "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\n"},
        {"type": "signal", "to": "", "kind": "candidate",
         "payload": {"candidate": "candidate:1 1 udp 1 10.0.0.1 9 typ host", "sdpMid": "0", "sdpMLineIndex": 0,
                     "usernameFragment": "abcd"}},
        {"type": "ping"},
    ]

    def call(data: bytes) -> Any:
        rooms = Hub(Limits(), b"s" * 32, random_bytes=_counter())
        a, _ = rooms.connect(0.0)
        b, _ = rooms.connect(0.0)
        peer_b = ""
        for conn in (a, b):
            for out in rooms.on_frame(conn, json.dumps({"type": "hello"}), 0.0):
                if isinstance(out, RoomSend) and out.frame.get("type") == "welcome" and conn == b:
                    peer_b = out.frame["peerId"]
            rooms.on_frame(conn, json.dumps({"type": "join", "room": "lab"}), 0.0)
        text = data.decode("utf-8", "replace").replace('"to": ""', json.dumps({"to": peer_b})[1:-1])
        conn = a if len(data) % 3 else rooms.connect(0.0)[0]  # joined, or before hello
        outputs = rooms.on_frame(conn, text, 1.0)
        for out in outputs:
            if isinstance(out, RoomSend):
                json.dumps(out.frame, allow_nan=False)  # what the adapter writes to the socket
        return outputs

    return Target("signaling-server", call, (), [_dumps(s) for s in samples], _json_mutator(samples),
                  "Hub.on_frame: a client's frame at the signaling server (refusals are replies, never raised)")


def _onnx() -> Target:
    from test_onnx_import import mlp
    from test_onnx_ops import _case, CASES

    from weei.onnx import OnnxError, Settings
    from weei.onnx.compiler import compile_graph
    from weei.onnx.model import read_model

    # every operator's small graph (MLP, Conv, pools, BatchNorm, attention, embeddings) and a whole MLP
    samples = [_case(name)[0].SerializeToString() for name in sorted(CASES)] + [mlp(hidden=4)]

    def parse(data: bytes) -> Any:
        return compile_graph(read_model(data), Settings(loss="mse"))

    return Target("onnx", parse, (OnnxError,), samples, mutate_bytes,
                  "weei.onnx: an ONNX file read and compiled to the graph runtime's blob (weei model import)")


def _counter() -> Callable[[int], bytes]:
    count = iter(range(1 << 30))
    return lambda n: next(count).to_bytes(n, "little")


#: name -> builder (building a target reads its samples, so it happens in the process that runs it).
TARGETS: dict[str, Callable[[], Target]] = {
    "frame": _frame, "wire": _wire, "message": _message, "checkpoint": _checkpoint, "package": _package,
    "dataset-manifest": _dataset_manifest, "model-info": _model_info, "settings": _settings,
    "job-record": _job_record, "diagnostics": _diagnostics, "model-result": _model_result, "debuglog": _debuglog,
    "agent-storage": _storage, "shader-archive": _shader_archive, "device-program": _device_program,
    "signaling-client": _signaling_client, "signaling-server": _signaling_server,
    "stored-job": _stored_job, "stored-device-settings": _stored_device_settings,
    "stored-participation": _stored_participation, "stored-checkpoint": _stored_checkpoint, "onnx": _onnx,
    "qdelta": _qdelta,
}


def check(target: Target, data: Any) -> BaseException | None:
    """The oracle: None when ``data`` is parsed or refused by name, else the exception that escaped."""
    try:
        target.call(data)
    except target.named as error:
        reason = getattr(error, "reason", None)
        if not isinstance(reason, str) or not reason:
            return error
        return None
    except BaseException as error:  # noqa: BLE001 - anything else is what the fuzzer is looking for
        if isinstance(error, KeyboardInterrupt):
            raise
        return error
    return None


def generate(target: Target, rng: random.Random) -> Any:
    """One input: a mutation of a sample, now and then of an earlier mutation (two steps away)."""
    data = target.samples[rng.randrange(len(target.samples))]
    data = target.mutate(rng, data)
    if rng.random() < 0.15:
        data = target.mutate(rng, data)
    if target.kind == "bytes" and len(data) > _MAX_INPUT:
        data = data[:_MAX_INPUT]
    return data


def to_file(target: Target, data: Any) -> bytes:
    """An input as bytes: itself, or a value pickled (a value may nest deeper than json.dumps can write)."""
    if target.kind == "bytes":
        return bytes(data)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 20_000))
    try:
        return pickle.dumps(data)
    finally:
        sys.setrecursionlimit(limit)


def from_file(target: Target, raw: bytes) -> Any:
    """The input :func:`to_file` saved (run.py --replay: the fuzzer's own files only, pickle trusts them)."""
    return raw if target.kind == "bytes" else pickle.loads(raw)  # noqa: S301
