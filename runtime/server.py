"""The server's lifecycle: load models, serve REST and gRPC in one event loop, drain, unload.

On SIGTERM or SIGINT the server stops accepting connections and calls on both ports, lets
in-flight requests and streams finish within ``shutdown_grace_period``, unloads every model and
returns, so the process exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import socket
from collections.abc import Awaitable, Iterator

import uvicorn

from .dataplane import DataPlane
from .grpc import GrpcServer
from .registry import Registry
from .repository import read_repository
from .rest import create_app
from .rest.protocol import HttpProtocol
from .settings import ModelSettings, Settings

logger = logging.getLogger("runtime.server")


class _Uvicorn(uvicorn.Server):
    """uvicorn without its own signal handling: the Server below owns the signals and the exit."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


class Server:
    """One process serving the models of a repository over REST and gRPC."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.registry = Registry()
        self.dataplane = DataPlane(settings, self.registry)
        self.http_port: int | None = None
        self.grpc_port: int | None = None
        self._grpc: GrpcServer | None = None
        self._http: _Uvicorn | None = None
        self._http_task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    async def load_models(self, models: list[ModelSettings] | None = None) -> None:
        if models is None:
            models, broken = read_repository(self.settings.model_repository_root)
            for path, reason in broken:
                logger.error("Cannot read %s: %s", path, reason)
        await asyncio.gather(*(self.registry.load(m) for m in models))

    async def start(self, models: list[ModelSettings] | None = None) -> None:
        """Load the models (unless told not to) and start listening."""
        if self.settings.load_models_at_startup or models is not None:
            await self.load_models(models)
        app = create_app(self.dataplane)
        config = uvicorn.Config(
            app,
            lifespan="off",
            log_config=None,
            access_log=self.settings.access_log,
            root_path=self.settings.root_path,
            timeout_graceful_shutdown=self.settings.shutdown_grace_period,  # type: ignore[arg-type]
            http=HttpProtocol,  # httptools, one write per response
            loop="none",
            server_header=False,
        )
        sock = bind(self.settings.host, self.settings.http_port)
        self.http_port = sock.getsockname()[1]
        self._http = _Uvicorn(config)
        config.load()
        self._http.lifespan = config.lifespan_class(config)
        await self._http.startup(sockets=[sock])
        self._http_task = asyncio.create_task(self._run_http(sock))
        logger.info("HTTP server listening on http://%s:%d", self.settings.host, self.http_port)
        self._grpc = GrpcServer(self.dataplane, self.settings)
        self.grpc_port = await self._grpc.start()
        # What was loaded so far (frameworks, weights) lives until exit: move it out of the
        # collector's reach, so that full collections stay short on the serving path. Collecting
        # the young generations first frees what loading left behind; a full collection would also
        # walk every object of the frameworks (some 300 000 with torch: a quarter of a second).
        gc.collect(1)
        gc.freeze()
        self.dataplane.started = True

    async def _run_http(self, sock: socket.socket) -> None:
        assert self._http is not None
        await self._http.main_loop()
        await self._http.shutdown(sockets=[sock])

    def endpoints(self) -> str:
        """``http=HOST:PORT`` (and ``grpc=HOST:PORT`` when gRPC is served), space-separated."""
        endpoints = f"http={self.settings.host}:{self.http_port}"
        if self.grpc_port is not None:
            endpoints += f" grpc={self.settings.host}:{self.grpc_port}"
        return endpoints

    def request_stop(self) -> None:
        self._stopping.set()

    async def wait(self) -> None:
        await self._stopping.wait()

    async def stop(self) -> None:
        """Stop accepting, drain in-flight requests and streams (REST and gRPC at once), unload models."""
        self.dataplane.draining = True
        self.dataplane.streams.cut_after(self.settings.shutdown_grace_period)  # streams end in band
        draining: list[Awaitable[None]] = []
        if self._grpc is not None:
            draining.append(self._grpc.stop(self.settings.shutdown_grace_period))
        if self._http is not None and self._http_task is not None:
            self._http.should_exit = True
            draining.append(self._http_task)
        await asyncio.gather(*draining)
        await self._wait_streams()
        await self.registry.unload_all()
        logger.info("Server stopped")

    async def _wait_streams(self, timeout: float = 5.0) -> None:
        """Let streams cut at the end of the grace period close their models' generators first."""
        try:
            await asyncio.wait_for(self.dataplane.streams.wait_idle(), timeout)
        except asyncio.TimeoutError:
            logger.warning("%d stream(s) still open when unloading models", self.dataplane.streams.active)

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.request_stop)


async def serve(settings: Settings) -> None:
    """Run a server until SIGINT or SIGTERM, then shut it down cleanly."""
    server = Server(settings)
    server.install_signal_handlers()
    try:
        await server.start()
    except OSError as exc:  # a port in use, an unreadable certificate…
        logger.error("Cannot start serving on %s: %s", settings.host, exc)
        await server.stop()
        raise SystemExit(1) from None
    # one machine-readable line that scripts and tests wait for
    logger.info("mlserver-like ready: %s", server.endpoints())
    await server.wait()
    logger.info("Shutting down")
    await server.stop()
