"""Secure aggregation gives the same bytes in the page's Pyodide as in CPython.

One round (n = 5, t = 3, one participant gone after masking, one before;
seeded randomness) runs in both; every message the coordinator receives and
the unmasked sum are hashed, and the digests must be equal: the masked sum
is bit-identical across the two platforms, not only close. In the page the
round runs twice: with the pure-Python X25519 and with the aggregation
kernel's (aggregate.wasm in the browser's WebAssembly, as the page's
controller uses it), against CPython's pure-Python transcript.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from site_helpers import run_in_pyodide

KERNEL_WASM = Path(__file__).resolve().parents[2] / "app" / "static" / "kernel" / "aggregate.wasm"

ROUND = r'''
def secagg_round(x25519=None):
    import hashlib, json, random
    from weei.core.privacy import fixedpoint
    from weei.core.privacy.secagg import (Roster, SecAggClient, SecAggParams, SecAggServer, SharesFor, Unmask,
                                          fedavg_from_sum, weighted_vector)
    from weei.core.privacy.x25519 import x25519 as ladder
    x25519 = x25519 or ladder
    ids = ["p1", "p2", "p3", "p4", "p5"]
    rng = random.Random(5)
    vectors = {pid: weighted_vector([rng.uniform(-1, 1) for _ in range(300)], rng.randint(1, 50), 2.0) for pid in ids}
    params = SecAggParams(b"job/round-1/attempt-1", 3, 301, 100.0, 5)
    clients = {pid: SecAggClient(pid, params, random.Random(i).randbytes, x25519) for i, pid in enumerate(ids)}
    server = SecAggServer(params, ids, 0.0, 30.0, x25519)
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
    got = run_in_pyodide(pg, ROUND, """
import json
from weei.browser.engine import BrowserEngine
from weei.kernel.wasm_kernel import WasmKernel
kernel = WasmKernel(BrowserEngine().compile(wasm.to_bytes()).instantiate(lambda _p, _n: None))
k = u = (9).to_bytes(32, "little")
for _ in range(1000):  # RFC 7748, section 5.2: 1,000 iterations
    k, u = kernel.x25519(k, u), k
json.dumps([secagg_round(), secagg_round(kernel.x25519), k.hex()])""", wasm=KERNEL_WASM.read_bytes())
    plain, kernel, iterated = json.loads(got)
    assert json.loads(plain) == expected and json.loads(kernel) == expected
    assert iterated == "684cf59ba83309552800ef566f2f4d3c1c3887c49360e3875f2eb94d99532c51"
    assert not log.errors, log.errors


JOB_ROUND = r'''
def secure_job_round():
    import hashlib, json, random
    from array import array
    from weei.core.job.secure_round import SecureContribution, SecureRound, SecureTerms
    from weei.core.wire.messages import SecAggRoster, SecAggSharesFor, SecAggUnmask, decode_message, encode_message

    def wire(message):  # what the other side decodes
        return decode_message(json.loads(json.dumps(encode_message(message))))

    rng = random.Random(7)
    start = array("f", [rng.uniform(-1, 1) for _ in range(200)]).tobytes()
    terms = SecureTerms(0.5, 40.0, 0.6, 1, True)
    people = {}
    for i, pid in enumerate(["p1", "p2", "p3", "p4", "p5"]):
        trained = array("f", [w + rng.gauss(0, 0.05) for w in array("f", start)]).tobytes()
        people[pid] = SecureContribution(pid, "job", 3, terms, start, trained, rng.randint(10, 40), random.Random(i).randbytes)
    secure = SecureRound("job", 3, terms, 200, {pid: wire(c.keys()).keys for pid, c in people.items()}, 0.0)
    queue = list(secure.start(0.0))
    while queue:
        send = queue.pop(0)
        message, who = wire(send.message), people[send.peer]
        if isinstance(message, SecAggRoster):
            queue += secure.receive(send.peer, wire(who.on_roster(message)), {}, 0.0)
        elif isinstance(message, SecAggSharesFor) and send.peer != "p2":  # p2 vanishes before masking
            masked, data = who.on_shares_for(message)
            queue += secure.receive(send.peer, wire(masked), {masked.masked.sha256: data}, 0.0)
        elif isinstance(message, SecAggUnmask) and send.peer != "p4":  # p4 after
            queue += secure.receive(send.peer, wire(who.on_unmask(message)), {}, 0.0)
        if not queue and not secure.done:
            queue += secure.handle_timer(secure.deadline)
    weights, contributors = secure.result(start)
    return json.dumps({"weights": hashlib.sha256(weights).hexdigest(), "contributors": list(contributors)})
'''


def test_a_job_round_under_secure_aggregation_writes_the_same_weights_in_pyodide_and_cpython(weei_server: Any,
                                                                                             page: Any) -> None:
    # The participants' clipping and encoding and the coordinator's decoding into float32 weights, through the wire
    # messages: the checkpoint's bytes, not only the ring sum, are the same on both platforms.
    scope: dict[str, Any] = {}
    exec(JOB_ROUND, scope)
    expected = json.loads(scope["secure_job_round"]())
    assert expected["contributors"] == ["p1", "p3", "p4", "p5"]
    pg, log = page
    pg.goto(weei_server.url)
    got = run_in_pyodide(pg, JOB_ROUND, "secure_job_round()")
    assert json.loads(got) == expected
    assert not log.errors, log.errors
