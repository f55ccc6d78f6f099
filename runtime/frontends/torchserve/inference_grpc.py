"""TorchServe's gRPC inference API (``org.pytorch.serve.grpc.inference.InferenceAPIsService``),
served by the same gRPC server as the OIP service: a translator onto :class:`.frontend.FrontEnd`.

- ``Ping``: ``health`` is the text ``/ping`` answers.
- ``Predictions``: ``input`` entries reach the handler as ``data[i][key]`` (bytes, never decoded);
  gRPC metadata does not reach the handler; ``prediction`` is the answer (a streamed answer's
  chunks joined). Errors abort the call with TorchServe's codes (unknown model: INTERNAL "Model
  not found: M"; a handler's status through ``error_body.CODES``).
- ``StreamPredictions``: one message per answer, intermediate ones first.
- ``StreamPredictions2``: a bidirectional stream of requests of one or more sequences; each
  request's answers come back in order, as ``prediction`` only. An error is answered in the stream
  (``status`` code 13 and TorchServe's message; the stream goes on): a request without
  ``sequence_id`` gets "Parameter sequenceId is required.". ``sequence_id`` is the sequence's id
  (header ``ts_request_sequence_id``); the input keys ``ts_request_sequence_start`` /
  ``ts_request_sequence_end`` stay entries and also mark the request's start / end.
  Requests are served one after the other, each once the previous one is answered.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

import grpc
from google.protobuf import any_pb2
from google.rpc import status_pb2

from runtime.core.dataplane import DataPlane
from runtime.core.management import Management
from runtime.core.management_key import ManagementKey
from runtime.errors import InvalidInput, ModelNotFound, ServerError
from runtime.frontends.grpc.generated import ts_inference_pb2 as pb
from runtime.frontends.grpc.status_codes import trailers_of
from runtime.frontends.torchserve.error_body import describe, grpc_code
from runtime.frontends.torchserve.frontend import FrontEnd
from runtime.settings import ModelSettings
from runtime.torchserve.payload import Answer, Entry
from runtime.types import InferenceRequest

SERVICE = "org.pytorch.serve.grpc.inference.InferenceAPIsService"
SEQUENCE_KEYS = ("ts_request_sequence_start", "ts_request_sequence_end")


def error_status(error: ServerError, model: str) -> tuple[grpc.StatusCode, str, tuple[tuple[str, str], ...]]:
    """The code, message and trailing metadata TorchServe aborts a call with (``retry-after`` for
    a "try later" error, as on the OIP services)."""
    status, _, message = describe(error, model)
    if isinstance(error, ModelNotFound):
        return grpc.StatusCode.INTERNAL, message, ()  # as TorchServe answers (observed)
    return grpc_code(status), message, trailers_of(error) if status == 503 else ()


def in_stream_error(error: ServerError | _HandlerStatus, model: str) -> Any:
    """The failure of one request answered inside StreamPredictions2 (the stream goes on): code 13
    with TorchServe's message and an ErrorInfo naming its exception type, as TorchServe does; the
    one place its in-band errors are made. A handler's own error status is its message."""
    from google.rpc import error_details_pb2  # imported by the first such error, not at start-up

    if isinstance(error, _HandlerStatus):
        kind, message = "InternalServerException", error.message
    else:
        _, kind, message = describe(error, model)

    detail = any_pb2.Any()
    detail.Pack(error_details_pb2.ErrorInfo(reason=f"{kind}.()"))
    return pb.PredictionResponse(status=status_pb2.Status(code=13, message=message, details=[detail]))


