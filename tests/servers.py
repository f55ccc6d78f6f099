"""Real servers for tests: a subprocess on 127.0.0.1 with port 0, and the ports read back; or a
real server inside the test's event loop (``serving``), whose models and DataPlane a test can read."""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime.server import Server
from runtime.settings import ModelSettings, Settings

ROOT = Path(__file__).resolve().parent.parent
READY = re.compile(r"mlserver-like ready: (.*)$")


@dataclass
class RunningServer:
    process: subprocess.Popen[bytes]
    endpoints: dict[str, str]
    log: list[str] = field(default_factory=list)

    @property
    def http_url(self) -> str:
        return f"http://{self.endpoints['http']}"

    @property
    def http_address(self) -> str:
        return self.endpoints["http"]

    @property
    def grpc_address(self) -> str:
        return self.endpoints["grpc"]

    def read_log(self) -> str:
        """Everything the server has written to stderr so far (without blocking)."""
        stream = self.process.stderr
        assert stream is not None
        os.set_blocking(stream.fileno(), False)
        try:
            chunk = stream.read()
        finally:
            os.set_blocking(stream.fileno(), True)
        if chunk:
            self.log.extend(chunk.decode(errors="replace").splitlines())
        return "\n".join(self.log)

    def wait_for_log(self, text: str, timeout: float = 30.0) -> None:
        """Block until the server's log holds ``text`` (the server says so; no sleeping)."""
        stream = self.process.stderr
        assert stream is not None
        if text in self.read_log():
            return
        selector = selectors.DefaultSelector()
        selector.register(stream, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if selector.select(deadline - time.monotonic()) and text in self.read_log():
                    return
        finally:
            selector.close()
        raise TimeoutError(f"{text!r} not in the server log:\n{self.read_log()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        assert self.process.stderr is not None
        rest = self.process.stderr.read()
        self.process.stderr.close()
        self.log.extend(rest.decode(errors="replace").splitlines())
        return code


def start_server(
    folder: str | Path, *args: str, timeout: float = 60.0, env: dict[str, str] | None = None
) -> RunningServer:
    """Start ``mlserver-like start FOLDER`` on loopback with free ports; return once it says it is ready."""
    cmd = [sys.executable, "-m", "runtime", "start", str(folder), "--host", "127.0.0.1", "--http-port", "0"]
    if "--grpc-port" not in args:
        cmd += ["--grpc-port", "0"]
    cmd += list(args)
    process = subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, **(env or {})},
        cwd=ROOT,
    )
    assert process.stderr is not None
    log: list[str] = []
    selector = selectors.DefaultSelector()
    selector.register(process.stderr, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    buffer = b""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            process.kill()
            raise TimeoutError("server did not become ready:\n" + "\n".join(log))
        if not selector.select(remaining):
            continue
        chunk = os.read(process.stderr.fileno(), 65536)
        if not chunk:
            process.wait()
            raise RuntimeError(f"server exited with {process.returncode}:\n" + "\n".join(log))
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for raw in lines:
            line = raw.decode(errors="replace")
            log.append(line)
            match = READY.search(line)
            if match:
                selector.close()
                endpoints = dict(part.split("=", 1) for part in match.group(1).split())
                if buffer:
                    log.append(buffer.decode(errors="replace"))
                return RunningServer(process, endpoints, log)


@asynccontextmanager
async def serving(*models: ModelSettings, grace: float = 5, **settings: Any) -> AsyncIterator[Server]:
    """A real server (REST and gRPC) in this event loop, on 127.0.0.1 and free ports."""
    server = Server(
        Settings(host="127.0.0.1", http_port=0, grpc_port=0, shutdown_grace_period=grace, **settings)
    )
    await server.start(list(models))
    try:
        yield server
    finally:
        if server.registry.entries():
            await server.stop()
