"""The tabular runtimes on the whole core, through real servers and real clients (httpx, tritonclient):
KServe's variables with no model-settings.json, adaptive batching, worker processes, metrics, the
repository API and the management API's register."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml

from runtime.repository import IMPLEMENTATION_ALIASES, import_model_class
from runtime.settings import ModelSettings
from tests.conftest import ROOT
from tests.frontends.management.test_api import Admin
from tests.servers import RunningServer, launch_server, start_server, start_servers
from tests.tabular_models import (
    data,
    lightgbm_booster,
    onnx_graph,
    outputs_of,
    rows_body,
    sklearn_classifier,
    xgboost_classifier,
)

pytest.importorskip("sklearn", reason="the [sklearn] extra is not installed")
pytest.importorskip("xgboost", reason="the [xgboost] extra is not installed")
pytest.importorskip("lightgbm", reason="the [lightgbm] extra is not installed")
pytest.importorskip("onnxruntime", reason="the [onnx] extra is not installed")

FORMATS = ROOT / "deploy" / "kserve" / "mlserver-formats.yaml"
RUNTIME = ROOT / "deploy" / "kserve" / "servingruntime.yaml"


def inference_services() -> dict[str, dict[str, Any]]:
    """The example InferenceServices by model format."""
    found = {}
    for document in yaml.safe_load_all(FORMATS.read_text()):
        if document:
            found[document["spec"]["predictor"]["model"]["modelFormat"]["name"]] = document
    return found


def test_every_mlserver_format_is_listed_with_a_class_that_resolves() -> None:
    (runtime,) = [d for d in yaml.safe_load_all(RUNTIME.read_text()) if d]
    listed = {entry["name"] for entry in runtime["spec"]["supportedModelFormats"]}
    services = inference_services()
    assert {"sklearn", "xgboost", "lightgbm", "mlflow", "onnx"} <= listed
    assert set(services) == {"sklearn", "xgboost", "lightgbm", "mlflow", "onnx"}
    for name, service in services.items():
        model_class = service["metadata"]["labels"]["modelClass"]
        assert service["spec"]["predictor"]["model"]["runtime"] == runtime["metadata"]["name"]
        if name == "mlflow":  # the MLflow runtime is a package of its own, with its own tests
            assert IMPLEMENTATION_ALIASES[model_class] == "runtime.mlflow.MLflowModel"
            continue
        cls = import_model_class(ModelSettings(implementation=model_class))
        assert cls.__module__ == f"runtime.{name}"


def kserve_folder(root: Path, kind: str) -> Path:
    """A model's files alone in a folder, as KServe's storage initializer leaves /mnt/models."""
    folder = root / kind
    if kind == "sklearn":
        sklearn_classifier(folder)
    elif kind == "xgboost":
        xgboost_classifier(folder)
    elif kind == "lightgbm":
        lightgbm_booster(folder)
    else:
        onnx_graph(folder)
    (folder / "model-settings.json").unlink()
    return folder


def test_kserve_variables_serve_each_format_with_no_model_settings(tmp_path: Path) -> None:
    """What kserve-mlserver sets (the class from the modelClass label, KServe's name and
    /mnt/models), nothing else: each format answers over REST and through tritonclient."""
    import tritonclient.http as triton

    services = inference_services()
    kinds = ["sklearn", "xgboost", "lightgbm", "onnx"]
    launched = []
    for kind in kinds:
        service = services[kind]
        env = {
            "MLSERVER_MODEL_IMPLEMENTATION": service["metadata"]["labels"]["modelClass"],
            "MLSERVER_MODEL_NAME": service["metadata"]["name"],
            "MLSERVER_MODEL_URI": str(kserve_folder(tmp_path, kind)),
        }
        launched.append(launch_server(tmp_path / kind, env=env))
    servers = start_servers(*launched, timeout=120)
    try:
        x = data(rows=2, seed=21)[0]
        for kind, server in zip(kinds, servers, strict=True):
            name = services[kind]["metadata"]["name"]
            client = triton.InferenceServerClient(url=server.http_address)
            try:
                assert client.is_model_ready(name)
                if kind == "onnx":
                    first = triton.InferInput("x", [2, 4], "FP32")
                    first.set_data_from_numpy(x.astype(np.float32))
                    second = triton.InferInput("counts", [2, 2], "INT64")
                    second.set_data_from_numpy(np.ones((2, 2), dtype=np.int64))
                    result = client.infer(name, [first, second])
                    assert result.as_numpy("total").tolist() == [[2], [2]]
                    continue
                features = triton.InferInput("input-0", [2, 4], "FP64")
                features.set_data_from_numpy(x)
                result = client.infer(name, [features], outputs=[triton.InferRequestedOutput("predict")])
                labels = result.as_numpy("predict")
                assert labels is not None and labels.shape[0] == 2
                answer = httpx.post(f"{server.http_url}/v2/models/{name}/infer", json=rows_body(x)).json()
                assert np.array(answer["outputs"][0]["data"]).ravel().tolist() == labels.ravel().tolist()
            finally:
                client.close()
    finally:
        for server in servers:
            assert server.stop() == 0


@pytest.fixture(scope="module")
def tabular_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[RunningServer, dict[str, Any]]]:
    """One server: scikit-learn and XGBoost with adaptive batching, scikit-learn in two worker processes."""
    root = tmp_path_factory.mktemp("tabular")
    batching: dict[str, Any] = {"max_batch_size": 16, "max_batch_time": 0.2}
    models = {
        "sk-batched": sklearn_classifier(root / "sk-batched", **batching),
        "xgb-batched": xgboost_classifier(
            root / "xgb-batched", implementation="mlserver_xgboost.XGBoostModel", **batching
        ),
        "sk-workers": sklearn_classifier(root / "sk-workers", workers=2),
    }
    server = start_server(root, timeout=120)
    yield server, models
    assert server.stop() == 0


def executed(server: RunningServer, name: str) -> float:
    """The model's executions (batches) so far, read from the metrics port."""
    found = re.search(
        rf'nv_inference_exec_count\{{model="{name}"[^}}]*\}} (\S+)', httpx.get(server.metrics_url).text
    )
    assert found is not None
    return float(found.group(1))


