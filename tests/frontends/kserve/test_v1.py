"""KServe V1 on the main REST port, driven as a KServe V1 client does (plain httpx JSON): model list
and readiness, instances and inputs mapped onto the declared tensors, KServe's error body, and
concurrent calls merged by the adaptive batcher, each answer carrying its batch's batchId."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from runtime.settings import ModelSettings
from tests.conftest import InProcess
from tests.models import zoo

pytestmark = pytest.mark.anyio

ROW = {"name": "x", "datatype": "FP32", "shape": [-1, 3]}


@pytest.fixture
async def v1(inprocess: InProcess) -> AsyncIterator[httpx.AsyncClient]:
    await inprocess.load(
        ModelSettings(name="echo", implementation=zoo.Echo, inputs=[ROW], outputs=[ROW]),
        ModelSettings(
            name="pair",
            implementation=zoo.Echo,
            inputs=[ROW, {"name": "w", "datatype": "BYTES", "shape": [-1]}],
        ),
        ModelSettings(
            name="batched",
            implementation=zoo.Echo,
            inputs=[ROW],
            max_batch_size=8,
            max_batch_time=0.5,  # KServe's maxLatency; the batch leaves when 8 requests are in
        ),
        ModelSettings(name="raising", implementation=zoo.Raising),
    )
    async with inprocess.client() as client:
        yield client


async def test_models_and_readiness(v1: httpx.AsyncClient) -> None:
    models = (await v1.get("/v1/models")).json()["models"]
    assert {"echo", "pair", "batched", "raising"} <= set(models)
    # one answer for KServe's clients (name, ready) and OpenAI's (id, object, created, owned_by)
    echo = (await v1.get("/v1/models/echo")).json()
    assert echo == {
        "name": "echo",
        "ready": True,
        "id": "echo",
        "object": "model",
        "created": echo["created"],
        "owned_by": "mlserver-like",
    }
    listed = (await v1.get("/v1/models")).json()
    assert listed["object"] == "list" and [card["id"] for card in listed["data"]] == listed["models"]
    missing = await v1.get("/v1/models/nope")
    assert missing.status_code == 404
    assert missing.json() == {"error": "Model with name nope does not exist."}


async def test_instances_and_inputs_map_onto_declared_tensors(v1: httpx.AsyncClient) -> None:
    rows = [[1, 2, 3], [4, 5, 6]]
    answer = await v1.post("/v1/models/echo:predict", json={"instances": rows})
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"predictions": [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]}
    columns = await v1.post("/v1/models/echo:predict", json={"inputs": rows})
    assert columns.json()["predictions"] == [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
    pair = await v1.post(
        "/v1/models/pair:predict",
        json={"instances": [{"x": [1, 2, 3], "w": "a"}, {"x": [0, 0, 1], "w": "b"}]},
    )
    assert pair.json()["predictions"] == [{"x": [1.0, 2.0, 3.0], "w": "a"}, {"x": [0.0, 0.0, 1.0], "w": "b"}]


async def test_kserve_error_bodies(v1: httpx.AsyncClient) -> None:
    unknown = await v1.post("/v1/models/nope:predict", json={"instances": [[1, 2, 3]]})
    assert unknown.status_code == 404 and unknown.json() == {"error": "Model with name nope does not exist."}
    not_list = await v1.post("/v1/models/echo:predict", json={"instances": 3})
    assert not_list.status_code == 400 and not_list.json() == {"error": 'Expected "instances" to be a list'}
    bad_json = await v1.post("/v1/models/echo:predict", content=b"{nope")
    assert bad_json.status_code == 400 and bad_json.json()["error"].startswith("Unrecognized request format")
    wrong_shape = await v1.post("/v1/models/echo:predict", json={"instances": [[1, 2]]})
    assert wrong_shape.status_code == 400
    raised = await v1.post("/v1/models/raising:predict", json={"instances": [1]})
    assert raised.status_code == 500 and "error" in raised.json()
    assert (await v1.get("/v1/models/echo")).status_code == 200


async def test_concurrent_calls_share_a_batch_id(v1: httpx.AsyncClient) -> None:
    """Eight concurrent calls fill one batch (max_batch_size 8): one batchId, each its own rows."""
    calls = [v1.post("/v1/models/batched:predict", json={"instances": [[i, i, i]]}) for i in range(8)]
    answers = [r.json() for r in await asyncio.gather(*calls)]
    assert {a["batchId"] for a in answers} == {answers[0]["batchId"]}
    assert len(answers[0]["batchId"]) == 36  # a uuid, as KServe's batcher answers
    assert [a["predictions"] for a in answers] == [[[float(i)] * 3] for i in range(8)]
    assert all(a["message"] == "" for a in answers)
    later = (await v1.post("/v1/models/batched:predict", json={"instances": [[9, 9, 9]]})).json()
    assert later["batchId"] != answers[0]["batchId"]
