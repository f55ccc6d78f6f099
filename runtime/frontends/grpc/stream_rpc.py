"""ModelStreamInfer: many requests and responses on one bidirectional stream, in two wire formats.

The core serves the stream (``runtime.core.client_streams``); this module only translates. It reads each
message into a ``Routed`` item and writes each ``Reply``: responses in the form of the request
they answer (raw when it was raw), errors in band with the failed request's id. What the stream
guarantees (one model stream per run of requests for one model, or one per request; errors in
band and the stream going on; every response still owed sent after the client half-closes;
cancellation reaching the model) is the core's, and the same in both formats.

``mlserver`` (the default): ``DataPlane.infer_routed``, as in MLServer (a stream-to-stream model
sees the consecutive requests that name it). Responses are ModelInferResponse messages. An error is
a ModelInferResponse carrying the id of the failed request, no outputs, and the parameters
``error`` (the message) and ``error_code`` (the gRPC status name). (MLServer ends the whole call
instead; the protocol's ModelInferResponse has no error field, so these two parameters are the
in-band form.)

``triton``: ``DataPlane.infer_each``: Triton's ModelStreamInferResponse, as tritonclient's
start_stream/async_stream_infer read it; every request is served on its own. Errors travel in
``error_message`` with ``infer_response.id`` set to the failed request's id. Every response carries
the parameter ``triton_final_response``: with the request parameter
``triton_enable_empty_final_response=true`` each response leaves as soon as it exists with
``false`` and an empty response with ``true`` ends the request (Triton's decoupled convention);
without it, the last response of the request carries ``true``, which costs a streaming model one
response of look-ahead.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncGenerator, Callable, Iterator
from contextlib import aclosing
from typing import Any, TypeVar, cast

import grpc

from runtime.core.client_streams import Reply, Routed
from runtime.core.dataplane import DataPlane
from runtime.core.fairness import LoopTurns
from runtime.errors import ServerError, internal_error
from runtime.frontends.grpc.converters import Undecodable, request_from_proto, response_to_proto
from runtime.frontends.grpc.generated import dataplane_pb2 as pb
from runtime.frontends.grpc.status_codes import code_of, trailers_of
from runtime.streams.pipeline import StreamError
from runtime.streams.stream_counter import cut_error
from runtime.types import InferenceResponse

logger = logging.getLogger(__name__)

T = TypeVar("T")

_EMPTY = pb.ModelInferRequest()
"""What a message that does not parse is tagged as (it names nothing, carries nothing)."""

FINAL = "triton_final_response"
EMPTY_FINAL = "triton_enable_empty_final_response"


async def _routed(
    context: grpc.aio.ServicerContext, tag: Callable[[pb.ModelInferRequest], T], turns: LoopTurns
) -> AsyncGenerator[Routed[T], None]:
    """The call's requests, as the core reads them, until the client half-closes."""
    while (message := await context.read()) is not grpc.aio.EOF:
        turns.grpc_call()
        if type(message) is Undecodable:  # answered in band; the stream goes on
            yield Routed("", None, None, message.decode, tag(_EMPTY), error=message.refusal())
            continue
        yield Routed(
            model=message.model_name,
            version=message.model_version or None,
            id=message.id or None,
            decode=functools.partial(request_from_proto, message),
            tag=tag(message),
        )


def in_band_error(reply: Reply[Any], failure: StreamError, triton: bool, final: bool = True) -> Any:
    """The message that reports ``failure`` in band for the request ``reply`` answers, and the
    stream goes on: the one place gRPC's in-band errors are made, for both wire formats.

    MLServer's: a ModelInferResponse with the request's id, no outputs, and the parameters
    ``error`` (the message) and ``error_code`` (the gRPC status name, e.g. INVALID_ARGUMENT).
    Triton's: a ModelStreamInferResponse whose ``error_message`` is the message, its
    ``infer_response`` naming the request and carrying ``triton_final_response`` = ``final``.
    """
    exc = failure.error
    if isinstance(exc, ServerError):
        code, text = code_of(exc), exc.message
    else:
        logger.error("Unexpected error in a stream: %s: %s", type(exc).__name__, exc, exc_info=exc)
        code, text = grpc.StatusCode.INTERNAL, internal_error(exc)
    if triton:
        return _triton_empty(reply, final=final, error=text)
    message = pb.ModelInferResponse(
        model_name=reply.model, model_version=reply.version or "", id=reply.request_id or ""
    )
    message.parameters["error"].string_param = text
    message.parameters["error_code"].string_param = code.name
    return message


