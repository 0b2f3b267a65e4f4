"""What a securely aggregated round costs the window (docs/privacy.md, "The overhead cut at its causes"):
the protocol's steps build no state for subscribers at once (they change nothing the window shows until the
round closes); the step that closes the round is told at once, as every other change."""

from __future__ import annotations

import io
from collections import Counter
from pathlib import Path
from typing import Any, Mapping

import pytest

from weei.api.executor import Executor
from weei.api.peer_events import PeerEvents
from weei.core.wire.messages import Message, SecAggMasked, SecAggReveal, SecAggShares
from weei.demo.run import DemoJob, run_job

STEPS = (SecAggShares, SecAggMasked, SecAggReveal)


def test_secure_aggregation_steps_are_told_quietly_and_the_round_close_at_once(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    drains: Counter[tuple[str, str, bool]] = Counter()  # (peer, message type, quiet)
    handle, drain = PeerEvents._handle, Executor.drain
    current: list[tuple[str, str]] = []

    async def handling(self: PeerEvents, peer: str, message: Message, blobs: Mapping[str, bytes]) -> None:
        current.append((self.session.my_peer_id, message.TYPE))
        try:
            await handle(self, peer, message, blobs)
        finally:
            current.pop()

    async def draining(self: Executor, *, quiet: bool = False) -> None:
        if current and current[-1][0] == self.session.my_peer_id:
            drains[(*current[-1], quiet)] += 1
        await drain(self, quiet=quiet)

    monkeypatch.setattr(PeerEvents, "_handle", handling)
    monkeypatch.setattr(Executor, "drain", draining)
    settings: dict[str, Any] = {"localEpochs": 1, "batchSize": 16, "epochs": 1, "coordinatorParticipates": True,
                                "validationSchedule": {"enabled": True, "unit": "round", "every": 1},
                                "privacy": {"secureAggregation": True, "clip": 1000}}
    job = DemoJob("secagg-window", "digits-mlp", {}, peers=5, validation="validation.bin")
    report = run_job(job, tmp_path, stream=io.StringIO(), settings=settings, seed=1, flat=True)
    rounds = len(report.rounds) - 1  # validated every round, the starting checkpoint too
    assert rounds >= 3
    coordinator = next(peer for peer, _, _ in drains if any(p == peer and t == "secaggShares" for p, t, _ in drains))
    told = {(t, quiet): n for (peer, t, quiet), n in drains.items() if peer == coordinator}
    remote = 4 * rounds  # the coordinator's own participant's steps stay local
    # Shares and masked vectors never close a round: every one is told quietly.
    assert told.get(("secaggShares", True)) == remote and ("secaggShares", False) not in told
    assert told.get(("secaggMasked", True)) == remote and ("secaggMasked", False) not in told
    # The last reveal of a round closes it (a new checkpoint): told at once, once a round.
    assert told.get(("secaggReveal", False)) == rounds
    assert told.get(("secaggReveal", True)) == remote - rounds
    # At the participants, the coordinator's steps are quiet too (none failed).
    answers = Counter(t for (peer, t, quiet), n in drains.items() if peer != coordinator and not quiet
                      for _ in range(n))
    assert not {t for t in answers if t in ("secaggRoster", "secaggSharesFor", "secaggUnmask")}, answers
