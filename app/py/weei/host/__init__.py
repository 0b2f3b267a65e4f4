"""CPython implementations of the API controller's ports: memory storage, a Worker pool.

A port moves bytes, persists or runs the model; it decides nothing. The
in-memory demo and the agent use these; the browser has its own (Pyodide)
equivalents over IndexedDB and Workers.
"""
