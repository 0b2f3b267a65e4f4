"""Formats: what is read from and written to files and records, each parsed into a frozen, checked object.

The checkpoint file, the model package's manifest and model info, the
training settings, canonical JSON and the seeds of experience jobs.
Imports only the core's foundations (``weei.core`` errors, limits, floats,
checks) and the table of aggregation methods (``weei.core.aggregation.methods``).
"""
