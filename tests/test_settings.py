"""Server and model settings (``runtime.settings``): files, ``MLSERVER_`` variables and the checks
on their fields."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from runtime.settings import ModelSettings, Settings, json_schemas


@pytest.fixture(autouse=True)
def _no_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("MLSERVER_"):
            monkeypatch.delenv(name)


def test_load_reads_the_file_then_applies_overrides_that_are_set(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"server_name": "from-file", "http_port": 9000, "debug": True}))
    settings = Settings.load(path, http_port=9100, debug=None)
    assert (settings.server_name, settings.http_port, settings.debug) == ("from-file", 9100, True)
    assert Settings.load(tmp_path / "missing.json").server_name == Settings().server_name


@pytest.mark.parametrize(
    ("text", "message"), [("{not json", "cannot read"), ("[1, 2]", "must hold a JSON object")]
)
def test_a_settings_file_that_is_not_a_json_object_is_refused(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "settings.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        Settings.load(path)


def test_variables_set_fields_nested_ones_included(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLSERVER_HTTP_PORT", "9001")
    monkeypatch.setenv("MLSERVER_EXTENSIONS", '["a", "b"]')
    monkeypatch.setenv("MLSERVER_LOGGING_SETTINGS__version", "1")
    settings = Settings()
    assert settings.http_port == 9001 and settings.extensions == ["a", "b"]
    assert settings.logging_settings == {"version": "1"}


def test_fields_are_checked() -> None:
    with pytest.raises(ValidationError, match="metrics_endpoint must be a path starting with '/'"):
        Settings(metrics_endpoint="metrics")
    assert (
        Settings(metrics_endpoint="").metrics_endpoint is None
        and not Settings(metrics_endpoint="").metrics_enabled
    )
    with pytest.raises(ValidationError, match="must be given together"):
        Settings(grpc_tls_certificate="cert.pem")
    with pytest.raises(ValidationError):
        Settings(http_port=70000)
    with pytest.raises(ValidationError):
        Settings(grpc_stream_format="other")


def test_a_model_is_named_after_its_folder_unless_its_file_names_it(tmp_path: Path) -> None:
    folder = tmp_path / "resnet"
    folder.mkdir()
    path = folder / "model-settings.json"
    path.write_text(json.dumps({"parameters": {"version": "2"}}))
    settings = ModelSettings.from_file(path)
    assert (settings.name, settings.version, settings.folder) == ("resnet", "2", folder)
    path.write_text(json.dumps({"name": "own"}))
    assert ModelSettings.from_file(path).name == "own"


def test_model_fields_are_checked() -> None:
    assert ModelSettings(implementation=ModelSettings).implementation is ModelSettings
    with pytest.raises(ValidationError, match="implementation must be an import path or a class"):
        ModelSettings(implementation=3)
    with pytest.raises(ValidationError):
        ModelSettings(max_queue_size=0)
    assert ModelSettings().version is None and ModelSettings().folder is None


def test_the_schemas_describe_both_files() -> None:
    schemas = json_schemas()
    assert set(schemas) == {"settings.schema.json", "model-settings.schema.json"}
    assert "http_port" in schemas["settings.schema.json"]["properties"]
    assert "max_batch_size" in schemas["model-settings.schema.json"]["properties"]
