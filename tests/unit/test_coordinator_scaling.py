"""The coordinator's per-message work does not grow with its number of peers (counted, not timed).

The job record is saved after every drain, i.e. after every message: what it derives from all peers (who takes
part, robust aggregation's counts) must not be recomputed over every peer each time, or a round at N peers
costs O(N^2) (it did: through a Flower grid at 100 nodes that was most of the coordinator's own time); nor
rebuilt over every peer when one peer's membership changes, or N peers joining cost O(N^2) (it did: at 1,000
nodes a Flower grid's job spent most of the coordinator's time there)."""

from __future__ import annotations

from typing import Any

import pytest

from sim import Sim, dataset_spec
from weei.core.job.peers import PeerRecord


def _counting(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts the ``approved`` evaluations that the job record's accessors make."""
    counts = {"approved": 0, "asking": 0}
    plain = PeerRecord.approved.fget
    assert plain is not None

    def approved(record: PeerRecord) -> bool:
        counts["approved"] += counts["asking"]
        return plain(record)

    monkeypatch.setattr(PeerRecord, "approved", property(approved))
    return counts


def _job_record_after_each_message(sim: Sim, counts: dict[str, int]) -> list[tuple[list[str], Any]]:
    """Ask what the job record keeps after every message the coordinator receives, as a drain does."""
    coordinator = sim.coordinator
    receive = coordinator.receive
    seen: list[tuple[list[str], Any]] = []

    def receive_then_record(*args: Any, **kwargs: Any) -> Any:
        out = receive(*args, **kwargs)
        if coordinator.status == "running":  # at the end every peer leaves: each a change, seen once
            counts["asking"] = 1
            seen.append((coordinator.remote_participants(), coordinator.robust_records()))
            counts["asking"] = 0
        return out

    coordinator.receive = receive_then_record  # type: ignore[method-assign]
    return seen


@pytest.mark.parametrize("n", [8, 64])
def test_job_record_is_not_rebuilt_over_every_peer_per_message(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    counts = _counting(monkeypatch)
    peers = [f"p{i:03d}" for i in range(n)]
    spec, store = dataset_spec(2 * n, settings={"epochs": 2, "localEpochs": 1, "batchSize": 1,
                                                "coordinatorParticipates": False})
    sim = Sim.start_job(spec, store, peers, start=False)
    seen = _job_record_after_each_message(sim, counts)
    sim.coordinator.start(sim.now)
    sim.pump()
    sim.run_to_end()
    assert sim.coordinator.status == "completed"
    assert len(seen) >= 4 * n  # every peer sent an update (and more) in each of the 4 rounds
    assert all(p == peers and r == {} for p, r in seen)
    # Nobody joined or left during the rounds: the participants were worked out once, not once a message.
    assert counts["approved"] <= n


@pytest.mark.parametrize("n", [8, 64])
def test_peers_joining_do_not_rebuild_the_job_record_over_every_peer(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    counts = _counting(monkeypatch)
    spec, store = dataset_spec(n, settings={"epochs": 1, "coordinatorParticipates": False})
    sim = Sim.create(spec, store)
    coordinator = sim.coordinator
    receive = coordinator.receive
    seen: list[list[str]] = []

    def receive_then_record(*args: Any, **kwargs: Any) -> Any:
        out = receive(*args, **kwargs)
        counts["asking"] = 1
        seen.append(coordinator.remote_participants())
        counts["asking"] = 0
        return out

    coordinator.receive = receive_then_record  # type: ignore[method-assign]
    peers = [f"p{i:03d}" for i in range(n)]
    for peer in reversed(peers):  # joined in reverse: the record keeps them sorted all the same
        sim.join(peer)
    assert seen[-1] == peers and len(seen) >= 2 * n  # an answer and a module status from each
    # Each join changed one peer's membership: that peer was looked at, not every peer again.
    assert counts["approved"] <= 4 * n


def test_a_change_of_membership_is_seen_at_once() -> None:
    spec, store = dataset_spec(8, settings={"epochs": 1, "coordinatorParticipates": False})
    sim = Sim.start_job(spec, store, ["p1", "p2", "p3"], start=False)
    c = sim.coordinator

    def naive() -> list[str]:
        return sorted(p for p, r in c.peers.items() if p != c.my_peer_id and r.approved)

    assert c.remote_participants() == naive() == ["p1", "p2", "p3"]
    c.peers["p2"].outliers = 1
    assert c.robust_records() == {"p2": {"outlierRounds": 0, "outliers": 1, "excluded": False}}
    sim.join("p4")
    assert c.remote_participants() == naive() == ["p1", "p2", "p3", "p4"]
    c.start(sim.now)
    sim.pump()
    sim.run_to_end()
    assert c.status == "completed" and c.remote_participants() == naive()


def test_a_peers_chunk_for_its_diagnostics_is_looked_up_not_scanned_for() -> None:
    """A diagnostics report is shown with the chunk of the peer's first attempt of the round that has one:
    an index kept as attempts are handed out (a scan of the round per report was O(peers) a message)."""
    spec, store = dataset_spec(12, settings={"epochs": 2, "localEpochs": 1, "batchSize": 1,
                                             "coordinatorParticipates": False})
    peers = ["p1", "p2", "p3"]
    sim = Sim.start_job(spec, store, peers, start=False)
    c = sim.coordinator
    receive = c.receive
    checked = [0]

    def receive_then_compare(*args: Any, **kwargs: Any) -> Any:
        out = receive(*args, **kwargs)
        for peer in peers:
            scanned = next((a.chunk_id for a in c.attempts.current if a.peer == peer and a.chunk_id), None)
            assert c.attempts.first_chunk_of(peer) == scanned
            checked[0] += scanned is not None
        return out

    c.receive = receive_then_compare  # type: ignore[method-assign]
    c.start(sim.now)
    sim.pump()
    sim.run_to_end()
    assert c.status == "completed" and checked[0] > 0


def test_the_members_version_moves_whenever_what_the_job_record_keeps_of_the_peers_does() -> None:
    """The job store builds and compares the job record only when ``members_version`` moved: a change of who
    takes part or of robust state that left it still would never be saved."""
    spec, store = dataset_spec(8, settings={"epochs": 2, "coordinatorParticipates": False})
    sim = Sim.start_job(spec, store, ["p1", "p2", "p3"], start=False)
    c = sim.coordinator
    seen: list[tuple[int, list[str], dict[str, Any]]] = []

    def ask() -> None:
        seen.append((c.members_version(), c.remote_participants(), c.robust_records()))

    receive = c.receive

    def receive_then_ask(*args: Any, **kwargs: Any) -> Any:
        out = receive(*args, **kwargs)
        ask()
        return out

    c.receive = receive_then_ask  # type: ignore[method-assign]
    ask()
    c.peers["p2"].outliers = 1  # robust state changes: the version moves
    ask()
    sim.join("p4")  # a member more
    c.start(sim.now)
    sim.pump()
    sim.run_to_end()  # and at the end every peer leaves
    ask()
    assert c.status == "completed"
    pairs = list(zip(seen, seen[1:]))
    assert any(a[1:] != b[1:] for a, b in pairs) and any(a == b for a, b in pairs)
    for (v1, members1, robust1), (v2, members2, robust2) in pairs:
        assert (v1 == v2) == ((members1, robust1) == (members2, robust2)), (v1, v2, members1, members2)
