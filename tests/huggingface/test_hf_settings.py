"""The Hugging Face runtime's settings, read from model-settings.json as MLServer writes them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runtime.huggingface.hf_settings import read_config
from runtime.repository import import_model_class
from runtime.settings import ModelSettings


def test_mlserver_settings_are_read_unchanged(tmp_path: Path) -> None:
    checkpoint = tmp_path / "weights"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")
    extra = {
        "task": "text-generation",
        "pretrained_model": str(checkpoint),
        "device": -1,
        "framework": "pt",
        "optimum_model": False,
    }
    config = read_config(ModelSettings(name="m", parameters={"extra": extra}))
    assert config.path == checkpoint and config.tokenizer_path == checkpoint
    assert config.options.device == "cpu" and config.options.task == "text-generation"
    assert read_config(ModelSettings(name="m", parameters={"uri": str(checkpoint)})).path == checkpoint
    # from a model-settings.json elsewhere: the tokenizer is beside the weights, unless named
    (tmp_path / "model").mkdir()
    source = tmp_path / "model" / "model-settings.json"
    source.write_text(json.dumps({"name": "m", "parameters": {"extra": extra}}))
    found = ModelSettings.from_file(source)
    assert found.folder == tmp_path / "model"
    assert read_config(found).tokenizer_path == checkpoint
    source.write_text(
        json.dumps({"name": "m", "parameters": {"extra": {**extra, "pretrained_tokenizer": "tok"}}})
    )
    assert read_config(ModelSettings.from_file(source)).tokenizer_path == tmp_path / "model" / "tok"
    with_gpu = read_config(
        ModelSettings(name="m", parameters={"uri": str(checkpoint), "extra": {"device": 1}})
    )
    assert with_gpu.options.device == "cuda:1"


def test_the_mlserver_runtime_name_is_this_runtime() -> None:
    from runtime.huggingface import HuggingFaceModel

    named = ModelSettings(name="m", implementation="mlserver_huggingface.HuggingFaceRuntime")
    assert import_model_class(named) is HuggingFaceModel


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"extra": {"task": "translation"}}, "task"),
        ({"extra": {"tusk": "text-generation"}}, "tusk"),
        ({"extra": {"device": "tpu"}}, "device"),
        ({"extra": {"pretrained_model": "/nowhere/gpt2"}}, "config.json"),
    ],
)
def test_bad_settings_fail_the_load_saying_why(parameters: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        read_config(ModelSettings(name="m", parameters=parameters))


def test_no_folder_at_all() -> None:
    with pytest.raises(ValueError, match=r"pretrained_model or parameters\.uri"):
        read_config(ModelSettings(name="m"))
