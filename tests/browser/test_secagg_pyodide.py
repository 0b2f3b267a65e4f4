"""Secure aggregation gives the same bytes in the page's Pyodide as in CPython.

One round (n = 5, t = 3, one participant gone after masking, one before;
seeded randomness) runs in both; every message the coordinator receives and
the unmasked sum are hashed, and the digests must be equal: the masked sum
is bit-identical across the two platforms, not only close.
"""

from __future__ import annotations

import json
from typing import Any

ROUND = r'''
def secagg_round():
    import hashlib, json, random
    from weei.core.privacy import fixedpoint
    from weei.core.privacy.secagg import (Roster, SecAggClient, SecAggParams, SecAggServer, SharesFor, Unmask,
                                          fedavg_from_sum, weighted_vector)
    ids = ["p1", "p2", "p3", "p4", "p5"]
    rng = random.Random(5)
    vectors = {pid: weighted_vector([rng.uniform(-1, 1) for _ in range(300)], rng.randint(1, 50), 2.0) for pid in ids}
    params = SecAggParams(b"job/round-1/attempt-1", 3, 301, 100.0, 5)
    clients = {pid: SecAggClient(pid, params, random.Random(i).randbytes) for i, pid in enumerate(ids)}
    server = SecAggServer(params, ids, 0.0, 30.0)
    seen = hashlib.sha256()
    queue = []
    now = 0.0

    def deliver(pid, message):
        seen.update(repr((pid, message)).encode())
        queue.extend(server.receive(pid, message, now))

    for pid in ids:
        deliver(pid, clients[pid].advertise())
    while queue:
        out = queue.pop(0)
        if isinstance(out.message, Roster):
            deliver(out.to, clients[out.to].share(out.message))
        elif isinstance(out.message, SharesFor) and out.to != "p2":  # p2 vanishes before masking
            deliver(out.to, clients[out.to].mask(out.message, vectors[out.to]))
        elif isinstance(out.message, Unmask) and out.to != "p4":  # p4 after
            deliver(out.to, clients[out.to].unmask(out.message))
        while not queue and not server.done:  # simulated time: the stage's deadline passes
            now += 10.0
            queue.extend(server.handle_timer(now))
    mean, weight = fedavg_from_sum(server.total, params.bits, len(server.contributors), 50)
    return json.dumps({"transcript": seen.hexdigest(), "total": hashlib.sha256(fixedpoint.to_bytes(server.total)).hexdigest(),
                       "mean": hashlib.sha256(repr(mean).encode()).hexdigest(), "weight": weight,
                       "contributors": list(server.contributors)})
'''


def test_a_secure_aggregation_round_is_bit_identical_in_pyodide_and_cpython(weei_server: Any, page: Any) -> None:
    scope: dict[str, Any] = {}
    exec(ROUND, scope)
    expected = json.loads(scope["secagg_round"]())
    assert expected["contributors"] == ["p1", "p3", "p4", "p5"]

    pg, log = page
    pg.goto(weei_server.url)
    got = pg.evaluate("""async (source) => {
      const { pyodide } = await __weeiTestHooks.get('distributed-training').mainThreadPython();
      const ns = pyodide.globals.get('dict')();
      pyodide.runPython(source, { globals: ns });
      return pyodide.runPython('secagg_round()', { globals: ns });
    }""", ROUND)
    assert json.loads(got) == expected
    assert not log.errors, log.errors
