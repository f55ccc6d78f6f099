"""ModelStreamInfer: many requests and responses on one bidirectional stream, in two wire formats.

Both formats feed requests through ``DataPlane.infer_stream``, tag every response with the id of
the request it answers, report an error for one request in-band and keep the stream open, and,
when the client half-closes, send every response still owed before ending the call.

``mlserver`` (the default): consecutive requests for one model share one model stream, as in
MLServer (a stream-to-stream model sees them all); a request naming another model starts a new
model stream after the current one has answered. Responses are ModelInferResponse messages, raw
when the request they answer was raw. An error is answered by a ModelInferResponse carrying the
id of the request it belongs to, no outputs, and the parameters ``error`` (the message) and
``error_code`` (the gRPC status name). A failure of the model ends the model stream it happened
in, and the next request starts a fresh one; a scheduler that fails requests one by one (the
sequence batcher, which reads ahead) reports each for its own request and its stream goes on. (MLServer ends the whole call instead; the protocol's
ModelInferResponse has no error field, so these two parameters are the in-band form.)

``triton``: Triton's ModelStreamInferResponse, as tritonclient's start_stream/async_stream_infer
read it. Each request is served on its own, concurrently with the others of the stream (at most
``STREAM_IN_FLIGHT`` at a time; beyond that the server stops reading, and gRPC's flow control
holds the client back). Errors travel in ``error_message`` with ``infer_response.id`` set to the
failed request's id. Every response carries the parameter ``triton_final_response``: with the
request parameter ``triton_enable_empty_final_response=true`` each response leaves as soon as it
exists with ``false`` and an empty response with ``true`` ends the request (Triton's decoupled
convention); without it, the last response of the request carries ``true``, which costs a
streaming model one response of look-ahead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, TypeVar

import grpc

from ..dataplane import DataPlane
from ..errors import ServerError
from ..streaming import RECENT_REQUESTS, StreamError
from ..types import InferenceRequest, InferenceResponse
from .converters import request_from_proto, response_to_proto
from .errors import code_of
from .generated import dataplane_pb2 as pb

logger = logging.getLogger(__name__)

T = TypeVar("T")

STREAM_IN_FLIGHT = 64
"""Most requests of one Triton-format stream served at the same time."""

FINAL = "triton_final_response"
EMPTY_FINAL = "triton_enable_empty_final_response"


class _Reader:
    """The requests of a call, read one at a time; None once the client has half-closed."""

    def __init__(self, context: grpc.aio.ServicerContext) -> None:
        self._context = context
        self._ended = False

    async def read(self) -> pb.ModelInferRequest | None:
        if self._ended:
            return None
        message = await self._context.read()
        if message is grpc.aio.EOF:
            self._ended = True
            return None
        return message


@contextlib.asynccontextmanager
async def _closing(stream: AsyncIterator[T]) -> AsyncIterator[AsyncIterator[T]]:
    """Close an async generator when leaving the block, however it is left."""
    try:
        yield stream
    finally:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()


def _failure(exc: Exception) -> tuple[grpc.StatusCode, str]:
    if isinstance(exc, ServerError):
        return code_of(exc), exc.message
    logger.error("Unexpected error in a stream: %s: %s", type(exc).__name__, exc, exc_info=exc)
    return grpc.StatusCode.INTERNAL, f"Internal server error: {type(exc).__name__}: {exc}"


# ---------------------------------------------------------------------- MLServer's format


class _Segment:
    """Consecutive requests of a call that name one model, fed to one model stream."""

    def __init__(self, reader: _Reader, first: pb.ModelInferRequest) -> None:
        self.reader = reader
        self.first = first
        self.current = first
        self.raw = bool(first.raw_input_contents)
        self.next: pb.ModelInferRequest | None = None
        self._raw_of: OrderedDict[str, bool] = OrderedDict()

    def _take(self, message: pb.ModelInferRequest) -> InferenceRequest:
        request = request_from_proto(message)
        if request.id is None:  # named now, so that its answer finds its raw/typed form
            request.id = str(uuid.uuid4())
        self.current = message
        self.raw = bool(message.raw_input_contents)
        self._raw_of[request.id] = self.raw
        if len(self._raw_of) > RECENT_REQUESTS:
            self._raw_of.popitem(last=False)
        return request

    def raw_for(self, response: InferenceResponse) -> bool:
        """Whether ``response`` answers a raw request (a scheduler may read ahead of its answers)."""
        return self._raw_of.get(response.id, self.raw) if response.id is not None else self.raw

    async def requests(self) -> AsyncGenerator[InferenceRequest, None]:
        first = self.first
        name, version = first.model_name, first.model_version
        yield self._take(first)
        while True:
            message = await self.reader.read()
            if message is None:
                return
            if message.model_name != name or message.model_version != version:
                self.next = message
                return
            yield self._take(message)


def _mlserver_error(
    request: pb.ModelInferRequest, exc: Exception, request_id: str | None = None
) -> pb.ModelInferResponse:
    code, message = _failure(exc)
    response = pb.ModelInferResponse(
        model_name=request.model_name,
        model_version=request.model_version,
        id=request.id if request_id is None else request_id,
    )
    response.parameters["error"].string_param = message
    response.parameters["error_code"].string_param = code.name
    return response


async def serve_mlserver_stream(dataplane: DataPlane, context: grpc.aio.ServicerContext) -> None:
    reader = _Reader(context)
    first = await reader.read()
    while first is not None:
        segment = _Segment(reader, first)
        name, version = first.model_name, first.model_version or None
        requests = segment.requests()
        try:
            async with _closing(dataplane.infer_stream_in_band(requests, name, version)) as items:
                async for item in items:
                    if isinstance(item, StreamError):
                        await context.write(_mlserver_error(segment.first, item.error, item.request_id))
                    else:
                        await context.write(response_to_proto(item, segment.raw_for(item)))
        except Exception as exc:
            await context.write(_mlserver_error(segment.current, exc))
        finally:
            await requests.aclose()
        # the next model stream starts with the request that named another model, or, after an
        # error or a model that stopped reading early, with the next request of the call
        first = segment.next or await reader.read()


# ---------------------------------------------------------------------- Triton's format


class _Writer:
    """Writes of concurrent tasks, one at a time."""

    def __init__(self, context: grpc.aio.ServicerContext) -> None:
        self._context = context
        self._lock = asyncio.Lock()

    async def write(self, message: pb.ModelStreamInferResponse) -> None:
        async with self._lock:
            await self._context.write(message)


def _triton_response(response: InferenceResponse, raw: bool, final: bool) -> pb.ModelStreamInferResponse:
    message = pb.ModelStreamInferResponse()
    response_to_proto(response, raw, into=message.infer_response)
    message.infer_response.parameters[FINAL].bool_param = final
    return message


def _triton_empty(request: pb.ModelInferRequest, error: str = "") -> pb.ModelStreamInferResponse:
    message = pb.ModelStreamInferResponse(error_message=error)
    infer = message.infer_response
    infer.model_name = request.model_name
    infer.model_version = request.model_version
    infer.id = request.id
    infer.parameters[FINAL].bool_param = True
    return message


async def _one(request: InferenceRequest) -> AsyncIterator[InferenceRequest]:
    yield request


def _wants_empty_final(request: InferenceRequest) -> bool:
    extra = request.parameters.model_extra if request.parameters is not None else None
    return bool(extra) and extra.get(EMPTY_FINAL) is True  # type: ignore[union-attr]


async def _serve_triton_request(dataplane: DataPlane, writer: _Writer, message: pb.ModelInferRequest) -> None:
    raw = bool(message.raw_input_contents)
    try:
        request = request_from_proto(message)
        empty_final = _wants_empty_final(request)
        held: InferenceResponse | None = None
        stream = dataplane.infer_stream(_one(request), message.model_name, message.model_version or None)
        async with _closing(stream) as responses:
            async for response in responses:
                if empty_final:
                    await writer.write(_triton_response(response, raw, final=False))
                    continue
                if held is not None:
                    await writer.write(_triton_response(held, raw, final=False))
                held = response
        if held is not None:
            await writer.write(_triton_response(held, raw, final=True))
        else:
            await writer.write(_triton_empty(message))
    except Exception as exc:
        await writer.write(_triton_empty(message, error=_failure(exc)[1]))


async def serve_triton_stream(dataplane: DataPlane, context: grpc.aio.ServicerContext) -> None:
    reader = _Reader(context)
    writer = _Writer(context)
    slots = asyncio.Semaphore(STREAM_IN_FLIGHT)
    tasks: set[asyncio.Task[None]] = set()

    async def serve(message: pb.ModelInferRequest) -> None:
        try:
            await _serve_triton_request(dataplane, writer, message)
        finally:
            slots.release()

    try:
        while (message := await reader.read()) is not None:
            await slots.acquire()
            task = asyncio.create_task(serve(message))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        while tasks:
            await asyncio.gather(*tasks)
    finally:
        pending = [task for task in tasks if not task.done()]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)


def stream_handler(dataplane: DataPlane, stream_format: str) -> Any:
    """The ModelStreamInfer handler of the configured wire format."""
    serve = serve_triton_stream if stream_format == "triton" else serve_mlserver_stream

    async def ModelStreamInfer(request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        await serve(dataplane, context)

    return ModelStreamInfer
