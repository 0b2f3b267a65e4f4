"""The page's side of ``widgetsApi.get('distributed-training')``: JS calls in, controller calls out.

Theory of operation
-------------------
``weei.js`` (section 4) owns the JavaScript API object on the page's main
thread; this runs in the host worker (``host.js``). Every method that needs
Python is a message the host worker turns into :meth:`PageApi.call` (async
methods) or :meth:`PageApi.call_sync` with a method name, its arguments as
JSON text and, for file-taking methods, an object of ``ArrayBuffer``s. This module only
converts: it decides nothing. Each name maps to one ``TrainingController``
method, which checks the role, the state and the inputs.

Every call returns an envelope, a plain JS object: ``{ok: true, json}``
(the result as JSON text, so ``null`` survives and bytes cannot slip
through), ``{ok: true, file: {name, bytes}}`` for exported files, or
``{ok: false, error: {reason, message, kind}}``. ``weei.js`` turns the
last into an ``Error`` whose ``message`` is the Python error's message and
``reason`` its reason code. An unexpected Python exception becomes reason
``internal-error`` (and is printed to the console with its traceback).

State: the page's ``getState()`` answers from the last state published here.
:meth:`listen` keeps one controller subscription (the host worker keeps it
on); its state dicts are coalesced (the controller notifies several times
within one command) and sent to ``on_state(jsonText)`` once per event-loop
turn, so each change is converted once. :meth:`publish` sends what is
pending at once; the host worker calls it before each reply, so a call's
promise settles after the page has its effect.

Mirrors: the page's synchronous methods cannot wait for this worker, so each
publish also sends, to ``on_mirror(name, value)``, whatever changed of what
they answer from: ``debugLog`` (``getDebugLog()``'s JSON and the text the
key-value store keeps, which the page writes on ``pagehide`` and
``visibilitychange``), ``checkpoint`` and ``module`` (the envelope of
``exportCheckpoint()`` / ``exportModule()``; the host worker makes its file a
``File``, which reaches the page by reference) and ``invite`` (the refusal
``invite()`` gives each connected peer and any other one, from
``TrainingController.check_invite``: the page throws it, or forwards the
invitation).
"""

from __future__ import annotations

import asyncio
import traceback
from typing import Any, Awaitable, Callable, NoReturn

import js  # type: ignore[import-not-found]

from weei.api.controller import TrainingController
from weei.core._check import parse_json
from weei.core.errors import UsageError, WeeiError, UsageReason

from .convert import is_nullish, js_bytes, json_text
from .engine import PageEngine, to_uint8array
from .worker_main import js_object

__all__ = ["PageApi", "UNKNOWN_PEER"]

#: The peer ID invite()'s mirrored refusal for a peer that is not connected names (weei.js puts the real one in).
UNKNOWN_PEER = "\u0000peer"


def _arg(args: dict[str, Any], name: str) -> Any:
    return args.get(name)


def _text(args: dict[str, Any], name: str, what: str) -> str:
    value = args.get(name)
    if not isinstance(value, str):
        raise UsageError(UsageReason.INVALID_ARGUMENT, f"{what} must be a string")
    return value