async def concurrent(url: str, bodies: list[dict[str, Any]]) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=60) as client:
        return await asyncio.gather(*(client.post(url, json=body) for body in bodies))


@pytest.mark.parametrize("name", ["sk-batched", "xgb-batched"])
def test_adaptive_batching_merges_rows_and_splits_them_back_exactly(
    tabular_server: tuple[RunningServer, dict[str, Any]], name: str
) -> None:
    """Concurrent requests of 1 to 3 rows, some asking for probabilities, some for the default:
    each gets exactly the answer the model gives its own rows, from batches of several requests."""
    server, models = tabular_server
    model = models[name]
    rows = [data(rows=1 + i % 3, seed=100 + i)[0] for i in range(12)]
    bodies = [
        rows_body(r, outputs=[{"name": "predict_proba"}, {"name": "predict"}]) if i % 2 else rows_body(r)
        for i, r in enumerate(rows)
    ]
    url = f"{server.http_url}/v2/models/{name}/infer"
    before = executed(server, name)
    responses = asyncio.run(concurrent(url, bodies))
    sizes = []
    for i, (response, x) in enumerate(zip(responses, rows, strict=True)):
        assert response.status_code == 200, response.text
        document = response.json()
        outputs = outputs_of(document)
        assert outputs["predict"]["data"] == model.predict(x).tolist()
        assert outputs["predict"]["shape"] == [len(x), 1]
        if i % 2:
            proba = outputs["predict_proba"]
            assert proba["shape"] == [len(x), 3]
            np.testing.assert_allclose(
                np.array(proba["data"]).reshape(len(x), 3), model.predict_proba(x), rtol=1e-6
            )
        else:
            assert list(outputs) == ["predict"]
        sizes.append(document["parameters"]["batch_size"])
    assert max(sizes) > 1
    executions = executed(server, name) - before
    assert 1 <= executions < len(bodies)  # the metrics count batches, not requests


def test_bad_rows_in_a_batch_get_their_own_400(tabular_server: tuple[RunningServer, dict[str, Any]]) -> None:
    """A request of the wrong width never joins the others' batch, and is told why."""
    server, _ = tabular_server
    good = [rows_body(data(rows=1, seed=i)[0]) for i in range(4)]
    bad = rows_body(np.ones((1, 3)))
    responses = asyncio.run(concurrent(f"{server.http_url}/v2/models/sk-batched/infer", [*good, bad]))
    assert [r.status_code for r in responses] == [200, 200, 200, 200, 400]
    assert (
        responses[-1].json()["error"]
        == "Input 'input-0' has 3 features (shape [1, 3]) but model 'sk-batched' takes 4"
    )


def test_worker_processes_answer_as_the_server_process(
    tabular_server: tuple[RunningServer, dict[str, Any]],
) -> None:
    server, models = tabular_server
    rows = [data(rows=2, seed=200 + i)[0] for i in range(6)]
    responses = asyncio.run(
        concurrent(f"{server.http_url}/v2/models/sk-workers/infer", [rows_body(r) for r in rows])
    )
    for response, x in zip(responses, rows, strict=True):
        assert response.json()["outputs"][0]["data"] == models["sk-workers"].predict(x).tolist()
    refused = httpx.post(f"{server.http_url}/v2/models/sk-workers/infer", json=rows_body(np.ones((1, 5))))
    assert refused.status_code == 400 and "has 5 features" in refused.json()["error"]


def test_the_repository_api_unloads_and_loads_a_runtime(
    tabular_server: tuple[RunningServer, dict[str, Any]],
) -> None:
    server, models = tabular_server
    x = data(rows=1, seed=5)[0]
    with httpx.Client(base_url=server.http_url, timeout=60, headers=server.authorization()) as client:
        assert client.post("/v2/repository/models/xgb-batched/unload").status_code == 200
        assert client.post("/v2/models/xgb-batched/infer", json=rows_body(x)).status_code in (404, 503)
        assert client.post("/v2/repository/models/xgb-batched/load").status_code == 200
        answer = client.post("/v2/models/xgb-batched/infer", json=rows_body(x)).json()
    assert answer["outputs"][0]["data"] == models["xgb-batched"].predict(x).tolist()


@pytest.mark.anyio
async def test_the_management_api_registers_a_runtime_model(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    model = xgboost_classifier(repo / "registered", implementation="mlserver_xgboost.XGBoostModel")
    admin = Admin(repo, None)
    try:
        async with admin.client(None) as client:
            answer = await client.post("/models", params={"url": "registered", "synchronous": "true"})
            assert answer.status_code == 200, answer.text
            described = (await client.get("/models/registered")).json()
        assert described[0]["modelName"] == "registered"
        entry = admin.registry.get("registered")
        assert entry.model is not None
        x = data(rows=2, seed=3)[0]
        from runtime.types import InferenceRequest, RequestInput

        request = InferenceRequest(inputs=[RequestInput(name="x", shape=[2, 4], datatype="FP64", data=x)])
        response = await entry.model.predict(request)
        assert response.outputs[0].data.ravel().tolist() == model.predict(x).tolist()
    finally:
        await admin.management.close()
        await admin.registry.unload_all()
