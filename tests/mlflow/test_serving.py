"""MLflow models behind a real server process: worker processes with adaptive batching, tritonclient
on /v2 (the ``pd`` content type), MLflow's /invocations through the same batcher, and metrics."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.mlflow.saved_models import IMPLEMENTATION, features
from tests.servers import RunningServer, start_server

tritonclient_http = pytest.importorskip("tritonclient.http", reason="tritonclient[http] drives the server")

Models = tuple[Path, dict[str, Any]]

pytestmark = pytest.mark.timeout(400)


@pytest.fixture(scope="module")
def server(mlflow_models: Models, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """``columns`` in one worker process with adaptive batching, ``scaled`` in the server process."""
    root = tmp_path_factory.mktemp("mlflow-repository")
    for name in ("columns", "scaled"):
        shutil.copytree(mlflow_models[0] / name, root / name)
    (root / "columns" / "model-settings.json").write_text(
        json.dumps(
            {
                "name": "columns",
                "implementation": IMPLEMENTATION,
                "workers": 1,
                "max_batch_size": 16,
                "max_batch_time": 0.2,
                "worker_start_timeout": 300,
            }
        )
    )
    running = start_server(root, "--mlflow-model", "columns", timeout=300)
    yield running
    assert running.stop() == 0


def _infer(url: str, frame: Any) -> Any:
    client = tritonclient_http.InferenceServerClient(url)
    try:
        inputs = []
        for name, datatype in (("a", "FP64"), ("b", "FP64"), ("c", "INT64")):
            values = frame[name].to_numpy().reshape(-1, 1)
            inp = tritonclient_http.InferInput(name, list(values.shape), datatype)
            inp.set_data_from_numpy(values, binary_data=False)
            inputs.append(inp)
        result = client.infer("columns", inputs, parameters={"content_type": "pd"})
        return result.as_numpy("output-1"), result.get_response()
    finally:
        client.close()


def test_tritonclient_requests_are_batched_in_a_worker_and_split_back_exactly(
    server: RunningServer, mlflow_models: Models
) -> None:
    estimator = mlflow_models[1]["columns"]
    frames = [features(rows, seed=10 + rows) for rows in (1, 2, 3, 4, 5, 6)]
    with ThreadPoolExecutor(len(frames)) as pool:
        answers = list(pool.map(lambda f: _infer(server.http_address, f), frames))
    for frame, (labels, response) in zip(frames, answers, strict=True):
        assert labels.shape == (len(frame), 1)
        assert labels[:, 0].tolist() == estimator.predict(frame).tolist()
        assert response["model_name"] == "columns"
    assert max(r["parameters"]["batch_size"] for _, r in answers) > 1


def test_invocations_go_through_the_same_model_and_metrics_count_them(
    server: RunningServer, mlflow_models: Models
) -> None:
    estimator = mlflow_models[1]["columns"]
    frame = features(3, seed=42)
    with httpx.Client(base_url=server.http_url, timeout=60) as client:
        answer = client.post("/invocations", json={"dataframe_split": frame.to_dict(orient="split")})
        bad = client.post("/invocations", json={"dataframe_records": [{"a": "x", "b": 1.0, "c": 1}]})
        health, version = client.get("/health"), client.get("/version")
        scaled = client.post(
            "/v2/models/scaled/infer",
            json={
                "inputs": [
                    {"name": "a", "datatype": "FP64", "shape": [1], "data": [1.0]},
                    {"name": "b", "datatype": "FP64", "shape": [1], "data": [2.0]},
                ],
                "parameters": {"scale": 10},
            },
        )
        metrics = httpx.get(server.metrics_url).text
    assert answer.json() == {"predictions": estimator.predict(frame).tolist()}
    assert bad.status_code == 400 and bad.json()["error_code"] == "BAD_REQUEST"
    assert health.status_code == 200 and version.status_code == 200
    assert {o["name"]: o["data"] for o in scaled.json()["outputs"]}["y"] == [30.0]
    counted = [
        line
        for line in metrics.splitlines()
        if line.startswith("model_infer_request_success") and '"columns"' in line
    ]
    assert counted and float(counted[0].rsplit(" ", 1)[1]) >= 7
    assert np.isfinite(float(counted[0].rsplit(" ", 1)[1]))


def test_mlflows_own_scoring_client_is_answered(server: RunningServer, mlflow_models: Models) -> None:
    from mlflow.pyfunc.scoring_server.client import ScoringServerClient

    host, port = server.http_address.rsplit(":", 1)
    client = ScoringServerClient(host, int(port))  # type: ignore[no-untyped-call]
    client.wait_server_ready(timeout=30)  # type: ignore[no-untyped-call]
    frame = features(4, seed=9)
    predictions = client.invoke(frame).get_predictions()
    assert predictions.iloc[:, 0].tolist() == mlflow_models[1]["columns"].predict(frame).tolist()
    assert client.get_version() == metadata.version("mlflow")  # type: ignore[no-untyped-call]


def test_tritonclient_over_grpc_sends_columns_with_the_pd_content_type(
    server: RunningServer, mlflow_models: Models
) -> None:
    grpcclient = pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] drives the gRPC port")
    frame = features(3, seed=21)
    client = grpcclient.InferenceServerClient(server.grpc_address)
    try:
        inputs = []
        for name, datatype in (("a", "FP64"), ("b", "FP64"), ("c", "INT64")):
            values = frame[name].to_numpy()
            inp = grpcclient.InferInput(name, list(values.shape), datatype)
            inp.set_data_from_numpy(values)
            inputs.append(inp)
        result = client.infer("columns", inputs, parameters={"content_type": "pd"})
    finally:
        client.close()
    labels = result.as_numpy("output-1")
    assert labels.shape == (3, 1)
    assert labels[:, 0].tolist() == mlflow_models[1]["columns"].predict(frame).tolist()
