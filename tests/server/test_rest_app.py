"""Infer requests go from the app straight to their handler (``RestApp``): the same scope, answers
and errors as through Starlette's router and error middlewares."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from runtime.server.rest_app import RestApp
from runtime.settings import ModelParameters, ModelSettings
from tests.conftest import InProcess
from tests.models import zoo

pytestmark = pytest.mark.anyio

BODY = {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}


class Recorded:
    """The REST app, keeping the scope of every request it served."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.scopes: list[Scope] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.app(scope, receive, send)
        finally:
            self.scopes.append(scope)


async def _client(
    inprocess: InProcess, raise_app_exceptions: bool = True
) -> tuple[httpx.AsyncClient, Recorded]:
    await inprocess.load(
        ModelSettings(name="echo", implementation=zoo.Echo),
        ModelSettings(name="v", implementation=zoo.VersionTag, parameters=ModelParameters(version="2")),
        ModelSettings(name="raising", implementation=zoo.Raising),
    )
    recorded = Recorded(inprocess.app)
    transport = httpx.ASGITransport(app=recorded, raise_app_exceptions=raise_app_exceptions)
    return httpx.AsyncClient(transport=transport, base_url="http://test"), recorded


async def test_the_scope_is_what_the_router_would_make(inprocess: InProcess) -> None:
    app = inprocess.app
    assert isinstance(app, RestApp)
    client, recorded = await _client(inprocess)
    async with client:
        assert (await client.post("/v2/models/echo/infer", json=BODY)).status_code == 200
        assert (await client.post("/v2/models/v/versions/2/infer", json=BODY)).status_code == 200
        # a GET goes through the router: its scope shows what the router sets
        assert (await client.get("/v2/models/echo/ready")).status_code == 200
    plain, versioned, routed = recorded.scopes
    infer_routes = [r for r in app.routes if getattr(r, "path", "").endswith("/infer")]
    assert plain["path_params"] == {"model_name": "echo"}
    assert plain["endpoint"] is infer_routes[0].endpoint  # type: ignore[attr-defined]
    assert versioned["path_params"] == {"model_name": "v", "model_version": "2"}
    assert versioned["endpoint"] is infer_routes[1].endpoint  # type: ignore[attr-defined]
    for scope in (plain, versioned, routed):
        assert scope["app"] is app and scope["router"] is app.router


async def test_errors_get_the_same_answers(inprocess: InProcess) -> None:
    client, _ = await _client(inprocess)
    async with client:
        missing = await client.post("/v2/models/nope/infer", json=BODY)
        assert missing.status_code == 404 and "nope" in missing.json()["error"]
        bad = await client.post("/v2/models/echo/infer", content=b"{not json")
        assert bad.status_code == 400 and "Invalid JSON" in bad.json()["error"]
        failed = await client.post("/v2/models/raising/infer", json=BODY)
        assert failed.status_code == 500 and "error" in failed.json()
        # paths the fast path does not take fall through to the router, unchanged
        assert (await client.post("/v2/models//infer", json=BODY)).status_code == 404
        # (the versioned metadata route, GET only, with the version "infer")
        assert (await client.post("/v2/models/echo/versions/infer", json=BODY)).status_code == 405
        assert (await client.get("/v2/models/echo/infer")).status_code == 405


async def test_an_unexpected_failure_is_answered_500_and_raised(
    inprocess: InProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def boom(*args: Any) -> Any:
        raise RuntimeError("boom")

    assert isinstance(inprocess.app, RestApp)
    monkeypatch.setattr(inprocess.app._api, "answer", boom)
    client, _ = await _client(inprocess, raise_app_exceptions=False)
    async with client:
        response = await client.post("/v2/models/echo/infer", json=BODY)
    assert response.status_code == 500
    assert response.json() == {"error": "Internal server error: RuntimeError: boom"}
    client, _ = await _client(inprocess)
    async with client:
        with pytest.raises(
            RuntimeError, match="boom"
        ):  # re-raised, as Starlette's ServerErrorMiddleware does
            await client.post("/v2/models/echo/infer", json=BODY)


async def _raw(
    app: Any, headers: list[tuple[bytes, bytes]], body: bytes
) -> tuple[int, dict[bytes, bytes], bytes]:
    """One infer request for ``echo`` straight through the ASGI app, with exactly these headers."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v2/models/echo/infer",
        "raw_path": b"/v2/models/echo/infer",
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    sent: list[Any] = []

    async def receive() -> Any:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: Any) -> None:
        sent.append(message)

    await app(scope, receive, send)
    start, answer = sent
    return start["status"], dict(start["headers"]), answer["body"]


async def test_headers_are_read_in_one_pass_as_starlette_reads_them(inprocess: InProcess) -> None:
    """The first of a repeated header counts (as Starlette's ``Headers.get``); the sequence
    headers reach the request's parameters; a Content-Length over the limit is refused first."""
    import orjson

    client, _ = await _client(inprocess)
    await client.aclose()
    app = inprocess.app
    document = orjson.dumps(BODY)
    raw = b"\x00\x00\x80?\x00\x00\x00@"
    header = orjson.dumps(
        {"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "parameters": {"binary_data_size": 8}}]}
    )
    status, headers, body = await _raw(
        app,
        [
            (b"inference-header-content-length", str(len(header)).encode()),
            (b"inference-header-content-length", b"1"),
            (b"content-length", str(len(header) + 8).encode()),
        ],
        header + raw,
    )
    assert status == 200 and orjson.loads(body)["outputs"][0]["data"] == [1.0, 2.0]
    status, headers, body = await _raw(
        app,
        [
            (b"ts_request_sequence_id", b"s-1"),
            (b"ts_request_sequence_start", b"true"),
            (b"sequence_step", b"1"),
            (b"content-type", b"application/json"),
        ],
        document,
    )
    assert status == 200 and headers[b"content-type"] == b"application/json"
    assert orjson.loads(body)["parameters"] == {
        "sequence_id": "s-1",
        "sequence_start": True,
        "sequence_step": 1,
    }
    status, _, body = await _raw(app, [(b"content-length", b"999999999999")], document)
    assert status == 413 and b"over the limit" in body
