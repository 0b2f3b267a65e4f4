"""The sans-I/O core: formats, settings, aggregation and the job state machines.

One sub-package per concern, bottom first: this package's own modules (the
foundations: errors, limits, floats, verified blobs, input checks, states),
``formats`` and ``observe``, ``aggregation``, ``wire``, ``links``, ``job``
(docs/architecture.md, "Layers").

Nothing here imports js, pyodide, asyncio, sockets or reads the clock: time
comes in as ``now`` and effects go out as commands, so the same logic runs in
CPython tests under simulated time, in the browser and in the agent.
"""
