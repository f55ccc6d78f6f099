"""grpc.health.v1.Health, so that Kubernetes gRPC probes (and grpc_health_probe) work.

``Check`` for the whole server ("") or for ``inference.GRPCInferenceService`` answers SERVING
exactly when the server is ready (models loaded, not draining), asked afresh each time; other
service names are NOT_FOUND, as the health protocol says. ``Watch`` reports SERVING from start
until the server begins to drain, then NOT_SERVING.
"""

from __future__ import annotations

from typing import Any

from grpc_health.v1 import health, health_pb2

from ..dataplane import DataPlane

SERVICE_NAME = "inference.GRPCInferenceService"


class HealthServicer(health.aio.HealthServicer):
    def __init__(self, dataplane: DataPlane) -> None:
        super().__init__()
        self.dataplane = dataplane

    async def start(self) -> None:
        await self.set("", health_pb2.HealthCheckResponse.SERVING)
        await self.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)

    async def Check(self, request: health_pb2.HealthCheckRequest, context: Any) -> Any:
        if request.service in ("", SERVICE_NAME):
            ready = self.dataplane.ready()
            status = health_pb2.HealthCheckResponse.SERVING if ready else health_pb2.HealthCheckResponse.NOT_SERVING
            return health_pb2.HealthCheckResponse(status=status)
        return await super().Check(request, context)
