"""The server's lifecycle: load models, serve REST and gRPC in one event loop, drain, unload.

On SIGTERM or SIGINT the server stops accepting connections and calls on both ports, lets
in-flight requests and streams finish within ``shutdown_grace_period``, unloads every model and
returns, so the process exits 0. A unary request still running when the grace period ends is
cancelled and answered 503 / UNAVAILABLE ("shutting down").
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import signal
import socket
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any

import uvicorn

from runtime.core.dataplane import DataPlane
from runtime.core.management import Management
from runtime.core.management_key import ManagementKey
from runtime.core.registry import Registry
from runtime.core.repository_poll import RepositoryPoll
from runtime.core.residency import Residency
from runtime.core.response_cache import make_cache
from runtime.core.watchdog import LoopWatchdog
from runtime.frontends.grpc.grpc_server import GrpcServer
from runtime.frontends.management.api import create_management_app
from runtime.frontends.rest.protocol import guarded_protocol
from runtime.frontends.torchserve.inference_grpc import torchserve_services
from runtime.model import MLModel
from runtime.repository import read_repository
from runtime.scheduling import gc_threshold
from runtime.server.observability import Observability
from runtime.server.rest_app import create_app
from runtime.settings import ModelSettings, Settings

logger = logging.getLogger("runtime.server.serving")

CUT_MARGIN = 1.0
DRAIN_POLL = 0.05
"""Seconds between looks at the work in flight while the listeners stay open during a drain."""
"""Seconds past ``shutdown_grace_period`` that REST and gRPC wait before they drop connections and
calls: unary requests still running at the end of the grace period are cancelled first, so that
their callers get a 503 / UNAVAILABLE answer rather than a dropped call."""


@contextlib.contextmanager
def fewer_collections() -> Iterator[None]:
    """While the models load at start-up, the cyclic collector's first threshold is at least
    ``gc_threshold.YOUNG`` (10 000 net allocations instead of 700), through the same hold that a
    running batcher takes (``runtime.scheduling.gc_threshold``), so that a batcher loaded meanwhile
    keeps its own. Loading imports frameworks whose hundreds of thousands of long-lived objects
    each young, middle and full collection walked again: with the torch examples some 690 young,
    63 middle and 5 full collections, 0.8 to 1.1 s of a 4 to 5 s start (loaded machine), against
    48 young and 5 middle, 0.3 to 0.4 s, at this threshold. Cyclic garbage is still collected, a
    little later. A threshold of 0 (collector off) or above this one is kept."""
    gc_threshold.hold()
    try:
        yield
    finally:
        gc_threshold.release()


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

    def __init__(self, settings: Settings, tracer_provider: Any = None) -> None:
        self.settings = settings
        self.registry = Registry(
            settings.model_repository_root,
            settings.parallel_workers,
            settings.shutdown_grace_period,
            Residency(settings.max_loaded_models, settings.models_memory_limit, settings.model_load_wait),
            make_cache(settings.response_cache, settings.response_cache_size, settings.response_cache_ttl),
        )
        self.dataplane = DataPlane(settings, self.registry)
        self.observability = Observability(settings, self.dataplane, tracer_provider)
        self.http_port: int | None = None
        self.grpc_port: int | None = None
        self.metrics_port: int | None = None
        self._grpc: GrpcServer | None = None
        self._http: _Uvicorn | None = None
        self._http_task: asyncio.Task[None] | None = None
        self._metrics: _Uvicorn | None = None
        self._metrics_task: asyncio.Task[None] | None = None
        self.management_port: int | None = None
        self.management: Management | None = None
        self._management_key: ManagementKey | None = None
        self._management_http: _Uvicorn | None = None
        self._management_task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._hurry = asyncio.Event()
        self._watchdog: LoopWatchdog | None = None
        self.poll: RepositoryPoll | None = None
        """Follows the model repository (``repository_poll_interval``; None: off)."""

    async def load_models(self, models: list[ModelSettings] | None = None) -> None:
        broken: list[tuple[Path, str]] = []
        if models is None:
            models, broken = read_repository(self.settings.model_repository_root)
            for path, reason in broken:
                logger.error("Cannot read %s: %s", path, reason)
        unreadable = [path.parent.name for path, _ in broken]
        if self.registry.residency.on_demand:
            await self._load_under_limits(models, unreadable)
            return
        self.dataplane.expect(models, unreadable)
        await asyncio.gather(*(self.registry.load(m) for m in models))

    async def _load_under_limits(self, models: list[ModelSettings], unreadable: list[str]) -> None:
        """Under a residency limit: register every model, load the pinned ones (readiness waits
        for them), then, with ``load_models_at_startup``, the others in order while they fit."""
        for settings in models:
            self.registry.register(settings)
        pinned = [m for m in models if m.pinned]
        self.dataplane.expect(pinned, unreadable)
        for settings in pinned:
            await self.registry.load(settings)
        if not self.settings.load_models_at_startup:
            return
        residency = self.registry.residency
        for settings in models:
            if settings.pinned:
                continue
            entry = self.registry.find(settings.name, settings.version)
            resident = self.registry.resident()
            full = residency.memory_limit and sum(e.memory for e in resident) >= residency.memory_limit
            if full or not residency.fits(resident, entry):
                break
            await self.registry.load(settings)
            if len(self.registry.resident()) <= len(resident):  # it took another's room: full
                break

    async def start(self, models: list[ModelSettings] | None = None) -> None:
        """Load the models (unless told not to) and start listening."""
        if self.settings.load_models_at_startup or models is not None or self.registry.residency.on_demand:
            with fewer_collections():
                await self.load_models(models)
        if self.settings.repository_poll_interval > 0:
            self.poll = RepositoryPoll(
                self.registry,
                self.settings.model_repository_root,
                self.settings.repository_poll_interval,
                self.dataplane.forget,
            )
            await self.poll.start()
        self.observability.start()
        app = self.observability.wrap_rest(create_app(self.dataplane))
        self._http, self._http_task, self.http_port = await self._serve_http(app, self.settings.http_port)
        logger.info("HTTP server listening on http://%s:%d", self.settings.host, self.http_port)
        if self.observability.metrics_app is not None:
            served = await self._serve_http(self.observability.metrics_app, self.settings.metrics_port)
            self._metrics, self._metrics_task, self.metrics_port = served
            logger.info(
                "Metrics served on http://%s:%d%s",
                self.settings.host,
                self.metrics_port,
                self.settings.metrics_endpoint,
            )
        # one management core for both management front ends (REST on its port, gRPC's service)
        self.management = Management(self.settings, self.registry)
        self._grpc = GrpcServer(
            self.dataplane,
            self.settings,
            self.observability.grpc_interceptors(),
            services=torchserve_services(self.dataplane, self.management, self._new_management_key()),
            registration=self.observability.grpc_registration,
        )
        self.grpc_port = await self._grpc.start()
        if self.settings.management_enabled:
            await self._start_management()
        # What was loaded so far (frameworks, weights) lives until exit: move it out of the
        # collector's reach, so that full collections stay short on the serving path. Collecting
        # the young generations first frees what loading left behind; a full collection would also
        # walk every object of the frameworks (some 300 000 with torch: a quarter of a second).
        gc.collect(1)
        gc.freeze()
        if self.settings.loop_block_warning > 0:
            self._watchdog = LoopWatchdog(self.settings.loop_block_warning, self._models)
            self._watchdog.start()
        self.dataplane.started = True
        await self._grpc.health.refresh()

    async def _serve_http(
        self, app: Any, port: int, host: str | None = None
    ) -> tuple[_Uvicorn, asyncio.Task[None], int]:
        """Serve an ASGI app with uvicorn in this loop on ``host:port`` (``settings.host`` by
        default); return it and its port."""
        config = uvicorn.Config(
            app,
            lifespan="off",
            log_config=None,
            access_log=False,  # the access log is the server's own (runtime.server.observability)
            root_path=self.settings.root_path,
            timeout_graceful_shutdown=self.settings.shutdown_grace_period + CUT_MARGIN,  # type: ignore[arg-type]
            http=guarded_protocol(self.settings.http_header_timeout, self.settings.http_max_header_size),
            timeout_keep_alive=self.settings.http_keepalive_timeout,  # type: ignore[arg-type]
            loop="none",
            server_header=False,
        )
        sock = bind(host or self.settings.host, port)
        server = _Uvicorn(config)
        config.load()
        server.lifespan = config.lifespan_class(config)
        await server.startup(sockets=[sock])
        task = asyncio.create_task(self._run_http(server, sock))
        return server, task, sock.getsockname()[1]

    @staticmethod
    async def _run_http(server: _Uvicorn, sock: socket.socket) -> None:
        await server.main_loop()
        await server.shutdown(sockets=[sock])

    def _new_management_key(self) -> ManagementKey | None:
        """The management key (written to its file), which both the management REST API and
        TorchServe's gRPC management service require (None when their token authorization is
        off), and the repository extension's load and unload too (``repository_token_auth``)."""
        settings = self.settings
        if settings.management_token_auth or settings.repository_token_auth:
            self._management_key = ManagementKey(settings.management_key_file)
            self._management_key.write()
        if settings.repository_token_auth:
            self.dataplane.repository_key = self._management_key
        return self._management_key if settings.management_token_auth else None

    async def _start_management(self) -> None:
        """The management API on its own port, guarded by a key unless token auth is off."""
        settings = self.settings
        if not settings.management_token_auth and settings.management_host not in (
            "127.0.0.1",
            "localhost",
            "::1",
        ):
            logger.warning(
                "The management API listens on %s without token authorization: anyone who reaches "
                "it can register and run code",
                settings.management_host,
            )
        assert self.management is not None
        key = self._management_key if settings.management_token_auth else None
        app = create_management_app(self.management, key)
        served = await self._serve_http(app, settings.management_port, settings.management_host)
        self._management_http, self._management_task, self.management_port = served
        logger.info(
            "Management API listening on http://%s:%d", settings.management_host, self.management_port
        )

    def _models(self) -> list[MLModel]:
        return [entry.model for entry in self.registry.entries() if entry.model is not None]

    def endpoints(self) -> str:
        """``http=HOST:PORT`` (and ``grpc=``, ``metrics=`` when served), space-separated."""
        endpoints = f"http={self.settings.host}:{self.http_port}"
        if self.grpc_port is not None:
            endpoints += f" grpc={self.settings.host}:{self.grpc_port}"
        if self._grpc is not None and self._grpc.management_port is not None:
            endpoints += f" grpc_management={self.settings.host}:{self._grpc.management_port}"
        if self.metrics_port is not None:
            endpoints += f" metrics={self.settings.host}:{self.metrics_port}"
        if self.management_port is not None:
            endpoints += f" management={self.settings.management_host}:{self.management_port}"
        return endpoints

    def request_stop(self) -> None:
        if self._stopping.is_set():
            self._hurry.set()  # a second signal cuts drain_delay short
        self._stopping.set()

    async def wait(self) -> None:
        await self._stopping.wait()

    async def stop(self) -> None:
        """Stop accepting, drain in-flight requests and streams (REST and gRPC at once), unload models."""
        self.dataplane.draining = True  # readiness says no first, while connections are still taken
        if self.poll is not None:
            await self.poll.stop()
        if self._grpc is not None:
            await self._grpc.health.refresh()
        await self.registry.hand_over()  # sequences in a shared store go on at other replicas now
        spent = await self._drain_window()
        grace = self.settings.shutdown_grace_period
        # one end of the grace period (what the window left of it): streams end in band, unary
        # requests still running get 503
        self.dataplane.streams.cut_after(grace - spent)
        forget_unary = self.dataplane.streams.on_cut(functools.partial(self._cut, grace))
        draining: list[Awaitable[None]] = []
        if self._grpc is not None:
            draining.append(self._grpc.stop(grace + CUT_MARGIN))
        if self._http is not None and self._http_task is not None:
            self._http.should_exit = True
            draining.append(self._http_task)
        if self._management_http is not None and self._management_task is not None:
            self._management_http.should_exit = True
            draining.append(self._management_task)
        await asyncio.gather(*draining)
        if self.management is not None:
            await self.management.close()
        if self._management_key is not None:
            self._management_key.remove()
        forget_unary()
        await self._wait_streams()
        await self.registry.unload_all()
        if self._watchdog is not None:
            self._watchdog.stop()
        if self._metrics is not None and self._metrics_task is not None:  # scrapable until the end
            self._metrics.should_exit = True
            await self._metrics_task
        self.observability.stop()
        logger.info("Server stopped")

    async def _drain_window(self) -> float:
        """Keep the listeners open while readiness says no, so that load balancers see the server
        leave before its connections are refused (Triton's drain): for ``drain_delay``, then on
        while requests or streams are in flight, at most for the grace period (new inference is
        refused with 503 meanwhile). Return the seconds spent past ``drain_delay``: they count
        against the grace period."""
        if not self.dataplane.started:
            return 0.0
        loop = asyncio.get_running_loop()
        start = loop.time()
        delay = start + self.settings.drain_delay
        limit = delay + self.settings.shutdown_grace_period
        if self.settings.drain_delay:
            logger.info("Not ready; closing the listeners in %gs", self.settings.drain_delay)
        told = False
        while not self._hurry.is_set():
            now = loop.time()
            busy = self.dataplane.in_flight()
            if now >= limit or (now >= delay and not busy):
                break
            if now >= delay and not told:
                told = True
                logger.info(
                    "Not ready; %d request(s) or stream(s) in flight: the listeners stay open until "
                    "they end (at most %gs)",
                    busy,
                    limit - now,
                )
            wait = delay - now if now < delay else min(DRAIN_POLL, limit - now)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._hurry.wait(), wait)
        return max(0.0, loop.time() - delay)

    def _cut(self, grace: float) -> None:
        cut = self.dataplane.cut_unary()
        if cut:
            logger.warning("%d request(s) still running after the grace period of %gs: cancelled", cut, grace)

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
    for warning in settings.unknown_keys:
        logger.warning("%s", warning)
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
    because = server.dataplane.not_ready_because()
    if because is not None:  # listening, but readiness says no (strict readiness)
        logger.warning("Serving, but not ready: %s", because)
    await server.wait()
    logger.info("Shutting down")
    await server.stop()
