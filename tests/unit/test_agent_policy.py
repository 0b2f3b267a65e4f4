"""The agent's acceptance policy (issue 9 §3): what (module hash) and who
(coordinator key or room), never the module hash alone."""

from __future__ import annotations

import argparse
import asyncio
import io

import pytest

from weei.agent.main import add_arguments, run_cli
from weei.agent.policy import AcceptancePolicy, CoordinatorTrust, parse_peer_id
from weei.core.errors import UsageError

SHA = "ab" * 32
COORD = "c" * 26
OTHER = "d" * 26


def invitation(coordinator: str = COORD, sha: str = SHA) -> dict[str, object]:
    return {"coordinator": coordinator, "module": {"sha256": sha, "bytes": 10}, "settings": {}}


def decide(policy: AcceptancePolicy, inv: dict[str, object], sender: str) -> tuple[bool, str]:
    decision = asyncio.run(policy.decide("job-1", inv, sender))
    return decision.accepted, decision.reason


def test_a_module_hash_alone_accepts_nothing() -> None:
    """The attack: anyone in the room with a listed module used the agent's compute."""
    accepted, reason = decide(AcceptancePolicy([SHA]), invitation(), COORD)
    assert not accepted and "--trust-room or --accept-coordinator" in reason


def test_room_trust_accepts_room_members_with_a_listed_module_only() -> None:
    policy = AcceptancePolicy([SHA], trust=CoordinatorTrust(room=True))
    assert decide(policy, invitation(), COORD)[0]
    assert decide(policy, invitation(OTHER), OTHER)[0]
    accepted, reason = decide(policy, invitation(sha="ef" * 32), COORD)
    assert not accepted and "is not one of --accept-model" in reason


def test_a_coordinator_key_accepts_that_coordinator_only() -> None:
    policy = AcceptancePolicy([SHA], trust=CoordinatorTrust(peers=frozenset({COORD})))
    assert decide(policy, invitation(), COORD)[0]
    accepted, reason = decide(policy, invitation(OTHER), OTHER)
    assert not accepted and f"coordinator {OTHER} is not trusted" in reason


def test_an_invitation_naming_another_coordinator_than_its_sender_is_refused() -> None:
    policy = AcceptancePolicy([SHA], trust=CoordinatorTrust(peers=frozenset({COORD}), room=True))
    accepted, reason = decide(policy, invitation(COORD), OTHER)  # OTHER poses as the trusted COORD
    assert not accepted and "came from" in reason
    # asking on the terminal does not help it either
    asked = AcceptancePolicy(interactive=True, ask=lambda _p: "y", out=io.StringIO())
    assert not decide(asked, invitation(COORD), OTHER)[0]


def test_command_line_options() -> None:
    assert parse_peer_id(" " + COORD.upper() + " ") == COORD
    with pytest.raises(UsageError):
        parse_peer_id("not-a-peer")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--room", "http://127.0.0.1:1/#room=abc", "--accept-model", SHA,
                              "--accept-coordinator", "nope"])
    assert run_cli(args, io.StringIO()) == 2
    args = parser.parse_args(["--room", "abc", "--accept-model", SHA, "--trust-room"])
    assert run_cli(args, io.StringIO()) == 2  # a bare key needs --server
    args = parser.parse_args(["--room", "ftp://x/#room=abc"])
    assert run_cli(args, io.StringIO()) == 2


def test_a_jobs_wgsl_archive_runs_only_if_accept_model_lists_it_too() -> None:
    """Issue 20 §3: the WGSL archive (announced after the acceptance) is code the GPU runs: accepting the
    module, by the rules or on the terminal, does not accept it."""
    archive = "cd" * 32
    for policy in (AcceptancePolicy([SHA], trust=CoordinatorTrust(room=True)),
                   AcceptancePolicy(interactive=True, ask=lambda _p: "y", out=io.StringIO())):
        decision = policy.archive_decision(archive)
        assert not decision.accepted and f"--accept-model {archive}" in decision.reason
    assert AcceptancePolicy([SHA, archive.upper()]).archive_decision(archive).accepted
