"""A Flower deployment on loopback, as an operator would set one up: a certificate authority and a
SuperLink certificate, SuperNode keys registered with ``flwr supernode register``, a SuperLink with TLS and
``--enable-supernode-auth``, SuperNodes, ``flwr run``. The deployment test and ``bench/bench_flower.py``
use it; docs/flower.md gives the same recipe as commands.

Every process gets ``FLWR_TELEMETRY_ENABLED=0`` and a private ``FLWR_HOME``; nothing listens beyond
127.0.0.1, and the SuperLink does not install app dependencies (``--disable-runtime-dependency-installation``).
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

__all__ = ["LocalDeployment", "make_tls", "make_node_key", "free_port"]

_HOST = "127.0.0.1"


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now."""
    with socket.socket() as s:
        s.bind((_HOST, 0))
        return int(s.getsockname()[1])


def make_tls(folder: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA and a SuperLink certificate for localhost/127.0.0.1: (ca.crt, server.pem, server.key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    valid = (now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=1))

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca = (x509.CertificateBuilder().subject_name(name("weei-local-ca")).issuer_name(name("weei-local-ca"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(valid[0]).not_valid_after(valid[1])
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True).sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP384R1())
    cert = (x509.CertificateBuilder().subject_name(name("localhost")).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(valid[0]).not_valid_after(valid[1])
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address(_HOST))]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = folder / "ca.crt", folder / "server.pem", folder / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    os.chmod(paths[2], 0o600)
    return paths


def make_node_key(folder: Path, name: str) -> tuple[Path, Path]:
    """A SuperNode's EC P-384 key pair in OpenSSH form (what ``flwr supernode register`` and
    ``flower-supernode --auth-supernode-private-key`` read): (private, public)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    folder.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    private, public = folder / name, folder / f"{name}.pub"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                          serialization.NoEncryption()))
    os.chmod(private, 0o600)
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                     serialization.PublicFormat.OpenSSH))
    return private, public


@dataclass
class LocalDeployment:
    """A SuperLink and SuperNodes under ``root``; :meth:`close` ends every process it started."""

    root: Path
    env: dict[str, str] = field(default_factory=dict)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    node_ports: dict[str, int] = field(default_factory=dict)
    port: int = 0

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        bin_dir = str(Path(sys.executable).parent)
        home = self.root / "flwr-home"
        home.mkdir(exist_ok=True)
        # A SuperNode's SuperExec looks for a message to start a ClientApp for once a second by default:
        # 0.1 s takes up to 0.9 s off every message for a poll that costs next to nothing.
        self.env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "FLWR_HOME": str(home),
                    "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.1",
                    "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""), **self.env}
        self.ca, self.cert, self.key = make_tls(self.root / "tls")

    def _start(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.root / f"{name}.log", "wb")
        process = subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        self.processes[name] = process
        return process

    def log(self, name: str) -> str:
        """What process ``name`` has written."""
        return (self.root / f"{name}.log").read_text(errors="replace")

    def start_superlink(self, timeout_s: float = 120.0) -> None:
        """The SuperLink with TLS and SuperNode authentication; returns once it answers."""
        self.port = free_port()
        self._start("superlink", ["flower-superlink", "--ssl-ca-certfile", str(self.ca), "--ssl-certfile",
                                  str(self.cert), "--ssl-keyfile", str(self.key), "--enable-supernode-auth",
                                  "--disable-runtime-dependency-installation", "--host", _HOST, "--port",
                                  str(self.port), "--database", ":flwr-in-memory:"])
        (self.root / "flwr-home" / "config.toml").write_text(
            f'[superlink]\ndefault = "local-deployment"\n\n[superlink.local-deployment]\n'
            f'address = "{_HOST}:{self.port}"\nroot-certificates = "{self.ca}"\n')
        deadline = time.monotonic() + timeout_s
        while "Uvicorn running" not in self.log("superlink"):
            if self.processes["superlink"].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the SuperLink did not start:\n{self.log('superlink')[-3000:]}")
            time.sleep(0.2)

    def flwr(self, *args: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
        """``flwr ARGS`` against this deployment's SuperLink."""
        return subprocess.run(["flwr", *args], env=self.env, capture_output=True, text=True, timeout=timeout_s,
                              cwd=self.root, stdin=subprocess.DEVNULL)

    def register(self, public_key: Path) -> int:
        """``flwr supernode register``: the node id the SuperLink gives the key."""
        done = self.flwr("supernode", "register", str(public_key), "--format", "json")
        text = done.stdout[done.stdout.find("{"):]
        try:
            return int(json.loads(text)["node-id"])
        except (ValueError, KeyError) as exc:
            raise RuntimeError(f"flwr supernode register failed: {done.stdout}{done.stderr}") from exc

    def start_supernode(self, name: str, private_key: Path | None, node_config: Mapping[str, str],
                        *, tls: bool = True, retries: int | None = None) -> subprocess.Popen[bytes]:
        """A SuperNode (``tls=False``: one that tries without TLS); ``retries`` bounds its reconnection."""
        config = " ".join(f'{k}="{v}"' for k, v in node_config.items())
        self.node_ports[name] = free_port()
        argv = ["flower-supernode", "--superlink", f"{_HOST}:{self.port}", "--port", str(self.node_ports[name]),
                "--node-config", config]
        argv += ["--root-certificates", str(self.ca)] if tls else ["--insecure"]
        if private_key is not None:
            argv += ["--auth-supernode-private-key", str(private_key)]
        if retries is not None:
            argv += ["--max-retries", str(retries), "--max-wait-time", "20"]
        return self._start(name, argv)

    def online(self) -> dict[int, str]:
        """The SuperLink's nodes and their status (``flwr supernode ls``)."""
        done = self.flwr("supernode", "ls", "--format", "json")
        text = done.stdout[done.stdout.find("{"):]
        try:
            nodes = json.loads(text)["nodes"]
        except (ValueError, KeyError) as exc:
            raise RuntimeError(f"flwr supernode ls failed: {done.stdout}{done.stderr}") from exc
        return {int(n["node-id"]): str(n["status"]) for n in nodes}

    def wait_online(self, node_ids: list[int], timeout_s: float = 120.0) -> None:
        """Returns once every node in ``node_ids`` is online."""
        deadline = time.monotonic() + timeout_s
        while True:
            status = self.online()
            if all(status.get(n) == "online" for n in node_ids):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"nodes not online after {timeout_s} s: {status}")
            time.sleep(1.0)

    def kill_node(self, name: str) -> None:
        """Kill SuperNode ``name`` and what runs for it (its SuperExec and ClientApp, which Flower starts in
        sessions of their own, and so Weei's resident participant) at once, as a pulled plug would."""
        process = self.processes[name]
        runtime = f"{_HOST}:{self.node_ports[name]}".encode()
        for pid in self.descendants():
            try:
                if runtime in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"):
                    os.kill(pid, signal.SIGKILL)
            except (OSError, ProcessLookupError):
                continue
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()

    def descendants(self) -> list[int]:
        """Processes started under this deployment (they inherit its ``FLWR_HOME``) but not by it: Flower's
        SuperExecs, ServerApps and ClientApps, which Flower starts in sessions of their own, and Weei's
        resident participants."""
        marker = f"FLWR_HOME={self.env['FLWR_HOME']}".encode()
        mine = {p.pid for p in self.processes.values()}
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) in mine or int(entry.name) == os.getpid():
                continue
            try:
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
        return found

    def close(self) -> None:
        """End every process this deployment started, and theirs (SIGTERM, then SIGKILL)."""
        for pid in self.descendants():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for process in self.processes.values():
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 10.0
        for process in self.processes.values():
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                process.wait()

    def __enter__(self) -> "LocalDeployment":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
