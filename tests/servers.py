"""Real servers for tests: a subprocess on 127.0.0.1 with port 0, and the ports read back; or a
real server inside the test's event loop (``serving``), whose models and DataPlane a test can read.

A thread drains the server's stderr into ``log`` as lines arrive, so a chatty server never blocks
on a full pipe, and tests can wait for a line (``wait_for_log``) instead of sleeping.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from runtime.scheduling.worker_executor import WorkerExecutor
from runtime.server.serving import Server
from runtime.settings import ModelSettings, Settings

ROOT = Path(__file__).resolve().parent.parent
READY = re.compile(r"mlserver-like ready: ([^\"]*)")  # a text line, or the message of a JSON one


class RunningServer:
    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process
        self.endpoints: dict[str, str] = {}
        self.log: list[str] = []
        self._changed = threading.Condition()
        self._eof = False
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        stream = self.process.stderr
        assert stream is not None
        for raw in stream:
            line = raw.decode(errors="replace").rstrip("\n")
            with self._changed:
                self.log.append(line)
                match = READY.search(line)
                if match and not self.endpoints:
                    self.endpoints = dict(part.split("=", 1) for part in match.group(1).split())
                self._changed.notify_all()
        with self._changed:
            self._eof = True
            self._changed.notify_all()

    def _wait(self, done: Callable[[], object], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._changed:
            while not done():
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._eof:
                    return bool(done())
                self._changed.wait(remaining)
            return True

    @property
    def http_url(self) -> str:
        return f"http://{self.endpoints['http']}"

    @property
    def http_address(self) -> str:
        return self.endpoints["http"]

    @property
    def grpc_address(self) -> str:
        return self.endpoints["grpc"]

    @property
    def metrics_url(self) -> str:
        return f"http://{self.endpoints['metrics']}/metrics"

    def management_key(self) -> str:
        """The management key, read from the key file whose path the server logged."""
        line = self.wait_for_log(r"Management API key written to ")
        path = line.split("Management API key written to ", 1)[1].split('"')[0].strip()
        key: str = json.loads(Path(path).read_text())["management"]["key"]
        return key

    def authorization(self) -> dict[str, str]:
        """The ``authorization`` header (or gRPC metadata) the repository's load and unload need."""
        return {"authorization": f"Bearer {self.management_key()}"}

    def read_log(self) -> str:
        """Everything the server has written to stderr so far."""
        with self._changed:
            return "\n".join(self.log)

    def wait_for_log(self, pattern: str, timeout: float = 30.0) -> str:
        """Block until the server writes a line matching the regex ``pattern`` (no sleeping); return it."""
        regex = re.compile(pattern)
        found: list[str] = []

        def matched() -> bool:
            found[:] = [line for line in self.log if regex.search(line)][:1]
            return bool(found)

        if not self._wait(matched, timeout):
            raise TimeoutError(f"no log line matched {pattern!r}:\n{self.read_log()}")
        return found[0]

    def ready(self, timeout: float = 60.0) -> RunningServer:
        """Block until the server says it is ready (its endpoints known); stop it and raise if it does not."""
        if not self._wait(lambda: bool(self.endpoints), timeout):
            code = self.stop(signal.SIGKILL) if self.process.poll() is None else self.stop()
            raise RuntimeError(f"server did not become ready (exit {code}):\n{self.read_log()}")
        return self

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        self._reader.join(timeout)
        if self.process.stderr is not None:
            self.process.stderr.close()
        return code


def start_server(
    folder: str | Path, *args: str, timeout: float = 60.0, env: dict[str, str] | None = None
) -> RunningServer:
    """Start ``mlserver-like start FOLDER`` on loopback with free ports; return once it says it is ready."""
    return launch_server(folder, *args, env=env).ready(timeout)


def start_servers(*launched: RunningServer, timeout: float = 60.0) -> list[RunningServer]:
    """Wait for servers started together with ``launch_server`` (their start-ups overlap); if one
    does not become ready, every one is stopped."""
    try:
        return [server.ready(timeout) for server in launched]
    except BaseException:
        for server in launched:
            server.stop(signal.SIGKILL)
        raise


def launch_server(folder: str | Path, *args: str, env: dict[str, str] | None = None) -> RunningServer:
    """Start ``mlserver-like start FOLDER`` like ``start_server`` without waiting: ``.ready()`` waits."""
    cmd = [sys.executable, "-m", "runtime", "start", str(folder), "--host", "127.0.0.1", "--http-port", "0"]
    if "--grpc-port" not in args:
        cmd += ["--grpc-port", "0"]
    if "--metrics-port" not in args:
        cmd += ["--metrics-port", "0"]
    if "--management-port" not in args:
        cmd += ["--management-port", "0"]
    cmd += list(args)
    process = subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, **(env or {})},
        cwd=ROOT,
    )
    return RunningServer(process)


@asynccontextmanager
async def serving(
    *models: ModelSettings, grace: float = 5, tracer_provider: Any = None, **settings: Any
) -> AsyncIterator[Server]:
    """A real server (REST and gRPC) in this event loop, on 127.0.0.1 and free ports."""
    settings.setdefault("metrics_port", 0)
    settings.setdefault("management_port", 0)
    server = Server(
        Settings(host="127.0.0.1", http_port=0, grpc_port=0, shutdown_grace_period=grace, **settings),
        tracer_provider=tracer_provider,
    )
    await server.start(list(models))
    try:
        yield server
    finally:
        if server.registry.entries():
            await server.stop()


@asynccontextmanager
async def clients(server: Server) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient]]:
    """The OIP client and the management client (with its bearer key) of a ``serving`` server."""
    key = server._management_key
    assert key is not None and server.http_port and server.management_port
    async with (
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}", timeout=60) as oip,
        httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{server.management_port}",
            headers={"Authorization": f"Bearer {key.key}"},
            timeout=60,
        ) as admin,
    ):
        yield oip, admin


def executor(server: Server, name: str) -> WorkerExecutor:
    """The worker processes of a model served in them."""
    found = getattr(server.registry.get(name).scheduler, "workers", None) or getattr(
        server.registry.get(name).scheduler, "executor", None
    )
    assert isinstance(found, WorkerExecutor)
    return found
