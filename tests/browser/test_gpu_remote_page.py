"""A page invited to a job with executionFiles trains on its GPU (docs/gpu.md, "Remote participants").

Two Chromium processes in one signaling room, over WebRTC: the coordinator
creates a digits job with the WGSL archive and does not train itself; the
participant (with --enable-unsafe-webgpu: SwiftShader, backendPreference
'gpu') asks for the archive, checks it and trains every assignment on its
GPU through the shim in its training Worker (the gpu.trained events say so).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from site_helpers import ROOT, TIMEOUT_MS

SETTINGS = {"epochs": 1, "localEpochs": 1, "batchSize": 32, "coordinatorParticipates": False}


def test_an_invited_page_fetches_the_archive_and_trains_on_its_gpu(weei_server: Any, browsers: Any) -> None:
    url = f"{weei_server.url}?room=gpu-{uuid.uuid4().hex[:8]}"
    coordinator = browsers(url, timeout_ms=TIMEOUT_MS * 4)
    helper = browsers(url, "--enable-unsafe-webgpu", timeout_ms=TIMEOUT_MS * 4)
    helper_id = helper.evaluate("async () => { await T.api().setBackendPreference('gpu'); "
                                "return T.api().getState().myPeerId; }")
    coordinator.evaluate("(id) => T.waitFor('the helper connected', () => T.api().getState().peers.includes(id))",
                         helper_id)
    job_id = coordinator.evaluate("""async (settings) => {
      const training = T.api();
      const pkg = await T.pkg('digits-mlp');
      const archive = await T.fetchFile('models/digits-mlp/model.wgsl.json', 'model.wgsl.json', 'application/json');
      await training.createJob({ wasm: pkg.wasm, manifest: pkg.manifest, files: pkg.files, settings,
                                 executionFiles: [archive] });
      for (const peerId of training.getState().peers) training.invite(peerId);
      return training.getState().job.id;
    }""", SETTINGS)
    helper.evaluate("""(jobId) => T.waitFor('the invitation',
      () => T.api().getState().invitations.some(([id]) => id === jobId))""", job_id)
    helper.evaluate("(jobId) => T.api().decideInvitation(jobId, true)", job_id)
    coordinator.evaluate("""(id) => T.waitFor('the helper loaded the model', () => {
      const p = T.api().getState().job.participants[id];
      return p && p.approved && p.state !== 'approved';
    })""", helper_id)
    out = coordinator.evaluate("""async (id) => {
      const training = T.api();
      await training.start();
      await T.waitFor('the job to complete', () => T.done(training.getState()), 240000);
      // The helper's diagnostics come in its periodic reports: wait for one from after its training.
      await T.waitFor('the helper diagnostics of a GPU assignment', () => {
        const d = training.getState().diagnostics[id];
        return d && d.execution.actual === 'gpu' && d.model !== 'unknown' && d.model.wgsl.present;
      });
      const state = training.getState();
      return { status: state.job.status, error: state.error || null, remote: state.diagnostics[id] };
    }""", helper_id)
    events = helper.evaluate("T.api().getDebugLog().events.filter((e) => e.event.startsWith('gpu.'))")
    assert out["error"] is None and out["status"] == "completed"
    remote = out["remote"]
    assert [e["event"] for e in events].count("gpu.archive-received") == 1, events[:3]
    trained = [e["details"] for e in events if e["event"] == "gpu.trained"]
    assert len(trained) == 15 and all(t["host"] == "worker" for t in trained), events[:3]
    assert remote["execution"]["actual"] == "gpu" and remote["execution"]["backend"] == "gpu-webgpu"
    assert remote["model"]["wgsl"]["present"] is True and len(remote["model"]["wgsl"]["sha256"]) == len(
        json.loads((ROOT / "app/static/models/digits-mlp/model.wgsl.json").read_text())["modules"])
    assert remote["timings"]["compilationMs"] is not None
