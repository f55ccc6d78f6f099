"""MLflow's scoring routes (``runtime.frontends.mlflow.scoring``) in process, over real MLflow
models: every format ``mlflow models serve`` reads, its refusals, ``/health``, ``/version``, and
which model answers."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path
from typing import Any

import httpx
import pytest

from runtime.settings import ModelSettings, Settings
from tests.conftest import InProcess
from tests.mlflow.saved_models import IMPLEMENTATION, features

Models = tuple[Path, dict[str, Any]]

# saving the models with mlflow (once per session) takes a minute on a busy machine
pytestmark = pytest.mark.timeout(300)


def _settings(root: Path, name: str) -> ModelSettings:
    return ModelSettings(name=name, implementation=IMPLEMENTATION, parameters={"uri": str(root / name)})


@pytest.fixture
async def columns(mlflow_models: Models) -> Any:
    server = InProcess()
    await server.load(_settings(mlflow_models[0], "columns"))
    yield server
    await server.registry.unload_all()


async def _invoke(server: InProcess, body: Any, content_type: str = "application/json") -> httpx.Response:
    content = body if isinstance(body, (bytes, str)) else httpx.Request("POST", "/", json=body).content
    async with server.client() as client:
        return await client.post("/invocations", content=content, headers={"Content-Type": content_type})


async def test_every_format_answers_the_estimators_predictions(
    columns: InProcess, mlflow_models: Models
) -> None:
    frame = features(4, seed=7)
    expected = mlflow_models[1]["columns"].predict(frame).tolist()
    records = frame.to_dict(orient="records")
    bodies: list[tuple[Any, str]] = [
        ({"dataframe_split": frame.to_dict(orient="split")}, "application/json"),
        (
            {"dataframe_split": {"columns": list(frame.columns), "data": frame.to_numpy().tolist()}},
            "application/json",
        ),
        ({"dataframe_records": records}, "application/json; charset=utf-8"),
        ({"instances": records}, "application/json"),
        ({"inputs": frame.to_dict(orient="list")}, "application/json"),
        ({"inputs": frame.to_dict(orient="list"), "params": {"k": 2.0}}, "application/json"),
        (frame.to_csv(index=False), "text/csv"),
    ]
    for body, content_type in bodies:
        answer = await _invoke(columns, body, content_type)
        assert answer.status_code == 200, (body, answer.text)
        assert answer.json() == {"predictions": expected}, body


async def test_a_tensor_model_takes_rows(mlflow_models: Models) -> None:
    server = InProcess()
    await server.load(_settings(mlflow_models[0], "tensor"))
    array = features(3, seed=2).to_numpy()
    try:
        by_instances = await _invoke(server, {"instances": array.tolist()})
        by_inputs = await _invoke(server, {"inputs": array.tolist()})
        wrong = await _invoke(server, {"inputs": array[:, :2].tolist()})
    finally:
        await server.registry.unload_all()
    expected = {"predictions": mlflow_models[1]["tensor"].predict(array).tolist()}
    assert by_instances.json() == expected and by_inputs.json() == expected
    assert wrong.status_code == 400 and "[-1, 3]" in wrong.json()["message"]


async def test_a_dataframe_answer_is_a_list_of_records(mlflow_models: Models) -> None:
    server = InProcess()
    await server.load(_settings(mlflow_models[0], "scaled"))
    try:
        answer = await _invoke(
            server,
            {
                "dataframe_split": {"columns": ["a", "b"], "data": [[1, 1], [0.2, 0.2]]},
                "params": {"scale": 2},
            },
        )
    finally:
        await server.registry.unload_all()
    assert answer.json() == {"predictions": [{"y": 4.0, "label": "big"}, {"y": 0.8, "label": "small"}]}


@pytest.mark.parametrize(
    ("body", "content_type", "status", "message"),
    [
        ("a,b\n1,2", "text/plain", 415, "only supports the following content types"),
        ("{}", "application/json; charset=latin-1", 415, "only supports UTF-8"),
        ("{}", "application/json; format=pandas-split", 415, "Unrecognized content type parameters: format"),
        ([[1, 2, 3]], "application/json", 400, "Received a list"),
        ({"instances": [], "inputs": []}, "application/json", 400, "exactly one of the input fields"),
        ({"columns": ["a"], "data": [[1]]}, "application/json", 400, "exactly one of the input fields"),
        ({"instances": [[1.0, 2.0, 3]]}, "application/json", 400, "Model is missing inputs"),
        ("{not json", "application/json", 400, "valid JSON"),
        ({"dataframe_split": [[1]]}, "application/json", 400, "must be a dictionary"),
        ({"dataframe_records": [{"a": 1.0, "b": 2.0}]}, "application/json", 400, "expects input(s) ['c']"),
        (
            {"dataframe_records": [{"a": "x", "b": 2.0, "c": 1}]},
            "application/json",
            400,
            "Input 'a' must hold FP64",
        ),
        (
            {"dataframe_records": [{"a": 1.0, "b": 2.0, "c": 1, "d": 4}]},
            "application/json",
            400,
            "no input 'd'",
        ),
        ("a,b,c\nx,1,2\n", "text/csv", 400, "Input 'a' must hold FP64"),
    ],
)
async def test_refusals_have_mlflows_status_and_body(
    columns: InProcess, body: Any, content_type: str, status: int, message: str
) -> None:
    answer = await _invoke(columns, body, content_type)
    assert answer.status_code == status, answer.text
    document = answer.json()
    assert set(document) == {"error_code", "message"} and message in document["message"], document
    assert document["error_code"] == "BAD_REQUEST"


async def test_health_and_version_answer_as_mlflow_does(columns: InProcess) -> None:
    async with columns.client() as client:
        health = await client.get("/health")
        version = await client.get("/version")
        ping = await client.get("/ping")
    assert (health.status_code, health.text) == (200, "\n")
    assert (version.status_code, version.text) == (200, metadata.version("mlflow"))
    assert ping.status_code == 200


async def test_which_model_answers(mlflow_models: Models) -> None:
    root = mlflow_models[0]
    empty = InProcess()
    async with empty.client() as client:
        none = await client.post("/invocations", json={"inputs": [[1]]})
        unhealthy = await client.get("/health")
    assert none.status_code == 404 and "No model is loaded" in none.json()["message"]
    assert unhealthy.status_code == 404
    two = InProcess()
    await two.load(_settings(root, "columns"), _settings(root, "tensor"))
    chosen = InProcess(Settings(mlflow_model="tensor"))
    await chosen.load(_settings(root, "columns"), _settings(root, "tensor"))
    try:
        several = await _invoke(two, {"inputs": [[1.0, 2.0, 3.0]]})
        answered = await _invoke(chosen, {"inputs": [[1.0, 2.0, 3.0]]})
    finally:
        await two.registry.unload_all()
        await chosen.registry.unload_all()
    assert several.status_code == 404 and "mlflow_model" in several.json()["message"]
    assert answered.status_code == 200 and len(answered.json()["predictions"]) == 1


async def test_a_model_that_did_not_load_is_unavailable(mlflow_models: Models) -> None:
    server = InProcess()
    await server.load(_settings(mlflow_models[0], "broken"))
    answer = await _invoke(server, {"inputs": [[1.0, 2.0, 3.0]]})
    async with server.client() as client:
        health = await client.get("/health")
    assert answer.status_code == 503 and answer.json()["error_code"] == "TEMPORARILY_UNAVAILABLE"
    assert health.status_code == 503
