"""What a peer shows of itself: the diagnostics, the debug log, live training progress and transfer progress.

Imports only the core's foundations, so every layer above may report here.
"""
