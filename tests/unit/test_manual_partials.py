"""Where the manual was met only in part (issue 21, section 6): one test per item, each failing on
the code before its fix."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from weei.adapters.link_transport import LinkTransport
from weei.core.wire.commands import Send
from weei.core.errors import UsageError, UsageReason
from weei.core.wire.messages import ArtifactRef, Assign, Deliver
from weei.core.links.peerlink import CHANNEL_LABEL, LinkManager
from weei.core.links.peerlink_commands import MakeAnswer, MakeOffer, SendSignal, SetRemote

A, B = "a" * 26, "b" * 26


def _open_pair(a: LinkManager, b: LinkManager) -> tuple[int, int]:
    """A and B with an open channel, A offering (lower id); returns their link numbers."""
    a.welcomed(A, (), 0.0)
    b.welcomed(B, (), 0.0)
    out = a.room((A, B), 0.0)
    link_a = next(c.link for c in out if isinstance(c, MakeOffer))
    offer = next(c for c in a.local_description(link_a, "sdp-offer") if isinstance(c, SendSignal))
    link_b = next(c.link for c in b.signal(A, "offer", offer.payload, 0.0) if isinstance(c, SetRemote))
    assert any(isinstance(c, MakeAnswer) for c in b.remote_set(link_b))
    answer = next(c for c in b.local_description(link_b, "sdp-answer") if isinstance(c, SendSignal))
    assert any(isinstance(c, SetRemote) for c in a.signal(B, "answer", answer.payload, 0.0))
    a.remote_set(link_a)
    a.channel_open(link_a, 0.0)
    assert b.accepts_channel(link_b, CHANNEL_LABEL)
    b.channel_open(link_b, 0.0)
    return link_a, link_b


def test_transfers_in_flight_name_their_job_on_both_ends() -> None:
    """state.transfers[*].jobId: the sender's from the message it frames, the receiver's from the job it
    shares with the peer (what the agent and the page attach: ``controller.job_with``)."""
    sender = LinkManager()
    receiver = LinkTransport(signaling=None)
    receiver.attach(object(), job_of=lambda peer: "job-7" if peer == A else None)
    link_a, link_b = _open_pair(sender, receiver.links)
    data = bytes(12 * 1024 * 1024)
    ref = ArtifactRef("module", hashlib.sha256(data).hexdigest(), len(data))
    sender.send(Send(B, Deliver("job-7", ref, {"id": "job-7"}), (ref,)), {ref.sha256: data})
    for frame in sender.frames(link_a, 0, 100.0):  # one high-water mark's worth: the module is half sent
        receiver.links.frame(link_b, frame, 100.0)
    sent = sender.transfers_state()["transfers"]
    got = receiver.transfers_state()["transfers"]
    assert [(t["direction"], t.get("jobId")) for t in sent] == [("send", "job-7")]
    assert [(t["direction"], t.get("jobId")) for t in got] == [("receive", "job-7")]


def test_fedadam_with_epsilon_zero_takes_a_zero_step_on_an_unmoved_weight() -> None:
    """epsilon 0 is valid ("from 0 to 1"); a weight no update moved has m = v = 0, so 0/0: it stays as it
    was, bit-identical on every kernel, and the round's aggregate is finite (the job does not pause)."""
    from weei.core.aggregation.aggregate import check_finite, server_step
    from weei.core.aggregation.methods import METHODS
    from weei.kernel.native import NativeKernel
    from weei.kernel.numpy_kernel import NumpyKernel
    from weei.kernel.wasm_kernel import WasmKernel

    start = np.array([0.5, -0.0, 1.0, 2.0, -3.0], dtype="<f4")
    average = np.array([0.5, -0.0, 1.5, 2.0, -2.0], dtype="<f4")  # weights 0, 1 and 3 unmoved
    results = []
    for kernel in (NumpyKernel(block=2), NativeKernel(), WasmKernel()):
        adam = METHODS["fedadam"]
        first = check_finite(kernel, server_step(kernel, adam, start.tobytes(), average.tobytes(), None, [(0, 5)],
                                                 (0.01, 0.9, 0.99, 0.0)))
        again = check_finite(kernel, server_step(kernel, adam, first.weights, first.weights, first.state, [(0, 5)],
                                                 (0.01, 0.9, 0.99, 0.0)))
        results.append((first.weights, first.state.data, again.weights, again.state.data))
    assert results[0] == results[1] == results[2]
    out = np.frombuffer(results[0][0], "<f4")
    assert out[[0, 3]].tolist() == [0.5, 2.0] and out[2] > 1.0 and out[4] > -3.0


ECHO = Path(__file__).parent / "fixtures" / "echo_model.c"
AUX_SLOT = {"id": "ref", "role": "reference-policy", "bytes": 16, "source": {"kind": "initial"}}


