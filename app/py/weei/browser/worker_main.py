"""The Python side of ``worker.js``: one model, trained and evaluated for the page.

Theory of operation
-------------------
``worker.js`` loads Pyodide, unpacks the weei package, calls :func:`start`
with a function that posts a message (``post(message)``) and then hands every
request from the page to :func:`handle`, one at a time, posting what it
returns (``ArrayBuffer`` fields are transferred, not copied).

Requests are plain objects with an ``id`` (echoed back) and an ``op``:

===================== ====================================================
``loadModel``         ``wasm`` (ArrayBuffer), optional ``module`` (the
                      ``WebAssembly.Module`` compiled from those bytes by
                      the page, shared by its Workers); instantiate the
                      model module; replies ``modelInfo`` (an object),
                      ``compiled`` (whether this Worker compiled the bytes
                      itself) and ``seconds``. Compiled modules are kept by
                      SHA-256 (``BrowserEngine``): V8 installs optimized
                      code in the compiled module as functions get hot, so
                      a module loaded again, or shared with the Worker that
                      warmed it, starts with that code
``createInitialWeights`` ``seed`` (u64 as a decimal string or a number);
                      replies ``weights``
``train``             ``weights``, then ``data`` + ``format`` + ``seed``
                      or ``experience`` = ``{unitStart, unitCount, seed}``,
                      ``settings`` (object), optional ``auxiliary``
                      (``{slotId: ArrayBuffer}``); replies ``weights``,
                      ``metrics``, ``uniqueExamples`` / ``completedUnits``,
                      ``optimizerSteps``, ``seconds``
``evaluate``          as train without ``seed``/``settings``; replies
                      ``metrics``, ``examples``, ``seconds``
``trainGpu``          as train, plus ``gpu`` = ``{job, archive (the WGSL
                      archive's text), backend (the GPU backend entry),
                      preference, budgetMiB}``: the assignment on this
                      Worker's WebGPU device (``weei.gpu.trainer``: the
                      device is kept between requests, the gate runs once
                      per job and device); replies as train plus ``gpu`` =
                      ``{steps, trainingMs, gate}``. While it runs it posts
                      ``{type: "progress", id, event, detail}`` for
                      ``adapter`` (``{adapter}``) and ``compiled``
                      (``{compilationMs}``). A GPU failure is a reply with
                      ``kind: "gpu"`` and the fallback's reason.
===================== ====================================================

``trainGpu`` blocks on WebGPU's promises (the shim's ``run_sync``), which
works only because ``worker.js`` enters :func:`handle` for it with
``callPromising`` (JSPI); every other request is a plain call (a promising
call switches stacks each time). It handles one request at a time anyway.

Every reply is ``{type: "reply", id, ok: true, ...}`` or ``{type: "reply",
id, ok: false, error: {kind, reason, message}}`` (``kind`` is ``model`` for
a failure of the module, ``usage`` for a bad request). While ``train`` or
``evaluate`` runs, ``weei.onProgress`` reports are posted as ``{type:
"progress", id, processedExamples, totalExamples, metrics}``: the first,
the last (processed = total) and at most one per ``progressIntervalMs``
(a request field, default 100; 0 forwards every report) in between.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import js  # type: ignore[import-not-found]
from pyodide.ffi import JsProxy, to_js  # type: ignore[import-not-found]

try:  # JS null arrives as this sentinel in recent Pyodide (as None before)
    from pyodide.ffi import jsnull  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover
    jsnull = None

from weei.core.errors import UsageError, WeeiError, UsageReason
from weei.gpu.archive import parse_archive
from weei.gpu.errors import GpuError
from weei.gpu.session import GpuBackendSpec, GpuWork
from weei.gpu.trainer import GpuAssignment, GpuTrainer
from weei.runtime.abi import ModelRuntime
from weei.runtime.results import TrainProgress

from .engine import BrowserEngine, to_uint8array

__all__ = ["start", "handle", "WorkerSession"]

Post = Callable[[Any], None]

#: Seconds between forwarded progress reports (the last one always goes).
DEFAULT_PROGRESS_INTERVAL = 0.1


def js_object(value: Mapping[str, Any]) -> Any:
    """A plain JS object from a dict (nested dicts too; JS values pass as they are)."""
    return to_js(value, dict_converter=js.Object.fromEntries)


def _field(msg: Any, name: str) -> Any:
    value = getattr(msg, name, None)
    return None if value is None or value is jsnull else value


def _bytes(msg: Any, name: str, required: bool = True) -> bytes | None:
    value = _field(msg, name)
    if value is None:
        if required:
            raise UsageError(UsageReason.INVALID_REQUEST, f"{name} is required")
        return None
    if not isinstance(value, JsProxy) or not hasattr(value, "to_bytes"):
        raise UsageError(UsageReason.INVALID_REQUEST, f"{name} must be an ArrayBuffer or a typed array")
    return value.to_bytes()


def _seed(value: Any, name: str) -> int:
    try:
        seed = int(str(value), 10)
    except ValueError:
        raise UsageError(UsageReason.INVALID_REQUEST, f"{name} must be a u64 (decimal string or number), got {value!r}") from None
    return seed


def _plain(value: Any) -> Any:
    return value.to_py() if isinstance(value, JsProxy) else value


@dataclass(frozen=True)
class WorkRequest:
    """A train or evaluate request, checked at the boundary."""

    weights: bytes
    data: bytes | None
    format: str | None
    experience: tuple[int, int, int] | None
    seed: int
    settings: dict[str, Any]
    auxiliary: dict[str, bytes]

    @classmethod
    def parse(cls, msg: Any, op: str) -> WorkRequest:
        weights = _bytes(msg, "weights")
        assert weights is not None
        data = _bytes(msg, "data", required=False)
        fmt = _field(msg, "format")
        exp = _field(msg, "experience")
        experience = None
        if exp is not None:
            fields = _plain(exp)
            if not isinstance(fields, dict):
                raise UsageError(UsageReason.INVALID_REQUEST, "experience must be {unitStart, unitCount, seed}")
            try:
                experience = (int(fields["unitStart"]), int(fields["unitCount"]), _seed(fields["seed"], "experience.seed"))
            except (KeyError, TypeError, ValueError):
                raise UsageError(UsageReason.INVALID_REQUEST, "experience must be {unitStart, unitCount, seed}") from None
        settings = _plain(_field(msg, "settings")) or {}
        if not isinstance(settings, dict):
            raise UsageError(UsageReason.INVALID_REQUEST, f"{op}: settings must be an object")
        aux = _field(msg, "auxiliary")
        auxiliary: dict[str, bytes] = {}
        if aux is not None:
            for key in js.Object.keys(aux):
                auxiliary[str(key)] = getattr(aux, key).to_bytes()
        seed_value = _field(msg, "seed")
        return cls(
            weights=weights,
            data=data,
            format=None if fmt is None else str(fmt),
            experience=experience,
            seed=0 if seed_value is None else _seed(seed_value, "seed"),
            settings=settings,
            auxiliary=auxiliary,
        )


class WorkerSession:
    """One Worker's state: the loaded model and its engine."""

    def __init__(self, post: Post) -> None:
        self._post = post
        self._engine: BrowserEngine | None = None
        self._runtime: ModelRuntime | None = None
        self._needs_auxiliary = False
        self._request_id: Any = None
        self._progress_interval = DEFAULT_PROGRESS_INTERVAL
        self._last_progress = -math.inf
        self._gpu: GpuTrainer | None = None  # this Worker's WebGPU device, on the first trainGpu

    def handle(self, msg: Any) -> Any:
        """Run one request; return the reply as a JS object (never raises for
        a bad request or a failing module: the reply says ``ok: false``)."""
        request_id = _field(msg, "id")
        try:
            op = str(_field(msg, "op"))
            method = self._OPS.get(op)
            if method is None:
                raise UsageError(UsageReason.UNKNOWN_OP, f"unknown op {op!r}")
            self._request_id = request_id
            interval = _field(msg, "progressIntervalMs")
            self._progress_interval = DEFAULT_PROGRESS_INTERVAL if interval is None else float(interval) / 1000
            self._last_progress = -math.inf
            reply = method(self, msg)
        except GpuError as exc:  # a named fallback (a WeeiError, so caught first): the page restarts on the CPU
            reply = {"ok": False, "error": {"kind": "gpu", "reason": exc.reason, "message": exc.message}}
        except WeeiError as exc:
            kind = "usage" if isinstance(exc, UsageError) else "model"
            reply = {"ok": False, "error": {"kind": kind, "reason": exc.reason, "message": exc.message}}
        finally:
            self._request_id = None
        return js_object({"type": "reply", "id": request_id, **reply, "ok": reply.get("ok", True)})

    # -- operations ------------------------------------------------------------

    def _load_model(self, msg: Any) -> dict[str, Any]:
        wasm = _bytes(msg, "wasm")
        assert wasm is not None
        module = _field(msg, "module")
        # One engine per Worker: its cache of compiled modules outlives the instances.
        if self._engine is None:
            self._engine = BrowserEngine()
        self._engine.close()
        self._runtime = None
        start = time.perf_counter()
        if module is not None and not self._engine.adopt(wasm, module):
            raise UsageError(UsageReason.INVALID_REQUEST, "module must be the WebAssembly.Module compiled from wasm")
        compiles = self._engine.compiles
        self._runtime = ModelRuntime.load(wasm, self._engine, self._on_progress)
        info = self._runtime.model_info()
        # model_info() deep-copies: ask once, not before every train.
        self._needs_auxiliary = bool(info.get("auxiliaryWeights"))
        return {"modelInfo": info, "compiled": self._engine.compiles > compiles, "seconds": time.perf_counter() - start}

    def _require(self) -> ModelRuntime:
        if self._runtime is None:
            raise UsageError(UsageReason.NO_MODEL, "send loadModel first")
        if self._runtime.broken is not None:
            raise UsageError(UsageReason.INSTANCE_BROKEN, f"the model instance is unusable ({self._runtime.broken}); send loadModel")
        return self._runtime

    def _create_initial_weights(self, msg: Any) -> dict[str, Any]:
        runtime = self._require()
        weights = runtime.create_initial_weights(_seed(_field(msg, "seed"), "seed"))
        return {"weights": to_uint8array(weights).buffer}

    def _load(self, runtime: ModelRuntime, request: WorkRequest) -> None:
        runtime.load_model(request.weights)
        if request.auxiliary or self._needs_auxiliary:
            runtime.load_auxiliary(request.auxiliary)

    def _train(self, msg: Any) -> dict[str, Any]:
        runtime = self._require()
        request = WorkRequest.parse(msg, "train")
        start = time.perf_counter()
        self._load(runtime, request)
        result = runtime.train(
            data=request.data, format=request.format, experience=request.experience,
            seed=request.seed, settings=request.settings,
        )
        seconds = time.perf_counter() - start
        return {
            "weights": to_uint8array(result.weights).buffer,
            "metrics": dict(result.metrics),
            "uniqueExamples": result.unique_examples,
            "completedUnits": result.completed_units,
            "optimizerSteps": result.optimizer_steps,
            "seconds": seconds,
        }

    def _train_gpu(self, msg: Any) -> dict[str, Any]:
        runtime = self._require()
        request = WorkRequest.parse(msg, "trainGpu")
        assignment = _gpu_assignment(_plain(_field(msg, "gpu")), request)
        if self._gpu is None:
            from . import webgpu  # navigator.gpu of this Worker (None without WebGPU: webgpu-unavailable)

            self._gpu = GpuTrainer(webgpu.gpu)
        start = time.perf_counter()

        def event(kind: str, detail: dict[str, Any]) -> None:
            self._post(js_object({"type": "progress", "id": self._request_id, "event": kind, "detail": detail}))

        outcome = self._gpu.run(runtime, assignment, event)
        return {
            "weights": to_uint8array(outcome.weights).buffer,
            "metrics": outcome.metrics,
            ("completedUnits" if request.experience is not None else "uniqueExamples"): outcome.examples,
            "optimizerSteps": outcome.optimizer_steps,
            "seconds": time.perf_counter() - start,
            "gpu": {"steps": outcome.steps, "trainingMs": outcome.training_ms, "gate": outcome.gate},
        }

    def _evaluate(self, msg: Any) -> dict[str, Any]:
        runtime = self._require()
        request = WorkRequest.parse(msg, "evaluate")
        start = time.perf_counter()
        self._load(runtime, request)
        result = runtime.evaluate(data=request.data, format=request.format, experience=request.experience)
        return {"metrics": dict(result.metrics), "examples": result.examples, "seconds": time.perf_counter() - start}

    _OPS: dict[str, Callable[[WorkerSession, Any], dict[str, Any]]] = {
        "loadModel": _load_model,
        "createInitialWeights": _create_initial_weights,
        "train": _train,
        "evaluate": _evaluate,
        "trainGpu": _train_gpu,
    }

    def _on_progress(self, progress: TrainProgress) -> None:
        # A model may report every batch (hundreds per second); the page
        # needs a few per second, and each post costs ~15-30 µs of Python.
        now = time.perf_counter()
        final = progress.processed_examples >= progress.total_examples
        if not final and now - self._last_progress < self._progress_interval:
            return
        self._last_progress = now
        self._post(js_object({
            "type": "progress",
            "id": self._request_id,
            "processedExamples": progress.processed_examples,
            "totalExamples": progress.total_examples,
            "metrics": dict(progress.metrics),
        }))