class InferenceApi:
    """The InferenceAPIsService methods over one DataPlane."""

    def __init__(self, dataplane: DataPlane) -> None:
        self.dataplane = dataplane
        self.front = FrontEnd(dataplane)

    def _request(self, message: Any, settings: ModelSettings) -> InferenceRequest:
        entries = [Entry(key, bytes(value)) for key, value in message.input.items()]
        headers = {
            key: bytes(message.input[key]).decode("utf-8", "replace")
            for key in SEQUENCE_KEYS
            if key in message.input
        }
        sequence_id = message.sequence_id if message.HasField("sequence_id") else None
        return self.front.request(settings, entries, headers, sequence_id or None)

    async def _answers(self, message: Any) -> AsyncIterator[Answer]:
        name, version = message.model_name, message.model_version or None
        settings = self.dataplane.check_model(name, version).settings
        request = self._request(message, settings)
        answers = self.front.answers(request, name, version, settings)
        async with aclosing(answers) as items:
            async for answer, _ in items:
                if answer.status >= 400:
                    raise _HandlerStatus(answer)
                yield answer

    async def Ping(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        healthy = self.dataplane.ready()
        text = json.dumps({"status": "Healthy" if healthy else "Unhealthy"}, indent=2) + "\n"
        return pb.TorchServeHealthResponse(health=text)

    async def Predictions(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        if not request.model_name:
            await context.abort(grpc.StatusCode.INTERNAL, "Parameter model_name is required.")
        try:
            bodies = [answer.body async for answer in self._answers(request)]
        except ServerError as exc:
            await context.abort(*error_status(exc, request.model_name))
        except _HandlerStatus as exc:
            await context.abort(grpc_code(exc.answer.status), exc.message)
        return pb.PredictionResponse(prediction=b"".join(bodies))

    async def StreamPredictions(
        self, request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        if not request.model_name:
            await context.abort(grpc.StatusCode.INTERNAL, "Parameter model_name is required.")
        try:
            async for answer in self._answers(request):
                yield pb.PredictionResponse(prediction=answer.body)
        except ServerError as exc:
            await context.abort(*error_status(exc, request.model_name))
        except _HandlerStatus as exc:
            await context.abort(grpc_code(exc.answer.status), exc.message)

    async def StreamPredictions2(
        self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        async for request in requests:
            if not request.sequence_id:
                yield in_stream_error(InvalidInput("Parameter sequenceId is required."), request.model_name)
                continue
            if not request.model_name:
                yield in_stream_error(InvalidInput("Parameter model_name is required."), request.model_name)
                continue
            try:
                async for answer in self._answers(request):
                    yield pb.PredictionResponse(prediction=answer.body)
            except (ServerError, _HandlerStatus) as exc:
                yield in_stream_error(exc, request.model_name)


class _HandlerStatus(Exception):
    """A handler answered a request with an error status (``set_response_status``)."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.message = answer.body.decode("utf-8", "replace")
        super().__init__(self.message)


def inference_handlers(dataplane: DataPlane) -> dict[str, grpc.RpcMethodHandler]:
    """The InferenceAPIsService method handlers, by method name."""
    api = InferenceApi(dataplane)
    request, response = pb.PredictionsRequest, pb.PredictionResponse
    from google.protobuf import empty_pb2

    return {
        "Ping": grpc.unary_unary_rpc_method_handler(
            api.Ping,
            request_deserializer=empty_pb2.Empty.FromString,
            response_serializer=pb.TorchServeHealthResponse.SerializeToString,
        ),
        "Predictions": grpc.unary_unary_rpc_method_handler(
            api.Predictions,
            request_deserializer=request.FromString,
            response_serializer=response.SerializeToString,
        ),
        "StreamPredictions": grpc.unary_stream_rpc_method_handler(
            api.StreamPredictions,
            request_deserializer=request.FromString,
            response_serializer=response.SerializeToString,
        ),
        "StreamPredictions2": grpc.stream_stream_rpc_method_handler(
            api.StreamPredictions2,
            request_deserializer=request.FromString,
            response_serializer=response.SerializeToString,
        ),
    }


def torchserve_services(
    dataplane: DataPlane, management: Management, management_key: ManagementKey | None = None
) -> dict[str, dict[str, grpc.RpcMethodHandler]]:
    """TorchServe's gRPC services, by full service name, for the server's one gRPC server: the
    management service is ``management``'s operations (the management REST API's) and needs
    ``management_key`` (unless None), as the management REST API does."""
    from runtime.frontends.torchserve.management_grpc import SERVICE as MANAGEMENT
    from runtime.frontends.torchserve.management_grpc import management_handlers

    return {
        SERVICE: inference_handlers(dataplane),
        MANAGEMENT: management_handlers(management, management_key),
    }
