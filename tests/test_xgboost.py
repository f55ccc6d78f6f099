"""XGBoostModel: MLServer 1.7's outputs, the fast booster call giving the scikit-learn interface's values."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from runtime.settings import ModelSettings
from runtime.xgboost import XGBoostModel
from tests.conftest import InProcess
from tests.tabular_models import data, outputs_of, rows_body, xgboost_classifier, xgboost_regressor

pytest.importorskip("xgboost", reason="the [xgboost] extra is not installed")


async def load(inprocess: InProcess, folder: Path) -> XGBoostModel:
    await inprocess.load(ModelSettings.from_file(folder / "model-settings.json"))
    model = inprocess.registry.get(folder.name).model
    assert isinstance(model, XGBoostModel)
    return model


@pytest.mark.parametrize(("filename", "classes"), [("model.json", 3), ("model.bst", 2), ("model.ubj", 3)])
async def test_a_classifier_answers_labels_and_probabilities(
    inprocess: InProcess, tmp_path: Path, filename: str, classes: int
) -> None:
    reference = xgboost_classifier(tmp_path / "xgb", filename=filename, classes=classes)
    served = await load(inprocess, tmp_path / "xgb")
    x, _ = data(rows=6, seed=7)
    async with inprocess.client() as client:
        default = await client.post("/v2/models/xgb/infer", json=rows_body(x))
        both = await client.post(
            "/v2/models/xgb/infer",
            json=rows_body(x, outputs=[{"name": "predict"}, {"name": "predict_proba"}]),
        )
    [labels] = default.json()["outputs"]
    assert (labels["name"], labels["datatype"], labels["shape"]) == ("predict", "INT64", [6, 1])
    assert labels["data"] == reference.predict(x).tolist()
    proba = outputs_of(both.json())["predict_proba"]
    assert (proba["datatype"], proba["shape"]) == ("FP32", [6, classes])
    np.testing.assert_array_equal(
        np.array(proba["data"], dtype=np.float32).reshape(6, classes), reference.predict_proba(x)
    )
    assert served._fast  # the booster's inplace_predict serves it, with the same values


async def test_a_regressor_answers_values_and_refuses_probabilities(
    inprocess: InProcess, tmp_path: Path
) -> None:
    reference = xgboost_regressor(tmp_path / "reg")
    served = await load(inprocess, tmp_path / "reg")
    x, _ = data(rows=3, seed=8)
    async with inprocess.client() as client:
        answer = await client.post("/v2/models/reg/infer", json=rows_body(x))
        refused = await client.post(
            "/v2/models/reg/infer", json=rows_body(x, outputs=[{"name": "predict_proba"}])
        )
        unknown = await client.post(
            "/v2/models/reg/infer", json=rows_body(x, outputs=[{"name": "transform"}])
        )
    [out] = answer.json()["outputs"]
    assert (out["datatype"], out["shape"]) == ("FP32", [3, 1])
    np.testing.assert_array_equal(np.array(out["data"], dtype=np.float32), reference.predict(x))
    assert refused.status_code == 400 and "XGBRegressor" in refused.json()["error"]
    assert unknown.status_code == 400 and "'transform'" in unknown.json()["error"]
    assert served._fast


async def test_a_softmax_classifier_is_served_through_the_scikit_learn_interface(
    inprocess: InProcess, tmp_path: Path
) -> None:
    """``multi:softmax`` boosters answer labels, not probabilities: the load-time probe finds the
    fast call cannot give ``predict_proba`` and serves the model through XGBClassifier's methods."""
    xgb = pytest.importorskip("xgboost")
    x, y = data()
    reference = xgb.XGBClassifier(n_estimators=5, objective="multi:softmax", n_jobs=1).fit(x, y)
    folder = tmp_path / "softmax"
    folder.mkdir()
    reference.save_model(folder / "model.json")
    (folder / "model-settings.json").write_text('{"implementation": "mlserver_xgboost.XGBoostModel"}')
    served = await load(inprocess, folder)
    body = rows_body(x[:4], outputs=[{"name": "predict"}, {"name": "predict_proba"}])
    async with inprocess.client() as client:
        response = await client.post("/v2/models/softmax/infer", json=body)
    outputs = outputs_of(response.json())
    assert not served._fast
    assert outputs["predict"]["data"] == reference.predict(x[:4]).tolist()
    np.testing.assert_allclose(
        np.array(outputs["predict_proba"]["data"]).reshape(4, 3), reference.predict_proba(x[:4]), rtol=1e-6
    )


async def test_wrong_feature_count_is_a_400(inprocess: InProcess, tmp_path: Path) -> None:
    xgboost_classifier(tmp_path / "xgb")
    await load(inprocess, tmp_path / "xgb")
    body = {"inputs": [{"name": "rows", "shape": [1, 5], "datatype": "FP32", "data": [1, 2, 3, 4, 5]}]}
    async with inprocess.client() as client:
        response = await client.post("/v2/models/xgb/infer", json=body)
    assert response.status_code == 400
    assert response.json()["error"] == "Input 'rows' has 5 features (shape [1, 5]) but model 'xgb' takes 4"