def _gpu_assignment(gpu: Any, request: WorkRequest) -> GpuAssignment:
    """trainGpu's ``gpu`` field, checked (the archive module by module again)."""
    if not isinstance(gpu, dict):
        raise UsageError(UsageReason.INVALID_REQUEST, "trainGpu: gpu must be {job, archive, backend, preference, budgetMiB}")
    try:
        archive = parse_archive(str(gpu["archive"]).encode("utf-8"))
        spec = GpuBackendSpec.from_backend(gpu["backend"])
        preference, budget, job = str(gpu["preference"]), int(gpu["budgetMiB"]), str(gpu["job"])
    except (KeyError, TypeError, ValueError, AttributeError):
        raise UsageError(UsageReason.INVALID_REQUEST, "trainGpu: gpu must be {job, archive, backend, preference, budgetMiB}") from None
    work = GpuWork(data=request.data, format=request.format, experience=request.experience, seed=request.seed,
                   settings=request.settings)
    return GpuAssignment(job, archive, spec, preference, budget, request.weights, request.auxiliary, work)


_session: WorkerSession | None = None


def start(post: Post) -> None:
    """Create the Worker's session; ``post`` sends one message to the page."""
    global _session
    _session = WorkerSession(post)


def handle(msg: Any) -> Any:
    """Handle one request from the page (see the module docstring)."""
    if _session is None:
        raise RuntimeError("weei.browser.worker_main.start() was not called")
    return _session.handle(msg)
