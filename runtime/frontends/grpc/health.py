"""grpc.health.v1.Health, so that Kubernetes gRPC probes (and grpc_health_probe) work.

``Check`` for the whole server ("") or for ``inference.GRPCInferenceService`` answers SERVING
exactly when the server is ready (see ``Settings.strict_readiness``; never while draining), asked
afresh each time; other service names are NOT_FOUND, as the health protocol says. ``Watch``
reports the status when the server starts, again whenever a Check finds it changed, NOT_SERVING
as soon as the server begins to drain, and then ends the call, so that an open Watch does not
hold the shutdown for its whole grace period.
"""

from __future__ import annotations

from typing import Any

from grpc_health.v1 import health, health_pb2

from runtime.core.dataplane import DataPlane

SERVICE_NAME = "inference.GRPCInferenceService"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


class HealthServicer(health.aio.HealthServicer):  # type: ignore[misc]  # grpc_health ships no types
    def __init__(self, dataplane: DataPlane) -> None:
        super().__init__()
        self.dataplane = dataplane

    async def start(self) -> None:
        await self.refresh()

    async def refresh(self) -> None:
        """Set the statuses Watch reports from the server's readiness now."""
        status = SERVING if self.dataplane.ready() else NOT_SERVING
        for service in ("", SERVICE_NAME):
            if self._server_status.get(service) != status and not self._gracefully_shutting_down:
                await self.set(service, status)

    async def Check(self, request: health_pb2.HealthCheckRequest, context: Any) -> Any:
        if request.service in ("", SERVICE_NAME):
            await self.refresh()  # readiness changes with model loads: watchers hear it too
            return health_pb2.HealthCheckResponse(status=self._server_status[request.service])
        return await super().Check(request, context)

    async def Watch(self, request: health_pb2.HealthCheckRequest, context: Any) -> None:
        # the base class's bookkeeping (one condition per watched service, notified by set()),
        # plus an end once the server drains
        service = request.service
        condition = self._server_watchers[service]
        self._watcher_count_by_service[service] += 1
        sent = None
        try:
            async with condition:
                while True:
                    status = self._server_status.get(service, SERVICE_UNKNOWN)
                    if status != sent:
                        await context.write(health_pb2.HealthCheckResponse(status=status))
                        sent = status
                    if self._gracefully_shutting_down:
                        # the flag is set before the statuses change: say NOT_SERVING ourselves
                        if sent != NOT_SERVING:
                            await context.write(health_pb2.HealthCheckResponse(status=NOT_SERVING))
                        return
                    await condition.wait()
        finally:
            self._watcher_count_by_service[service] -= 1
            if self._watcher_count_by_service[service] == 0:
                del self._server_watchers[service]
                del self._watcher_count_by_service[service]
