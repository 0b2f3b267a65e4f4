"""A deployed node's resident participant (weei.flower.resident) in a state directory deeper than an AF_UNIX
address holds: pytest's own temporary directories are that deep, and there every node of the deployment
test failed (the resident could not bind its socket; each ClientApp waited 60 s for it)."""

from __future__ import annotations

import os
import signal
import socket
import struct
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from flwr.app import RecordDict  # noqa: E402

from weei.flower.resident import STATE_DIR_KEY, forward  # noqa: E402

pytestmark = pytest.mark.flower


def _resident_pid(sock_path: Path) -> int:
    """The pid of the process listening on ``sock_path`` (its peer credentials)."""
    fd = os.open(sock_path.parent, os.O_PATH | os.O_DIRECTORY)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(f"/proc/self/fd/{fd}/{sock_path.name}")
            return int(struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0])
    finally:
        os.close(fd)


def test_a_state_directory_too_deep_for_a_socket_address_still_serves_the_node(tmp_path: Path) -> None:
    root = tmp_path / ("deep-" + "d" * 100)
    node_id = 12345678901234567890
    sock_path = root / f"node-{node_id}" / "participant.sock"
    assert len(os.fsencode(sock_path)) > 107  # more than sun_path holds

    reply = forward(node_id, {STATE_DIR_KEY: str(root)}, RecordDict())
    pid = _resident_pid(sock_path)
    try:
        assert isinstance(reply, RecordDict)
        assert pid != os.getpid()  # a process of its own, started by the first message
        assert (sock_path.stat().st_mode & 0o777) == 0o600
        # the next message (a fresh ClientApp process in a deployment) reaches the same resident process
        forward(node_id, {STATE_DIR_KEY: str(root)}, RecordDict())
        assert _resident_pid(sock_path) == pid
        assert (sock_path.parent / "participant.log").read_text().count("received a message") == 2
    finally:
        os.kill(pid, signal.SIGTERM)
        try:
            os.waitpid(pid, 0)  # this process started it (forward): nothing outlives the test
        except ChildProcessError:  # already reaped by subprocess's own clean-up
            pass
