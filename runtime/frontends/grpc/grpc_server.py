"""The gRPC server: GRPCInferenceService, Health and reflection on one grpc.aio server.

It runs in the event loop it is started from (the REST server's), listens on
``settings.host:settings.grpc_port`` (port 0: any free port, read back), with TLS when a
certificate and key are configured, and stops with a grace period for in-flight calls.
The repository RPCs are also served under MLServer's separate service name
``inference.model_repository.ModelRepositoryService`` (same messages on the wire).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor_pool
from grpc_health.v1 import health_pb2, health_pb2_grpc

from runtime.core.dataplane import DataPlane
from runtime.frontends.grpc.generated import dataplane_pb2 as pb
from runtime.frontends.grpc.health import SERVICE_NAME, HealthServicer
from runtime.frontends.grpc.servicer import InferenceServicer, serialized
from runtime.frontends.grpc.stream_rpc import stream_handler
from runtime.settings import Settings

from .converters import request_reader

logger = logging.getLogger(__name__)

MLSERVER_REPOSITORY_SERVICE = "inference.model_repository.ModelRepositoryService"

_UNARY: tuple[tuple[str, Any, Any], ...] = (
    ("ServerLive", pb.ServerLiveRequest, pb.ServerLiveResponse),
    ("ServerReady", pb.ServerReadyRequest, pb.ServerReadyResponse),
    ("ModelReady", pb.ModelReadyRequest, pb.ModelReadyResponse),
    ("ServerMetadata", pb.ServerMetadataRequest, pb.ServerMetadataResponse),
    ("ModelMetadata", pb.ModelMetadataRequest, pb.ModelMetadataResponse),
    ("ModelInfer", pb.ModelInferRequest, pb.ModelInferResponse),
    ("RepositoryIndex", pb.RepositoryIndexRequest, pb.RepositoryIndexResponse),
    ("RepositoryModelLoad", pb.RepositoryModelLoadRequest, pb.RepositoryModelLoadResponse),
    ("RepositoryModelUnload", pb.RepositoryModelUnloadRequest, pb.RepositoryModelUnloadResponse),
)
_REPOSITORY = ("RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload")

REGISTERED: dict[str, tuple[str, ...]] = {SERVICE_NAME: ("ModelInfer",)}
"""The methods registered with gRPC core, by service; every other method is served by its
service's generic handler (same handlers, same answers). grpc.aio's server keeps one pending
call request per registered method, plus one for the generic ones, and waits on all of them
(``asyncio.wait``) before every call it accepts: each registered method costs every call of every
method a done-callback added and removed, so only the hot path is registered."""


def method_handlers(dataplane: DataPlane, stream_format: str) -> dict[str, grpc.RpcMethodHandler]:
    """The handlers of GRPCInferenceService's methods, by method name."""
    servicer = InferenceServicer(dataplane)
    handlers = {
        name: grpc.unary_unary_rpc_method_handler(
            getattr(servicer, name),
            request_deserializer=request_reader(request),
            response_serializer=serialized if name == "ModelInfer" else response.SerializeToString,
        )
        for name, request, response in _UNARY
    }
    streamed = pb.ModelStreamInferResponse if stream_format == "triton" else pb.ModelInferResponse
    handlers["ModelStreamInfer"] = grpc.stream_stream_rpc_method_handler(
        stream_handler(dataplane, stream_format),
        request_deserializer=request_reader(pb.ModelInferRequest),
        response_serializer=streamed.SerializeToString,
    )
    return handlers


REFLECTION_SERVICE = "grpc.reflection.v1alpha.ServerReflection"


class _Reflection(grpc.GenericRpcHandler):  # type: ignore[misc]
    """Server reflection, imported and built by its first call: a server that is never asked
    what it serves does not load grpc_reflection and its descriptors."""

    _METHOD = f"/{REFLECTION_SERVICE}/ServerReflectionInfo"

    def __init__(self) -> None:
        self._handler: grpc.RpcMethodHandler | None = None

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        if handler_call_details.method != self._METHOD:
            return None
        if self._handler is None:
            from grpc_reflection.v1alpha import reflection, reflection_pb2

            names = (
                SERVICE_NAME,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                REFLECTION_SERVICE,
            )
            servicer = reflection.aio.ReflectionServicer(names, pool=_reflection_pool(reflection_pb2))
            self._handler = grpc.stream_stream_rpc_method_handler(
                servicer.ServerReflectionInfo,
                request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
                response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
            )
        return self._handler


