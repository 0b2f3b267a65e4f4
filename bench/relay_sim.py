"""The checkpoint relay over simulated links, in simulated time: the plan's own speed, apart from this machine.

    .venv/bin/python bench/relay_sim.py [--mb 16] [--mbps 20] [--latency-ms 20] [--peers 1,2,4,8]

bench_broadcast.py runs every peer in one Python process on one core, so a
relay hop there costs CPU time instead of running on a link of its own. This
runs the product's relay core itself (``weei.core.links.relay``: the coordinator's
``Broadcast`` and each participant's ``RelayNode``, the same objects the
hosts drive) over a network that exists only as numbers:

* every peer has an uplink of ``rate`` bytes/s; what it sends leaves in the
  order it was sent, one message after the other (a piece occupies the
  uplink for ``size / rate`` seconds), and arrives ``latency`` seconds after
  its last byte left. Downlinks are not limited; a peer sending to two
  children (a tree) shares its one uplink between them.
* a message's size is its JSON text plus its attachments (the framing's few
  bytes per fragment are left out);
* a peer handles what arrives at once: the frame reader hashes a transfer
  while its fragments arrive (faster than any link here: 0.19 GB/s in
  Pyodide, 0.7 GB/s with SubtleCrypto), so the hash adds no time;
* the coordinator's own work before the first send (hashing the pieces) is
  left out: that is P4's overhead, measured in bench_round.py.

"To 1" is the product's direct send (the Assign carrying the checkpoint:
``relay_assignments`` relays nothing for one target); "to N" is the relayed
broadcast, finished when the last target has assembled the checkpoint. The
deliveries are checked byte for byte. Deterministic: no clock, no randomness.
"""

from __future__ import annotations

import argparse
import hashlib
import heapq
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "app" / "py"))

from weei.core.wire.commands import Log, Send  # noqa: E402
from weei.core.links.relay import PIPELINE_PIECES, Broadcast, RelayNode, Relays, piece_size  # noqa: E402
from weei.core.wire.messages import RelayDone, RelayPiece, RelayPlan  # noqa: E402

__all__ = ["Links", "Delivery", "direct", "relayed", "ratio_line"]

MB = 1_000_000
COORDINATOR = "coord"
JOB = "sim-job"


@dataclass(frozen=True)
class Links:
    """Every peer's uplink: ``rate`` bytes/s, then ``latency`` seconds to the other end."""

    rate: float
    latency: float


@dataclass
class Delivery:
    """When each target held the checkpoint (seconds from the first send), and what the coordinator sent."""

    at: dict[str, float]
    coordinator_bytes: int
    sent_bytes: dict[str, int] = field(default_factory=dict)

    @property
    def last(self) -> float:
        return max(self.at.values())


def _size(send: Send) -> int:
    return len(json.dumps(send.message.to_json(), separators=(",", ":"))) + sum(r.bytes for r in send.attachments)


def direct(nbytes: int, links: Links) -> float:
    """The checkpoint straight from the coordinator to one participant: one transfer on one uplink."""
    return nbytes / links.rate + links.latency


