"""The Open Inference Protocol over gRPC (grpc.aio), translating to and from the DataPlane only.

``GrpcServer`` is imported on first use, so that the protocol's stubs (``runtime.frontends.grpc.generated``)
can be imported by a client without the server."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runtime.frontends.grpc.grpc_server import GrpcServer

__all__ = ["GrpcServer"]


def __getattr__(name: str) -> Any:
    if name == "GrpcServer":
        from runtime.frontends.grpc.grpc_server import GrpcServer

        return GrpcServer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
