"""The sans-I/O core: formats, settings, aggregation and the job state machines.

Nothing here imports js, pyodide, asyncio, sockets or reads the clock: time
comes in as ``now`` and effects go out as commands, so the same logic runs in
CPython tests under simulated time, in the browser and in the agent.
"""
