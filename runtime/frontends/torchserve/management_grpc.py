"""TorchServe's gRPC management API (``org.pytorch.serve.grpc.management.ManagementAPIsService``):
every call answers ``ManagementResponse{msg}``, ``msg`` being what TorchServe's management REST API
answers (a JSON document, or a status sentence).

Each call is the management core's operation (``runtime.frontends.management.Management``), the one the
management REST API calls, so both front ends list, describe, register (the same ``allowed_urls``,
TorchServe archives and model folders alike), scale, set defaults and unregister alike; only the
translation is here. A refusal is TorchServe's error table's (``runtime.frontends.torchserve.error_body``)
status as TorchServe's gRPC code (400 INVALID_ARGUMENT, 403 PERMISSION_DENIED, 404 NOT_FOUND, 409
ABORTED, 5xx INTERNAL or UNAVAILABLE), with its message. Zero fields are TorchServe's defaults:
``limit`` 0 gives an empty page (as TorchServe answers), ``min_worker`` 0 is 1, ``max_worker`` 0 is
``min_worker``, ``initial_workers`` 0 is the model's own setting.

Token authorization (TorchServe 0.11.1+): with the management key on (``management_token_auth``,
the default), every call must carry the metadata ``authorization: Bearer <key>``, the key the
management REST API takes (the same key file); without it the call is refused with
PERMISSION_DENIED and TorchServe's sentence, before the method runs.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from runtime.core.management import Management, default_set, scaled, unregistered
from runtime.core.management_key import AUTH_FAILED, ManagementKey
from runtime.errors import ServerError
from runtime.frontends.grpc.generated import ts_management_pb2 as pb
from runtime.frontends.torchserve.error_body import describe, grpc_code

SERVICE = "org.pytorch.serve.grpc.management.ManagementAPIsService"


def _json(document: Any) -> Any:
    return pb.ManagementResponse(msg=json.dumps(document, indent=2))


def _refused(method: Method) -> Method:
    """``method``, its core errors answered as TorchServe's gRPC management answers them."""

    async def translated(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        try:
            return await method(request, context)
        except ServerError as exc:
            status, _, message = describe(exc)
            await context.abort(grpc_code(status), message)

    return translated


class ManagementApi:
    """The ManagementAPIsService methods over the management core operations."""

    def __init__(self, management: Management) -> None:
        self.ops = management

    async def ListModels(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        return _json(self.ops.list_models(request.limit, request.next_page_token))

    async def DescribeModel(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        version = request.model_version or None
        every = version == "all"
        return _json(self.ops.describe(request.model_name, None if every else version, every))

    async def RegisterModel(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        done = await self.ops.register(
            request.url, request.model_name or None, request.initial_workers or None, request.synchronous
        )
        return pb.ManagementResponse(msg=done.status())

    async def UnregisterModel(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        name, version = request.model_name, request.model_version or None
        await self.ops.unregister(name, version)
        return pb.ManagementResponse(msg=unregistered(name, version))

    async def ScaleWorker(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        name, version = request.model_name, request.model_version or None
        minimum = request.min_worker or 1
        count = await self.ops.scale(
            name, version, minimum, request.max_worker or minimum, request.synchronous
        )
        return pb.ManagementResponse(msg=scaled(name, version, count, request.synchronous))

    async def SetDefault(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        name, version = request.model_name, request.model_version
        self.ops.set_default(name, version)
        return pb.ManagementResponse(msg=default_set(name, version))


Method = Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[Any]]


def _authorized(method: Method, key: ManagementKey) -> Method:
    """``method``, refused with PERMISSION_DENIED (as TorchServe's gRPC interceptor) unless the
    call's metadata ``authorization`` carries the key."""

    async def guarded(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        metadata = context.invocation_metadata() or ()
        sent = next((v for k, v in metadata if k == "authorization"), None)
        if not key.allows(sent.decode("latin-1") if isinstance(sent, bytes) else sent):
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, AUTH_FAILED)
        return await method(request, context)

    return guarded


def management_handlers(
    management: Management, key: ManagementKey | None = None
) -> dict[str, grpc.RpcMethodHandler]:
    """The ManagementAPIsService method handlers, by method name; each needs ``key`` unless it is None."""
    api = ManagementApi(management)
    requests: dict[str, Any] = {
        "ListModels": pb.ListModelsRequest,
        "DescribeModel": pb.DescribeModelRequest,
        "RegisterModel": pb.RegisterModelRequest,
        "UnregisterModel": pb.UnregisterModelRequest,
        "ScaleWorker": pb.ScaleWorkerRequest,
        "SetDefault": pb.SetDefaultRequest,
    }
    return {
        name: grpc.unary_unary_rpc_method_handler(
            _refused(getattr(api, name)) if key is None else _authorized(_refused(getattr(api, name)), key),
            request_deserializer=message.FromString,
            response_serializer=pb.ManagementResponse.SerializeToString,
        )
        for name, message in requests.items()
    }
