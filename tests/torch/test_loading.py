"""The PyTorch runtime's loading (``runtime.torch.loading``): load errors that name the problem, and
numpy <-> torch conversions as loaded models use them."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from runtime.core.registry import Registry
from runtime.tensors import dtype_of
from runtime.torch.convert import DTYPES, to_array, to_tensor
from tests.torch_helpers import torch_settings_file

CPU = torch.device("cpu")


# ---------------------------------------------------------------------- load errors through the registry


class Doubler(nn.Module):
    def __init__(self, size: int = 2) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((size,), 2.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


def _module_file(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "nets.py").write_text(
        "import torch\nfrom torch import nn\n\n\n"
        "class Doubler(nn.Module):\n"
        "    def __init__(self, size: int = 2) -> None:\n"
        "        super().__init__()\n"
        "        self.scale = nn.Parameter(torch.full((size,), 2.0))\n\n"
        "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n"
        "        return x * self.scale\n\n\n"
        "class NotAModule:\n"
        "    pass\n"
    )


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("state_dict_as_torchscript", "is not a TorchScript file"),
        ("wrong_keys", 'Unexpected key(s) in state_dict: "other"'),
        ("not_a_state_dict", "does not hold a state_dict"),
        ("no_inputs", "needs the model's inputs in model-settings.json"),
        ("bytes_input", "input 'x' is BYTES, which torch tensors cannot hold"),
        ("not_a_module", "module_class 'nets.NotAModule' is not a torch.nn.Module"),
        ("no_such_module", "cannot import module_class 'absent.Net': No module named 'absent'"),
        ("no_such_class", "cannot import module_class 'nets.Absent': module 'nets' has no class 'Absent'"),
        ("too_many_inputs", "declares 2 inputs ['a', 'b'] but the model's forward takes 1: ['x']"),
    ],
)
async def test_load_errors_name_the_problem(tmp_path: Path, case: str, expected: str) -> None:
    _module_file(tmp_path)
    extra: dict[str, Any] = {"module_class": "nets.Doubler"}
    fields: dict[str, Any] = {}
    torch.save(Doubler().state_dict(), tmp_path / "m.pth")
    uri = "m.pth"
    if case == "state_dict_as_torchscript":
        extra = {}
    elif case == "wrong_keys":
        torch.save({**Doubler().state_dict(), "other": torch.zeros(1)}, tmp_path / "m.pth")
    elif case == "not_a_state_dict":
        torch.save({"scale": [1, 2]}, tmp_path / "m.pth")
    elif case == "no_inputs":
        fields["inputs"] = []
    elif case == "bytes_input":
        fields["inputs"] = [{"name": "x", "datatype": "BYTES", "shape": [-1]}]
    elif case == "not_a_module":
        extra = {"module_class": "nets.NotAModule"}
    elif case == "no_such_module":
        extra = {"module_class": "absent.Net"}
    elif case == "no_such_class":
        extra = {"module_class": "nets.Absent"}
    elif case == "too_many_inputs":
        fields["inputs"] = [
            {"name": "a", "datatype": "FP32", "shape": [-1]},
            {"name": "b", "datatype": "FP32", "shape": [-1]},
        ]
    registry = Registry()
    entry = await registry.load(
        torch_settings_file(tmp_path, {"uri": uri, "format": None, "extra": extra}, **fields)
    )
    assert not entry.ready
    assert expected in entry.reason
    await registry.unload_all()


@pytest.mark.anyio
@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is present here")
async def test_cuda_where_there_is_none_fails_the_load(tmp_path: Path) -> None:
    _module_file(tmp_path)
    torch.save(Doubler().state_dict(), tmp_path / "m.pth")
    extra = {"module_class": "nets.Doubler", "device": "cuda"}
    entry = await Registry().load(torch_settings_file(tmp_path, {"uri": "m.pth", "extra": extra}))
    assert "device 'cuda' was asked for but torch sees no CUDA device" in entry.reason


# ---------------------------------------------------------------------- conversions


@pytest.mark.parametrize("datatype", sorted(DTYPES))
def test_read_only_arrays_are_shared_not_copied(datatype: str) -> None:
    """Binary inputs are read-only views of the body: torch shares them, without a warning."""
    dtype = dtype_of(datatype)
    body = np.arange(6).astype(dtype).tobytes()
    array = np.frombuffer(memoryview(body), dtype=dtype).reshape(2, 3)
    assert not array.flags.writeable
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tensor = to_tensor(array, datatype, CPU)
    assert tensor.dtype == DTYPES[datatype]
    assert tensor.data_ptr() == array.ctypes.data
    back, back_datatype = to_array(tensor)
    assert back_datatype == datatype
    assert back.tobytes() == body


def test_writable_arrays_are_shared_not_copied() -> None:
    array = np.ones((2, 2), dtype=np.int64)
    tensor = to_tensor(array, "INT64", CPU)
    assert tensor.data_ptr() == array.ctypes.data


def test_bf16_bits_are_viewed_both_ways() -> None:
    values = torch.tensor([1.5, -2.25, 3.0e38], dtype=torch.bfloat16)
    bits = values.view(torch.int16).numpy().view(np.uint16)
    tensor = to_tensor(bits, "BF16", CPU)
    assert tensor.dtype == torch.bfloat16 and torch.equal(tensor, values)
    assert tensor.data_ptr() == bits.ctypes.data
    array, datatype = to_array(tensor)
    assert datatype == "BF16" and array.dtype == np.uint16 and np.array_equal(array, bits)


def test_inputs_convert_to_the_compute_dtype() -> None:
    tensor = to_tensor(np.array([1.0, 2.0], dtype=np.float32), "FP32", CPU, torch.float16)
    assert tensor.dtype == torch.float16


def test_outputs_convert_to_their_declared_float_datatype_only() -> None:
    array, datatype = to_array(torch.tensor([1.5], dtype=torch.bfloat16), "FP32")
    assert datatype == "FP32" and array.dtype == np.float32 and array[0] == 1.5
    with pytest.raises(TypeError, match=r"is torch\.int64 but is declared INT32"):
        to_array(torch.tensor([1]), "INT32")
