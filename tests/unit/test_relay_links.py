"""The relay's plan over simulated links (bench/relay_sim.py): the product's Broadcast and RelayNodes, every
uplink a rate and a latency, time as numbers. Deterministic: no clock is read."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from weei.core.links.relay import MAX_PIECES, MIN_PIECE_BYTES, PIECE_BYTES, piece_size

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from relay_sim import Links, direct, relayed  # noqa: E402

MB = 1_000_000
LINKS = Links(rate=20 * MB, latency=0.020)


def data(nbytes: int) -> bytes:
    return (bytes(range(251)) * (nbytes // 251 + 1))[:nbytes]


@pytest.mark.parametrize(("total", "size"), [
    (2 * 2**20, 64 * 1024), (4 * MB, 64 * 1024), (16 * MB, 256 * 1024), (64 * 2**20, 2**20), (200 * MB, 2**20),
])
def test_pieces_are_about_64_in_whole_64_kib_from_64_kib_to_1_mib(total: int, size: int) -> None:
    assert piece_size(total) == size
    assert size % MIN_PIECE_BYTES == 0 and MIN_PIECE_BYTES <= size <= PIECE_BYTES


def test_the_piece_size_keeps_to_the_policy_and_to_max_pieces() -> None:
    assert piece_size(10_017, 1000) == 1000  # a policy's largest piece below 64 KiB wins
    assert piece_size(MAX_PIECES * 2**20 + 1, 2**20) == 2**20 + 1  # never more than MAX_PIECES pieces
    assert -(-(MAX_PIECES * 2**20 + 1) // (2**20 + 1)) == MAX_PIECES


@pytest.mark.parametrize("nbytes", [4 * MB, 16 * MB])
def test_a_chain_of_four_gets_the_checkpoint_within_one_and_a_half_times_the_direct_send(nbytes: int) -> None:
    # With pieces of 1 MiB a 4 MB checkpoint reached the 4th participant 1.99 x later than a direct
    # send reaches one: each hop waits for a whole piece. In simulated time, so the figures are exact.
    got = relayed(data(nbytes), 4, LINKS)
    one = direct(nbytes, LINKS)
    before = relayed(data(nbytes), 4, LINKS, pipeline_pieces=1)  # pieces of 1 MiB
    assert (before.last > 1.5 * one) == (nbytes == 4 * MB)
    assert got.coordinator_bytes == nbytes  # one copy leaves the coordinator, not four
    assert sorted(got.at) == ["p1", "p2", "p3", "p4"]
    assert got.at["p1"] < got.at["p2"] < got.at["p3"] < got.at["p4"] <= 1.5 * one
    # Each hop adds about one piece-time and one latency, not the whole checkpoint again.
    hop = piece_size(nbytes) / LINKS.rate + LINKS.latency
    assert got.at["p4"] - got.at["p1"] < 3 * hop * 1.1


def test_a_tree_shares_the_coordinator_uplink_between_its_children() -> None:
    got = relayed(data(4 * MB), 4, LINKS, fanout=2)
    assert got.coordinator_bytes == 2 * 4 * MB
    assert got.last > 2 * (4 * MB) / LINKS.rate  # two copies through one uplink: the chain is the faster plan
