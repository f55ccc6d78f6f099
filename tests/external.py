"""Real external processes for tests: redis-server, haproxy and nginx on 127.0.0.1, on free ports.

Each is started by the test, waited for by polling (a PING, a TCP connect), and stopped by its PID.
A test whose binary is missing skips, saying which binary and how to get it (``scripts/test``, which
``.ci/run`` runs, installs them from Debian when one is missing: ``apt-get install redis-server
haproxy nginx-core``).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest


def binary(name: str) -> str:
    """The path of ``name``, or skip the test saying it is missing."""
    found = shutil.which(name) or next(
        (str(p) for p in (Path("/usr/sbin") / name, Path("/usr/bin") / name) if p.exists()), None
    )
    if found is None:
        pytest.skip(
            f"{name} is not installed (apt-get install {'redis-server' if 'redis' in name else name})"
        )
    return found


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the caller retries if another process takes it first)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _connects(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    for stream in (process.stdout, process.stderr):
        if stream is not None:
            stream.close()


def _ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@contextmanager
def redis_server() -> Iterator[str]:
    """A private redis-server (no persistence); yields its URL, ``redis://127.0.0.1:<port>/0``."""
    exe = binary("redis-server")
    for _attempt in range(5):
        port = free_port()
        process = subprocess.Popen(
            [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while process.poll() is None and not _ping(port) and time.monotonic() < deadline:
            time.sleep(0.01)
        if process.poll() is None and _ping(port):
            break
        _stop(process)  # the port was taken meanwhile, or it did not start: another port
    else:
        raise RuntimeError("redis-server did not start")
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        _stop(process)


@dataclass(frozen=True)
class Front:
    """A proxy in front of the replicas: its REST URL and its gRPC address (host:port)."""

    url: str
    grpc: str


HAPROXY_CONFIG = Path(__file__).resolve().parent.parent / "deploy" / "haproxy" / "haproxy.cfg"


@contextmanager
def haproxy(replicas: list[str], grpc_replicas: list[str] | None = None) -> Iterator[Front]:
    """HAProxy with the shipped config (deploy/haproxy/haproxy.cfg: hashing on the sequence id
    header, consistent, health checks on readiness) over two replicas (REST host:port, and their
    gRPC host:port where given); yields its addresses."""
    exe = binary("haproxy")
    assert len(replicas) == 2, "the shipped config names two replicas"
    grpc_replicas = grpc_replicas or ["127.0.0.1:1", "127.0.0.1:1"]
    for _attempt in range(5):
        port, grpc_port = free_port(), free_port()
        env = {
            "BIND": f"127.0.0.1:{port}",
            "REPLICA_0": replicas[0],
            "REPLICA_1": replicas[1],
            "GRPC_BIND": f"127.0.0.1:{grpc_port}",
            "GRPC_REPLICA_0": grpc_replicas[0],
            "GRPC_REPLICA_1": grpc_replicas[1],
        }
        process = subprocess.Popen(
            [exe, "-f", str(HAPROXY_CONFIG), "-db"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, **env},
        )
        deadline = time.monotonic() + 10
        while process.poll() is None and not _connects(port) and time.monotonic() < deadline:
            time.sleep(0.01)
        if process.poll() is None and _connects(port):
            break
        _stop(process)
    else:
        raise RuntimeError("haproxy did not start")
    try:
        yield Front(f"http://127.0.0.1:{port}", f"127.0.0.1:{grpc_port}")
    finally:
        _stop(process)


NGINX_CONFIG = Path(__file__).resolve().parent.parent / "deploy" / "nginx" / "nginx.conf"


@contextmanager
def nginx(replicas: list[str], grpc_replicas: list[str] | None = None) -> Iterator[Front]:
    """nginx with the shipped config (deploy/nginx/nginx.conf: consistent hash on the sequence id
    header), its example addresses replaced by free ports and the two replicas (REST host:port, and
    their gRPC host:port where given); yields its addresses."""
    exe = binary("nginx")
    assert len(replicas) == 2, "the shipped config names two replicas"
    grpc_replicas = grpc_replicas or ["127.0.0.1:1", "127.0.0.1:1"]
    shipped = NGINX_CONFIG.read_text()
    with tempfile.TemporaryDirectory() as prefix:
        for _attempt in range(5):
            port, grpc_port = free_port(), free_port()
            config = (
                shipped.replace("127.0.0.1:8080", f"127.0.0.1:{port}")
                .replace("127.0.0.1:8081", replicas[0])
                .replace("127.0.0.1:8082", replicas[1])
                .replace("127.0.0.1:8090", f"127.0.0.1:{grpc_port}")
                .replace("127.0.0.1:8091", grpc_replicas[0])
                .replace("127.0.0.1:8092", grpc_replicas[1])
            )
            path = Path(prefix) / "nginx.conf"
            path.write_text(config)
            process = subprocess.Popen(
                [exe, "-p", prefix, "-c", str(path), "-e", "stderr", "-g", "daemon off;"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            deadline = time.monotonic() + 10
            while process.poll() is None and not _connects(port) and time.monotonic() < deadline:
                time.sleep(0.01)
            if process.poll() is None and _connects(port):
                break
            _stop(process)
        else:
            raise RuntimeError("nginx did not start")
        try:
            yield Front(f"http://127.0.0.1:{port}", f"127.0.0.1:{grpc_port}")
        finally:
            _stop(process)
