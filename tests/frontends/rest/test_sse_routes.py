"""The REST streaming and generate routes (``runtime.frontends.rest.sse_routes``) in process:
infer_stream, generate, generate_stream (events, errors, bodies)."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest
from httpx_sse import ServerSentEvent, aconnect_sse

from runtime.settings import ModelSettings
from tests.conftest import InProcess
from tests.stream_models import Counter, Words

pytestmark = pytest.mark.anyio

COUNTER = ModelSettings(
    name="counter",
    implementation=Counter,
    inputs=[{"name": "n", "datatype": "INT32", "shape": [1]}],
    parameters={"version": "3"},
    require_declared_inputs=True,
)
WORDS = ModelSettings(name="words", implementation=Words)
PROMPTED = ModelSettings(
    name="prompted",
    implementation=Words,
    inputs=[{"name": "prompt", "datatype": "BYTES", "shape": [-1, 1]}],
    parameters={"extra": {"input": "prompt", "output": "completion"}},
    generate={"text_input": "prompt", "text_output": "completion"},
)


def counter_body(n: int, **extra: Any) -> dict[str, Any]:
    return {"inputs": [{"name": "n", "shape": [1], "datatype": "INT32", "data": [n]}], **extra}


@pytest.fixture
async def client(inprocess: InProcess) -> Any:
    await inprocess.load(COUNTER, WORDS, PROMPTED)
    async with inprocess.client() as client:
        yield client


async def stream(client: httpx.AsyncClient, path: str, body: Any) -> tuple[int, Any]:
    """(status, events) for an event stream, (status, JSON) for anything else."""
    async with aconnect_sse(client, "POST", path, json=body) as source:
        response = source.response
        if response.headers["content-type"].startswith("text/event-stream"):
            return response.status_code, [event async for event in source.aiter_sse()]
        await response.aread()
        return response.status_code, response.json()


def data(events: list[ServerSentEvent]) -> list[Any]:
    return [orjson.loads(event.data) for event in events]


async def test_infer_stream_sends_one_event_per_response_in_order(client: httpx.AsyncClient) -> None:
    status, events = await stream(client, "/v2/models/counter/infer_stream", counter_body(6, id="abc"))
    assert status == 200
    assert [event.event for event in events] == ["message"] * 6
    docs = data(events)
    assert [doc["outputs"][0]["data"] for doc in docs] == [[i] for i in range(6)]
    assert {(doc["id"], doc["model_name"], doc["model_version"]) for doc in docs} == {("abc", "counter", "3")}


async def test_infer_stream_on_a_versioned_route(client: httpx.AsyncClient) -> None:
    status, events = await stream(client, "/v2/models/counter/versions/3/infer_stream", counter_body(2))
    assert status == 200 and len(events) == 2
    status, body = await stream(client, "/v2/models/counter/versions/9/infer_stream", counter_body(2))
    assert status == 404 and "version '9'" in body["error"]


async def test_an_empty_stream_is_a_200_without_events(client: httpx.AsyncClient) -> None:
    assert await stream(client, "/v2/models/counter/infer_stream", counter_body(0)) == (200, [])


async def test_a_failure_mid_stream_is_an_error_event_that_ends_it(client: httpx.AsyncClient) -> None:
    body = {"text_input": "one two three four", "parameters": {"fail_after": 2}}
    status, events = await stream(client, "/v2/models/words/generate_stream", body)
    assert status == 200
    assert [event.event for event in events] == ["message", "message", "error"]
    assert [doc.get("text_output") for doc in data(events)[:2]] == ["one", "two"]
    assert data(events)[2] == {"error": "Model 'words' failed: RuntimeError: broke after 2 words"}


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        ("/v2/models/nope/infer_stream", counter_body(1), 404, "Model 'nope' not found"),
        ("/v2/models/nope/generate_stream", {"text_input": "x"}, 404, "Model 'nope' not found"),
        ("/v2/models/counter/infer_stream", {"inputs": [{"name": "n"}]}, 400, "inputs.0.shape"),
        ("/v2/models/counter/infer_stream", counter_body(1) | {"inputs": []}, 400, "expects input(s) ['n']"),
        (
            "/v2/models/counter/infer_stream",
            {"inputs": [{"name": "n", "shape": [1], "datatype": "FP32", "data": [1]}]},
            400,
            "must be INT32",
        ),
        (
            "/v2/models/words/generate_stream",
            {"text_input": "x", "parameters": {"reject": 1}},
            400,
            "rejected",
        ),
        ("/v2/models/words/generate_stream", {"text_input": 3}, 400, "text_input"),
        ("/v2/models/words/generate_stream", {"text": "x"}, 400, "needs text_input"),
        (
            "/v2/models/words/generate_stream",
            {"text_input": "x", "parameters": {"max_tokens": 0}},
            400,
            "max_tokens",
        ),
        (
            "/v2/models/words/generate",
            {"text_input": "x", "parameters": {"temperature": -1}},
            400,
            "temperature",
        ),
        ("/v2/models/words/generate", [1, 2], 400, "needs text_input"),
    ],
)
async def test_errors_before_the_first_event_are_json_errors_with_a_status(
    client: httpx.AsyncClient, path: str, body: Any, status: int, message: str
) -> None:
    got_status, got = await stream(client, path, body)
    assert got_status == status
    assert message in got["error"]


async def test_malformed_json_is_a_400(client: httpx.AsyncClient) -> None:
    for path in ("infer_stream", "generate", "generate_stream"):
        response = await client.post(f"/v2/models/words/{path}", content=b"{nope")
        assert response.status_code == 400 and "JSON" in response.json()["error"]


async def test_generate_stream_streams_text_pieces_with_details_only_when_asked(
    client: httpx.AsyncClient,
) -> None:
    status, events = await stream(client, "/v2/models/words/generate_stream", {"text_input": "the quick fox"})
    assert status == 200
    assert data(events) == [
        {"text_output": "the", "model_name": "words"},
        {"text_output": "quick", "model_name": "words"},
        {"text_output": "fox", "model_name": "words"},
    ]
    body = {"text_input": "the quick fox", "parameters": {"details": True}}
    _, events = await stream(client, "/v2/models/words/generate_stream", body)
    assert data(events)[-1]["details"] == {"tokens": 1, "finish_reason": "length"}
    assert all("details" not in doc for doc in data(events)[:-1])


async def test_generate_answers_a_generate_body(client: httpx.AsyncClient) -> None:
    response = await client.post("/v2/models/words/generate", json={"text_input": "a b  c", "id": "g1"})
    assert response.status_code == 200
    assert response.json() == {"text_output": "a b c", "model_name": "words"}
    response = await client.post(
        "/v2/models/words/generate", json={"text_input": "a b", "parameters": {"details": True, "seed": 3}}
    )
    assert response.json()["details"] == {"tokens": 1, "finish_reason": "length"}


async def test_generate_names_follow_the_model_settings(client: httpx.AsyncClient) -> None:
    response = await client.post("/v2/models/prompted/generate", json={"text_input": "x y"})
    assert response.status_code == 200, response.text
    assert response.json() == {"text_output": "x y", "model_name": "prompted"}
    _, events = await stream(client, "/v2/models/prompted/generate_stream", {"text_input": "x y"})
    assert [doc["text_output"] for doc in data(events)] == ["x", "y"]


async def test_generate_and_generate_stream_accept_a_tensor_body(client: httpx.AsyncClient) -> None:
    tensor = {
        "id": "t1",
        "inputs": [{"name": "text_input", "shape": [1], "datatype": "BYTES", "data": ["red green"]}],
    }
    response = await client.post("/v2/models/words/generate", json=tensor)
    assert response.status_code == 200
    doc = response.json()
    assert doc["id"] == "t1" and doc["outputs"][0]["name"] == "text_output"
    assert doc["outputs"][0]["data"] == ["red green"]
    status, events = await stream(client, "/v2/models/words/generate_stream", tensor)
    assert status == 200
    assert [(d["id"], d["outputs"][0]["data"]) for d in data(events)] == [("t1", ["red"]), ("t1", ["green"])]


async def test_generate_accepts_binary_tensor_data(client: httpx.AsyncClient) -> None:
    text = b"binary words"
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "text_input",
                    "shape": [1],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": 4 + len(text)},
                }
            ]
        }
    )
    payload = header + len(text).to_bytes(4, "little") + text
    response = await client.post(
        "/v2/models/words/generate",
        content=payload,
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == ["binary words"]


async def test_server_metadata_lists_the_generate_extension(client: httpx.AsyncClient) -> None:
    assert "generate" in (await client.get("/v2")).json()["extensions"]
