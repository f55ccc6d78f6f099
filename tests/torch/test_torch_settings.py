"""The PyTorch runtime's settings (``runtime.torch.torch_settings``): a misspelt or out-of-range
setting refused with a reason, the format following the file when not given, and every setting
documented."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runtime.torch import TorchSettings
from runtime.torch.torch_settings import read_config
from tests.torch_helpers import torch_settings_file


@pytest.mark.parametrize(
    ("parameters", "expected"),
    [
        ({}, "needs parameters.uri"),
        ({"uri": "m.pt", "extra": {"devcie": "cpu"}}, "devcie: Extra inputs are not permitted"),
        ({"uri": "m.pt", "extra": {"device": "tpu"}}, "device: Value error, must be 'auto', 'cpu', 'cuda'"),
        ({"uri": "m.pt", "extra": {"dtype": "int8"}}, "dtype: Input should be 'float32'"),
        ({"uri": "m.pt", "extra": {"workers": 0}}, "workers: Input should be greater than or equal to 1"),
        ({"uri": "m.pt", "format": "onnx"}, "parameters.format must be one of"),
        ({"uri": "m.pt", "format": "state_dict"}, "needs parameters.extra.module_class"),
        (
            {"uri": "m.pt", "format": "torchscript", "extra": {"module_class": "a.B"}},
            "module_class is for a state_dict",
        ),
    ],
)
def test_bad_settings_are_refused_with_a_reason(
    tmp_path: Path, parameters: dict[str, Any], expected: str
) -> None:
    with pytest.raises(ValueError) as caught:
        read_config(torch_settings_file(tmp_path, parameters))
    assert expected in str(caught.value)


def test_format_follows_the_file_when_not_given(tmp_path: Path) -> None:
    assert read_config(torch_settings_file(tmp_path / "a", {"uri": "m.pt2"})).format == "export"
    assert read_config(torch_settings_file(tmp_path / "b", {"uri": "m.pt"})).format == "torchscript"
    config = read_config(
        torch_settings_file(tmp_path / "c", {"uri": "m.pth", "extra": {"module_class": "n.Net"}})
    )
    assert config.format == "state_dict"
    assert config.path == tmp_path / "c" / "m.pth"
    assert config.options == TorchSettings(module_class="n.Net")


def test_settings_are_documented() -> None:
    for name, field in TorchSettings.model_fields.items():
        assert field.description, name
