"""Loading a save_pretrained folder: on the CPU in float32 by default, the chat template from the settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.huggingface.hf_settings import read_config
from runtime.settings import ModelSettings

torch = pytest.importorskip("torch", reason="the Hugging Face runtime needs torch")

from runtime.huggingface.hf_loading import load, resolve_device  # noqa: E402


def test_loads_on_the_cpu_in_float32_with_the_template_of_the_settings(tiny_llm: Path) -> None:
    extra = {"chat_template": "{{ messages[0]['content'] }}", "device": "cpu"}
    loaded = load(read_config(ModelSettings(name="m", parameters={"uri": str(tiny_llm), "extra": extra})))
    assert loaded.device == torch.device("cpu")
    assert next(loaded.model.parameters()).dtype == torch.float32
    assert loaded.tokenizer.chat_template == extra["chat_template"]
    half = read_config(
        ModelSettings(name="m", parameters={"uri": str(tiny_llm), "extra": {"dtype": "bfloat16"}})
    )
    assert next(load(half).model.parameters()).dtype == torch.bfloat16


def test_devices() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            resolve_device("cuda:0")
