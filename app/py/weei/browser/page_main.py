"""The Python side of the page: what the host worker (``host.js``) runs in its Pyodide.

Theory of operation
-------------------
``weei.js`` starts the host worker lazily (after ``weeiReady``); it starts
Pyodide (``boot.mjs``), unpacks the weei package and calls :func:`start`
with the site's base URL. Nothing here runs on the page's main thread: what
a Worker lacks reaches it through host.js (``localStorage`` and
``sessionStorage`` mirrors, ``RTCPeerConnection`` stand-ins over the page's
real ones), so the same code would run on a page too.
:class:`PageSession` owns the page's one ``aggregate.wasm`` instance
(``WasmKernel`` over :class:`BrowserEngine`).

:meth:`PageSession.open_api` is the bootstrap of the API: it binds one
``TrainingController`` to the browser's ports — IndexedDB
(:mod:`.idb`), localStorage (:mod:`.local_storage`), module Workers
(:mod:`.workers`), the page engine (:class:`~.engine.PageEngine`, whose
``precompile`` the API awaits before preparing a job), ``Date.now``,
``performance.now`` and ``crypto.getRandomValues`` — awaits its ``init()``
(which continues an interrupted job) and returns the :class:`PageApi` that
``weei.js`` forwards every method to. Without a room there is no transport
(``peers`` is empty) and this peer's id is random and kept in
``sessionStorage`` (so a reload keeps it); in a room signaling assigns it.

:meth:`PageSession.debug_aggregate` is the test hook behind weei.js's
``aggregate`` (``window.__weeiTestHooks``): it takes plain JS values and returns a JS object.
"""

from __future__ import annotations

import re
import time
from typing import Any

import js  # type: ignore[import-not-found]
from pyodide.ffi import JsException, JsProxy  # type: ignore[import-not-found]

from weei.api.controller import TrainingController
from weei.api.retention import DEFAULT_KEEP_LAST
from weei.core.aggregation.aggregate import AggregationState, aggregate_round
from weei.core.formats.modelinfo import ModelAggregation
from weei.core.formats.settings import AggregationSettings
from weei.kernel.wasm_kernel import WasmKernel

from . import webgpu
from .convert import from_js_value, is_nullish
from .engine import BrowserEngine, PageEngine, to_uint8array
from .idb import DB_NAME, IndexedDBStorage
from .local_storage import LocalStorageKeyValue
from .page_api import PageApi
from .rtc import BrowserTransport
from .signaling_ws import BrowserSignaling, KeyValueTokens, signal_url
from .worker_main import js_object
from .workers import BrowserWorkerPool, WorkerGpuHost

__all__ = ["PageSession", "start", "session", "PEER_ID_KEY", "environment", "random_bytes"]

#: sessionStorage key of this tab's peer id (kept across reloads of the tab).
PEER_ID_KEY = "weei.peerId"

async def fetch_bytes(url: str) -> bytes:
    """GET ``url`` with the page's ``fetch``; raise OSError on an HTTP error."""
    response = await js.fetch(url)
    if not response.ok:
        raise OSError(f"GET {url}: HTTP {response.status}")
    return (await response.arrayBuffer()).to_bytes()


def random_bytes(count: int) -> bytes:
    """``count`` bytes from ``crypto.getRandomValues`` (64 KiB per call at most)."""
    out = bytearray()
    get_random_values = js.crypto.getRandomValues
    while len(out) < count:
        n = min(65536, count - len(out))
        out += get_random_values(js.Uint8Array.new(n)).to_bytes()
    return bytes(out)


def _peer_id() -> str:
    try:
        store = js.sessionStorage
        existing = store.getItem(PEER_ID_KEY)
        if not is_nullish(existing) and str(existing):
            return str(existing)
    except (AttributeError, JsException):
        store = None
    peer = "peer-" + random_bytes(8).hex()
    if store is not None:
        try:
            store.setItem(PEER_ID_KEY, peer)
        except JsException:
            pass
    return peer


def environment() -> dict[str, Any]:
    """The diagnostics' environment (browser, version, OS, cores) from ``navigator``."""
    ua = str(getattr(js.navigator, "userAgent", "") or "")
    browser, version = "unknown", "unknown"
    for name, pattern in (("Edge", r"Edg/([\d.]+)"), ("Opera", r"OPR/([\d.]+)"), ("Firefox", r"Firefox/([\d.]+)"),
                          ("Chrome", r"(?:Headless)?Chrom(?:e|ium)/([\d.]+)"),
                          ("Safari", r"Version/([\d.]+).*Safari/")):
        match = re.search(pattern, ua)
        if match:
            browser, version = name, match.group(1)
            break
    os_name = "unknown"
    for name, pattern in (("Android", r"Android"), ("iOS", r"iPhone|iPad|iPod"), ("ChromeOS", r"CrOS"),
                          ("Windows", r"Windows"), ("macOS", r"Mac OS X|Macintosh"), ("Linux", r"Linux|X11")):
        if re.search(pattern, ua):
            os_name = name
            break
    cores = getattr(js.navigator, "hardwareConcurrency", None)
    logical = int(cores) if not is_nullish(cores) and int(cores) > 0 else "unknown"
    return {"browser": browser, "browserVersion": version, "os": os_name, "logicalCores": logical}


