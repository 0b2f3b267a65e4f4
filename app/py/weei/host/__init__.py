"""Hosts for the core state machines in CPython: artifact store, participant runner.

A host moves bytes, persists and runs the model; it decides nothing. The
in-memory demo and the agent use these; the browser has its own (Pyodide)
equivalents over IndexedDB and Workers.
"""
