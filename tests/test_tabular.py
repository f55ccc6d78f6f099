"""What the tabular runtimes share: the framework on load, the model's file, features and content types."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from runtime.settings import ModelParameters, ModelSettings
from runtime.sklearn import SKLearnModel
from runtime.tabular import MissingExtra, model_file, require
from runtime.types import State
from tests.conftest import InProcess
from tests.tabular_models import data, rows_body, sklearn_classifier, write_settings

pytest.importorskip("sklearn", reason="the [sklearn] extra is not installed")


def test_require_names_the_pip_command() -> None:
    with pytest.raises(MissingExtra, match=r"pip install 'mlserver-like\[onnx\]'"):
        require("a_framework_that_is_not_installed", "onnx")


async def test_a_missing_framework_leaves_the_model_unavailable_with_the_pip_command(
    inprocess: InProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sklearn_classifier(tmp_path / "m", implementation="mlserver_sklearn.SKLearnModel")
    monkeypatch.setitem(sys.modules, "sklearn", None)  # what an environment without the extra meets
    await inprocess.load(ModelSettings.from_file(tmp_path / "m" / "model-settings.json"))
    entry = inprocess.registry.find("m")
    assert entry.state is State.UNAVAILABLE
    assert "pip install 'mlserver-like[sklearn]'" in entry.reason
    async with inprocess.client() as client:
        response = await client.get("/v2/models/m/ready")
    assert response.status_code == 503


def test_model_file_lookup(tmp_path: Path) -> None:
    folder = write_settings(tmp_path / "m", "runtime.sklearn.SKLearnModel")
    (folder / "model.pkl").write_bytes(b"x")
    (folder / "model.pickle").write_bytes(b"x")
    settings = ModelSettings.from_file(folder / "model-settings.json")
    model = SKLearnModel(settings)
    assert model_file(model, SKLearnModel.filenames) == folder / "model.pickle"
    settings.parameters = ModelParameters(uri="file://./model.pkl")
    assert model_file(model, SKLearnModel.filenames) == folder / "model.pkl"
    settings.parameters = ModelParameters(uri=str(tmp_path))  # a folder holding none: the runtime reads it
    assert model_file(model, SKLearnModel.filenames) == tmp_path
    settings.parameters = ModelParameters(uri="./missing.joblib")
    with pytest.raises(FileNotFoundError, match=r"missing\.joblib"):
        model_file(model, SKLearnModel.filenames)
    with pytest.raises(FileNotFoundError, match=r"neither a folder nor parameters\.uri"):
        model_file(SKLearnModel(ModelSettings(name="nowhere")), SKLearnModel.filenames)


async def test_content_types_decode_through_the_codecs(inprocess: InProcess, tmp_path: Path) -> None:
    model = sklearn_classifier(tmp_path / "m")
    await inprocess.load(ModelSettings.from_file(tmp_path / "m" / "model-settings.json"))
    x, _ = data(rows=2)
    typed = rows_body(x, parameters={"content_type": "np"})
    typed["inputs"][0]["parameters"] = {"content_type": "np"}
    unknown = rows_body(x, parameters={"content_type": "nonesuch"})
    async with inprocess.client() as client:
        answered = await client.post("/v2/models/m/infer", json=typed)
        refused = await client.post("/v2/models/m/infer", json=unknown)
    assert answered.json()["outputs"][0]["data"] == model.predict(x).tolist()
    assert refused.status_code == 400
    assert "no codec" in refused.json()["error"] and "'input-0'" in refused.json()["error"]


async def test_one_input_only(inprocess: InProcess, tmp_path: Path) -> None:
    sklearn_classifier(tmp_path / "m")
    await inprocess.load(ModelSettings.from_file(tmp_path / "m" / "model-settings.json"))
    body = rows_body(np.ones((1, 4)))
    body["inputs"].append({**body["inputs"][0], "name": "second"})
    async with inprocess.client() as client:
        response = await client.post("/v2/models/m/infer", json=body)
    assert response.status_code == 400
    assert "takes one input" in response.json()["error"] and "second" in response.json()["error"]
