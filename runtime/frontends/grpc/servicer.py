"""The unary RPCs of GRPCInferenceService: translate, call the DataPlane, translate back.

Every core error leaves through the one table in ``errors.py``; anything else is logged and
answered INTERNAL, and the server serves on.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from runtime.core.dataplane import DataPlane
from runtime.errors import InvalidInput, ServerError, internal_error
from runtime.frontends.grpc.converters import (
    headers_of,
    model_metadata_to_proto,
    repository_index_to_proto,
    request_from_proto,
    response_to_proto,
    server_metadata_to_proto,
)
from runtime.frontends.grpc.generated import dataplane_pb2 as pb
from runtime.frontends.grpc.status_codes import code_of, status_message, trailers_of
from runtime.frontends.grpc.wire_codec import response_bytes
from runtime.sequences.identity import apply_headers, response_headers

logger = logging.getLogger(__name__)

Request = TypeVar("Request")
Response = TypeVar("Response")
Handler = Callable[[Any, Request, grpc.aio.ServicerContext], Awaitable[Response]]


def guarded(method: Handler[Request, Response]) -> Handler[Request, Response]:
    """Answer a core error with its status code, and anything unexpected with INTERNAL."""

    @functools.wraps(method)
    async def handler(self: Any, request: Request, context: grpc.aio.ServicerContext) -> Response:
        try:
            return await method(self, request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await abort(context, exc, method.__name__)
        raise AssertionError("context.abort returned")  # pragma: no cover

    return handler


async def abort(context: grpc.aio.ServicerContext, exc: Exception, method: str) -> None:
    """End the call with ``exc``'s status: a core error's code, INTERNAL for anything unexpected
    (logged). Raises grpc.aio's AbortError, as ``context.abort`` does."""
    if isinstance(exc, ServerError):
        code, message, trailers = code_of(exc), exc.message, trailers_of(exc)
    else:
        logger.exception("Unexpected error serving %s", method, exc_info=exc)
        code, message = grpc.StatusCode.INTERNAL, internal_error(exc)
        trailers = ()
    await context.abort(code, status_message(message), trailing_metadata=trailers)


def _metadata(context: Any) -> tuple[tuple[str, Any], ...]:
    """The call's metadata; its binary ``-bin`` entries are never sequence fields, whose names
    ``apply_headers`` looks for and which gRPC carries as text."""
    return context.invocation_metadata() or ()


def _authorization(context: Any) -> str | None:
    """The call's ``authorization`` metadata (``Bearer <key>``), as REST's header."""
    for key, value in context.invocation_metadata() or ():
        if key == "authorization":
            return value.decode("latin-1") if isinstance(value, bytes) else str(value)
    return None


def serialized(message: pb.ModelInferResponse | bytes) -> bytes:
    """ModelInfer's response serializer: its answer is a message, or already its bytes."""
    return message if type(message) is bytes else message.SerializeToString()  # type: ignore[union-attr]


class InferenceServicer:
    """GRPCInferenceService's unary methods over one DataPlane (streams: ``streams.py``)."""

    def __init__(self, dataplane: DataPlane) -> None:
        self.dataplane = dataplane

    @guarded
    async def ServerLive(self, request: pb.ServerLiveRequest, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self.dataplane.live())

    @guarded
    async def ServerReady(self, request: pb.ServerReadyRequest, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.dataplane.ready())

    @guarded
    async def ModelReady(self, request: pb.ModelReadyRequest, context: Any) -> pb.ModelReadyResponse:
        ready = self.dataplane.model_ready(request.name, request.version or None)
        return pb.ModelReadyResponse(ready=ready)

    @guarded
    async def ServerMetadata(
        self, request: pb.ServerMetadataRequest, context: Any
    ) -> pb.ServerMetadataResponse:
        return server_metadata_to_proto(self.dataplane.metadata())

    @guarded
    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Any) -> pb.ModelMetadataResponse:
        meta = await self.dataplane.model_metadata(request.name, request.version or None)
        return model_metadata_to_proto(meta)

    async def ModelInfer(self, request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
        # guarded as the other methods are, in this one frame (the hot path: no wrapper coroutine)
        try:
            name, version = request.model_name, request.model_version or None
            dataplane = self.dataplane
            dataplane.turns.grpc_call()
            entry = dataplane.check_model(name, version)  # before the request is read
            inference = request_from_proto(request)
            apply_headers(inference, _metadata(context))
            response = await dataplane.infer(inference, name, version, entry)
            raw = bool(request.raw_input_contents)
            body = response_bytes(response, raw)  # no parameters, so no trailers either
            if body is not None:
                return body  # type: ignore[return-value]  # serialized: see ``serialized``
            message = response_to_proto(response, raw)
            if response.parameters is not None:  # headers and sequence fields are parameters
                trailers = headers_of(response.parameters) + tuple(response_headers(response).items())
                if trailers:
                    context.set_trailing_metadata(trailers)
            return message
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await abort(context, exc, "ModelInfer")
        raise AssertionError("context.abort returned")  # pragma: no cover

    @guarded
    async def RepositoryIndex(
        self, request: pb.RepositoryIndexRequest, context: Any
    ) -> pb.RepositoryIndexResponse:
        return repository_index_to_proto(await self.dataplane.repository_index(ready_only=request.ready))

    @guarded
    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, context: Any
    ) -> pb.RepositoryModelLoadResponse:
        if request.parameters:
            raise InvalidInput(
                f"Loading with parameters ({', '.join(sorted(request.parameters))}) is not supported: "
                "models load from the model-settings.json in the repository folder"
            )
        await self.dataplane.repository_load(request.model_name, _authorization(context))
        return pb.RepositoryModelLoadResponse()

    @guarded
    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: Any
    ) -> pb.RepositoryModelUnloadResponse:
        # Triton's unload_dependents has no meaning here: models do not depend on each other
        await self.dataplane.repository_unload(request.model_name, _authorization(context))
        return pb.RepositoryModelUnloadResponse()
