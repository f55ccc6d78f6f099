"""``runtime.model_settings``: a model's settings as model-settings.json, the environment and
MLServer's variables give them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from runtime import settings as server_settings
from runtime.model_settings import MODEL_SETTINGS_FILENAME, ModelParameters, ModelSettings


@pytest.fixture(autouse=True)
def _no_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("MLSERVER_"):
            monkeypatch.delenv(name)


def _folder(tmp_path: Path, name: str, content: dict[str, object]) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    path = folder / MODEL_SETTINGS_FILENAME
    path.write_text(json.dumps(content))
    return path


def test_the_server_settings_module_names_the_same_classes() -> None:
    """``runtime.settings.ModelSettings`` (the path users import) is this module's class."""
    assert server_settings.ModelSettings is ModelSettings
    assert server_settings.ModelParameters is ModelParameters


def test_a_file_without_a_name_takes_its_folders(tmp_path: Path) -> None:
    path = _folder(tmp_path, "iris", {"implementation": "runtime.sklearn.SKLearnModel"})
    settings = ModelSettings.from_file(path)
    assert settings.name == "iris"
    assert settings.implementation == "runtime.sklearn.SKLearnModel"


def test_mlservers_model_variables_fill_the_parameters_as_kserve_sets_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLSERVER_MODEL_URI", "/mnt/models")
    monkeypatch.setenv("MLSERVER_MODEL_EXTRA", '{"task": "text-generation"}')
    path = _folder(tmp_path, "served", {"parameters": {"version": "2"}})
    parameters = ModelSettings.from_file(path).parameters
    assert parameters is not None
    assert parameters.uri == "/mnt/models"
    assert parameters.version == "2"  # the file's own parameters win over the variables'
    assert parameters.extra == {"task": "text-generation"}


def test_an_extra_that_is_not_json_is_refused_naming_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLSERVER_MODEL_EXTRA", "{not json")
    path = _folder(tmp_path, "broken", {})
    with pytest.raises(ValueError, match="MLSERVER_MODEL_EXTRA must be a JSON object"):
        ModelSettings.from_file(path)


def test_fields_are_checked() -> None:
    with pytest.raises(ValidationError):
        ModelSettings(name="m", max_batch_size=-1)