class PageApi:
    """Converts the page's calls for one :class:`TrainingController`."""

    def __init__(self, controller: TrainingController, engine: PageEngine, storage: Any,
                 on_state: Callable[[str], None], on_mirror: Callable[[str, Any], None] | None = None) -> None:
        self.controller = controller
        self.engine = engine
        self.storage = storage
        self._on_state = on_state
        self._on_mirror = on_mirror
        self._mirrored: dict[str, Any] = {}  # what was last published, per mirror
        self._unsubscribe: Callable[[], None] | None = None
        self._pending: dict[str, Any] | None = None
        self._last_state: str | None = None
        self._scheduled = False
        self._async: dict[str, Callable[[dict[str, Any], Any], Awaitable[Any]]] = {
            "createJob": self._create_job,
            "continueFromCheckpoint": self._continue_from_checkpoint,
            "decideInvitation": lambda a, _b: controller.decide_invitation(_text(a, "jobId", "jobId"),
                                                                          bool(_arg(a, "accepted"))),
            "start": lambda _a, _b: controller.start(),
            "pause": lambda _a, _b: controller.pause(),
            "resume": lambda _a, _b: controller.resume(),
            "stop": lambda _a, _b: controller.stop(),
            "updateSettings": lambda a, _b: controller.update_settings(_arg(a, "settings")),
            "runValidation": lambda _a, _b: controller.run_validation(),
            "shuffleChunks": lambda _a, _b: controller.shuffle_chunks(),
            "leave": lambda _a, _b: controller.leave(),
            "setMaxLocalWorkers": lambda a, _b: controller.set_max_local_workers(_arg(a, "count")),
            "setGpuMemoryBudgetMiB": lambda a, _b: controller.set_gpu_memory_budget_mib(_arg(a, "mib")),
            "setBackendPreference": lambda a, _b: controller.set_backend_preference(_arg(a, "preference")),
            "setDisplayName": lambda a, _b: controller.set_display_name(_arg(a, "name")),
            "tryCheckpoint": lambda a, _b: controller.try_checkpoint(_arg(a, "request")),
            "setCheckpointRetention": lambda a, _b: controller.set_checkpoint_retention(_arg(a, "keepLast")),
            "getStorageUse": lambda _a, _b: controller.storage_use(),
            "openSavedJob": lambda a, _b: controller.open_saved_job(_text(a, "jobId", "the job id")),
            "deleteSavedJob": lambda a, _b: controller.delete_saved_job(_text(a, "jobId", "the job id")),
            "importOnnx": self._import_onnx,
            "exportOnnx": self._export_onnx,
            "pauseContribution": self._pause_contribution,
            "listSavedJobs": self._list_saved_jobs,
            "debugStorageKeys": self._storage_keys,
            "debugIdle": lambda _a, _b: controller.idle(),
        }
        self._sync: dict[str, Callable[[dict[str, Any]], Any]] = {
            "invite": lambda a: controller.invite(_text(a, "peerId", "the peer id")),
            "getDebugLog": lambda _a: controller.get_debug_log(),
            "clearDebugLog": lambda _a: controller.clear_debug_log(),
            "exportCheckpoint": self._export_checkpoint,
            "exportModule": self._export_module,
            "reviewSettings": lambda a: controller.review_settings(_arg(a, "settings"), _arg(a, "manifest")),
        }

    # -- calls from the page ---------------------------------------------------

    async def call(self, name: str, args_json: str, blobs: Any = None) -> Any:
        """Run async method ``name``; returns the envelope (never raises)."""
        try:
            handler = self._async.get(name)
            if handler is None:
                raise UsageError(UsageReason.UNKNOWN_METHOD, f"unknown method {name}")
            value = await handler(self._args(args_json), blobs)
            return self._ok(value)
        except Exception as exc:  # every failure goes back to the page as a rejected promise
            return self._failed(exc)

    def call_sync(self, name: str, args_json: str) -> Any:
        """Run synchronous method ``name``; returns the envelope (never raises)."""
        try:
            handler = self._sync.get(name)
            if handler is None:
                raise UsageError(UsageReason.UNKNOWN_METHOD, f"unknown method {name}")
            return self._ok(handler(self._args(args_json)))
        except Exception as exc:
            return self._failed(exc)

    def get_state_json(self) -> str:
        """getState(): the controller's TrainingState as JSON text."""
        return json_text(self.controller.get_state())

    def listen(self, on: bool) -> None:
        """Keep (or drop) the one controller subscription that feeds ``on_state``."""
        if on and self._unsubscribe is None:
            self._unsubscribe = self.controller.subscribe(self._changed)
        elif not on and self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
            self._pending = None

    # -- state -------------------------------------------------------------------

    def _changed(self, state: dict[str, Any]) -> None:
        self._pending = state
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_event_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        self.publish()

    def publish(self) -> None:
        """Send the state if it changed, then the mirrors that changed with it (the host worker calls
        this before each reply too, so a call's promise settles after the page has seen its effect)."""
        state, self._pending = self._pending, None
        self._send(None if state is None else json_text(state))

    def refresh(self) -> None:
        """Publish the state if it is not the one last published: what changes without the controller telling
        (``activeWorkers`` when a cancelled task's Worker is let go, the diagnostics' ages). The host worker
        calls this every second, so the page's copy is never more than about a second behind."""
        if self._pending is not None:
            self.publish()
        elif self._unsubscribe is not None:
            text = json_text(self.controller.get_state())
            self._send(text if text != self._last_state else None)

    def _send(self, state_text: str | None) -> None:
        try:
            if state_text is not None and self._unsubscribe is not None:
                self._last_state = state_text
                self._on_state(state_text)
            if self._on_mirror is not None:
                self._publish_mirrors()
        except Exception:  # a page listener's error must not stop the job
            js.console.error("[weei] state listener failed:\n" + traceback.format_exc())

    # -- mirrors: what the page's synchronous methods answer from -------------------------

    def _publish_mirrors(self) -> None:
        c = self.controller
        checks: dict[str, tuple[Any, Callable[[], Any]]] = {
            "debugLog": (c.session.debug_log.revision, self.debug_log),
            "checkpoint": (_Same(c.store.latest_checkpoint),
                           lambda: self._answer(lambda: self._export_checkpoint({}))),
            "module": (self._module_key(), lambda: self._answer(lambda: self._export_module({}))),
            "invite": (json_text(self._invite_refusals()), None),
        }
        for name, (key, value) in checks.items():
            if name in self._mirrored and self._mirrored[name] == key:
                continue
            self._mirrored[name] = key
            assert self._on_mirror is not None
            self._on_mirror(name, key if value is None else value())

    def debug_log(self) -> Any:
        """``{file, stored}``: getDebugLog() as JSON text (the page sets exportedAt when it answers) and the
        text the key-value store keeps (the page writes it when it is hidden or closed: the controller's own
        copy is written at most every 2 s, and a message from here would come too late)."""
        log = self.controller.session.debug_log
        return js_object({"file": json_text(self.controller.get_debug_log()), "stored": log.to_json()})

    def _module_key(self) -> Any:
        try:
            module = self.controller.export_module()
        except WeeiError as exc:
            return ("refused", exc.reason)
        return None if module is None else (module[0], _Same(module[1]))

    def _answer(self, handler: Callable[[], Any]) -> Any:
        try:
            return self._ok(handler())
        except Exception as exc:
            return self._failed(exc)

    def _invite_refusals(self) -> dict[str, Any]:
        """invite()'s refusal for each connected peer (None: allowed) and for any other peer
        (``other``; its message names UNKNOWN_PEER, which the page replaces by the peer it was given)."""
        transport = self.controller.session.transport
        peers = list(transport.peers()) if transport is not None else []
        return {"peers": {peer: self._refusal(peer) for peer in peers}, "other": self._refusal(UNKNOWN_PEER)}

    def _refusal(self, peer: str) -> dict[str, str] | None:
        try:
            self.controller.check_invite(peer)
        except WeeiError as exc:
            return {"reason": exc.reason, "message": exc.message, "kind": type(exc).__name__}
        return None

    # -- envelopes ---------------------------------------------------------------

    @staticmethod
    def _args(args_json: str) -> dict[str, Any]:
        if is_nullish(args_json) or args_json == "":
            return {}
        args = parse_json(str(args_json), _bad_arguments)
        if not isinstance(args, dict):
            raise UsageError(UsageReason.INVALID_ARGUMENT, "arguments must be an object")
        return args

    @staticmethod
    def _ok(value: Any) -> Any:
        if isinstance(value, list) and value and all(isinstance(v, tuple) for v in value):  # several files
            return js_object({"ok": True, "files": [{"name": n, "bytes": to_uint8array(d)} for n, d in value]})
        if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], (bytes, bytearray)):
            name, data = value
            return js_object({"ok": True, "file": {"name": name, "bytes": to_uint8array(data)}})
        return js_object({"ok": True, "json": json_text(value)})

    @staticmethod
    def _failed(exc: BaseException) -> Any:
        if isinstance(exc, WeeiError):
            error = {"reason": exc.reason, "message": exc.message, "kind": type(exc).__name__}
        else:
            js.console.error("[weei] internal error:\n" + "".join(traceback.format_exception(exc)))
            error = {"reason": "internal-error", "message": f"{type(exc).__name__}: {exc}", "kind": "InternalError"}
        return js_object({"ok": False, "error": error})

    # -- methods with files ---------------------------------------------------------

    @staticmethod
    def _package(args: dict[str, Any], blobs: Any) -> dict[str, Any]:
        """The controller's keyword arguments for the model, manifest, files and validation."""
        if is_nullish(blobs):
            raise UsageError(UsageReason.INVALID_ARGUMENT, "the files are missing")
        names = args.get("fileNames") or []
        buffers = list(blobs.files) if not is_nullish(getattr(blobs, "files", None)) else []
        if len(names) != len(buffers):
            raise UsageError(UsageReason.INVALID_ARGUMENT, "file names and contents do not match")
        files = {str(n): js_bytes(b) for n, b in zip(names, buffers, strict=True)}
        validation = None
        if not is_nullish(getattr(blobs, "validation", None)):
            validation = (str(args.get("validationName") or "validation"), js_bytes(blobs.validation))
        return {"wasm_name": str(args.get("wasmName") or "model.wasm"), "wasm": js_bytes(blobs.wasm),
                "manifest": js_bytes(blobs.manifest), "files": files, "validation": validation}

    @staticmethod
    def _execution_files(args: dict[str, Any], blobs: Any) -> dict[str, bytes]:
        """createJob's executionFiles (the WGSL archive) by name."""
        names = args.get("executionNames") or []
        buffers = list(blobs.execution) if not is_nullish(getattr(blobs, "execution", None)) else []
        if len(names) != len(buffers):
            raise UsageError(UsageReason.INVALID_ARGUMENT, "execution file names and contents do not match")
        return {str(n): js_bytes(b) for n, b in zip(names, buffers, strict=True)}

    async def _create_job(self, args: dict[str, Any], blobs: Any) -> str:
        package = self._package(args, blobs)
        # prepare_job compiles the module synchronously; the main thread
        # may only compile large modules asynchronously: compile first.
        await self.engine.precompile(package["wasm"])
        return await self.controller.create_job(**package, settings=args.get("settings"),
                                                execution_files=self._execution_files(args, blobs))

    async def _continue_from_checkpoint(self, args: dict[str, Any], blobs: Any) -> str:
        package = self._package(args, blobs)
        checkpoint = js_bytes(blobs.checkpoint)
        await self.engine.precompile(package["wasm"])
        return await self.controller.continue_from_checkpoint(
            checkpoint=checkpoint, **package, settings=args.get("settings"),
            dataset_mode=args.get("datasetMode"),  # type: ignore[arg-type]
            execution_files=self._execution_files(args, blobs))

    def _export_checkpoint(self, _args: dict[str, Any]) -> tuple[str, bytes]:
        name, data = self.controller.export_checkpoint()
        return name, bytes(data)

    def _export_module(self, _args: dict[str, Any]) -> tuple[str, bytes] | None:
        module = self.controller.export_module()
        return None if module is None else (module[0], bytes(module[1]))

    async def _import_onnx(self, args: dict[str, Any], blobs: Any) -> list[tuple[str, bytes]]:
        from .onnx_form import import_in_page

        if is_nullish(blobs) or is_nullish(getattr(blobs, "onnx", None)) or is_nullish(getattr(blobs, "runtime", None)):
            raise UsageError(UsageReason.INVALID_ARGUMENT, "the ONNX file is missing")
        names = args.get("fileNames") or []
        buffers = list(blobs.files) if not is_nullish(getattr(blobs, "files", None)) else []
        if len(names) != len(buffers):
            raise UsageError(UsageReason.INVALID_ARGUMENT, "file names and contents do not match")
        files = {str(n): js_bytes(b) for n, b in zip(names, buffers, strict=True)}
        return import_in_page(self.engine, args, js_bytes(blobs.onnx), js_bytes(blobs.runtime), files)

    async def _export_onnx(self, args: dict[str, Any], blobs: Any) -> tuple[str, bytes]:
        from .onnx_form import export_in_page

        if is_nullish(blobs) or is_nullish(getattr(blobs, "onnx", None)):
            raise UsageError(UsageReason.INVALID_ARGUMENT, "the ONNX file is missing")
        return await export_in_page(self.controller, args.get("round"), js_bytes(blobs.onnx))

    async def _pause_contribution(self, args: dict[str, Any], _blobs: Any) -> None:
        self.controller.pause_contribution(bool(_arg(args, "paused")))

    async def _list_saved_jobs(self, _args: dict[str, Any], _blobs: Any) -> list[dict[str, Any]]:
        saved: list[dict[str, Any]] = self.controller.get_state()["savedJobs"]
        return saved

    async def _storage_keys(self, args: dict[str, Any], _blobs: Any) -> list[str]:
        keys: list[str] = await self.storage.keys(_text(args, "store", "store"))
        return keys


class _Same:
    """Equal only to a holder of the very same object (a checkpoint's or module's bytes: comparing them by
    value would cost a pass over megabytes, and an id() can be reused once the old object is gone)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.value is self.value

    __hash__ = None  # type: ignore[assignment]


def _bad_arguments(message: str) -> NoReturn:
    # The embedding page's arguments, as JSON.stringify wrote them: nesting past
    # MAX_JSON_DEPTH (or an integer past 4,300 digits) is the page's error, by name.
    raise UsageError(UsageReason.INVALID_ARGUMENT, f"the arguments {message}")
