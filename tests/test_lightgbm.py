"""LightGBMModel: one ``predict`` output, Booster.predict's own array, as MLServer 1.7 answers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from runtime.settings import ModelSettings
from runtime.types import State
from tests.conftest import InProcess
from tests.tabular_models import data, lightgbm_booster, rows_body

pytest.importorskip("lightgbm", reason="the [lightgbm] extra is not installed")


async def load(inprocess: InProcess, folder: Path) -> None:
    await inprocess.load(ModelSettings.from_file(folder / "model-settings.json"))


async def test_a_multiclass_booster_answers_probabilities(inprocess: InProcess, tmp_path: Path) -> None:
    booster = lightgbm_booster(tmp_path / "lgb", implementation="mlserver_lightgbm.LightGBMModel")
    await load(inprocess, tmp_path / "lgb")
    x, _ = data(rows=5, seed=11)
    async with inprocess.client() as client:
        response = await client.post("/v2/models/lgb/infer", json=rows_body(x))
    [out] = response.json()["outputs"]
    assert (out["name"], out["datatype"], out["shape"]) == ("predict", "FP64", [5, 3])
    np.testing.assert_array_equal(np.array(out["data"]).reshape(5, 3), booster.predict(x))


async def test_a_text_model_through_uri(inprocess: InProcess, tmp_path: Path) -> None:
    booster = lightgbm_booster(
        tmp_path / "binary", filename="model.txt", classes=2, parameters={"uri": "./model.txt"}
    )
    await load(inprocess, tmp_path / "binary")
    x, _ = data(rows=3, seed=12)
    async with inprocess.client() as client:
        response = await client.post("/v2/models/binary/infer", json=rows_body(x))
    [out] = response.json()["outputs"]
    assert (out["datatype"], out["shape"]) == ("FP64", [3, 1])
    np.testing.assert_array_equal(out["data"], booster.predict(x))


async def test_a_text_model_without_uri_is_unavailable(inprocess: InProcess, tmp_path: Path) -> None:
    lightgbm_booster(tmp_path / "txt", filename="model.txt")
    await load(inprocess, tmp_path / "txt")
    entry = inprocess.registry.find("txt")
    assert entry.state is State.UNAVAILABLE
    assert "looked for model.bst" in entry.reason and '"uri"' in entry.reason


async def test_wrong_feature_count_is_a_400(inprocess: InProcess, tmp_path: Path) -> None:
    lightgbm_booster(tmp_path / "lgb")
    await load(inprocess, tmp_path / "lgb")
    body = {"inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP64", "data": [1, 2, 3, 4]}]}
    async with inprocess.client() as client:
        response = await client.post("/v2/models/lgb/infer", json=body)
    assert response.status_code == 400
    assert "Input 'x' has 2 features" in response.json()["error"]