@pytest.fixture(scope="module")
def echo_aux(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The echo fixture model with one snapshot slot ('ref', 16 bytes); its train reports auxSlots."""
    clang = shutil.which("clang") or shutil.which("clang-14")
    if clang is None:
        pytest.skip("clang is not installed (make setup installs it)")
    out = tmp_path_factory.mktemp("wasm") / "echo_aux.wasm"
    subprocess.run([clang, "--target=wasm32", "-O2", "-nostdlib", "-mbulk-memory", "-Wl,--no-entry", "-DWITH_AUX",
                    "-o", str(out), str(ECHO)], check=True, capture_output=True)
    return out.read_bytes()


def test_the_gpu_admission_gate_loads_the_auxiliary_slots(echo_aux: bytes) -> None:
    """The gate's CPU step runs with the slots loaded (it used to stop at auxiliary-not-loaded, so a model with
    slots never reached the GPU); the echo model has no GPU operations, so the gate stops at its GPU step."""
    from weei.gpu.session import GpuBackendSpec, GpuWork, run_gate
    from weei.runtime import ModelRuntime, WasmtimeEngine

    runtime = ModelRuntime.load(echo_aux, WasmtimeEngine())
    weights = np.arange(4, dtype="<f4").tobytes()
    backend = GpuBackendSpec("gpu", 1 << 20, "fp32-standard")
    with pytest.raises(UsageError) as caught:
        run_gate(runtime, None, None, backend, weights,  # type: ignore[arg-type]  # never reached
                 GpuWork(data=bytes(8), format="echo-v1"), budget_mib=64, auxiliary={"ref": weights})
    assert caught.value.reason == "no-gpu-operations"


def test_continue_from_checkpoint_loads_the_slots_after_its_compatibility_load(echo_aux: bytes) -> None:
    """continueFromCheckpoint's loadModel is followed by loadAuxiliary, as every loadModel is."""
    from weei.prepare import PreparedJob
    from weei.runtime import ModelRuntime, WasmtimeEngine

    from sim import experience_spec

    spec, store = experience_spec(weight_count=4, aux=[AUX_SLOT])
    runtime = ModelRuntime.load(echo_aux, WasmtimeEngine())
    prepared = PreparedJob(spec, bytes(16), 1, runtime, store, None, None)
    prepared.load_checkpoint(np.arange(4, dtype="<f4").tobytes())
    assert runtime.train(data=bytes(8), format="echo-v1").metrics["auxSlots"] == 1


@pytest.mark.parametrize("aux, why", [
    ({}, "fills auxiliary slots []"),  # a declared slot left empty
    ({"ref": "snap16", "extra": "snap16"}, "the model declares ['ref']"),  # a slot the model does not declare
    ({"ref": "snap8"}, "8 bytes, the model declares 16"),  # not the declared size
])
def test_an_assignment_fills_exactly_the_declared_slots_at_the_weight_size(aux: dict[str, str], why: str) -> None:
    """Assign.auxiliary is checked against the model's slots and the weight size before anything trains: a
    bad one fails that attempt by name (AssignmentFailed), and the next good one trains."""
    from weei.core.wire.commands import Train
    from weei.core.wire.messages import AssignmentFailed, ChunkRef, Invitation
    from weei.core.job.participant import Participant

    from sim import JOB_ID, WASM, sha

    weights = bytes(16)
    refs = {"snap16": ArtifactRef("snapshot", sha(weights), 16), "snap8": ArtifactRef("snapshot", sha(b"8" * 8), 8)}
    info = {"id": "m", "auxiliaryWeights": [AUX_SLOT]}
    p = Participant("p1")
    p.on_message("coord", Invitation(JOB_ID, "coord", info, {"fileName": "model.wasm", "bytes": len(WASM),
                                                          "sha256": sha(WASM)}, 10, {"epochs": 1}), 0.0)
    p.decide(True, 0.0)
    p.on_message("coord", Deliver(JOB_ID, ArtifactRef("module", sha(WASM), len(WASM)), info), 0.0)
    p.module_loaded(16, (), 0.0)
    p.take_commands()

    def assign(n: int, slots: dict[str, ArtifactRef]) -> Assign:
        return Assign(JOB_ID, 1, f"a{n}", f"a{n}-1", ArtifactRef("checkpoint", sha(weights), 16),
                      {"localEpochs": 1, "batchSize": 2}, 7, ChunkRef("c", "syn", 5, ArtifactRef("chunk", sha(b"c"), 1)),
                      auxiliary=slots)

    p.on_message("coord", assign(1, {k: refs[v] for k, v in aux.items()}), 0.0)
    commands = p.take_commands()
    assert not any(isinstance(c, Train) for c in commands)
    failed = [c.message for c in commands if isinstance(c, Send) and isinstance(c.message, AssignmentFailed)]
    assert len(failed) == 1 and why in failed[0].error
    p.on_message("coord", assign(2, {"ref": refs["snap16"]}), 0.0)
    assert any(isinstance(c, Train) for c in p.take_commands())