# ---------------------------------------------------------------------- MLServer's format


def _is_raw(message: pb.ModelInferRequest) -> bool:
    return bool(message.raw_input_contents)


def _mlserver_message(reply: Reply[bool]) -> pb.ModelInferResponse:
    if reply.response is None:
        assert reply.failure is not None
        return cast(pb.ModelInferResponse, in_band_error(reply, reply.failure, triton=False))
    try:
        return response_to_proto(reply.response, reply.tag)
    except Exception as exc:  # e.g. a parameter gRPC cannot carry: this response fails, the stream goes on
        failure = StreamError(exc, reply.request_id)
        return cast(pb.ModelInferResponse, in_band_error(reply, failure, triton=False))


async def serve_mlserver_stream(dataplane: DataPlane, context: grpc.aio.ServicerContext) -> None:
    async with aclosing(_routed(context, _is_raw, dataplane.turns)) as items:
        async with aclosing(dataplane.infer_routed(items)) as replies:
            async for reply in replies:
                await context.write(_mlserver_message(reply))


# ---------------------------------------------------------------------- Triton's format


class _Request:
    """What the Triton format remembers of one request while it is answered."""

    __slots__ = ("empty_final", "held", "raw")

    def __init__(self, message: pb.ModelInferRequest) -> None:
        self.raw = bool(message.raw_input_contents)
        flag = message.parameters.get(EMPTY_FINAL)
        self.empty_final = flag is not None and flag.bool_param
        self.held: InferenceResponse | None = None
        """The latest response, held back until it is known whether it is the request's last."""


def _triton_response(
    reply: Reply[_Request], response: InferenceResponse, final: bool
) -> pb.ModelStreamInferResponse:
    message = pb.ModelStreamInferResponse()
    try:
        response_to_proto(response, reply.tag.raw, into=message.infer_response)
    except Exception as exc:  # this response fails; the request's final flag still follows
        failure = StreamError(exc, reply.request_id)
        return cast(pb.ModelStreamInferResponse, in_band_error(reply, failure, triton=True, final=final))
    message.infer_response.parameters[FINAL].bool_param = final
    return message


def _triton_empty(reply: Reply[Any], final: bool = True, error: str = "") -> pb.ModelStreamInferResponse:
    message = pb.ModelStreamInferResponse(error_message=error)
    infer = message.infer_response
    infer.model_name = reply.model
    infer.model_version = reply.version or ""
    infer.id = reply.request_id or ""
    infer.parameters[FINAL].bool_param = final
    return message


def _triton_messages(reply: Reply[_Request]) -> Iterator[pb.ModelStreamInferResponse]:
    request = reply.tag
    if reply.response is not None:
        if request.empty_final:
            yield _triton_response(reply, reply.response, final=False)
            return
        if request.held is not None:
            yield _triton_response(reply, request.held, final=False)
        request.held = reply.response
        return
    held, request.held = request.held, None
    if reply.failure is not None:
        if held is not None:
            yield _triton_response(reply, held, final=False)
        yield in_band_error(reply, reply.failure, triton=True)
    elif held is not None:
        yield _triton_response(reply, held, final=True)
    else:
        yield _triton_empty(reply)


async def serve_triton_stream(dataplane: DataPlane, context: grpc.aio.ServicerContext) -> None:
    async with aclosing(_routed(context, _Request, dataplane.turns)) as items:
        async with aclosing(dataplane.infer_each(items)) as replies:
            async for reply in replies:
                for message in _triton_messages(reply):
                    await context.write(message)


def stream_handler(dataplane: DataPlane, stream_format: str) -> Any:
    """The ModelStreamInfer handler of the configured wire format."""
    serve = serve_triton_stream if stream_format == "triton" else serve_mlserver_stream

    async def ModelStreamInfer(request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        task = asyncio.current_task()
        assert task is not None
        cut: list[bool] = []

        def end_now() -> None:  # the grace period is over: the stream ends before gRPC drops it
            cut.append(True)
            task.cancel()

        forget = dataplane.streams.on_cut(end_now)
        try:
            await serve(dataplane, context)
        except asyncio.CancelledError:
            if not cut:
                raise
            task.uncancel()
            logger.warning(
                "A gRPC stream was still running when the grace period ended: it ends with UNAVAILABLE"
            )
            error = cut_error()
            await context.abort(code_of(error), error.message, trailers_of(error))
        finally:
            forget()

    return ModelStreamInfer