def _reflection_pool(reflection_pb2: Any) -> descriptor_pool.DescriptorPool:
    # the stubs live in a pool of their own (see scripts/generate_grpc.py): gather what
    # reflection describes into one pool
    pool = descriptor_pool.DescriptorPool()
    for file in (pb.DESCRIPTOR, health_pb2.DESCRIPTOR, reflection_pb2.DESCRIPTOR):
        pool.AddSerializedFile(file.serialized_pb)
    return pool


def _credentials(settings: Settings) -> grpc.ServerCredentials | None:
    if settings.grpc_tls_certificate is None or settings.grpc_tls_private_key is None:
        return None
    try:
        certificate = Path(settings.grpc_tls_certificate).read_bytes()
        key = Path(settings.grpc_tls_private_key).read_bytes()
    except OSError as exc:
        raise RuntimeError(f"Cannot read the gRPC TLS certificate or key: {exc}") from exc
    return grpc.ssl_server_credentials([(key, certificate)])


class _GenericOnly:
    """A server as a generated ``add_*Servicer_to_server`` sees it, which takes the service's
    generic handler and drops its registered ones (see ``REGISTERED``): the same handlers serve
    every method either way."""

    def __init__(self, target: Any) -> None:
        self.target = target

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self.target.add_generic_rpc_handlers(handlers)

    def add_registered_method_handlers(self, service: str, table: dict[str, grpc.RpcMethodHandler]) -> None:
        pass


class GrpcServer:
    """One grpc.aio server over a DataPlane."""

    def __init__(
        self,
        dataplane: DataPlane,
        settings: Settings,
        interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
        services: dict[str, dict[str, grpc.RpcMethodHandler]] | None = None,
        registration: Callable[[grpc.aio.Server], Any] | None = None,
    ) -> None:
        self.dataplane = dataplane
        self.settings = settings
        self.interceptors = list(interceptors)
        self.services = services or {}
        """Other protocols' services served beside OIP's (by full name: method handlers by method)."""
        self.registration = registration
        """What registers the method handlers on the server (None: the server itself); the metrics
        observe each handler once this way rather than with an interceptor on every call."""
        self.port: int | None = None
        self.management_port: int | None = None
        self.health = HealthServicer(dataplane)
        self._server: grpc.aio.Server | None = None

    async def start(self) -> int:
        """Listen and serve; return the port (the one picked when grpc_port is 0)."""
        settings = self.settings
        size = settings.grpc_max_message_length
        server = grpc.aio.server(
            interceptors=self.interceptors or None,
            options=[
                ("grpc.max_send_message_length", size),
                ("grpc.max_receive_message_length", size),
                ("grpc.so_reuseport", 0),
            ],
        )
        handlers = method_handlers(self.dataplane, settings.grpc_stream_format)
        repository = {name: handlers[name] for name in _REPOSITORY}
        add = self.registration(server) if self.registration is not None else server
        tables = {SERVICE_NAME: handlers, MLSERVER_REPOSITORY_SERVICE: repository, **self.services}
        for service, table in tables.items():  # self.services: e.g. TorchServe's own API
            add.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, table),))
            hot = {name: table[name] for name in REGISTERED.get(service, ()) if name in table}
            if hot:
                add.add_registered_method_handlers(service, hot)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, _GenericOnly(add))
        add.add_generic_rpc_handlers((_Reflection(),))
        host = f"[{settings.host}]" if ":" in settings.host else settings.host
        address = f"{host}:{settings.grpc_port}"
        credentials = _credentials(settings)
        port: int
        try:
            if credentials is None:
                port = server.add_insecure_port(address)
            else:
                port = server.add_secure_port(address, credentials)
            if settings.grpc_management_port is not None:  # TorchServe's management clients' port
                second = f"{host}:{settings.grpc_management_port}"
                if credentials is None:
                    self.management_port = server.add_insecure_port(second)
                else:
                    self.management_port = server.add_secure_port(second, credentials)
        except RuntimeError as exc:  # grpc's way of saying the address cannot be bound
            raise OSError(f"gRPC cannot listen on {address}: {exc}") from None
        await server.start()
        await self.health.start()
        self._server, self.port = server, port
        scheme = "grpcs" if credentials is not None else "grpc"
        logger.info("gRPC server listening on %s://%s:%d", scheme, settings.host, port)
        return port

    async def stop(self, grace: float | None) -> None:
        """Refuse new calls, give those in flight ``grace`` seconds, then cancel what remains."""
        await self.health.enter_graceful_shutdown()
        if self._server is not None:
            await self._server.stop(grace)
