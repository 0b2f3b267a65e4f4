"""A SuperNode's resident participant: one process per node that outlives Flower's per-message ClientApps.

Flower 1.42's SuperNode starts a fresh ``flwr-clientapp`` process for every
message, in both isolation modes (``subprocess``: its SuperExec starts it;
``process``: an outside SuperExec does), and the process ends with the
reply. Weei's participant is stateful across messages (the invitation it
accepted, the module it compiled, the chunks and checkpoints it holds, the
assignment it trains), and rebuilding it per message cost the prototype
9–27 s a round (imports and a WASM compile each time). So the ClientApp a
deployment runs is a thin forwarder (:func:`forward`): it hands the message's
RecordDict to this node's resident process over a Unix socket and returns
its reply; the resident process (:func:`serve`) holds the node's
:class:`~weei.flower.client.NodeHosts` for as long as the node lives.

The socket is in a directory only this user can enter (0700, checked), and
the resident process takes connections from this user's processes only
(``SO_PEERCRED``); a request is length-prefixed and bounded
(``MAX_RECORD_BYTES``). The resident process ends when the process that
started its first ClientApp (the SuperNode's SuperExec) ends, or after
``idle_s`` without a message.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Mapping

from .codec import MAX_RECORD_BYTES
from .errors import FlowerError, FlowerReason

__all__ = ["forward", "serve", "state_dir", "STATE_DIR_KEY"]

STATE_DIR_KEY = "weei-state-dir"
_HEADER_MAX = 64 * 1024
_START_S = 60.0
_IDLE_S = 900.0
# An AF_UNIX address holds at most 107 bytes of path on Linux (sun_path is 108, NUL included).
_SUN_PATH_MAX = 107


def state_dir(node_id: int, node_config: Mapping[str, Any]) -> Path:
    """The node's private directory: node config ``weei-state-dir``, else one under the user's cache."""
    base = node_config.get(STATE_DIR_KEY)
    root = Path(str(base)) if base else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "weei-flower"
    path = root / f"node-{node_id}"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.stat()
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        # Another user could plant a socket or read the node's artifacts: refuse rather than trust it.
        raise FlowerError(FlowerReason.UNSAFE_STATE_DIR,
                          f"{path} must be owned by this user and closed to others (mode 0700)")
    return path


def _send(sock: socket.socket, header: Mapping[str, Any], body: bytes) -> None:
    head = json.dumps(header).encode()
    sock.sendall(struct.pack("<IQ", len(head), len(body)) + head)
    # With an empty body the other side has the whole request once the header is in: it may answer and close
    # before a second send, which then fails with EPIPE (seen under load: a message with empty content).
    if body:
        sock.sendall(body)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    parts, got = [], 0
    while got < n:
        part = sock.recv(min(n - got, 1 << 20))
        if not part:
            raise ConnectionError(f"the peer closed the socket after {got} of {n} bytes")
        parts.append(part)
        got += len(part)
    return b"".join(parts)


def _recv(sock: socket.socket) -> tuple[dict[str, Any], bytes]:
    head_len, body_len = struct.unpack("<IQ", _recv_exact(sock, 12))
    if head_len > _HEADER_MAX or body_len > MAX_RECORD_BYTES + _HEADER_MAX:
        raise ConnectionError(f"a frame of {head_len} + {body_len} bytes is over the limit")
    header = json.loads(_recv_exact(sock, head_len))
    if not isinstance(header, dict):
        raise ConnectionError("the frame's header is not an object")
    return header, _recv_exact(sock, body_len)


def _to_bytes(content: Any) -> bytes:
    from flwr.common.serde import recorddict_to_proto

    return bytes(recorddict_to_proto(content).SerializeToString())


def _from_bytes(data: bytes) -> Any:
    from flwr.common.serde import recorddict_from_proto
    from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict

    return recorddict_from_proto(ProtoRecordDict.FromString(data))


@contextmanager
def _address(path: Path) -> Iterator[str]:
    """The AF_UNIX address of the socket file ``path``: the path itself when it fits, else the same file
    reached through a descriptor of its directory (``/proc/self/fd/N/NAME``). A node's state directory may
    be deeper than an address holds (under pytest's temporary directory the socket's path is 110 bytes), and
    then the resident process could not bind and every message of the node failed."""
    if len(os.fsencode(path)) <= _SUN_PATH_MAX:
        yield str(path)
        return
    fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}/{path.name}"
    finally:
        os.close(fd)


def _connect(path: Path) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with _address(path) as address:
            sock.connect(address)
        return sock
    except OSError:
        sock.close()
        return None


def forward(node_id: int, node_config: Mapping[str, Any], content: Any) -> Any:
    """The ClientApp's side: ``content`` to this node's resident participant (started if none is);
    its reply's content."""
    folder = state_dir(node_id, node_config)
    path = folder / "participant.sock"
    sock = _connect(path)
    if sock is None:
        with open(folder / "start.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # two ClientApps of one node start one resident process
            sock = _connect(path)
            if sock is None:
                sock = _start(folder, path, node_id)
    with sock:
        config = {k: v for k, v in node_config.items() if isinstance(v, (str, int, float, bool))}
        _send(sock, {"node_id": node_id, "node_config": config}, _to_bytes(content))
        header, body = _recv(sock)
    if "error" in header:
        raise FlowerError(FlowerReason.RESIDENT_FAILED, f"the node's resident participant failed: {header['error']}")
    return _from_bytes(body)


def _start(folder: Path, path: Path, node_id: int) -> socket.socket:
    path.unlink(missing_ok=True)
    log_path = folder / "participant.log"
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "weei.flower.resident", "--dir", str(folder), "--node-id", str(node_id),
             "--watch-pid", str(os.getppid())],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, close_fds=True)
    deadline = time.monotonic() + _START_S
    while time.monotonic() < deadline:
        sock = _connect(path)
        if sock is not None:
            return sock
        if process.poll() is not None:  # it will not start: say why now, not after the whole wait
            lines = log_path.read_bytes().decode(errors="replace").strip().splitlines()
            raise FlowerError(FlowerReason.RESIDENT_FAILED,
                              f"node {node_id}'s resident participant exited ({process.returncode}): "
                              f"{lines[-1] if lines else 'no output'} (see {log_path})")
        time.sleep(0.05)
    raise FlowerError(FlowerReason.RESIDENT_FAILED,
                      f"node {node_id}'s resident participant did not start in {_START_S} s (see {folder})")


