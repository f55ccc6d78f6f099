"""OpenTelemetry traces (the optional ``tracing`` extra), imported only when tracing is configured.

Spans: one per REST request or gRPC call (SERVER, the W3C ``traceparent`` it carries is its
parent), one per inference request in the DataPlane (``infer <model>``); under adaptive batching a
``queue`` span per request (from its arrival to its batch's start, child of the request's span)
and one ``batch`` span per batch, linked to the span of every request in it, with the ``predict``
span of the model call as its child. Exported by OTLP to ``tracing_server`` or where the standard
``OTEL_*`` variables say.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator, Sequence
from typing import Any

from ..settings import Settings

logger = logging.getLogger(__name__)

_active: Tracing | None = None
"""The tracing of the server running in this process (schedulers read it for batch spans)."""


def wanted(settings: Settings) -> bool:
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return bool(
        settings.tracing_server
        or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def exporter(settings: Settings) -> Any:
    """The OTLP span exporter: HTTP for an ``http(s)://`` address (unless OTEL_EXPORTER_OTLP_PROTOCOL
    says grpc), gRPC otherwise; with no ``tracing_server``, the exporter reads the OTEL_* variables."""
    server = settings.tracing_server
    protocol = os.environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "")
    )
    use_http = protocol.startswith("http") or (not protocol and bool(server) and "://" in (server or ""))
    if server is None and not protocol:
        use_http = True  # the SDK's default protocol is http/protobuf
    if use_http:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        if server is None:
            return OTLPSpanExporter()
        endpoint = server if server.rstrip("/").endswith("/v1/traces") else server.rstrip("/") + "/v1/traces"
        return OTLPSpanExporter(endpoint=endpoint)
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

    return GrpcExporter(endpoint=server) if server else GrpcExporter()


def from_settings(settings: Settings, provider: Any = None) -> Tracing | None:
    """The server's tracing, or None when it is not configured (OpenTelemetry is then not imported).

    ``provider``: a TracerProvider to use instead of one exporting by OTLP (tests give one with the
    SDK's in-memory exporter)."""
    if provider is None:
        if not wanted(settings):
            return None
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError:
            logger.error(
                "Tracing is configured but OpenTelemetry is not installed: pip install 'mlserver-like[tracing]'"
            )
            return None
        resource = Resource.create(
            {"service.name": os.environ.get("OTEL_SERVICE_NAME", settings.server_name)}
        )
        provider = TracerProvider(resource=resource)
        provider.add_span_processor(BatchSpanProcessor(exporter(settings)))
    return Tracing(provider)


def activate(tracing: Tracing | None) -> None:
    global _active
    _active = tracing


class Tracing:
    """Starts the server's spans on one TracerProvider."""

    def __init__(self, provider: Any) -> None:
        from opentelemetry import context, trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = provider
        self.tracer = provider.get_tracer("runtime")
        self._trace = trace
        self._context = context
        self._propagator = TraceContextTextMapPropagator()

    def shutdown(self) -> None:
        shutdown = getattr(self.provider, "shutdown", None)
        if shutdown is not None:
            shutdown()

    def server_span(self, name: str, carrier: dict[str, str], attributes: dict[str, Any]) -> _Span:
        """The span of a request as it enters a transport; its parent is the carrier's traceparent."""
        parent = self._propagator.extract(carrier)
        span = self.tracer.start_span(
            name, context=parent, kind=self._trace.SpanKind.SERVER, attributes=attributes
        )
        return _Span(self, span)

    def infer_span(self, model: str, version: str | None) -> _Span:
        attributes = {"model.name": model, "model.version": version or ""}
        return _Span(self, self.tracer.start_span(f"infer {model}", attributes=attributes))

    @contextlib.contextmanager
    def batch(self, model: str, batch_id: int, callers: Sequence[Any]) -> Iterator[None]:
        """Spans of one batch: each request's ``queue`` span, the ``batch`` span linking the requests,
        and the model call's ``predict`` span. ``callers`` carry the ``context`` they were queued in."""
        trace = self._trace
        now_ns, now = time.time_ns(), time.monotonic()
        links = []
        for caller in callers:
            parent = caller.context.run(trace.get_current_span)
            if not parent.get_span_context().is_valid:
                continue
            links.append(trace.Link(parent.get_span_context()))
            queued = self.tracer.start_span(
                "queue",
                context=trace.set_span_in_context(parent),
                start_time=now_ns - int((now - caller.arrival) * 1e9),
                attributes={"model.name": model, "batch.id": batch_id},
            )
            queued.end(end_time=now_ns)
        attributes = {"model.name": model, "batch.id": batch_id, "batch.size": len(callers)}
        with (
            self.tracer.start_as_current_span(
                "batch", context=self._context.Context(), links=links, attributes=attributes
            ),
            self.tracer.start_as_current_span("predict", attributes={"model.name": model}),
        ):
            yield


class _Span:
    """A span made current until it ends (in the task that started it)."""

    __slots__ = ("_token", "_tracing", "span")

    def __init__(self, tracing: Tracing, span: Any) -> None:
        self._tracing = tracing
        self.span = span
        self._token = tracing._context.attach(tracing._trace.set_span_in_context(span))

    @property
    def trace_id(self) -> str | None:
        context = self.span.get_span_context()
        return f"{context.trace_id:032x}" if context.is_valid else None

    def fail(self, exc: BaseException) -> None:
        self.span.record_exception(exc)
        self.span.set_status(self._tracing._trace.Status(self._tracing._trace.StatusCode.ERROR, str(exc)))

    def finish(self, route: str, status: int | str, error: bool) -> None:
        self.span.update_name(route)
        self.span.set_attribute("status", status)
        if error:
            self.span.set_status(self._tracing._trace.Status(self._tracing._trace.StatusCode.ERROR))
        self.end()

    def end(self) -> None:
        try:
            self._tracing._context.detach(self._token)
        finally:
            self.span.end()


@contextlib.contextmanager
def batch_span(model: str, batch_id: int, callers: Sequence[Any]) -> Iterator[None]:
    """The batch's spans when tracing is on; nothing otherwise."""
    if _active is None:
        yield
        return
    with _active.batch(model, batch_id, callers):
        yield
