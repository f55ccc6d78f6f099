"""Unknown keys in settings.json and model-settings.json (``runtime.settings_files.unknown_keys``): each
is warned about once, naming the key, the file and the closest field, and the server still starts."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from runtime.settings import ModelSettings, Settings
from runtime.settings_files import parse_size, read_json, unknown_keys
from tests.servers import start_server


@pytest.fixture(autouse=True)
def _no_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("MLSERVER_"):
            monkeypatch.delenv(name)


def test_a_misspelt_server_key_is_named_with_its_file_and_the_closest_field(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"htp_port": 9000, "server_name": "s", "qqqzzz": 1}))
    settings = Settings.load(path)
    assert settings.server_name == "s" and settings.http_port == 8080  # the misspelt key did nothing
    assert settings.unknown_keys == [
        f"Unknown key 'htp_port' in {path} is ignored (did you mean 'http_port'?)",
        f"Unknown key 'qqqzzz' in {path} is ignored (no setting has a name close to it)",
    ]
    assert Settings().unknown_keys == [] and Settings.load(tmp_path / "absent.json").unknown_keys == []


def test_keys_mlserver_accepts_and_this_server_ignores_are_known(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"kafka_enabled": False, "cache_size": 10, "environments_dir": "/tmp"}))
    assert Settings.load(path).unknown_keys == []
    data = {"warm_workers": True, "parameters": {"inference_pool_gid": "g", "environment_tarball": "t"}}
    assert unknown_keys(ModelSettings, data, path) == []


def test_nested_settings_are_checked_too(tmp_path: Path) -> None:
    data = {"parameters": {"ur": "model.pt", "version": "1"}, "generate": {"text_input": "t"}}
    assert unknown_keys(ModelSettings, data, tmp_path / "m.json") == [
        f"Unknown key 'parameters.ur' in {tmp_path / 'm.json'} is ignored (did you mean 'uri'?)"
    ]


def test_a_model_file_is_warned_about_once_per_key_as_it_is_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "m" / "model-settings.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"max_batch_sise": 4, "implementation": "tests.models.zoo.Echo"}))
    with caplog.at_level(logging.WARNING, logger="runtime.settings"):
        settings = ModelSettings.from_file(path)
    assert settings.max_batch_size == 0
    assert [r.getMessage() for r in caplog.records] == [
        f"Unknown key 'max_batch_sise' in {path} is ignored (did you mean 'max_batch_size'?)"
    ]


def test_a_server_started_with_misspelt_keys_logs_one_line_each_and_serves(tmp_path: Path) -> None:
    (tmp_path / "settings.json").write_text(json.dumps({"strict_readines": False}))
    model = tmp_path / "echo" / "model-settings.json"
    model.parent.mkdir()
    model.write_text(json.dumps({"implementation": "tests.models.zoo.Echo", "max_batch_tme": 0.1}))
    server = start_server(tmp_path)
    try:
        log = server.read_log()
    finally:
        server.stop()
    lines = [line for line in log.splitlines() if "Unknown key" in line]
    assert len(lines) == 2, log
    assert (
        "'strict_readines'" in lines[0] and "settings.json" in lines[0] and "'strict_readiness'" in lines[0]
    )
    assert "'max_batch_tme'" in lines[1] and str(model) in lines[1] and "'max_batch_time'" in lines[1]


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("1024", 1024),
        ("512MiB", 512 * 1024**2),
        ("4GiB", 4 * 1024**3),
        ("800MB", 800 * 1000**2),
        ("1.5k", 1500),
    ],
)
def test_sizes_are_read_with_their_units(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["lots", "12 parsecs", "-1MiB", ""])
def test_a_size_that_is_not_one_is_refused_saying_how_to_write_one(text: str) -> None:
    with pytest.raises(ValueError, match="is not a size"):
        parse_size(text)


def test_a_settings_file_must_hold_a_json_object(tmp_path: Path) -> None:
    good, listed, broken = tmp_path / "good.json", tmp_path / "listed.json", tmp_path / "broken.json"
    good.write_text('{"http_port": 1}')
    listed.write_text("[1, 2]")
    broken.write_text("{")
    assert read_json(good) == {"http_port": 1}
    with pytest.raises(ValueError, match="must hold a JSON object"):
        read_json(listed)
    with pytest.raises(ValueError, match="cannot read"):
        read_json(broken)
    with pytest.raises(ValueError, match="cannot read"):
        read_json(tmp_path / "missing.json")