def serve(folder: Path, node_id: int, watch_pid: int, idle_s: float = _IDLE_S) -> None:
    """The resident process: answer this node's ClientApps until ``watch_pid`` ends or ``idle_s`` pass idle."""
    from .apps import quiet_flower
    from .client import NodeHosts

    quiet_flower()
    hosts = NodeHosts()
    path = folder / "participant.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path.unlink(missing_ok=True)
    with _address(path) as address:
        server.bind(address)
    os.chmod(path, 0o600)
    server.listen(4)
    server.settimeout(1.0)
    last = time.monotonic()
    me = os.getuid()
    while _alive(watch_pid) and time.monotonic() - last < idle_s:
        try:
            conn, _ = server.accept()
        except TimeoutError:
            continue
        with conn:
            conn.settimeout(600.0)
            uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
            if uid != me:
                continue
            try:
                header, body = _recv(conn)
                started = time.monotonic()
                print(f"received a message of {len(body)} bytes", file=sys.stderr, flush=True)
                reply = hosts.handle(int(header["node_id"]), dict(header.get("node_config", {})), _from_bytes(body))
                _send(conn, {}, _to_bytes(reply))
                print(f"answered in {time.monotonic() - started:.3f} s", file=sys.stderr, flush=True)
            except Exception as exc:  # one bad request ends that ClientApp's message, not the node
                try:
                    _send(conn, {"error": f"{type(exc).__name__}: {exc}"}, b"")
                except OSError:
                    pass
        last = time.monotonic()
    server.close()
    path.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _main() -> None:
    parser = argparse.ArgumentParser(description="a SuperNode's resident Weei participant (docs/flower.md)")
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--node-id", type=int, required=True)
    parser.add_argument("--watch-pid", type=int, required=True)
    args = parser.parse_args()
    serve(args.dir, args.node_id, args.watch_pid)


if __name__ == "__main__":
    _main()
