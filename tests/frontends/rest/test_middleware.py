"""CORS and gzip on the REST routes (``runtime.frontends.rest.middleware``): answers compressed for clients
that accept gzip, gzip request bodies read (within the size limit), streams left uncompressed,
MLServer's CORS settings and defaults, refusals as JSON."""

from __future__ import annotations

import gzip
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from runtime.frontends.rest.middleware import wants_middleware
from runtime.settings import CORSSettings, ModelSettings, Settings
from tests.conftest import InProcess
from tests.models import zoo
from tests.stream_models import Counter

pytestmark = pytest.mark.anyio

ECHO = ModelSettings(name="echo", implementation=zoo.Echo)
COUNTER = ModelSettings(name="counter", implementation=Counter)
BIG = {"inputs": [{"name": "x", "shape": [1, 200], "datatype": "FP64", "data": [i / 7 for i in range(200)]}]}
SMALL = {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1.0]}]}
PLAIN = {"accept-encoding": "identity"}  # httpx asks for gzip by default


async def _served(settings: Settings) -> AsyncIterator[InProcess]:
    server = InProcess(settings)
    await server.load(ECHO, COUNTER)
    yield server
    await server.registry.unload_all()


@pytest.fixture
async def default() -> AsyncIterator[InProcess]:
    async for server in _served(Settings()):
        yield server


async def test_a_large_answer_is_gzipped_for_a_client_that_accepts_it(default: InProcess) -> None:
    async with default.client() as client:
        zipped = await client.post("/v2/models/echo/infer", json=BIG, headers={"accept-encoding": "gzip"})
        plain = await client.post("/v2/models/echo/infer", json=BIG, headers=PLAIN)
    assert zipped.status_code == plain.status_code == 200
    assert zipped.headers["content-encoding"] == "gzip" and "content-encoding" not in plain.headers
    assert int(zipped.headers["content-length"]) < len(plain.content)
    assert zipped.json()["outputs"] == plain.json()["outputs"]
    assert plain.json()["outputs"][0]["data"] == BIG["inputs"][0]["data"]
    assert "accept-encoding" in zipped.headers["vary"].lower()


async def test_small_answers_and_every_route_follow_starlettes_rules(default: InProcess) -> None:
    async with default.client() as client:
        small = await client.post("/v2/models/echo/infer", json=SMALL, headers={"accept-encoding": "gzip"})
        metadata = await client.get("/v2/models/echo", headers={"accept-encoding": "gzip"})
        missing = await client.post("/v2/models/nope/infer", json=BIG, headers={"accept-encoding": "gzip"})
    assert small.status_code == 200 and "content-encoding" not in small.headers  # under 500 bytes
    assert metadata.status_code == 200 and metadata.json()["name"] == "echo"
    assert missing.status_code == 404 and "error" in missing.json()


async def test_a_gzip_request_body_is_read_decompressed(default: InProcess) -> None:
    body = gzip.compress(json.dumps(BIG).encode())
    headers = {"content-encoding": "gzip", "content-type": "application/json", **PLAIN}
    async with default.client() as client:
        answer = await client.post("/v2/models/echo/infer", content=body, headers=headers)
        versioned = await client.post("/v2/models/echo/versions/1/infer", content=body, headers=headers)
        index = await client.post(
            "/v2/repository/index", content=gzip.compress(b'{"ready": true}'), headers=headers
        )
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs"][0]["data"] == BIG["inputs"][0]["data"]
    assert versioned.status_code == 404 and "version" in versioned.json()["error"]  # (no version 1)
    # a route through Starlette's router reads it decompressed too
    assert index.status_code == 200 and {m["name"] for m in index.json()} == {"echo", "counter"}


@pytest.mark.parametrize(
    ("body", "encoding", "status", "message"),
    [
        (b"not gzip at all", "gzip", 400, "not valid gzip"),
        (gzip.compress(b'{"inputs": []}')[:-12], "gzip", 400, "not valid gzip"),
        (b"{}", "br", 400, "Content-Encoding 'br' is not supported"),
    ],
    # ids of their own: a gzip stream carries the time it was made, and every test process of
    # pytest-xdist must collect the same test names
    ids=["not-gzip", "truncated-gzip", "brotli"],
)
async def test_a_bad_encoded_body_is_refused_with_a_json_error(
    default: InProcess, body: bytes, encoding: str, status: int, message: str
) -> None:
    async with default.client() as client:
        answer = await client.post(
            "/v2/models/echo/infer", content=body, headers={"content-encoding": encoding}
        )
    assert answer.status_code == status and message in answer.json()["error"]


async def test_a_body_is_limited_once_decompressed() -> None:
    """A small gzip body that inflates past ``max_request_size`` is refused before it is inflated
    whole (a zip bomb costs the server ``max_request_size`` bytes at the most)."""
    async for server in _served(Settings(max_request_size=10_000)):
        bomb = gzip.compress(b" " * 5_000_000)
        async with server.client() as client:
            answer = await client.post(
                "/v2/models/echo/infer", content=bomb, headers={"content-encoding": "gzip"}
            )
        assert len(bomb) < 10_000
        assert answer.status_code == 413 and "decompresses to more than" in answer.json()["error"]


