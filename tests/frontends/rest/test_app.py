"""The OIP REST API through the real Starlette app, in process: routes, errors, binary tensors."""

from __future__ import annotations

import asyncio
import re
import struct
from collections.abc import AsyncIterator
from typing import Any

import httpx
import numpy as np
import orjson
import pytest

from runtime.core.management_key import ManagementKey
from runtime.errors import Cancelled, PayloadTooLarge
from runtime.frontends.rest.app import read_request
from runtime.settings import ModelParameters, ModelSettings, Settings
from tests.conftest import InProcess
from tests.models import zoo

pytestmark = pytest.mark.anyio

TENSOR = {"name": "x", "shape": [2, 3], "datatype": "FP32", "data": [1, 2, 3, 4, 5, 6]}


@pytest.fixture
async def api(inprocess: InProcess) -> AsyncIterator[httpx.AsyncClient]:
    await inprocess.load(
        ModelSettings(name="echo", implementation=zoo.Echo),
        ModelSettings(
            name="typed",
            implementation=zoo.Echo,
            inputs=[{"name": "x", "datatype": "FP32", "shape": [-1, 3]}],
            outputs=[{"name": "x", "datatype": "FP32", "shape": [-1, 3]}],
        ),
        ModelSettings(name="raising", implementation=zoo.Raising),
        ModelSettings(name="wrong", implementation=zoo.WrongOutput),
        ModelSettings(name="broken", implementation=zoo.FailingLoad),
        ModelSettings(name="v", implementation=zoo.VersionTag, parameters=ModelParameters(version="1")),
        ModelSettings(name="v", implementation=zoo.VersionTag, parameters=ModelParameters(version="10")),
        ModelSettings(name="v", implementation=zoo.VersionTag, parameters=ModelParameters(version="2")),
    )
    async with inprocess.client() as client:
        yield client


async def test_health_and_server_metadata(api: httpx.AsyncClient, inprocess: InProcess) -> None:
    assert (await api.get("/v2/health/live")).status_code == 200
    # strict readiness: the model 'broken' failed to load, so the server is not ready
    assert (await api.get("/v2/health/ready")).status_code == 503
    key = ManagementKey("not-written")  # the key a server would give its DataPlane
    inprocess.dataplane.repository_key = key
    unload = await api.post(
        "/v2/repository/models/broken/unload", headers={"Authorization": f"Bearer {key.key}"}
    )
    assert unload.status_code == 200
    assert (await api.get("/v2/health/ready")).status_code == 200
    meta = (await api.get("/v2")).json()
    assert meta["name"] == "mlserver-like"
    assert "binary_tensor_data" in meta["extensions"]


async def test_model_metadata_and_versions(api: httpx.AsyncClient) -> None:
    meta = (await api.get("/v2/models/typed")).json()
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 3]}]
    versions = (await api.get("/v2/models/v")).json()["versions"]
    assert versions == ["1", "2", "10"]
    assert (await api.get("/v2/models/v/versions/2/ready")).status_code == 200
    body = {"inputs": [{"name": "a", "shape": [1], "datatype": "INT32", "data": [0]}]}
    default = (await api.post("/v2/models/v/infer", json=body)).json()
    assert default["model_version"] == "10" and default["outputs"][0]["data"] == ["10"]
    pinned = (await api.post("/v2/models/v/versions/2/infer", json=body)).json()
    assert pinned["outputs"][0]["data"] == ["2"]


async def test_triton_model_config(api: httpx.AsyncClient) -> None:
    config = (await api.get("/v2/models/typed/config")).json()
    assert config["name"] == "typed" and config["max_batch_size"] == 0
    assert config["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [-1, 3]}]
    assert (await api.get("/v2/models/nope/config")).status_code == 404


async def test_infer_json(api: httpx.AsyncClient) -> None:
    response = await api.post("/v2/models/echo/infer", json={"id": "r1", "inputs": [TENSOR]})
    assert response.status_code == 200
    body = response.json()
    assert body["id"] == "r1" and body["model_name"] == "echo"
    assert body["outputs"][0] == {**TENSOR, "data": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]}