def test_local_workers_effective_counts_the_models_default_units_per_assignment() -> None:
    """Without settings.experience an assignment has the model's unitsPerAssignment.default units, and no more
    Workers than units can play it (the code read a 'defaultUnits' key no model has)."""
    import asyncio
    import time

    from weei.api import TrainingController
    from weei.host.memory_storage import MemoryKeyValue, MemoryStorage
    from weei.host.worker_pool import ThreadWorkerPool
    from weei.kernel.numpy_kernel import NumpyKernel
    from weei.runtime import WasmtimeEngine

    async def main() -> dict[str, int]:
        engine = WasmtimeEngine()
        c = TrainingController(my_peer_id="me", storage=MemoryStorage(), kv=MemoryKeyValue(),
                               pool=ThreadWorkerPool(engine, 8), kernel=NumpyKernel(), engine=engine,
                               clock=lambda: time.time() * 1000, monotonic=lambda: time.monotonic() * 1000,
                               random_bytes=bytes, transport=None)
        await c.init()
        await c.set_max_local_workers(8)
        info = {"maxWorkers": 8, "workSource": {"kind": "experience", "inputs": "none",
                                                "unit": {"id": "episode", "label": "Episodes"},
                                                "unitsPerAssignment": {"default": 2, "minimum": 1, "maximum": 64}}}
        return c.view._local_workers(info=info, settings=None)

    assert asyncio.run(main())["effective"] == 2


def test_a_slot_beyond_the_task_memory_is_refused_at_create_job() -> None:
    """Slots may be 2 GiB, but every task copies the weights and every slot into a module's memory, which a
    browser caps at 1 GiB: such a job could never train, so creating it is refused by name."""
    from weei.core.errors import ManifestError
    from weei.core.formats.modelinfo import ModelInfo, check_weight_size

    from sim import experience_info

    def info(reward_bytes: int) -> ModelInfo:
        return ModelInfo.from_json(experience_info([
            {"id": "reward", "role": "reward-model", "bytes": reward_bytes, "sha256": "ab" * 32},
            AUX_SLOT]))

    check_weight_size(info((1 << 30) - 32), 16)  # exactly the cap: it fits
    with pytest.raises(ManifestError) as caught:
        check_weight_size(info(3 << 29), 16)
    assert caught.value.reason == "over-task-memory" and "1,073,741,824" in caught.value.message


def test_the_docs_list_every_refusal_of_invite() -> None:
    """docs/api.md's invite() entry names every reason the code raises for it (the page's argument check,
    the controller's and the coordinator's)."""
    import ast
    import inspect
    import textwrap

    import weei.api.controller as controller_module

    def reasons(function: Any) -> set[str]:
        tree = function if isinstance(function, ast.AST) else ast.parse(textwrap.dedent(inspect.getsource(function)))
        return {UsageReason[call.args[0].attr].value for call in ast.walk(tree)
                if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "UsageError"
                and call.args and isinstance(call.args[0], ast.Attribute)}

    # The page's module imports the browser's ``js``: read its argument check from the source.
    page = ast.parse((Path(controller_module.__file__).parents[1] / "browser" / "page_api.py").read_text())
    text_check = next(f for f in ast.walk(page) if isinstance(f, ast.FunctionDef) and f.name == "_text")
    raised = (reasons(text_check) | reasons(controller_module.TrainingController.check_invite)
              | reasons(controller_module.TrainingController._require_coordinator)
              | reasons(controller_module.Coordinator.check_invite))
    assert {"invalid-argument", "no-job", "not-coordinator", "peer-not-connected", "invite-self"} <= raised
    text = (Path(__file__).parents[2] / "docs" / "api.md").read_text(encoding="utf-8")
    entry = text[text.index("**`invite(peerId)`"):text.index("**`exportCheckpoint()`")]
    assert {r for r in raised if f"`{r}`" not in entry} == set()


def test_the_docs_do_not_deny_a_gpu_backend_a_built_in_model_has() -> None:
    """README and docs/abi.md said the byte-transformer had no GPU backend; its package has one."""
    import json
    import re

    root = Path(__file__).parents[2]
    with_gpu = [d.name for d in sorted((root / "app" / "static" / "models").iterdir())
                if any(b.get("kind") == "gpu" for b in
                       json.loads((d / "manifest.json").read_text())["execution"]["backends"])]
    assert "byte-transformer" in with_gpu
    for doc in ("README.md", "docs/abi.md"):
        for paragraph in re.split(r"\n\s*\n|\n(?=\* )", (root / doc).read_text(encoding="utf-8")):
            named = [m for m in with_gpu if m in paragraph]
            assert not (named and re.search(r"no GPU backend", paragraph, re.IGNORECASE)), (doc, named, paragraph)


def test_the_departures_from_the_manual_are_written_down_and_linked() -> None:
    """docs/manual-departures.md names each deliberate departure and the reading of the manual's silence on
    per-site enablement (how an operator turns the widget off); README's Documentation list links it."""
    root = Path(__file__).parents[2]
    readme = (root / "README.md").read_text(encoding="utf-8")
    docs = readme[readme.index("## Documentation"):]
    assert "(docs/manual-departures.md)" in docs.split("\n## ")[0]
    text = (root / "docs" / "manual-departures.md").read_text(encoding="utf-8")
    for topic in ("GPU training over dataset inputs", "The seed tag", "trailing newline", "every method",
                  "No TBT library", "One debug log per tab", "Per-site enablement", "turns it off"):
        assert topic in text, topic
