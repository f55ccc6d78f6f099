"""The Open Inference Protocol over gRPC (grpc.aio), translating to and from the DataPlane only."""

from runtime.frontends.grpc.grpc_server import GrpcServer

__all__ = ["GrpcServer"]
