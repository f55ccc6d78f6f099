"""SKLearnModel: MLServer 1.7's answers (names, datatypes, shapes, values) and this server's 400s."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from runtime.settings import ModelSettings
from runtime.types import State
from tests.conftest import InProcess
from tests.tabular_models import (
    data,
    outputs_of,
    rows_body,
    sklearn_classifier,
    sklearn_pipeline,
    sklearn_regressor,
    write_settings,
)

pytest.importorskip("sklearn", reason="the [sklearn] extra is not installed")


async def load(inprocess: InProcess, folder: Path) -> None:
    await inprocess.load(ModelSettings.from_file(folder / "model-settings.json"))


async def test_predict_is_the_default_output(inprocess: InProcess, tmp_path: Path) -> None:
    model = sklearn_classifier(tmp_path / "iris")
    await load(inprocess, tmp_path / "iris")
    x, _ = data(rows=5, seed=9)
    async with inprocess.client() as client:
        response = await client.post("/v2/models/iris/infer", json=rows_body(x))
    assert response.status_code == 200
    [out] = response.json()["outputs"]
    assert out == {
        "name": "predict",
        "datatype": "INT64",
        "shape": [5, 1],  # 1-D answers are [N, 1], as MLServer's NumpyCodec says
        "data": model.predict(x).tolist(),
        "parameters": {"content_type": "np"},
    }


async def test_outputs_chosen_by_the_request(inprocess: InProcess, tmp_path: Path) -> None:
    model = sklearn_classifier(tmp_path / "iris")
    await load(inprocess, tmp_path / "iris")
    x, _ = data(rows=3, seed=4)
    body = rows_body(x, outputs=[{"name": "predict_proba"}, {"name": "predict"}])
    async with inprocess.client() as client:
        response = await client.post("/v2/models/iris/infer", json=body)
    assert response.status_code == 200
    document = response.json()
    assert [out["name"] for out in document["outputs"]] == ["predict_proba", "predict"]
    proba = outputs_of(document)["predict_proba"]
    assert proba["datatype"] == "FP64" and proba["shape"] == [3, 3]
    np.testing.assert_array_equal(np.array(proba["data"]).reshape(3, 3), model.predict_proba(x))


async def test_predict_fn_sets_the_default_output(inprocess: InProcess, tmp_path: Path) -> None:
    model = sklearn_classifier(tmp_path / "proba", parameters={"extra": {"predict_fn": "predict_proba"}})
    await load(inprocess, tmp_path / "proba")
    x, _ = data(rows=2, seed=1)
    async with inprocess.client() as client:
        response = await client.post("/v2/models/proba/infer", json=rows_body(x))
    [out] = response.json()["outputs"]
    assert out["name"] == "predict_proba"
    np.testing.assert_array_equal(np.array(out["data"]).reshape(2, 3), model.predict_proba(x))


async def test_a_pipeline_transforms(inprocess: InProcess, tmp_path: Path) -> None:
    model = sklearn_pipeline(tmp_path / "pca")
    await load(inprocess, tmp_path / "pca")
    x, _ = data(rows=4, seed=2)
    async with inprocess.client() as client:
        answer = await client.post("/v2/models/pca/infer", json=rows_body(x, outputs=[{"name": "transform"}]))
        refused = await client.post("/v2/models/pca/infer", json=rows_body(x))
    [out] = answer.json()["outputs"]
    assert (out["name"], out["datatype"], out["shape"]) == ("transform", "FP64", [4, 2])
    np.testing.assert_allclose(np.array(out["data"]).reshape(4, 2), model.transform(x))
    assert refused.status_code == 400
    assert "has no 'predict' output" in refused.json()["error"]


async def test_a_regressor_answers_predict_and_refuses_predict_proba(
    inprocess: InProcess, tmp_path: Path
) -> None:
    model = sklearn_regressor(tmp_path / "linear")
    await load(inprocess, tmp_path / "linear")
    x, _ = data(rows=2, seed=3)
    async with inprocess.client() as client:
        answer = await client.post("/v2/models/linear/infer", json=rows_body(x))
        refused = await client.post(
            "/v2/models/linear/infer", json=rows_body(x, outputs=[{"name": "predict_proba"}])
        )
        unknown = await client.post("/v2/models/linear/infer", json=rows_body(x, outputs=[{"name": "nope"}]))
    [out] = answer.json()["outputs"]
    assert (out["datatype"], out["shape"]) == ("FP64", [2, 1])
    np.testing.assert_allclose(out["data"], model.predict(x))
    assert refused.status_code == 400
    assert "LinearRegression" in refused.json()["error"] and "predict_proba" in refused.json()["error"]
    assert unknown.status_code == 400
    assert "'nope'" in unknown.json()["error"]


@pytest.mark.parametrize(
    ("inputs", "says"),
    [
        ([{"name": "feats", "shape": [1, 3], "datatype": "FP64", "data": [1, 2, 3]}], "has 3 features"),
        ([{"name": "feats", "shape": [4], "datatype": "FP64", "data": [1, 2, 3, 4]}], "must be 2-D"),
        ([{"name": "feats", "shape": [1, 4], "datatype": "BYTES", "data": ["a", "b", "c", "d"]}], "BYTES"),
        ([{"name": "feats", "shape": [1, 4], "datatype": "FP64", "data": ["a", "b", "c", "d"]}], "feats"),
    ],
)
async def test_bad_input_is_a_400_naming_the_input(
    inprocess: InProcess, tmp_path: Path, inputs: list[dict[str, object]], says: str
) -> None:
    sklearn_classifier(tmp_path / "iris")
    await load(inprocess, tmp_path / "iris")
    async with inprocess.client() as client:
        response = await client.post("/v2/models/iris/infer", json={"inputs": inputs})
        still = await client.post("/v2/models/iris/infer", json=rows_body(data(rows=1)[0]))
    assert response.status_code == 400
    assert "feats" in response.json()["error"] and says in response.json()["error"]
    assert still.status_code == 200


async def test_the_estimator_refusing_the_input_is_a_400(inprocess: InProcess, tmp_path: Path) -> None:
    """NaN passes the server's checks; LogisticRegression refuses it (MLServer answers 500)."""
    sklearn_classifier(tmp_path / "iris")
    await load(inprocess, tmp_path / "iris")
    body = rows_body(np.array([[1.0, 2.0, 3.0, 4.0]]))
    body["inputs"][0]["data"] = [1.0, "NaN", 3.0, 4.0]
    async with inprocess.client() as client:
        response = await client.post("/v2/models/iris/infer", json=body)
    assert response.status_code == 400, response.text
    assert "'input-0'" in response.json()["error"] and "NaN" in response.json()["error"]


