"""The Python side of the page: what ``weei.js`` runs in the page's Pyodide.

Theory of operation
-------------------
``weei.js`` starts the page's Pyodide lazily (after ``weeiReady``), unpacks
the weei package and calls :func:`start` with the site's base URL. Today
the page's Python aggregates rounds: :class:`PageSession` owns one
``aggregate.wasm`` instance (``WasmKernel`` over :class:`BrowserEngine`)
and runs :func:`weei.core.aggregate.aggregate_round` on it. The
coordinator's state machine will run here too.

:meth:`PageSession.debug_aggregate` is the test hook behind the API's
``_debug.aggregate``: it takes plain JS values and returns a JS object.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import js  # type: ignore[import-not-found]
from pyodide.ffi import JsProxy  # type: ignore[import-not-found]

from weei.core.aggregate import AggregationState, aggregate_round
from weei.kernel.wasm_kernel import WasmKernel

from .engine import BrowserEngine, to_uint8array
from .worker_main import js_object

__all__ = ["PageSession", "start", "session"]

_SETTING_NAMES = {
    "serverLearningRate": "server_learning_rate",
    "momentum": "momentum",
    "beta1": "beta1",
    "beta2": "beta2",
    "epsilon": "epsilon",
}


async def fetch_bytes(url: str) -> bytes:
    """GET ``url`` with the page's ``fetch``; raise OSError on an HTTP error."""
    response = await js.fetch(url)
    if not response.ok:
        raise OSError(f"GET {url}: HTTP {response.status}")
    return (await response.arrayBuffer()).to_bytes()


class PageSession:
    """The page's Python state (one per page)."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self._engine = BrowserEngine()
        self._kernel: WasmKernel | None = None

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
        settings = SimpleNamespace(method=method, **{_SETTING_NAMES[k]: v for k, v in opts.items()})
        state_buffer = getattr(spec, "state", None)
        state = None
        if isinstance(state_buffer, JsProxy) and method != "fedavg":
            state = AggregationState(method, int(getattr(spec, "stateStep", 0) or 0), state_buffer.to_bytes())
        average_only = getattr(spec, "averageOnly", None)
        info = {"averageOnly": average_only.to_py()} if isinstance(average_only, JsProxy) else None
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
