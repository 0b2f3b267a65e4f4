"""CPU time of a benchmark's own processes, for benchmarks that say how much of the cores a run took."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["tree_cpu"]


def tree_cpu(root: int | None = None) -> float | None:
    """CPU seconds (user + system) that process ``root`` (this one by default) and every process below it
    have used so far: what the benchmark started (participant processes, Chromium, servers), and nothing
    else running on the machine. From /proc; None where it is missing."""
    root = os.getpid() if root is None else root
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for name in names:
        if not name.isdigit():
            continue
        try:
            # The command name may hold spaces and parentheses: split after its closing one.
            fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        parents[int(name)] = int(fields[1])
        ticks[int(name)] = int(fields[11]) + int(fields[12])  # utime, stime
    if root not in ticks:
        return None
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += ticks.get(pid, 0)
        todo.extend(children.get(pid, ()))
    return total / os.sysconf("SC_CLK_TCK")
