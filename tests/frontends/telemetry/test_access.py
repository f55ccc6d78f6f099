"""What the transports' entry reads from a request (``runtime.frontends.telemetry.access``): the trace
id of a ``traceparent`` and the route template that labels the request."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route
from starlette.types import Receive, Scope, Send

from runtime.frontends.telemetry.access import UNMATCHED, route_of, trace_id_of

pytestmark = pytest.mark.anyio


def test_trace_id_of_reads_a_well_formed_traceparent_only() -> None:
    trace = "4BF92F3577B34DA6A3CE929D0E0E4736"
    assert trace_id_of(f"00-{trace}-00f067aa0ba902b7-01") == trace.lower()
    for value in (
        None,
        "",
        "00-abc-00f067aa0ba902b7-01",
        f"00-{'0' * 32}-00f067aa0ba902b7-01",
        f"00-{'g' * 32}-0-01",
    ):
        assert trace_id_of(value) is None, value
    assert trace_id_of(f"00-{trace}-00f067aa0ba902b7") is None  # no flags


async def _ok(request: Request) -> PlainTextResponse:
    return PlainTextResponse("ok")


class Routes:
    """An app that keeps the route each request was labelled with."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.routes: list[str] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.app(scope, receive, send)
        finally:
            self.routes.append(route_of(dict(scope)))


async def _routes(*paths: str) -> list[str]:
    app = Routes(
        Starlette(
            routes=[
                Route("/v2/models/{model_name}/infer", _ok, methods=["POST"]),
                Route("/v2/models/{model_name}/versions/{model_version}/infer", _ok, methods=["POST"]),
                Route("/v2/models/{model_name}/ready", _ok),
                Route("/files/{name}/{rest:path}", _ok),
                Mount("/ts", routes=[Route("/predictions/{model_name}", _ok, methods=["POST"])]),
            ]
        )
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
        for path in paths:
            await client.post(path) if "ready" not in path and "files" not in path else await client.get(path)
    return app.routes


async def test_a_route_is_labelled_by_its_template() -> None:
    assert await _routes(
        "/v2/models/resnet/infer",
        "/v2/models/resnet/versions/2/infer",
        "/files/f/a/b/c",
        "/ts/predictions/m",
        "/nowhere",
    ) == [
        "/v2/models/{model_name}/infer",
        "/v2/models/{model_name}/versions/{model_version}/infer",
        "/files/{name}/{rest}",
        "/ts/predictions/{model_name}",
        UNMATCHED,
    ]


async def test_a_name_that_is_also_a_segment_of_the_route_is_labelled_by_the_template() -> None:
    assert await _routes(
        "/v2/models/infer/infer",
        "/v2/models/models/ready",
        "/v2/models/m/versions/m/infer",
    ) == [
        "/v2/models/{model_name}/infer",
        "/v2/models/{model_name}/ready",
        "/v2/models/{model_name}/versions/{model_version}/infer",
    ]
