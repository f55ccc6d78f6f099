"""gRPC's entry (``runtime.frontends.telemetry.grpc_access``) on a real grpc.aio server (127.0.0.1,
port 0) serving the real health service: the interceptor counts every call by kind, service,
method and status code and writes one access line for it (unary-stream calls, Health.Watch, pass
unobserved); the registration that observes each
handler once (the metrics alone) counts the same without an interceptor; statuses stay the
transport's own."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from runtime.frontends.telemetry.grpc_access import ObservedGrpc, ObservedRegistration, _status_name
from runtime.telemetry.counts import Recorder

pytestmark = pytest.mark.anyio

SERVICE = "grpc.health.v1.Health"


async def _health_calls(port: int) -> None:
    """Two good checks, one for an unknown service (NOT_FOUND), and a watch read to its first answer."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for _ in range(2):
            answer = await stub.Check(
                health_pb2.HealthCheckRequest(service=""), metadata=(("x-request-id", "r-1"),)
            )
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await stub.Check(health_pb2.HealthCheckRequest(service="nothere"))
        assert missing.value.code() is grpc.StatusCode.NOT_FOUND
        watch = stub.Watch(health_pb2.HealthCheckRequest(service=""))
        first = await watch.read()
        assert first.status == health_pb2.HealthCheckResponse.SERVING
        watch.cancel()


@pytest.fixture
async def intercepted() -> AsyncIterator[tuple[int, Recorder]]:
    recorder = Recorder()
    server = grpc.aio.server(interceptors=[ObservedGrpc(recorder, True, None)])
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield port, recorder
    await server.stop(None)


async def test_the_interceptor_counts_and_logs_every_call(
    intercepted: tuple[int, Recorder], caplog: pytest.LogCaptureFixture
) -> None:
    port, recorder = intercepted
    with caplog.at_level(logging.INFO, logger="runtime.access"):
        await _health_calls(port)
    check = recorder.grpc[("unary", SERVICE, "Check")]
    assert check.started == 3 and check.handled == {"OK": 2, "NOT_FOUND": 1}
    assert sum(check.seconds.counts) == 3 and check.seconds.sum > 0
    assert [key for key in recorder.grpc if key[2] == "Watch"] == []  # unary-stream calls pass unobserved
    lines = [r.getMessage() for r in caplog.records if r.name == "runtime.access"]
    checks = [line for line in lines if f"/{SERVICE}/Check" in line]
    assert len(checks) == 3, lines
    assert sum(" OK " in line for line in checks) == 2 and sum(" NOT_FOUND " in line for line in checks) == 1
    assert all(line.startswith("grpc ") for line in checks)


async def test_the_registration_counts_without_an_interceptor() -> None:
    recorder = Recorder()
    server = grpc.aio.server()
    registration = ObservedRegistration(server, ObservedGrpc(recorder, False, None))
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), registration)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        await _health_calls(port)
    finally:
        await server.stop(None)
    check = recorder.grpc[("unary", SERVICE, "Check")]
    assert check.started == 3 and check.handled == {"OK": 2, "NOT_FOUND": 1}


@pytest.mark.parametrize("status", list(grpc.StatusCode))
def test_a_calls_status_is_counted_by_its_name(status: grpc.StatusCode) -> None:
    assert _status_name(status) == status.name
    assert _status_name(status.value[0]) == status.name  # grpc.aio may give the code's integer


def test_an_unknown_status_value_is_counted_as_unknown() -> None:
    assert _status_name(99) == "UNKNOWN"
