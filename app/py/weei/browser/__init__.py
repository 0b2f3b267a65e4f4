"""The browser adapters of Weei (Pyodide only).

Theory of operation
-------------------
These modules run inside Pyodide, in the page or in a Web Worker, and are
the only place (with nothing else in the package) that imports ``js`` or
``pyodide.ffi``. They are thin: they move bytes between JavaScript and the
pure-Python layers below (``weei.runtime``, ``weei.kernel``, ``weei.core``)
and own every proxy they create.

* :mod:`weei.browser.engine` implements the runtime's Engine protocol over
  the browser's ``WebAssembly``, so ``ModelRuntime`` and ``WasmKernel`` run
  unchanged in the browser.
* :mod:`weei.browser.worker_main` is the Python side of ``worker.js``: it
  trains and evaluates one model at a time for the page.
* :mod:`weei.browser.page_main` is the Python side of the page (started
  lazily by ``weei.js``).

Importing this package itself imports nothing from Pyodide, so CPython can
still list it (for example when packing the site).
"""

from __future__ import annotations

__all__: list[str] = []
