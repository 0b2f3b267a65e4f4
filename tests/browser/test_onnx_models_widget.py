"""The issue's CNN and transformer, imported in the page and trained by a participant page (headless Chromium).

Each is built with onnx.helper (the unit tests' builders), imported by the
coordinator page's ``importOnnx`` (the window's ONNX form calls the same),
and trained in a job in which the coordinator does not train: a second
browser, invited through the room, does all the training. The round-0
checkpoint is validated before the start and the last one after; the
validation must improve. The last checkpoint is exported by ``exportOnnx``:
onnxruntime's predictions on that file equal the graph runtime's
``evaluate`` on the same checkpoint in CPython (wasmtime), and the accuracy
they give is the one the job reported. (test_onnx_widget.py drives the MLP
through the window's form, the buttons included.)
"""

from __future__ import annotations

import base64
import struct
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from test_onnx_import import cnn  # noqa: E402
from test_onnx_transformer import CONTEXT, transformer  # noqa: E402

from weei.core.formats.checkpoint import read_checkpoint  # noqa: E402
from weei.onnx import Settings, import_onnx  # noqa: E402
from weei.runtime import ModelRuntime, WasmtimeEngine  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "app" / "static" / "models"


@dataclass(frozen=True)
class Case:
    onnx: bytes
    data: str            # the built-in model whose data/ the page fetches from the site
    chunks: int
    loss: str
    data_format: str
    record: int          # bytes per record of validation.bin (after its 8-byte header)
    lr: float
    batch: int
    local_epochs: int


CASES = {
    "cnn": Case(cnn(), "digits-mlp", 4, "cross-entropy", "digits", 65, 0.01, 32, 2),
    "transformer": Case(transformer(), "byte-transformer", 6, "next-token", "tokens", CONTEXT + 1, 0.005, 8, 1),
}

IMPORT_AND_CREATE = """async ({ onnx, name, data, chunks, args, settings }) => {
  const training = T.api();
  const base = `models/${data}/data/`;
  const names = Array.from({ length: chunks }, (_, k) => `training-${String(k + 1).padStart(3, '0')}.bin`);
  const files = await Promise.all(names.map((n) => T.fetchFile(base + n, n)));
  const validation = await T.fetchFile(base + 'validation.bin', 'validation.bin');
  window.onnxFile = new File([Uint8Array.from(atob(onnx), (c) => c.charCodeAt(0))], name);
  const { wasm, manifest } = await training.importOnnx({ onnx: window.onnxFile, files: [...files, validation], ...args });
  await training.createJob({ wasm, manifest, files, validation, settings });
  await training.runValidation();
  await T.waitFor('round 0 validated', () => training.getState().job.checkpoints[0]?.validationMetrics, 120000);
  for (const peerId of training.getState().peers) training.invite(peerId);
  return training.getState().job.id;
}"""

TRAIN_AND_EXPORT = """async (ids) => {
  const training = T.api();
  await T.waitFor('the participant loaded the model', () => {
    const p = training.getState().job.participants;
    return ids.every((id) => p[id] && p[id].approved && p[id].state !== 'approved');
  }, 120000);
  await training.start();
  await T.waitFor('the job to finish', () => T.done(training.getState()), 480000);
  await T.waitFor('every checkpoint validated',
    () => training.getState().job.checkpoints.every((c) => c.validationMetrics), 120000);
  const job = training.getState().job;
  const last = job.checkpoints[job.checkpoints.length - 1].artifact.round;
  const b64 = async (file) => {
    const bytes = new Uint8Array(await file.arrayBuffer());
    let s = '';
    for (let i = 0; i < bytes.length; i += 32768) s += String.fromCharCode(...bytes.subarray(i, i + 32768));
    return btoa(s);
  };
  const accepted = training.getDebugLog().events.filter((e) => e.event === 'update.accepted').map((e) => e.details.peer);
  return { job, accepted, onnx: await b64(await training.exportOnnx(last, window.onnxFile)),
           checkpoint: await b64(training.exportCheckpoint()) };
}"""