def relayed(data: bytes, targets: int, links: Links, *, fanout: int = 1,
            pipeline_pieces: int = PIPELINE_PIECES) -> Delivery:
    """``data`` relayed to ``targets`` participants by the product's Broadcast and RelayNodes over ``links``
    (``fanout`` and ``pipeline_pieces``: the ``Relays`` policy; 1 piece aimed at is the plan of 1 MiB pieces)."""
    relays = Relays(COORDINATOR, JOB, fanout=fanout, pipeline_pieces=pipeline_pieces)
    names = [f"p{i + 1}" for i in range(targets)]
    nodes = {p: RelayNode(p) for p in names}
    free_at: dict[str, float] = {}  # when each uplink has sent everything queued on it
    sent: dict[str, int] = {}
    events: list[tuple[float, int, str, Send]] = []  # (arrival, order, sender, send)
    order = 0
    at: dict[str, float] = {}

    def emit(sender: str, commands: list[Send | Log], now: float) -> None:
        nonlocal order
        for command in commands:
            if isinstance(command, Log):
                if command.event == "relay.failed":
                    raise AssertionError(f"the relay failed on perfect links: {command.details}")
                continue
            size = _size(command)
            leaves = max(now, free_at.get(sender, 0.0)) + size / links.rate
            free_at[sender] = leaves
            sent[sender] = sent.get(sender, 0) + sum(r.bytes for r in command.attachments)
            order += 1
            heapq.heappush(events, (leaves + links.latency, order, sender, command))

    cast: Broadcast = relays.broadcast(1, hashlib.sha256(data).hexdigest(), data, names, 0.0)
    emit(COORDINATOR, cast.take_commands(), 0.0)
    while events:
        now, _, sender, send = heapq.heappop(events)
        if send.peer == COORDINATOR:
            assert isinstance(send.message, RelayDone)
            cast.relay_done(sender, send.message, now * 1000)
            emit(COORDINATOR, cast.take_commands(), now)
            continue
        node = nodes[send.peer]
        if isinstance(send.message, RelayPlan):
            node.plan(sender, send.message, job_id=JOB, coordinator=COORDINATOR)
        else:
            assert isinstance(send.message, RelayPiece)
            node.piece(sender, send.message, send.blobs)
        for got in node.take_assembled().values():
            if got != data:
                raise AssertionError(f"{send.peer} assembled other bytes")
            at[send.peer] = now
        emit(send.peer, node.take_commands(), now)
    if not cast.complete or set(at) != set(names):
        raise AssertionError(f"not delivered to {sorted(set(names) - set(at))}")
    return Delivery(at, sent.get(COORDINATOR, 0), sent)


def ratio_line(data: bytes, links: Links, how: str, *, targets: int = 4) -> str:
    """The P3 line on simulated links: the product's plan relaying to ``targets`` over the direct send to 1,
    MET at <= 1.5."""
    one = direct(len(data), links)
    many = relayed(data, targets, links).last
    ratio = many / one
    pieces = piece_size(len(data))
    return (f"P3 broadcast {len(data) / MB:g} MB checkpoint to {targets} participants, SIMULATED LINKS ({how}; "
            f"the product's Broadcast/RelayNode: a chain, {-(-len(data) // pieces)} pieces of {pieces // 1024} KiB): "
            f"{many:.3f} s = {ratio:.2f} x to 1 ({one:.3f} s) (goal <= 1.5 x) {'MET' if ratio <= 1.5 else 'not met'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=16.0, help="checkpoint size in MB (default 16)")
    parser.add_argument("--mbps", type=float, default=20.0, help="every uplink's rate in MB/s (default 20)")
    parser.add_argument("--latency-ms", type=float, default=20.0, help="one-way latency (default 20 ms)")
    parser.add_argument("--peers", default="1,2,4,8", help="participant counts (default 1,2,4,8)")
    args = parser.parse_args()
    links = Links(args.mbps * MB, args.latency_ms / 1000)
    nbytes = int(args.mb * MB) // 4 * 4
    data = (bytes(range(251)) * (nbytes // 251 + 1))[:nbytes]
    print(f"relay over simulated links: {args.mb:g} MB, uplinks {args.mbps:g} MB/s, {args.latency_ms:g} ms latency")
    print(f"{'plan':<10} {'pieces':>15} {'N':>3} {'last s':>8} {'x to 1':>7} {'coordinator copies':>19}")
    one = direct(nbytes, links)
    for fanout in (1, 2):
        for aim in (1, PIPELINE_PIECES):  # 1: pieces of 1 MiB, the plan before; then the product's
            size = piece_size(nbytes, count=aim)
            for n in (int(x) for x in args.peers.split(",")):
                if n == 1:
                    last, copies = one, 1.0
                else:
                    got = relayed(data, n, links, fanout=fanout, pipeline_pieces=aim)
                    last, copies = got.last, got.coordinator_bytes / nbytes
                plan = "chain" if fanout == 1 else f"tree k={fanout}"
                pieces = f"{-(-nbytes // size)} x {size // 1024} KiB"
                print(f"{plan:<10} {pieces:>15} {n:>3} {last:>8.3f} {last / one:>7.2f} {copies:>19.2f}")
    print("N = 1: the direct send (no relay for one target)")
    print(ratio_line(data, links, f"every uplink {args.mbps:g} MB/s, {args.latency_ms:g} ms latency"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
