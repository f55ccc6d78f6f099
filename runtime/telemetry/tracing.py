"""OpenTelemetry traces (the optional ``tracing`` extra), imported only when tracing is configured.

Spans: one per REST request or gRPC call (SERVER, the W3C ``traceparent`` it carries is its
parent), one per inference request in the DataPlane (``infer <model>``); and, whatever the
scheduling strategy, at the one place it calls the model (:func:`batch_span`): a ``queue`` span per
request (from its arrival to the start of the model call that serves it, child of the request's
span), one ``batch`` span per model call (a direct call, an adaptive batch, a sequence batch, a
continuous batching step), linked to the span of every request in it, and the ``predict`` span of
the model call as its child. A stream served by one call of the model's ``predict_stream`` (direct
scheduling, or a streaming model under adaptive batching) gets the same spans around the whole
call (:func:`direct_stream`). Exported by OTLP to ``tracing_server`` or where the standard
``OTEL_*`` variables say.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import operator
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from runtime.settings import Settings

logger = logging.getLogger(__name__)

T = TypeVar("T")

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
    """The OTLP span exporter.

    ``tracing_server`` is read as MLServer reads it: the address of a collector's OTLP/gRPC
    receiver (``collector:4317``, ``http://collector:4317``; plaintext unless ``https://``), so an
    MLServer settings.json traces unchanged; ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` (or
    ``OTEL_EXPORTER_OTLP_PROTOCOL``) ``http/protobuf`` makes it an OTLP/HTTP address instead
    (``/v1/traces`` is added). Without ``tracing_server`` the exporter reads the ``OTEL_*``
    variables, over HTTP unless the protocol says ``grpc`` (the SDK's default protocol).
    """
    server = settings.tracing_server
    protocol = os.environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "")
    ).strip()
    use_http = protocol.startswith("http") if protocol else server is None
    if use_http:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        if server is None:
            return OTLPSpanExporter()
        if "://" not in server:
            server = "http://" + server
        endpoint = server if server.rstrip("/").endswith("/v1/traces") else server.rstrip("/") + "/v1/traces"
        return OTLPSpanExporter(endpoint=endpoint)
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

    if server is None:
        return GrpcExporter()
    return GrpcExporter(endpoint=server, insecure=not server.startswith("https://"))


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

    def _open(
        self,
        model: str,
        batch_id: int,
        callers: Sequence[Any],
        arrival: Callable[[Any], float | None],
    ) -> tuple[Any, Any]:
        """Each request's ``queue`` span (ended now), and the ``batch`` and ``predict`` spans of the
        model call starting now (to be ended by the caller); see :meth:`batch`."""
        trace = self._trace
        now_ns, now = time.time_ns(), time.monotonic()
        links = []
        for caller in callers:
            parent = caller.context.run(trace.get_current_span)
            if not parent.get_span_context().is_valid:
                continue
            links.append(trace.Link(parent.get_span_context()))
            since = arrival(caller)
            if since is None:
                continue
            queued = self.tracer.start_span(
                "queue",
                context=trace.set_span_in_context(parent),
                start_time=now_ns - int(max(0.0, now - since) * 1e9),
                attributes={"model.name": model, "batch.id": batch_id},
            )
            queued.end(end_time=now_ns)
        attributes = {"model.name": model, "batch.id": batch_id, "batch.size": len(callers)}
        batch = self.tracer.start_span(
            "batch", context=self._context.Context(), links=links, attributes=attributes
        )
        predict = self.tracer.start_span(
            "predict", context=trace.set_span_in_context(batch), attributes={"model.name": model}
        )
        return batch, predict

    @contextlib.contextmanager
    def batch(
        self,
        model: str,
        batch_id: int,
        callers: Sequence[Any],
        arrival: Callable[[Any], float | None],
    ) -> Iterator[None]:
        """Spans of one model call: each request's ``queue`` span, the ``batch`` span linking the
        requests, and the model call's ``predict`` span. ``callers`` carry the ``context`` they were
        queued in; ``arrival(caller)`` is when it was queued (``time.monotonic()``), or None for a
        caller that waits no more (a stream of a continuous batch after its first step)."""
        batch, predict = self._open(model, batch_id, callers, arrival)
        use = self._trace.use_span
        with use(batch, end_on_exit=True), use(predict, end_on_exit=True):
            yield

    async def stream(
        self, model: str, call_id: int, caller: Here, responses: AsyncIterator[T]
    ) -> AsyncIterator[T]:
        """``responses`` (one call of a model's ``predict_stream``) with the spans of that model call
        (see :meth:`batch`) around the whole stream; the ``predict`` span is current while the
        model's generator runs, not while the consumer handles what it yielded."""
        batch, predict = self._open(model, call_id, (caller,), _ARRIVAL)
        current = self._trace.set_span_in_context(predict)
        attach, detach = self._context.attach, self._context.detach
        try:
            async with contextlib.aclosing(responses):  # type: ignore[type-var]
                while True:
                    token = attach(current)
                    try:
                        response = await anext(responses)
                    except StopAsyncIteration:
                        break
                    finally:
                        detach(token)
                    yield response
        except Exception as exc:
            status = self._trace.Status(self._trace.StatusCode.ERROR, f"{type(exc).__name__}: {exc}")
            for span in (predict, batch):
                span.record_exception(exc)
                span.set_status(status)
            raise
        finally:
            predict.end()
            batch.end()


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


_QUIET: AbstractContextManager[None] = contextlib.nullcontext()
_ARRIVAL = operator.attrgetter("arrival")


def batch_span(
    model: str,
    batch_id: int,
    callers: Sequence[Any],
    arrival: Callable[[Any], float | None] = _ARRIVAL,
) -> AbstractContextManager[None]:
    """The spans of one model call when tracing is on (see :meth:`Tracing.batch`); nothing otherwise.

    Every scheduling strategy wraps its one model call in it. ``callers``: the requests (or
    streams) the call serves, each with the ``context`` it was queued in and, by default, its
    ``arrival``."""
    if _active is None:
        return _QUIET
    return _active.batch(model, batch_id, callers, arrival)


def direct_span(model: str, call_id: int, arrival: float) -> AbstractContextManager[None]:
    """:func:`batch_span` for a model call serving the current request alone, which arrived at
    ``arrival`` (``time.monotonic()``); nothing is built when tracing is off."""
    if _active is None:
        return _QUIET
    return _active.batch(model, call_id, (Here(arrival),), _ARRIVAL)


def direct_stream(model: str, call_id: int, responses: AsyncIterator[T]) -> AsyncIterator[T]:
    """``responses``, a model's ``predict_stream`` called for the current stream alone (no batch),
    traced as one model call (``queue``, ``batch`` and ``predict`` spans, as :func:`direct_span`)
    when tracing is on; ``responses`` itself otherwise."""
    if _active is None:
        return responses
    return _active.stream(model, call_id, Here(time.monotonic()), responses)


class Here:
    """A caller that did not queue (a direct call): the current context, arrived at ``arrival``."""

    __slots__ = ("arrival", "context")

    def __init__(self, arrival: float) -> None:
        self.arrival = arrival
        self.context = contextvars.copy_context()
