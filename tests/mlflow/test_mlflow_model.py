"""``runtime.mlflow.MLflowModel`` served in process: metadata from the signature, the ``pd``
content type both ways, params, MLServer's answer names and shapes, bad input as a 400 naming the
input, a folder that does not load as an unavailable model with the reason."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from runtime.settings import ModelSettings
from runtime.types import InferenceRequest, RequestInput
from tests.conftest import InProcess
from tests.mlflow.saved_models import IMPLEMENTATION, features

Models = tuple[Path, dict[str, Any]]

# saving the models with mlflow (once per session) takes a minute on a busy machine
pytestmark = pytest.mark.timeout(300)


def _settings(root: Path, name: str, **extra: Any) -> ModelSettings:
    return ModelSettings(
        name=name, implementation=IMPLEMENTATION, parameters={"uri": str(root / name)}, **extra
    )


@pytest.fixture
async def served(mlflow_models: Models) -> Any:
    root, _ = mlflow_models
    server = InProcess()
    await server.load(*(_settings(root, name) for name in ("columns", "tensor", "scaled", "nosig", "broken")))
    yield server
    await server.registry.unload_all()


def _columns(frame: Any, **parameters: Any) -> dict[str, Any]:
    inputs = [
        {"name": "a", "datatype": "FP64", "shape": [len(frame)], "data": frame.a.tolist()},
        {"name": "b", "datatype": "FP64", "shape": [len(frame), 1], "data": frame.b.tolist()},
        {"name": "c", "datatype": "INT64", "shape": [len(frame)], "data": frame.c.tolist()},
    ]
    return {"inputs": inputs, "parameters": parameters} if parameters else {"inputs": inputs}


async def test_the_signature_is_the_metadata_and_a_column_signature_means_pd(served: InProcess) -> None:
    async with served.client() as client:
        meta = (await client.get("/v2/models/columns")).json()
        tensor = (await client.get("/v2/models/tensor")).json()
    assert [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]] == [
        ("a", "FP64", [-1, 1]),
        ("b", "FP64", [-1, 1]),
        ("c", "INT64", [-1, 1]),
    ]
    assert meta["parameters"]["content_type"] == "pd"
    assert meta["outputs"] == [
        {"name": "output-1", "datatype": "INT64", "shape": [-1], "parameters": {"content_type": "np"}}
    ]
    assert tensor["inputs"][0]["name"] == "input-0" and tensor["inputs"][0]["shape"] == [-1, 3]
    assert tensor["parameters"]["content_type"] == "np"


async def test_columns_answer_as_mlserver_does(served: InProcess, mlflow_models: Models) -> None:
    estimator = mlflow_models[1]["columns"]
    frame = features(5, seed=3)
    async with served.client() as client:
        answer = await client.post("/v2/models/columns/infer", json=_columns(frame))
    assert answer.status_code == 200, answer.text
    (output,) = answer.json()["outputs"]
    assert (output["name"], output["datatype"], output["shape"]) == ("output-1", "INT64", [5, 1])
    assert output["data"] == estimator.predict(frame).tolist()


async def test_skops_and_cloudpickle_files_both_load(served: InProcess, mlflow_models: Models) -> None:
    root, estimators = mlflow_models
    assert (root / "columns" / "model.skops").is_file() and (root / "tensor" / "model.pkl").is_file()
    array = features(4, seed=5).to_numpy()
    body = {
        "inputs": [{"name": "x", "datatype": "FP64", "shape": [4, 3], "data": array.reshape(-1).tolist()}]
    }
    async with served.client() as client:
        answer = await client.post("/v2/models/tensor/infer", json=body)
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs"][0]["data"] == estimators["tensor"].predict(array).tolist()


async def test_params_come_from_request_parameters_and_a_dataframe_answers_one_output_per_column(
    served: InProcess,
) -> None:
    body: dict[str, Any] = {
        "inputs": [
            {"name": "a", "datatype": "FP64", "shape": [2], "data": [1.0, 0.25]},
            {"name": "b", "datatype": "FP64", "shape": [2], "data": [1.0, 0.25]},
        ]
    }
    async with served.client() as client:
        plain = (await client.post("/v2/models/scaled/infer", json=body)).json()
        body["parameters"] = {"scale": 3.0}
        scaled = (await client.post("/v2/models/scaled/infer", json=body)).json()
    assert plain["parameters"]["content_type"] == "pd"
    by_name = {out["name"]: out for out in scaled["outputs"]}
    assert by_name["y"]["data"] == [6.0, 1.5] and by_name["y"]["shape"] == [2, 1]
    assert by_name["label"]["datatype"] == "BYTES" and by_name["label"]["data"] == ["big", "big"]
    assert {out["name"]: out["data"] for out in plain["outputs"]}["label"] == ["big", "small"]


@pytest.mark.parametrize(
    ("name", "inputs", "message"),
    [
        ("columns", [{"name": "zz", "datatype": "FP64", "shape": [1], "data": [1.0]}], "has no input 'zz'"),
        (
            "columns",
            [{"name": "a", "datatype": "BYTES", "shape": [1], "data": ["x"]}],
            "Input 'a' must hold numbers",
        ),
        (
            "columns",
            [
                {"name": "a", "datatype": "FP64", "shape": [1], "data": [1.0]},
                {"name": "b", "datatype": "FP64", "shape": [1], "data": [1.0]},
            ],
            "expects input(s) ['c']",
        ),
        (
            "columns",
            [
                {"name": "a", "datatype": "FP64", "shape": [1], "data": [1.0]},
                {"name": "b", "datatype": "FP64", "shape": [1], "data": [1.0]},
                {"name": "c", "datatype": "FP64", "shape": [1], "data": [1.5]},
            ],
            "Input 'c' must be INT64 (long)",
        ),
        ("tensor", [{"name": "x", "datatype": "FP64", "shape": [1, 4], "data": [1, 2, 3, 4]}], "[-1, 3]"),
        ("tensor", [{"name": "x", "datatype": "BYTES", "shape": [1, 3], "data": ["1", "2", "3"]}], "numbers"),
    ],
)
async def test_bad_input_is_a_400_naming_the_input(
    served: InProcess, name: str, inputs: list[dict[str, Any]], message: str
) -> None:
    async with served.client() as client:
        answer = await client.post(f"/v2/models/{name}/infer", json={"inputs": inputs})
    assert answer.status_code == 400
    assert message in answer.json()["error"], answer.json()


async def test_a_narrower_number_is_converted_without_loss(served: InProcess) -> None:
    frame = features(2)
    body = _columns(frame)
    body["inputs"][2]["datatype"] = "INT32"
    async with served.client() as client:
        answer = await client.post("/v2/models/columns/infer", json=body)
    assert answer.status_code == 200, answer.text


async def test_a_folder_that_does_not_load_is_unavailable_with_the_reason(served: InProcess) -> None:
    async with served.client() as client:
        index = (await client.post("/v2/repository/index", json={})).json()
        answer = await client.post("/v2/models/broken/infer", json={"inputs": []})
    broken = next(item for item in index if item["name"] == "broken")
    assert broken["state"] == "UNAVAILABLE" and "UnpicklingError" in broken["reason"]
    assert "could not load the MLflow model in" in broken["reason"]
    assert answer.status_code == 503 and "broken" in answer.json()["error"]


async def test_no_mlmodel_file_is_unavailable_naming_it(tmp_path: Path) -> None:
    server = InProcess()
    await server.load(
        ModelSettings(name="empty", implementation=IMPLEMENTATION, parameters={"uri": str(tmp_path)})
    )
    (entry,) = server.registry.entries()
    assert entry.state.value == "UNAVAILABLE" and "no MLmodel file" in entry.reason


async def test_adaptive_batching_merges_pd_requests_and_splits_them_back(mlflow_models: Models) -> None:
    root, estimators = mlflow_models
    server = InProcess()
    await server.load(_settings(root, "columns", max_batch_size=8, max_batch_time=0.5))
    frames = [features(rows, seed=rows) for rows in (1, 2, 3)]
    try:
        async with server.client() as client:
            answers = await asyncio.gather(
                *(
                    client.post("/v2/models/columns/infer", json=_columns(f, content_type="pd"))
                    for f in frames
                )
            )
    finally:
        await server.registry.unload_all()
    for frame, answer in zip(frames, answers, strict=True):
        body = answer.json()
        assert body["outputs"][0]["data"] == estimators["columns"].predict(frame).tolist()
        assert body["outputs"][0]["shape"] == [len(frame), 1]
    assert {a.json()["parameters"].get("batch_size") for a in answers} != {None}


def test_mlflow_and_pandas_are_imported_only_when_such_a_model_loads() -> None:
    import subprocess
    import sys

    code = (
        "import sys, runtime, runtime.server.serving, runtime.server.rest_app, runtime.mlflow, runtime.codecs; "
        "print(sorted(m for m in ('mlflow', 'pandas', 'sklearn') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout.strip() == "[]"


def test_the_request_input_models_are_plain(served: InProcess) -> None:
    assert RequestInput(name="a", shape=[1], datatype="FP64", data=np.zeros(1)).name == "a"
    assert InferenceRequest(inputs=[]).inputs == []


async def test_what_mlflow_refuses_is_a_400_and_what_the_model_raises_a_500(served: InProcess) -> None:
    def body(scale: Any) -> dict[str, Any]:
        inputs = [{"name": n, "datatype": "FP64", "shape": [1], "data": [1.0]} for n in ("a", "b")]
        return {"inputs": inputs, "parameters": {"scale": scale}}

    nosig = {"inputs": [{"name": "x", "datatype": "FP64", "shape": [1, 2], "data": [1.0, 2.0]}]}
    async with served.client() as client:
        refused = await client.post("/v2/models/scaled/infer", json=body("zz"))
        failed = await client.post("/v2/models/scaled/infer", json=body(-1.0))
        features_wrong = await client.post("/v2/models/nosig/infer", json=nosig)
        meta = (await client.get("/v2/models/nosig")).json()
    assert refused.status_code == 400
    assert (
        "does not fit the signature of model 'scaled'" in refused.json()["error"]
        and "scale" in refused.json()["error"]
    )
    assert failed.status_code == 500 and "scale must not be negative" in failed.json()["error"]
    assert features_wrong.status_code == 400
    assert "Model 'nosig' cannot take input(s) ['x']" in features_wrong.json()["error"]
    assert "features" in features_wrong.json()["error"]
    assert (meta["inputs"] == [] and "parameters" not in meta) or meta["parameters"].get(
        "content_type"
    ) is None