@pytest.mark.parametrize("name", sorted(CASES))
def test_an_imported_model_trains_on_a_participant_page_and_exports(weei_server: Any, browsers: Any,
                                                                     tmp_path: Path, name: str) -> None:
    case = CASES[name]
    url = f"{weei_server.url}?room=onnx-{uuid.uuid4().hex[:8]}"
    coordinator, participant = browsers(url), browsers(url)
    peer = participant.evaluate("T.api().getState().myPeerId")
    coordinator.evaluate("(id) => T.waitFor('the peer connected', () => T.api().getState().peers.includes(id))", peer)
    args = {"loss": case.loss, "optimizer": "adam", "learningRate": case.lr, "batchSize": case.batch,
            "dataFormat": case.data_format, "modelId": f"onnx-{name}"}
    settings = {"epochs": 1, "localEpochs": case.local_epochs, "batchSize": case.batch,
                "coordinatorParticipates": False, "validationSchedule": {"enabled": True, "unit": "round", "every": 1}}
    job_id = coordinator.evaluate(IMPORT_AND_CREATE, {
        "onnx": base64.b64encode(case.onnx).decode(), "name": f"{name}.onnx", "data": case.data,
        "chunks": case.chunks, "args": args, "settings": settings})
    participant.evaluate("(jobId) => T.waitFor('the invitation', () => T.api().getState().invitations"
                         ".find(([id]) => id === jobId))", job_id)
    participant.evaluate("(jobId) => T.api().decideInvitation(jobId, true)", job_id)
    out = coordinator.evaluate(TRAIN_AND_EXPORT, [peer])

    job = out["job"]
    assert job["status"] == "completed" and job["info"]["id"] == f"onnx-{name}"
    assert out["accepted"] and set(out["accepted"]) == {peer}, out["accepted"]   # the participant page trained
    metrics = [c["validationMetrics"]["values"] for c in job["checkpoints"]]
    if case.loss == "next-token":
        losses = [m["loss"] for m in metrics]
        assert losses[0] > 5.0 and losses[-1] < losses[0] - 0.5, losses   # ln 256 = 5.55 untrained
    else:
        accuracy = [m["accuracy"] for m in metrics]
        assert accuracy[-1] > accuracy[0] + 0.2, accuracy

    trained = tmp_path / "trained.onnx"
    trained.write_bytes(base64.b64decode(out["onnx"]))
    weights = read_checkpoint(base64.b64decode(out["checkpoint"])).weights
    validation = (MODELS / case.data / "data" / "validation.bin").read_bytes()
    n = struct.unpack_from("<I", validation, 4)[0]
    records = np.frombuffer(validation, np.uint8, n * case.record, 8).reshape(n, case.record)
    if case.data_format == "tokens":
        x = records[:, :CONTEXT]
        theirs = ort.InferenceSession(str(trained)).run(None, {"x": x.astype(np.int64)})[0]
        truth = records[:, 1:]
    else:
        x = records[:, :64] / 16.0
        theirs = ort.InferenceSession(str(trained)).run(None, {"x": x.astype(np.float32)})[0]
        truth = records[:, 64]
    wasm, _ = import_onnx(case.onnx, Settings(loss=case.loss, optimizer="adam", lr=case.lr, batch_size=case.batch,
                                             data=case.data_format, model_id=f"onnx-{name}"))
    rt = ModelRuntime.load(wasm, WasmtimeEngine())
    rt.load_model(weights)
    _, raw = rt._operation("onnxForward", lambda r: {"input": r[0], "batch": len(x)},
                           inputs=[memoryview(x.astype(np.float32).tobytes())], output="output")
    ours = np.frombuffer(raw, np.float32).reshape(theirs.shape)
    np.testing.assert_allclose(ours, theirs, atol=2e-5, rtol=1e-4)
    evaluated = rt.evaluate(data=validation, format=f"weei-{case.data_format if case.data_format == 'digits' else 'bytes'}-v1")
    ort_accuracy = float((theirs.argmax(-1) == truth).mean())
    assert abs(evaluated.metrics["accuracy"] - ort_accuracy) < 2e-3
    assert abs(evaluated.metrics["accuracy"] - metrics[-1]["accuracy"]) < 1e-6