@pytest.mark.parametrize("filename", ["model.pickle", "model.pkl"])
async def test_well_known_file_names(inprocess: InProcess, tmp_path: Path, filename: str) -> None:
    sklearn_classifier(tmp_path / "m", filename=filename)
    await load(inprocess, tmp_path / "m")
    assert inprocess.registry.find("m").state is State.READY


async def test_parameters_uri_and_mlserver_name(inprocess: InProcess, tmp_path: Path) -> None:
    (tmp_path / "named" / "weights").mkdir(parents=True)
    model = sklearn_classifier(
        tmp_path / "named",
        filename="weights/clf.joblib",
        implementation="mlserver_sklearn.SKLearnModel",
        parameters={"uri": "./weights/clf.joblib"},
    )
    await load(inprocess, tmp_path / "named")
    x, _ = data(rows=2)
    async with inprocess.client() as client:
        response = await client.post("/v2/models/named/infer", json=rows_body(x))
    assert response.status_code == 200
    assert response.json()["outputs"][0]["data"] == model.predict(x).tolist()


async def test_a_folder_without_a_model_file_is_unavailable_with_the_reason(
    inprocess: InProcess, tmp_path: Path
) -> None:
    write_settings(tmp_path / "empty", "runtime.sklearn.SKLearnModel")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "model.joblib").write_bytes(b"not a pickle")
    write_settings(tmp_path / "broken", "mlserver_sklearn.SKLearnModel")
    await load(inprocess, tmp_path / "empty")
    await load(inprocess, tmp_path / "broken")
    empty, broken = inprocess.registry.find("empty"), inprocess.registry.find("broken")
    assert empty.state is State.UNAVAILABLE and broken.state is State.UNAVAILABLE
    assert "model.joblib, model.pickle, model.pkl" in empty.reason
    assert "failed to load" in broken.reason
    async with inprocess.client() as client:
        response = await client.post("/v2/models/broken/infer", json=rows_body(data(rows=1)[0]))
        index = await client.post("/v2/repository/index", json={})
    assert response.status_code == 503 and "failed to load" in response.json()["error"]
    reasons = {item["name"]: item.get("reason", "") for item in index.json()}
    assert reasons["broken"] == broken.reason


async def test_many_rows_run_off_the_event_loop_with_the_same_answers(
    inprocess: InProcess, tmp_path: Path
) -> None:
    """``inline_ms: 0`` sends every call to a thread; the answers do not change."""
    model = sklearn_classifier(tmp_path / "threaded", parameters={"extra": {"inline_ms": 0}})
    await load(inprocess, tmp_path / "threaded")
    x, _ = data(rows=50, seed=5)
    async with inprocess.client() as client:
        first = await client.post("/v2/models/threaded/infer", json=rows_body(x))
        second = await client.post("/v2/models/threaded/infer", json=rows_body(x))
    assert first.json()["outputs"][0]["data"] == model.predict(x).tolist()
    assert second.json()["outputs"] == first.json()["outputs"]
