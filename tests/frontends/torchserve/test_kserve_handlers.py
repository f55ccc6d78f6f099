"""TorchServe handler models over KServe V1 and TorchServe's explanations: ``:predict`` as
TorchServe's KServe envelope serves it (each instance one row of the handler's batch, the
predictions the handler's answers), concurrent V1 calls merged by the adaptive batcher with one
``batchId`` per batch, ``/explanations`` and ``:explain`` through ``BaseHandler``'s
``explain_handle`` / ``get_insights``, and 501 for a model without an explainer."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

pytest.importorskip("ts", reason="the torchserve extra (pip install -e '.[torchserve]') is not installed")

from runtime.repository import read_repository
from runtime.settings import ModelSettings
from tests.conftest import InProcess
from tests.frontends.torchserve.test_rest_api import archive
from tests.models import zoo

pytestmark = pytest.mark.anyio

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "torchserve"
ROW = {"name": "x", "datatype": "FP32", "shape": [-1, 3]}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The archives, built once for the module (each test serves them afresh)."""
    store = tmp_path_factory.mktemp("store")
    archive(store, "summer", "explain_handler.py")
    archive(store, "batched", "explain_handler.py", "batchSize: 8\nmaxBatchDelay: 500\n")
    archive(store, "echo", "echo_handler.py")
    archive(store, "streamer", "stream_handler.py", fmt="no-archive")
    example = EXAMPLES / "stateful-sequence"
    # the seed's config, its handler in the server's process: worker processes are not what these
    # tests are about (tests/torchserve/test_management_archives.py and tests/workers are)
    config = (example / "model-config.yaml").read_text().replace("minWorkers: 2", "minWorkers: 0")
    archive(store, "stateful", str(example / "stateful_handler.py"), config)
    return store


@pytest.fixture
async def client(store: Path, inprocess: InProcess) -> AsyncIterator[httpx.AsyncClient]:
    found, broken = read_repository(store)
    assert not broken
    await inprocess.load(
        *found, ModelSettings(name="oip", implementation=zoo.Echo, inputs=[ROW], outputs=[ROW])
    )
    async with inprocess.client() as client:
        yield client


async def test_v1_predict_gives_the_handler_each_instance(client: httpx.AsyncClient) -> None:
    card = (await client.get("/v1/models/summer")).json()
    # KServe's answer, in the one body that serves OpenAI's clients too (id, object, owned_by)
    assert card["name"] == "summer" and card["ready"] is True and card["id"] == "summer"
    assert "summer" in (await client.get("/v1/models")).json()["models"]
    # a dict instance or a bare one: the handler gets each as it is, as under TorchServe's envelope
    body = {"instances": [{"data": [1, 2, 3]}, [4, 5]]}
    answer = await client.post("/v1/models/summer:predict", json=body)
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"predictions": [{"sum": 6.0, "batch": 2}, {"sum": 9.0, "batch": 2}]}
    # what a function handler gets: data[i] is the instance itself
    seen = await client.post(
        "/v1/models/echo:predict", json={"instances": [{"a": 1, "b": "x"}]}, headers={"x-k": "v"}
    )
    assert seen.status_code == 200, seen.text
    (text,) = seen.json()["predictions"]  # it returns JSON text: a string prediction, as in TorchServe
    prediction = json.loads(text)
    assert prediction["data"] == {"a": 1, "b": "x"} and prediction["headers"] == {"x-k": "v"}
    # a handler that streams answers once over V1: its last answer
    streamed = await client.post("/v1/models/streamer:predict", json={"instances": [{"data": "go"}]})
    assert streamed.status_code == 200, streamed.text
    assert streamed.json() == {"predictions": ["go-done"]}
    teapot = await client.post("/v1/models/streamer:predict", json={"instances": [{"data": "teapot"}]})
    assert teapot.status_code == 418 and teapot.json() == {"error": "I am a teapot"}


async def test_v1_on_a_sequence_model_makes_each_instance_a_sequence_of_one_step(
    client: httpx.AsyncClient,
) -> None:
    """V1 has no sequence ids: each instance starts and ends a sequence of its own, so none
    lingers (the model takes 4 open sequences at most)."""
    for _ in range(3):
        answer = await client.post(
            "/v1/models/stateful:predict", json={"instances": [{"data": 2}, {"data": 5}]}
        )
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"predictions": [2, 5]}