async def test_body_is_parsed_whatever_its_content_type(api: httpx.AsyncClient) -> None:
    raw = orjson.dumps({"inputs": [TENSOR]})
    for content_type in (None, "text/plain", "application/octet-stream"):
        headers = {"content-type": content_type} if content_type else {}
        response = await api.post("/v2/models/echo/infer", content=raw, headers=headers)
        assert response.status_code == 200, response.text


async def test_requested_outputs_are_filtered(api: httpx.AsyncClient) -> None:
    y = {**TENSOR, "name": "y"}
    body = {"inputs": [TENSOR, y], "outputs": [{"name": "y"}]}
    outputs = (await api.post("/v2/models/echo/infer", json=body)).json()["outputs"]
    assert [o["name"] for o in outputs] == ["y"]
    body["outputs"] = [{"name": "zzz"}]
    response = await api.post("/v2/models/echo/infer", json=body)
    assert response.status_code == 400 and "zzz" in response.json()["error"]


def _binary_body(header: dict[str, Any], *parts: bytes) -> tuple[bytes, dict[str, str]]:
    head = orjson.dumps(header)
    return head + b"".join(parts), {"Inference-Header-Content-Length": str(len(head))}


async def test_binary_inputs_and_outputs(api: httpx.AsyncClient) -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    s = struct.pack("<I", 2) + b"hi" + struct.pack("<I", 0)
    header = {
        "inputs": [
            {"name": "x", "shape": [2, 3], "datatype": "FP32", "parameters": {"binary_data_size": x.nbytes}},
            {"name": "s", "shape": [2], "datatype": "BYTES", "parameters": {"binary_data_size": len(s)}},
            {"name": "j", "shape": [1], "datatype": "INT64", "data": [7]},
        ],
        "outputs": [{"name": "x", "parameters": {"binary_data": True}}, {"name": "s"}, {"name": "j"}],
    }
    body, headers = _binary_body(header, x.tobytes(), s)
    response = await api.post("/v2/models/echo/infer", content=body, headers=headers)
    assert response.status_code == 200, response.text
    size = int(response.headers["inference-header-content-length"])
    doc = orjson.loads(response.content[:size])
    out_x, out_s, out_j = doc["outputs"]
    assert out_x["parameters"]["binary_data_size"] == x.nbytes and "data" not in out_x
    np.testing.assert_array_equal(np.frombuffer(response.content[size:], dtype=np.float32).reshape(2, 3), x)
    assert out_s["data"] == ["hi", ""] and out_j["data"] == [7]


async def test_binary_data_output_for_all(api: httpx.AsyncClient) -> None:
    body = {"inputs": [TENSOR], "parameters": {"binary_data_output": True}}
    response = await api.post("/v2/models/echo/infer", json=body)
    size = int(response.headers["inference-header-content-length"])
    assert np.frombuffer(response.content[size:], dtype=np.float32).tolist() == [1, 2, 3, 4, 5, 6]


async def test_whole_body_raw_input(api: httpx.AsyncClient) -> None:
    x = np.arange(9, dtype=np.float32)
    response = await api.post(
        "/v2/models/typed/infer", content=x.tobytes(), headers={"Inference-Header-Content-Length": "0"}
    )
    assert response.status_code == 200, response.text
    out = response.json()["outputs"][0]
    assert out["shape"] == [3, 3] and out["data"] == x.tolist()


