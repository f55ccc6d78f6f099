"""gRPC health checking (``runtime.frontends.grpc.health``): ``Check`` follows readiness afresh, ``Watch``
hears each change and ends when the server drains."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import grpc
import pytest
from grpc_health.v1 import health_pb2

from runtime.core.dataplane import DataPlane
from runtime.frontends.grpc.health import NOT_SERVING, SERVICE_NAME, SERVING, HealthServicer

pytestmark = pytest.mark.anyio


class Readiness:
    """The one thing the servicer asks of the DataPlane."""

    def __init__(self) -> None:
        self.now = False

    def ready(self) -> bool:
        return self.now


class Context:
    """A call's context that keeps what was written, and the code it was aborted with."""

    def __init__(self) -> None:
        self.written: list[Any] = []
        self.wrote = asyncio.Event()
        self.aborted: grpc.StatusCode | None = None

    async def write(self, message: health_pb2.HealthCheckResponse) -> None:
        self.written.append(message.status)
        self.wrote.set()

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        self.aborted = code
        raise RuntimeError("aborted")


def _servicer() -> tuple[HealthServicer, Readiness]:
    readiness = Readiness()
    return HealthServicer(cast(DataPlane, readiness)), readiness


async def _check(servicer: HealthServicer, service: str) -> Any:
    response = await servicer.Check(health_pb2.HealthCheckRequest(service=service), Context())
    return response.status


async def test_check_asks_for_readiness_each_time_for_the_server_and_the_inference_service() -> None:
    servicer, readiness = _servicer()
    await servicer.start()
    assert [await _check(servicer, s) for s in ("", SERVICE_NAME)] == [NOT_SERVING, NOT_SERVING]
    readiness.now = True
    assert [await _check(servicer, s) for s in ("", SERVICE_NAME)] == [SERVING, SERVING]


async def test_an_unknown_service_is_not_found() -> None:
    servicer, _ = _servicer()
    await servicer.start()
    context = Context()
    with pytest.raises(RuntimeError):
        await servicer.Check(health_pb2.HealthCheckRequest(service="other.Service"), context)
    assert context.aborted is grpc.StatusCode.NOT_FOUND


async def test_watch_hears_a_change_a_check_finds_and_ends_when_the_server_drains() -> None:
    servicer, readiness = _servicer()
    await servicer.start()
    context = Context()
    watch = asyncio.create_task(servicer.Watch(health_pb2.HealthCheckRequest(service=""), context))
    await asyncio.wait_for(context.wrote.wait(), 5)
    context.wrote.clear()
    readiness.now = True
    await _check(servicer, "")
    await asyncio.wait_for(context.wrote.wait(), 5)
    await servicer.enter_graceful_shutdown()
    await asyncio.wait_for(watch, 5)
    assert context.written == [NOT_SERVING, SERVING, NOT_SERVING]