async def test_streams_are_not_compressed(default: InProcess) -> None:
    body = {"inputs": [{"name": "n", "shape": [1], "datatype": "INT32", "data": [40]}]}
    async with default.client() as client:
        answer = await client.post(
            "/v2/models/counter/infer_stream", json=body, headers={"accept-encoding": "gzip"}
        )
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/event-stream")
    assert "content-encoding" not in answer.headers
    assert answer.text.count("data:") == 40


async def test_gzip_can_be_turned_off() -> None:
    async for server in _served(Settings(gzip_enabled=False)):
        assert server.app._middleware is None  # type: ignore[attr-defined]
        async with server.client() as client:
            answer = await client.post("/v2/models/echo/infer", json=BIG, headers={"accept-encoding": "gzip"})
        assert answer.status_code == 200 and "content-encoding" not in answer.headers


def test_cors_defaults_are_mlservers() -> None:
    assert Settings().cors_settings is None and Settings().gzip_enabled is True
    assert CORSSettings().model_dump() == {
        "allow_origins": [],
        "allow_origin_regex": None,
        "allow_credentials": False,
        "allow_methods": ["GET"],
        "allow_headers": [],
        "expose_headers": [],
        "max_age": 600,
    }


@pytest.fixture
async def cors() -> AsyncIterator[InProcess]:
    options = CORSSettings(
        allow_origins=["https://app.example"],
        allow_origin_regex=r"https://.*\.trusted\.example",
        allow_methods=["GET", "POST"],
        allow_headers=["x-custom"],
        max_age=60,
    )
    async for server in _served(Settings(cors_settings=options)):
        yield server


async def test_a_preflight_from_an_allowed_origin_is_answered(cors: InProcess) -> None:
    headers = {
        "origin": "https://app.example",
        "access-control-request-method": "POST",
        "access-control-request-headers": "content-type, x-custom",
    }
    async with cors.client() as client:
        answer = await client.options("/v2/models/echo/infer", headers=headers)
        regex = await client.options(
            "/v2/models/echo/infer", headers={**headers, "origin": "https://a.trusted.example"}
        )
    assert answer.status_code == 200
    assert answer.headers["access-control-allow-origin"] == "https://app.example"
    assert "POST" in answer.headers["access-control-allow-methods"]
    assert answer.headers["access-control-max-age"] == "60"
    assert (
        regex.status_code == 200
        and regex.headers["access-control-allow-origin"] == "https://a.trusted.example"
    )


async def test_a_refused_preflight_says_why_in_json(cors: InProcess) -> None:
    headers = {"origin": "https://evil.example", "access-control-request-method": "DELETE"}
    async with cors.client() as client:
        answer = await client.options("/v2/models/echo/infer", headers=headers)
    assert answer.status_code == 400 and answer.json() == {"error": "Disallowed CORS origin, method"}
    assert "access-control-allow-origin" not in answer.headers


async def test_cross_origin_requests_get_cors_headers_on_the_hot_path_and_elsewhere(cors: InProcess) -> None:
    async with cors.client() as client:
        infer = await client.post(
            "/v2/models/echo/infer", json=SMALL, headers={"origin": "https://app.example"}
        )
        ready = await client.get("/v2/health/ready", headers={"origin": "https://app.example"})
        other = await client.post(
            "/v2/models/echo/infer", json=SMALL, headers={"origin": "https://evil.example"}
        )
        same = await client.post("/v2/models/echo/infer", json=SMALL)
    assert infer.status_code == 200 and infer.headers["access-control-allow-origin"] == "https://app.example"
    assert ready.headers["access-control-allow-origin"] == "https://app.example"
    assert other.status_code == 200 and "access-control-allow-origin" not in other.headers
    assert "origin" in same.headers["vary"].lower()  # every answer may differ by origin


def test_only_requests_with_something_to_do_go_through_the_middleware() -> None:
    assert not wants_middleware([(b"host", b"h"), (b"accept-encoding", b"identity")], cors=False)
    assert wants_middleware([(b"accept-encoding", b"gzip, deflate")], cors=False)
    assert wants_middleware([(b"content-encoding", b"gzip")], cors=False)
    assert wants_middleware([], cors=True)


async def test_a_real_server_gzips_over_the_socket(example_server: Any) -> None:
    body = {"inputs": [{"name": "x", "shape": [1, 200], "datatype": "FP32", "data": [1.5] * 200}]}
    async with httpx.AsyncClient(base_url=example_server.http_url) as client:
        answer = await client.post("/v2/models/echo/infer", json=body, headers={"accept-encoding": "gzip"})
        sent = await client.post(
            "/v2/models/echo/infer",
            content=gzip.compress(json.dumps(body).encode()),
            headers={"content-encoding": "gzip", "content-type": "application/json"},
        )
    assert answer.status_code == 200 and answer.headers["content-encoding"] == "gzip"
    assert answer.json()["outputs"][0]["data"] == [1.5] * 200
    assert sent.status_code == 200 and sent.json()["outputs"][0]["data"] == [1.5] * 200