class PageSession:
    """The page's Python state (one per page)."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self._engine = BrowserEngine()
        self._kernel: WasmKernel | None = None
        self.api: PageApi | None = None
        self.seconds: dict[str, float] = {}

    async def open_api(self, hooks: Any) -> PageApi:
        """Bind a TrainingController to the browser and ``init()`` it (once).

        ``hooks``: ``{namespace, room, taskDeadlinesMs, createWorker(): WorkerClient, onState(jsonText),
        onMirror(name, value)}`` from host.js (page_api.PageApi's on_state and on_mirror). Raises StorageError when IndexedDB is unavailable.
        """
        if self.api is not None:
            return self.api
        t0 = time.perf_counter()
        kernel = await self.kernel()
        # This tab's storage namespace (weei.js holds its slot by a Web Lock): "" is the database
        # `weei` and the bare localStorage keys; "weei-tab-N" a database and a key prefix of its own.
        namespace = str(hooks.namespace) if not is_nullish(getattr(hooks, "namespace", None)) else ""
        storage = await IndexedDBStorage.open(namespace or DB_NAME)
        t1 = time.perf_counter()
        date_now = js.Date.now
        performance = js.performance
        engine = PageEngine()
        room = str(hooks.room) if not is_nullish(getattr(hooks, "room", None)) and str(hooks.room) else None
        kv = LocalStorageKeyValue(prefix=f"{namespace}:" if namespace else "")
        transport, peer_id = await self._connect(room, kv)
        pool = BrowserWorkerPool(hooks.createWorker, deadlines_ms=from_js_value(getattr(hooks, "taskDeadlinesMs", None)))
        # webgpu.gpu only says whether the page has WebGPU: GPU assignments train in a Worker, on its navigator.gpu.
        controller = TrainingController(
            my_peer_id=peer_id, storage=storage, kv=kv, pool=pool,
            kernel=kernel, engine=engine,
            clock=lambda: float(date_now()), monotonic=lambda: float(performance.now()),
            random_bytes=random_bytes, transport=transport, environment=environment(), gpu=webgpu.gpu,
            gpu_host=WorkerGpuHost(pool), room_key=room, keep_checkpoints=DEFAULT_KEEP_LAST)
        await controller.init()
        if transport is not None and room is not None:
            transport.on_change = controller.changed
            transport.on_peer_id = controller.peer_id_changed
            transport.attach(controller, has=controller.holds, job_of=controller.job_with)
            await transport.start(room)
        on_state, on_mirror = hooks.onState, hooks.onMirror
        self.api = PageApi(controller, engine, storage, lambda text: on_state(text),
                           lambda name, value: on_mirror(name, value))
        self.seconds = {"kernelAndStorage": t1 - t0, "init": time.perf_counter() - t1}
        return self.api

    async def _connect(self, room: str | None, kv: LocalStorageKeyValue) -> tuple[BrowserTransport | None, str]:
        """With a room (its key in the invite link's ``#room=KEY``), peers meet through the Weei
        server's signaling and the signaling server's peer ID is ours; without one, this browser
        trains alone under a local ID. The resume token is kept in ``kv`` (this tab's storage namespace),
        so the tab closed and opened again is the peer its saved job and that job's participants know."""
        if room is None:
            return None, _peer_id()
        signaling = BrowserSignaling(signal_url(self.base_url), room=room, tokens=KeyValueTokens(kv))
        welcome = await signaling.connect()
        return BrowserTransport(signaling), welcome.peer_id

    async def kernel(self) -> WasmKernel:
        """The aggregation kernel, fetched and instantiated on first use."""
        if self._kernel is None:
            wasm = await fetch_bytes(self.base_url + "kernel/aggregate.wasm")
            module = await self._engine.compile_async(wasm)
            self._kernel = WasmKernel(module.instantiate(lambda _ptr, _size: None))
        return self._kernel

    async def debug_aggregate(self, spec: Any) -> Any:
        """Aggregate one round from JS values.

        ``spec``: ``{start, updates: [{id, count, weights}], method,
        options: {serverLearningRate, ...}, state, stateStep, averageOnly:
        [{offset, bytes}]}`` with ArrayBuffers for the weights and state.
        Returns ``{weights, state, stateStep, seconds}`` (ArrayBuffers; state
        null for FedAvg). Raises the core's errors unchanged.
        """
        kernel = await self.kernel()
        start_weights = spec.start.to_bytes()
        contributions = [
            (str(u.id), int(u.count), u.weights.to_bytes()) for u in spec.updates
        ]
        method = str(spec.method) if getattr(spec, "method", None) else "fedavg"
        options = getattr(spec, "options", None)
        opts = options.to_py() if isinstance(options, JsProxy) else {}
        settings = AggregationSettings.from_json({**opts, "method": method})
        state_buffer = getattr(spec, "state", None)
        state = None
        if isinstance(state_buffer, JsProxy) and method != "fedavg":
            state = AggregationState(method, int(getattr(spec, "stateStep", 0) or 0), state_buffer.to_bytes())
        average_only = getattr(spec, "averageOnly", None)
        info = ModelAggregation.from_json({"averageOnly": average_only.to_py()}) if isinstance(average_only, JsProxy) else None
        t0 = time.perf_counter()
        result = aggregate_round(kernel, start_weights, contributions, settings, state, info)
        seconds = time.perf_counter() - t0
        return js_object({
            "weights": to_uint8array(result.weights).buffer,
            "state": None if result.state is None else to_uint8array(result.state.data).buffer,
            "stateStep": None if result.state is None else result.state.step,
            "seconds": seconds,
        })


session: PageSession | None = None


def start(base_url: str) -> PageSession:
    """Create the page's session (once); return it."""
    global session
    if session is None:
        session = PageSession(base_url)
    return session
