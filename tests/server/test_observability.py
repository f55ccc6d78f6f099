"""What one server observes, set up from its settings (``runtime.server.observability``): nothing
wrapped when nothing watches requests; with the metrics alone, the app and the gRPC handlers count
without a wrapper or an interceptor; with the access log, the REST app is wrapped and gRPC gets an
interceptor; and the metrics port's app, built at the first scrape, shows the DataPlane's counts."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import grpc
import httpx
import pytest

from runtime.core.dataplane import DataPlane
from runtime.core.registry import Registry
from runtime.server.observability import Observability
from runtime.server.rest_app import create_app
from runtime.settings import ModelSettings, Settings
from tests.models import zoo

pytestmark = pytest.mark.anyio

BODY = {"inputs": [{"name": "x", "shape": [1], "datatype": "INT64", "data": [3]}]}


async def _plane(settings: Settings) -> DataPlane:
    plane = DataPlane(settings, Registry())
    plane.started = True
    await plane.registry.load(ModelSettings(name="echo", implementation=zoo.Echo))
    return plane


@pytest.fixture
async def grpc_server() -> AsyncIterator[grpc.aio.Server]:
    server = grpc.aio.server()  # never started: only its registration is looked at
    yield server
    await server.stop(None)


async def test_nothing_is_wrapped_when_nothing_watches(grpc_server: grpc.aio.Server) -> None:
    plane = await _plane(Settings(metrics_endpoint=None))
    observability = Observability(plane.settings, plane)
    app = create_app(plane)
    assert observability.recorder is None and observability.metrics_app is None
    assert plane.observer is None and not observability.watching_requests
    assert observability.wrap_rest(app) is app
    assert observability.grpc_interceptors() == []
    assert observability.grpc_registration(grpc_server) is grpc_server
    await plane.registry.unload_all()


async def test_the_metrics_alone_count_without_a_wrapper(grpc_server: grpc.aio.Server) -> None:
    plane = await _plane(Settings())
    observability = Observability(plane.settings, plane)
    assert observability.counting_only and plane.observer is not None
    app = create_app(plane)
    assert observability.wrap_rest(app) is app  # the app counts its hot path itself
    assert observability.grpc_interceptors() == []
    registration = observability.grpc_registration(grpc_server)
    assert registration is not grpc_server and hasattr(registration, "add_generic_rpc_handlers")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        assert (await client.post("/v2/models/echo/infer", json=BODY)).status_code == 200
        assert (await client.post("/v2/models/nowhere/infer", json=BODY)).status_code == 404
    scrape_transport = httpx.ASGITransport(app=observability.metrics_app)
    async with httpx.AsyncClient(transport=scrape_transport, base_url="http://t") as scraper:
        scraped = await scraper.get("/metrics")
    assert scraped.status_code == 200
    counts = [line for line in scraped.text.splitlines() if line.startswith("nv_inference_count{")]
    assert any('model="echo"' in line and line.endswith(" 1.0") for line in counts), counts
    await plane.registry.unload_all()


async def test_the_access_log_wraps_rest_and_intercepts_grpc(
    grpc_server: grpc.aio.Server, caplog: pytest.LogCaptureFixture
) -> None:
    plane = await _plane(Settings(access_log=True, metrics_endpoint=None))
    observability = Observability(plane.settings, plane)
    assert observability.watching_requests and not observability.counting_only
    app = create_app(plane)
    wrapped = observability.wrap_rest(app)
    assert wrapped is not app
    (interceptor,) = observability.grpc_interceptors()
    assert isinstance(interceptor, grpc.aio.ServerInterceptor)
    assert observability.grpc_registration(grpc_server) is grpc_server
    with caplog.at_level(logging.INFO, logger="runtime.access"):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=wrapped), base_url="http://t") as c:
            assert (await c.post("/v2/models/echo/infer", json=BODY)).status_code == 200
    lines = [r.getMessage() for r in caplog.records if r.name == "runtime.access"]
    assert any(line.startswith("rest POST /v2/models/{model_name}/infer 200 ") for line in lines), lines
    observability.start()
    observability.stop()
    await plane.registry.unload_all()