async def test_v1_errors_on_handler_models(client: httpx.AsyncClient) -> None:
    for body, message in (
        ({"instances": 3}, 'Expected "instances" to be a list'),
        ({"instances": []}, 'No instances in the request: "instances" is empty'),
        ({"nothing": 1}, 'Unrecognized request format: expected "instances" or "inputs"'),
    ):
        refused = await client.post("/v1/models/summer:predict", json=body)
        assert refused.status_code == 400 and refused.json() == {"error": message}
    failed = await client.post("/v1/models/summer:predict", json={"instances": [["not a number"]]})
    assert failed.status_code == 503 and failed.json() == {
        "error": "Prediction failed"
    }  # TorchServe's status
    assert (await client.post("/v1/models/summer:predict", json={"instances": [[1]]})).status_code == 200


async def test_concurrent_v1_calls_share_a_batch_and_its_batch_id(client: httpx.AsyncClient) -> None:
    calls = [client.post("/v1/models/batched:predict", json={"instances": [[i], [i, 1]]}) for i in range(4)]
    answers = [a.json() for a in await asyncio.gather(*calls)]
    for i, answer in enumerate(answers):  # each caller gets its own predictions, in order
        assert [p["sum"] for p in answer["predictions"]] == [i, i + 1]
        assert answer["message"] == ""
    assert len({a["batchId"] for a in answers}) == 1
    assert {p["batch"] for a in answers for p in a["predictions"]} == {8}  # 4 calls x 2 instances, one batch


async def test_explanations_rest_and_v1_explain(client: httpx.AsyncClient) -> None:
    explained = await client.post("/explanations/summer", json=[1, 3])
    assert explained.status_code == 200, explained.text
    assert explained.json() == [0.25, 0.75]
    versioned = await client.post("/explanations/summer/1.0", json=[1, 1])
    assert versioned.json() == [0.5, 0.5]
    predicted = await client.post("/predictions/summer", json=[1, 3])
    assert predicted.json() == {"sum": 4.0, "batch": 1}
    v1 = await client.post(
        "/v1/models/summer:explain", json={"instances": [{"data": [1, 3]}, {"data": [2, 2]}]}
    )
    assert v1.status_code == 200, v1.text
    assert v1.json() == {"explanations": [[0.25, 0.75], [0.5, 0.5]]}


async def test_explain_and_predict_never_share_a_batch(client: httpx.AsyncClient) -> None:
    """BaseHandler reads the explain header of a batch's first request only."""
    calls = [
        client.post("/v1/models/batched:explain", json={"instances": [[1, 3]]}),
        client.post("/v1/models/batched:predict", json={"instances": [[1, 3]]}),
        client.post("/explanations/batched", json=[1, 1]),
        client.post("/predictions/batched", json=[1, 1]),
    ]
    explain_v1, predict_v1, explain_rest, predict_rest = [a.json() for a in await asyncio.gather(*calls)]
    assert explain_v1["explanations"] == [[0.25, 0.75]]
    assert predict_v1["predictions"][0]["sum"] == 4.0
    assert explain_rest == [0.5, 0.5]
    assert predict_rest["sum"] == 2.0
    assert explain_v1["batchId"] != predict_v1["batchId"]


async def test_models_without_an_explainer(client: httpx.AsyncClient) -> None:
    oip = await client.post("/v1/models/oip:explain", json={"instances": [[1, 2, 3]]})
    assert oip.status_code == 501
    assert oip.json() == {"error": "Model oip has no explainer: explanations need a TorchServe handler model"}
    unknown = await client.post("/v1/models/nope:explain", json={"instances": [[1]]})
    assert unknown.status_code == 404 and unknown.json() == {"error": "Model with name nope does not exist."}
    rest = await client.post("/explanations/oip", json=[1])
    assert rest.status_code == 501 and rest.json()["type"] == "NotImplementedException"
    missing = await client.post("/explanations/nope", json=[1])
    assert missing.status_code == 404 and missing.json()["type"] == "ModelNotFoundException"
    # the OIP model still predicts over V1
    assert (await client.post("/v1/models/oip:predict", json={"instances": [[1, 2, 3]]})).status_code == 200
