"""Operating the server: Prometheus metrics, the access log, structured logs and traces.

Everything here observes and never decides. The core calls it at a few places only: the
DataPlane's ``infer`` and stream paths (:class:`~.observer.Observer`), the transports' entry
(:mod:`.access`: a REST wrapper; :mod:`.grpc_access`: a gRPC interceptor) and each scheduler's
model call (:class:`~.stats.ExecutionStats`, and the batch's spans). See ``docs/metrics.md``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from runtime.core.observer import Observer
from runtime.telemetry.counts import Recorder
from runtime.telemetry.tracing import Tracing, activate, from_settings

if TYPE_CHECKING:
    import grpc

    from runtime.core.dataplane import DataPlane
    from runtime.settings import Settings


logger = logging.getLogger(__name__)

REFRESH_WAIT = 2.0
"""Seconds a scrape waits for the counts kept in worker processes."""


class Observability:
    """What one server observes, set up from its settings."""

    def __init__(self, settings: Settings, dataplane: DataPlane, tracer_provider: Any = None) -> None:
        self.settings = settings
        self.recorder = Recorder() if settings.metrics_enabled else None
        self.tracing: Tracing | None = from_settings(settings, tracer_provider)
        self.access_log = settings.access_log
        if self.recorder is not None or self.tracing is not None:
            dataplane.observer = Observer(dataplane.registry, self.recorder, self.tracing)
        self.metrics_app: Any = None
        if self.recorder is not None:
            assert settings.metrics_endpoint
            self.metrics_app = _first_scrape_builds(self.recorder, dataplane, settings.metrics_endpoint)

    @property
    def watching_requests(self) -> bool:
        return self.recorder is not None or self.access_log or self.tracing is not None

    def wrap_rest(self, app: Any) -> Any:
        """The REST app, wrapped when requests are counted, logged or traced."""
        if not self.watching_requests:
            return app
        from runtime.frontends.telemetry.access import ObservedApp, route_counter

        recorder = self.recorder
        if recorder is not None and self.counting_only:
            count_requests = getattr(app, "count_requests", None)
            if count_requests is not None:  # the app counts its hot path itself: no wrapper there
                count_requests(
                    route_counter(recorder), lambda inner: ObservedApp(inner, recorder, False, None)
                )
                return app
        return ObservedApp(app, recorder, self.access_log, self.tracing)

    @property
    def counting_only(self) -> bool:
        """Whether the metrics alone watch requests (no access log, no traces)."""
        return self.recorder is not None and not self.access_log and self.tracing is None

    def grpc_interceptors(self) -> list[grpc.aio.ServerInterceptor]:
        """The gRPC server's interceptor, when the access log or tracing read every call."""
        if not self.watching_requests or self.counting_only:
            return []
        from runtime.frontends.telemetry.grpc_access import ObservedGrpc

        return [ObservedGrpc(self.recorder, self.access_log, self.tracing)]

    def grpc_registration(self, server: grpc.aio.Server) -> Any:
        """What registers the gRPC server's method handlers: the server itself, or, when the
        metrics alone watch calls, a registration that observes each handler once (no interceptor)."""
        if not self.counting_only:
            return server
        from runtime.frontends.telemetry.grpc_access import ObservedGrpc, ObservedRegistration

        return ObservedRegistration(server, ObservedGrpc(self.recorder, False, None))

    def start(self) -> None:
        activate(self.tracing)

    def stop(self) -> None:
        if self.tracing is not None:
            activate(None)
            self.tracing.shutdown()


def _first_scrape_builds(recorder: Recorder, dataplane: DataPlane, path: str) -> Any:
    """The metrics port's ASGI app. prometheus-client (``.metrics``) is imported, and the collector
    and its registry built, by the first request to the port, not at start: a server nobody scrapes
    neither loads it nor holds it (some 25 ms of start-up and 4 MiB)."""
    app: Any = None

    async def metrics(scope: dict[str, Any], receive: Any, send: Any) -> None:
        nonlocal app
        if scope["type"] != "http":
            return
        if app is None:
            from runtime.frontends.telemetry.metrics import ServerCollector, metrics_app, new_registry

            app = metrics_app(new_registry(ServerCollector(recorder, dataplane.registry)), path)
        for entry in dataplane.registry.entries():  # counts kept in worker processes, read now
            if entry.scheduler is not None:
                try:
                    await asyncio.wait_for(entry.scheduler.refresh(), REFRESH_WAIT)
                except Exception:  # a worker that does not answer: its last counts are shown
                    logger.warning(
                        "Model %r: its workers' counts could not be read", entry.name, exc_info=True
                    )
        await app(scope, receive, send)

    return metrics


__all__ = ["Observability", "Observer", "Recorder", "Tracing"]
