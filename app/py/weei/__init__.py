"""Weei: distributed neural training in the browser.

Layers (dependencies point down only): ``weei.core`` (sans-I/O job logic and
formats), ``weei.runtime`` (the model ABI host over an engine), ``weei.kernel``
(aggregation kernels), then the hosts: ``weei.demo`` and the CLI.
"""

__version__ = "0.1.0"
