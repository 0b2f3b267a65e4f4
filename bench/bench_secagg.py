"""Secure aggregation's cost on 5 participants, side by side with plain FedAvg of the same updates.

One round of ``weei.core.privacy.secagg`` in memory (n = 5, t = 3, fixed
seeds), timed per part: one participant's work (key pairs, sharing,
clipping, encoding and masking, revealing; participants work in parallel, so
the slowest of the five is what a round waits for) and the coordinator's
(forwarding, the ring sum, rebuilding and removing the masks, decoding).
Beside it, in the same run on the same updates: the plain round's
aggregation (``aggregate_round``, FedAvg, the native kernel). Transfers are
excluded from both; secure aggregation adds three small exchanges (keys,
shares, reveals: O(n) messages per participant) and sends the masked update
as 8 bytes per weight instead of 4. Best of 3; the CPU clock beside the wall
clock (everything measured runs on this thread).
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable

import numpy as np

from weei.core.aggregation.aggregate import aggregate_round
from weei.core.formats.settings import FEDAVG
from weei.core.privacy.secagg import (Roster, SecAggClient, SecAggParams, SecAggServer, SharesFor, Unmask,
                                      fedavg_from_sum, weighted_vector)
from weei.kernel.native import NativeKernel

PEERS, THRESHOLD, CLIP, COUNT = 5, 3, 5.0, 100


def _timed(fn: Callable[[], object]) -> tuple[float, float, object]:
    c0, t0 = time.process_time(), time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, time.process_time() - c0, out


def secure_round(weight_count: int) -> tuple[float, float, float, float]:
    """(slowest participant, coordinator) on the wall clock, then on the CPU clock, in seconds."""
    rng = np.random.default_rng(0)
    ids = [f"p{i}" for i in range(PEERS)]
    deltas = [(rng.standard_normal(weight_count) * 0.01).tolist() for _ in ids]
    params = SecAggParams(b"bench/round-1", THRESHOLD, weight_count + 1, CLIP * COUNT, PEERS)
    clients = {pid: SecAggClient(pid, params, random.Random(i).randbytes) for i, pid in enumerate(ids)}
    server = SecAggServer(params, ids, 0.0, 60.0)
    part = dict.fromkeys(ids, 0.0)
    part_cpu = dict.fromkeys(ids, 0.0)
    coord = coord_cpu = 0.0
    inbox = []

    def client(pid: str, fn: Callable[[], object]) -> object:
        wall, cpu, out = _timed(fn)
        part[pid] += wall
        part_cpu[pid] += cpu
        return out

    def coordinator(pid: str, message: object) -> None:
        nonlocal coord, coord_cpu
        wall, cpu, out = _timed(lambda: server.receive(pid, message, 0.0))  # type: ignore[arg-type]
        coord, coord_cpu = coord + wall, coord_cpu + cpu
        inbox.extend(out)  # type: ignore[arg-type]

    for pid in ids:
        coordinator(pid, client(pid, clients[pid].advertise))
    while inbox:
        out = inbox.pop(0)
        pid, msg = out.to, out.message
        if isinstance(msg, Roster):
            coordinator(pid, client(pid, lambda: clients[pid].share(msg)))
        elif isinstance(msg, SharesFor):
            vector = client(pid, lambda: weighted_vector(deltas[ids.index(pid)], COUNT, CLIP))
            coordinator(pid, client(pid, lambda: clients[pid].mask(msg, vector)))  # type: ignore[arg-type]
        elif isinstance(msg, Unmask):
            coordinator(pid, client(pid, lambda: clients[pid].unmask(msg)))
    assert server.total is not None
    wall, cpu, _ = _timed(lambda: fedavg_from_sum(server.total, params.bits, PEERS, COUNT))  # type: ignore[arg-type]
    return max(part.values()), coord + wall, max(part_cpu.values()), coord_cpu + cpu


def plain_round(weight_count: int) -> tuple[float, float]:
    """The plain round's FedAvg aggregation of 5 updates of the same size: (wall, CPU) seconds."""
    rng = np.random.default_rng(0)
    start = rng.standard_normal(weight_count, dtype=np.float32)
    contributions = [(f"a{i}", COUNT, (start + rng.standard_normal(weight_count, dtype=np.float32) * np.float32(0.01))
                      .tobytes()) for i in range(PEERS)]
    kernel = NativeKernel()
    wall, cpu, _ = _timed(lambda: aggregate_round(kernel, start.tobytes(), contributions, FEDAVG, None, None))
    return wall, cpu


def main() -> int:
    load = os.getloadavg()[0]
    print(f"{'weights':>9} {'participant ms':>15} {'coordinator ms':>15} {'plain FedAvg ms':>16} "
          f"{'cpu: participant':>17} {'coordinator':>12} {'plain':>8}")
    for weight_count in (10_000, 100_000, 1_000_000):
        secure = [secure_round(weight_count) for _ in range(3)]
        plain = [plain_round(weight_count) for _ in range(3)]
        s = [min(r[i] for r in secure) for i in range(4)]
        p = [min(r[i] for r in plain) for i in range(2)]
        print(f"{weight_count:>9} {s[0] * 1e3:>15.1f} {s[1] * 1e3:>15.1f} {p[0] * 1e3:>16.1f} "
              f"{s[2] * 1e3:>17.1f} {s[3] * 1e3:>12.1f} {p[1] * 1e3:>8.1f}")
        print(f"SECAGG {weight_count} weights, 5 participants: +{s[0] * 1e3:.0f} ms per participant, "
              f"{s[1] * 1e3:.0f} ms at the coordinator vs {p[0] * 1e3:.1f} ms plain FedAvg "
              f"({s[1] / p[0]:.0f} x the aggregation)")
    print(f"load average (1 min): {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end; {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