BAD_REQUESTS = [
    ("echo", b"{not json", {}, 400, "Malformed JSON|Invalid JSON"),
    ("echo", b"[1, 2]", {}, 400, "Invalid request"),
    (
        "echo",
        b'{"inputs": [{"name": "x", "shape": [3], "datatype": "FP32", "data": [1]}]}',
        {},
        400,
        "3 elements",
    ),
    (
        "echo",
        b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP128", "data": [1]}]}',
        {},
        400,
        "datatype",
    ),
    ("echo", b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32"}]}', {}, 400, "no data"),
    (
        "typed",
        b'{"inputs": [{"name": "y", "shape": [1, 3], "datatype": "FP32", "data": [1,2,3]}]}',
        {},
        400,
        "no input 'y'",
    ),
    (
        "typed",
        b'{"inputs": [{"name": "x", "shape": [1, 3], "datatype": "INT32", "data": [1,2,3]}]}',
        {},
        400,
        "must be FP32",
    ),
    (
        "typed",
        b'{"inputs": [{"name": "x", "shape": [3, 1], "datatype": "FP32", "data": [1,2,3]}]}',
        {},
        400,
        "must have shape",
    ),
    ("echo", b'{"inputs": []}xx', {"Inference-Header-Content-Length": "14"}, 400, "binary bytes"),
    ("echo", b"{}", {"Inference-Header-Content-Length": "99"}, 400, "Inference-Header-Content-Length"),
    ("nope", b"{}", {}, 404, "not found"),
    ("raising", b'{"inputs": []}', {}, 500, "ValueError: the model broke"),
    ("wrong", b'{"inputs": []}', {}, 500, "3 elements"),
    ("broken", b'{"inputs": []}', {}, 503, "corrupt"),
]


@pytest.mark.parametrize(("model", "body", "headers", "status", "message"), BAD_REQUESTS)
async def test_errors_are_json_with_the_right_status(
    api: httpx.AsyncClient, model: str, body: bytes, headers: dict[str, str], status: int, message: str
) -> None:
    response = await api.post(f"/v2/models/{model}/infer", content=body, headers=headers)
    assert response.status_code == status
    assert response.headers["content-type"] == "application/json"
    assert re.search(message, response.json()["error"]), response.json()
    assert (await api.get("/v2/health/live")).status_code == 200
    assert (await api.get("/v2/models/echo/ready")).status_code == 200


async def test_unknown_routes_and_methods_answer_json(api: httpx.AsyncClient) -> None:
    response = await api.get("/v3/nothing")
    assert response.status_code == 404 and "error" in response.json()
    response = await api.get("/v2/models/echo/infer")
    assert response.status_code == 405 and "error" in response.json()


async def test_failed_model_reports_why_and_others_serve(api: httpx.AsyncClient) -> None:
    response = await api.get("/v2/models/broken/ready")
    assert response.status_code == 503 and "weights file is corrupt" in response.json()["error"]
    assert (await api.get("/v2/models/echo/ready")).status_code == 200
    assert (await api.get("/v2/health/ready")).status_code == 503  # strict readiness
    assert (await api.get("/v2/models/nope/ready")).status_code == 404


async def test_body_over_the_limit_is_413() -> None:
    server = InProcess(Settings(max_request_size=1000))
    await server.load(ModelSettings(name="echo", implementation=zoo.Echo))
    async with server.client() as client:
        data = {"inputs": [{"name": "x", "shape": [500], "datatype": "FP32", "data": [0.5] * 500}]}
        response = await client.post("/v2/models/echo/infer", json=data)
        assert response.status_code == 413 and "limit" in response.json()["error"]
        assert (await client.get("/v2/health/ready")).status_code == 200


def test_read_request_reads_the_headers_once_and_the_body_under_its_limit() -> None:
    def receiving(*messages: dict[str, Any]) -> Any:
        queue = list(messages)

        async def receive() -> dict[str, Any]:
            return queue.pop(0)

        return receive

    headers = [
        (b"content-length", b"5"),
        (b"content-length", b"999"),  # the first of each counts, as Starlette's Headers.get finds it
        (b"inference-header-content-length", b"3"),
        (b"ts_request_sequence_id", b"s1"),
        (b"sequence_step", b"2"),
    ]
    chunks = receiving(
        {"type": "http.request", "body": b"ab", "more_body": True},
        {"type": "http.request", "body": b"cde"},
    )
    read = asyncio.run(read_request({"headers": headers}, chunks, 10))
    assert read == (b"abcde", "3", [("ts_request_sequence_id", "s1"), ("sequence_step", "2")])
    plain = asyncio.run(read_request({"headers": []}, receiving({"type": "http.request", "body": b"{}"}), 10))
    assert plain == (b"{}", None, None)
    with pytest.raises(PayloadTooLarge, match="11 bytes"):  # refused before reading
        asyncio.run(read_request({"headers": [(b"content-length", b"11")]}, receiving(), 10))
    with pytest.raises(PayloadTooLarge, match="over the limit"):
        asyncio.run(read_request({"headers": []}, receiving({"type": "http.request", "body": b"x" * 11}), 10))
    with pytest.raises(Cancelled):
        asyncio.run(read_request({"headers": []}, receiving({"type": "http.disconnect"}), 10))
