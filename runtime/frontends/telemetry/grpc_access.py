"""gRPC's entry: per-call counts, the access log and the call's span.

One gRPC interceptor (:class:`ObservedGrpc`), or, when the metrics alone watch calls, each
method's handler observed once as it is registered (:class:`ObservedRegistration`); each sees
every call once, from arrival to the end of its response (a stream's end, for ModelStreamInfer).
They observe only: statuses, bodies and errors are the transport's own. The log line and the
trace id are the access log's (:mod:`.access`), shared with REST.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf.message import Message

from runtime.frontends.telemetry.access import REQUEST_ID, log_access, trace_id_of
from runtime.ids import new_id
from runtime.telemetry.counts import MethodCounters, Recorder

if TYPE_CHECKING:
    from runtime.telemetry.tracing import Tracing


class ObservedGrpc(grpc.aio.ServerInterceptor):  # type: ignore[misc]  # grpc has no type stubs
    """Counts every gRPC call by service, method and status code, logs it, traces it.

    As the server's interceptor when the access log or tracing read each call's metadata; when
    the metrics alone watch calls, each method's handler is observed once, as it is registered
    (:class:`ObservedRegistration`), and no interceptor runs: grpc.aio runs an interceptor
    through a chain of coroutines on every call, which costs more than the counting.
    """

    def __init__(self, recorder: Recorder | None, access_log: bool, tracing: Tracing | None) -> None:
        self.recorder = recorder
        self.access_log = access_log
        self.tracing = tracing

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None:
            return handler
        metadata = {k: v for k, v in (details.invocation_metadata or ()) if isinstance(v, str)}
        return self.observed(handler, details.method, metadata)

    def observed(
        self, handler: grpc.RpcMethodHandler, full: str, metadata: dict[str, str] | None = None
    ) -> grpc.RpcMethodHandler:
        """``handler`` of the method ``full`` (``/package.Service/Method``), observed: counted, and
        logged and traced where those are on (``metadata``: the call's, which they read)."""
        service, _, method = full.lstrip("/").rpartition("/")
        if handler.unary_unary is not None:
            kind, behaviour = "unary", handler.unary_unary
        elif handler.stream_stream is not None:
            kind, behaviour = "bidi_stream", handler.stream_stream
        else:  # unary-stream (Health.Watch) and stream-unary calls pass unobserved
            return handler
        counters = self.recorder.grpc_method(kind, service, method) if self.recorder is not None else None
        call = _Call(kind, service, method, full, metadata or {}, counters)
        observe, begin, end = self._observe, self._begin, self._end

        if inspect.isasyncgenfunction(behaviour):  # a handler that yields its responses (reflection)

            async def observed_stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                start = begin(call, traced=False)
                code: Any = grpc.StatusCode.OK
                try:
                    async for response in behaviour(request, context):
                        yield response
                    code = context.code() or grpc.StatusCode.OK
                except BaseException as exc:
                    code = context.code() or _failure(exc)
                    raise
                finally:
                    end(call, start, None, code, request, None)

            observed: Any = observed_stream
        elif counters is not None and not self.access_log and self.tracing is None:
            ok = grpc.StatusCode.OK
            clock = time.perf_counter

            async def counted(
                request: Any, context: grpc.aio.ServicerContext
            ) -> Any:  # one frame, counts only
                counters.started += 1
                start = clock()
                code: Any = ok
                try:
                    response = await behaviour(request, context)
                    code = context.code() or ok
                    return response
                except BaseException as exc:
                    code = context.code() or _failure(exc)
                    raise
                finally:
                    counters.done(_status_name(code), clock() - start)

            observed = counted
        else:

            async def observed_call(request: Any, context: grpc.aio.ServicerContext) -> Any:
                return await observe(behaviour, request, context, call)

            observed = observed_call

        make = (
            grpc.unary_unary_rpc_method_handler if kind == "unary" else grpc.stream_stream_rpc_method_handler
        )
        return make(
            observed,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def _begin(self, call: _Call, traced: bool = True) -> tuple[float, Any]:
        if call.counters is not None:
            call.counters.started += 1
        span = None
        if traced and self.tracing is not None:
            span = self.tracing.server_span(
                call.full.lstrip("/"),
                call.metadata,
                {"rpc.system": "grpc", "rpc.service": call.service, "rpc.method": call.method},
            )
        return time.perf_counter(), span

    def _end(
        self, call: _Call, start: tuple[float, Any], span: Any, code: Any, request: Any, response: Any
    ) -> None:
        status = _status(code)
        seconds = time.perf_counter() - start[0]
        span = span or start[1]
        if span is not None:
            span.finish(
                route=call.full.lstrip("/"), status=status.name, error=status is not grpc.StatusCode.OK
            )
        if call.counters is not None:
            call.counters.done(status.name, seconds)
        if self.access_log:
            self._log(request, response, call.metadata, call.full, status, seconds, span)

    async def _observe(
        self, behaviour: Any, request: Any, context: grpc.aio.ServicerContext, call: _Call
    ) -> Any:
        start = self._begin(call)
        code: Any = grpc.StatusCode.OK
        response = None
        read = None
        if self.access_log and call.kind == "bidi_stream":
            # the stream's log line names what its messages asked for (they are read from the context)
            context = read = _ReadRecorder(context)
        try:
            response = await behaviour(request, context)
            code = context.code() or grpc.StatusCode.OK
            return response
        except BaseException as exc:
            code = context.code() or _failure(exc)
            raise
        finally:
            self._end(call, start, None, code, request, read or response)

    def _log(
        self,
        request: Any,
        response: Any,
        metadata: dict[str, str],
        full: str,
        code: grpc.StatusCode,
        seconds: float,
        span: Any,
    ) -> None:
        if isinstance(response, _ReadRecorder):  # a stream: what its requests named
            model, version, first = response.named()
            request_id = metadata.get(REQUEST_ID) or first or new_id()
            trace_id = span.trace_id if span is not None else trace_id_of(metadata.get("traceparent"))
            log_access(
                "grpc", full, model, version, code.name, seconds, request_id, response.sequence_id, trace_id
            )
            return
        if not isinstance(request, Message):  # bytes that did not parse name nothing
            request = None
        model = getattr(request, "model_name", None) or getattr(request, "name", None) or None
        version = getattr(request, "model_version", None) or getattr(request, "version", None) or None
        request_id = metadata.get(REQUEST_ID) or getattr(request, "id", None) or new_id()
        sequence_id = _sequence_id(response) or _sequence_id(request)
        trace_id = span.trace_id if span is not None else trace_id_of(metadata.get("traceparent"))
        log_access("grpc", full, model, version, code.name, seconds, request_id, sequence_id, trace_id)


class _ReadRecorder:
    """A stream's servicer context that notes the model, version, id and sequence id of each message
    read (for the stream's access log line); everything else is the context's own."""

    __slots__ = ("_context", "first_id", "models", "sequence_id")

    def __init__(self, context: grpc.aio.ServicerContext) -> None:
        self._context = context
        self.models: dict[tuple[str, str], None] = {}
        self.first_id: str | None = None
        self.sequence_id: str | None = None

    async def read(self) -> Any:
        message = await self._context.read()
        if isinstance(message, Message):  # not EOF, nor bytes that did not parse
            model = getattr(message, "model_name", "")
            if model:
                self.models[model, getattr(message, "model_version", "")] = None
            if self.first_id is None:
                self.first_id = getattr(message, "id", None) or None
            if self.sequence_id is None:
                self.sequence_id = _sequence_id(message)
        return message

    def named(self) -> tuple[str | None, str | None, str | None]:
        """The models the stream's requests named (comma-separated when several), their version
        (when one model), and the first request's id."""
        if not self.models:
            return None, None, self.first_id
        names = list(dict.fromkeys(name for name, _ in self.models))
        versions = {version for _, version in self.models}
        version = versions.pop() if len(names) == 1 and len(versions) == 1 else ""
        return ",".join(names), version or None, self.first_id

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


def _sequence_id(message: Any) -> str | None:
    parameters = getattr(message, "parameters", None)
    if parameters is not None and "sequence_id" in parameters:
        param = parameters["sequence_id"]
        return str(getattr(param, param.WhichOneof("parameter_choice")))
    return None


class _Call:
    """What names one gRPC method, for its counts and log lines."""

    __slots__ = ("counters", "full", "kind", "metadata", "method", "service")

    def __init__(
        self,
        kind: str,
        service: str,
        method: str,
        full: str,
        metadata: dict[str, str],
        counters: MethodCounters | None,
    ) -> None:
        self.kind, self.service, self.method, self.full, self.metadata = kind, service, method, full, metadata
        self.counters = counters


class ObservedRegistration:
    """Registers method handlers on a grpc.aio server as its ``add_generic_rpc_handlers`` and
    ``add_registered_method_handlers`` do, each observed once (see :class:`ObservedGrpc`)."""

    def __init__(self, server: grpc.aio.Server, observer: ObservedGrpc) -> None:
        self.server = server
        self.observer = observer

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self.server.add_generic_rpc_handlers(tuple(_ObservedHandlers(h, self.observer) for h in handlers))

    def add_registered_method_handlers(self, service: str, table: dict[str, grpc.RpcMethodHandler]) -> None:
        observed = {name: self.observer.observed(h, f"/{service}/{name}") for name, h in table.items()}
        self.server.add_registered_method_handlers(service, observed)


class _ObservedHandlers(grpc.GenericRpcHandler):  # type: ignore[misc]  # grpc has no type stubs
    """A generic handler whose method handlers are observed, each made once (by method name and
    the handler it wraps)."""

    def __init__(self, handlers: grpc.GenericRpcHandler, observer: ObservedGrpc) -> None:
        self.handlers = handlers
        self.observer = observer
        self.made: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        handler = self.handlers.service(details)
        if handler is None:
            return None
        made = self.made.get(details.method)
        if made is not None and made[0] is handler:
            return made[1]
        observed = self.observer.observed(handler, details.method)
        if len(self.made) < 1024:  # method names come from clients: a bounded set is kept
            self.made[details.method] = (handler, observed)
        return observed


def _failure(exc: BaseException) -> grpc.StatusCode:
    return grpc.StatusCode.CANCELLED if isinstance(exc, asyncio.CancelledError) else grpc.StatusCode.UNKNOWN


def _status_name(code: Any) -> str:
    """``_status(code).name``, read as the member's attribute: an enum's ``name`` is a property,
    which costs two Python calls on every call counted."""
    name: str = (code if type(code) is grpc.StatusCode else _status(code))._name_
    return name


def _status(code: Any) -> grpc.StatusCode:
    if isinstance(code, grpc.StatusCode):
        return code
    for status in grpc.StatusCode:  # grpc.aio may give the code as its integer value
        if status.value[0] == code:
            return status
    return grpc.StatusCode.UNKNOWN
