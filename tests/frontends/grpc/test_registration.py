"""Which methods the gRPC server registers with gRPC core: the hot path alone (grpc.aio waits on
one pending call request per registered method before every call it accepts), every other method
served, with the same handlers, by its service's generic handler."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc
import pytest
from google.protobuf import empty_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from runtime.core.dataplane import DataPlane
from runtime.core.registry import Registry
from runtime.frontends.grpc.generated import dataplane_pb2 as pb
from runtime.frontends.grpc.generated import dataplane_pb2_grpc, ts_inference_pb2_grpc
from runtime.frontends.grpc.grpc_server import REGISTERED, GrpcServer
from runtime.frontends.grpc.health import SERVICE_NAME
from runtime.frontends.torchserve.inference_grpc import SERVICE as TORCHSERVE
from runtime.frontends.torchserve.inference_grpc import inference_handlers
from runtime.settings import Settings

pytestmark = pytest.mark.anyio


class Registration:
    """Registers on the server as the server does, noting which methods are registered with core."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self.server = server
        self.registered: dict[str, list[str]] = {}

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self.server.add_generic_rpc_handlers(handlers)

    def add_registered_method_handlers(self, service: str, table: dict[str, Any]) -> None:
        self.registered.setdefault(service, []).extend(table)
        self.server.add_registered_method_handlers(service, table)


async def test_only_model_infer_is_registered_and_every_method_still_answers() -> None:
    dataplane = DataPlane(Settings(host="127.0.0.1", grpc_port=0), Registry())
    dataplane.started = True
    registrations: list[Registration] = []

    def register(server: grpc.aio.Server) -> Registration:
        registrations.append(Registration(server))
        return registrations[-1]

    server = GrpcServer(
        dataplane,
        dataplane.settings,
        services={TORCHSERVE: inference_handlers(dataplane)},
        registration=register,
    )
    port = await server.start()
    try:
        assert REGISTERED == {SERVICE_NAME: ("ModelInfer",)}
        assert registrations[0].registered == {SERVICE_NAME: ["ModelInfer"]}
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = dataplane_pb2_grpc.GRPCInferenceServiceStub(channel)
            assert (await stub.ServerLive(pb.ServerLiveRequest())).live
            with pytest.raises(grpc.aio.AioRpcError) as info:  # registered: answered by the servicer
                await stub.ModelInfer(pb.ModelInferRequest(model_name="nope"))
            assert info.value.code() is grpc.StatusCode.NOT_FOUND
            health = health_pb2_grpc.HealthStub(channel)
            checked = await health.Check(health_pb2.HealthCheckRequest(service=""))
            serving = (
                health_pb2.HealthCheckResponse.SERVING
                if dataplane.ready()
                else health_pb2.HealthCheckResponse.NOT_SERVING
            )
            assert checked.status == serving
            torchserve = ts_inference_pb2_grpc.InferenceAPIsServiceStub(channel)
            assert (await torchserve.Ping(empty_pb2.Empty())).health
            unknown = channel.unary_unary("/inference.GRPCInferenceService/Nope")
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await unknown(b"")
            assert info.value.code() is grpc.StatusCode.UNIMPLEMENTED
    finally:
        await server.stop(0)
