"""The page's side of ``widgetsApi.get('distributed-training')``: JS calls in, controller calls out.

Theory of operation
-------------------
``weei.js`` (section 5) owns the JavaScript API object; every method of it
that needs Python calls :meth:`PageApi.call` (async methods) or
:meth:`PageApi.call_sync` with a method name, its arguments as JSON text and,
for file-taking methods, an object of ``ArrayBuffer``s. This module only
converts: it decides nothing. Each name maps to one ``TrainingController``
method, which checks the role, the state and the inputs.

Every call returns an envelope, a plain JS object: ``{ok: true, json}``
(the result as JSON text, so ``null`` survives and bytes cannot slip
through), ``{ok: true, file: {name, bytes}}`` for exported files, or
``{ok: false, error: {reason, message, kind}}``. ``weei.js`` turns the
last into an ``Error`` whose ``message`` is the Python error's message and
``reason`` its reason code. An unexpected Python exception becomes reason
``internal-error`` (and is printed to the console with its traceback).

On ``pagehide`` and ``visibilitychange`` the controller writes its debug log
to ``localStorage`` at once (it is otherwise written throttled).

State: :meth:`get_state_json` is ``getState()``. While the page has
subscribers, :meth:`listen` keeps one controller subscription; its state
dicts are coalesced (the controller notifies several times within one
command) and sent to the page's ``on_state(jsonText)`` once per event-loop
turn, so the page converts each change once.
"""

from __future__ import annotations

import asyncio
import traceback
from typing import Any, Awaitable, Callable, NoReturn

import js  # type: ignore[import-not-found]
from pyodide.ffi import create_proxy  # type: ignore[import-not-found]

from weei.api.controller import TrainingController
from weei.core._check import parse_json
from weei.core.errors import UsageError, WeeiError

from .convert import is_nullish, js_bytes, json_text
from .engine import PageEngine, to_uint8array
from .worker_main import js_object

__all__ = ["PageApi"]


def _arg(args: dict[str, Any], name: str) -> Any:
    return args.get(name)


def _text(args: dict[str, Any], name: str, what: str) -> str:
    value = args.get(name)
    if not isinstance(value, str):
        raise UsageError("invalid-argument", f"{what} must be a string")
    return value


class PageApi:
    """Converts the page's calls for one :class:`TrainingController`."""

    def __init__(self, controller: TrainingController, engine: PageEngine, storage: Any,
                 on_state: Callable[[str], None]) -> None:
        self.controller = controller
        self.engine = engine
        self.storage = storage
        self._on_state = on_state
        self._unsubscribe: Callable[[], None] | None = None
        self._pending: dict[str, Any] | None = None
        self._scheduled = False
        # The debug log reaches localStorage at most every 2 s: what the last seconds added is
        # written when the page is hidden or goes away. The proxy lives as long as the page.
        self._on_hide = create_proxy(lambda _event: controller.flush_debug_log())
        js.window.addEventListener("pagehide", self._on_hide)
        js.document.addEventListener("visibilitychange", self._on_hide)
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
            "openSavedJob": lambda a, _b: controller.open_saved_job(_text(a, "jobId", "the job id")),
            "deleteSavedJob": lambda a, _b: controller.delete_saved_job(_text(a, "jobId", "the job id")),
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
                raise UsageError("unknown-method", f"unknown method {name}")
            value = await handler(self._args(args_json), blobs)
            return self._ok(value)
        except Exception as exc:  # every failure goes back to the page as a rejected promise
            return self._failed(exc)

    def call_sync(self, name: str, args_json: str) -> Any:
        """Run synchronous method ``name``; returns the envelope (never raises)."""
        try:
            handler = self._sync.get(name)
            if handler is None:
                raise UsageError("unknown-method", f"unknown method {name}")
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
        state, self._pending = self._pending, None
        if state is None or self._unsubscribe is None:
            return
        try:
            self._on_state(json_text(state))
        except Exception:  # a page listener's error must not stop the job
            js.console.error("[weei] state listener failed:\n" + traceback.format_exc())

    # -- envelopes ---------------------------------------------------------------

    @staticmethod
    def _args(args_json: str) -> dict[str, Any]:
        if is_nullish(args_json) or args_json == "":
            return {}
        args = parse_json(str(args_json), _bad_arguments)
        if not isinstance(args, dict):
            raise UsageError("invalid-argument", "arguments must be an object")
        return args

    @staticmethod
    def _ok(value: Any) -> Any:
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
            raise UsageError("invalid-argument", "the files are missing")
        names = args.get("fileNames") or []
        buffers = list(blobs.files) if not is_nullish(getattr(blobs, "files", None)) else []
        if len(names) != len(buffers):
            raise UsageError("invalid-argument", "file names and contents do not match")
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
            raise UsageError("invalid-argument", "execution file names and contents do not match")
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

    async def _pause_contribution(self, args: dict[str, Any], _blobs: Any) -> None:
        self.controller.pause_contribution(bool(_arg(args, "paused")))

    async def _list_saved_jobs(self, _args: dict[str, Any], _blobs: Any) -> list[dict[str, Any]]:
        saved: list[dict[str, Any]] = self.controller.get_state()["savedJobs"]
        return saved

    async def _storage_keys(self, args: dict[str, Any], _blobs: Any) -> list[str]:
        keys: list[str] = await self.storage.keys(_text(args, "store", "store"))
        return keys


def _bad_arguments(message: str) -> NoReturn:
    # The embedding page's arguments, as JSON.stringify wrote them: nesting past
    # MAX_JSON_DEPTH (or an integer past 4,300 digits) is the page's error, by name.
    raise UsageError("invalid-argument", f"the arguments {message}")
