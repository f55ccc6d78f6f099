"""Calling a loaded model (``runtime.torch.runner``): named tensors in, named outputs out, nested
tuples flattened in order, dict outputs picked by declared name, undeclared outputs named like
Triton's, and every mismatch a model failure or an invalid input."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from runtime.errors import InvalidInput, ModelFailed
from runtime.torch import TensorSpec, TorchRunner

CPU = torch.device("cpu")


class Several(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.weight = nn.Parameter(torch.ones(2, 3))

    def forward(self, x: torch.Tensor) -> Any:
        if self.kind == "nested":
            return x + 1, (x + 2, x + 3)
        if self.kind == "dict":
            return {"b": x + 2, "a": x + 1}
        if self.kind == "int":
            return x.argmax(dim=-1)
        if self.kind == "parameter":
            return self.weight
        return "not a tensor"


def _run(kind: str, outputs: list[TensorSpec]) -> dict[str, tuple[np.ndarray, str]]:
    runner = TorchRunner("m", Several(kind), CPU, [TensorSpec("x", "FP32")], outputs)
    try:
        return runner.run({"x": np.zeros((2, 3), dtype=np.float32)})
    finally:
        runner.close()


def test_nested_tuples_are_flattened_in_order() -> None:
    out = _run("nested", [TensorSpec("y", "FP32"), TensorSpec("h", "FP32"), TensorSpec("c", "FP32")])
    assert [(name, float(array[0, 0])) for name, (array, _) in out.items()] == [("y", 1), ("h", 2), ("c", 3)]


def test_a_parameter_can_be_returned() -> None:
    array, datatype = _run("parameter", [TensorSpec("w", "FP32")])["w"]
    assert datatype == "FP32" and np.array_equal(array, np.ones((2, 3), dtype=np.float32))


def test_undeclared_outputs_are_named_like_triton() -> None:
    assert list(_run("nested", [])) == ["output__0", "output__1", "output__2"]
    assert list(_run("dict", [])) == ["b", "a"]


def test_dict_outputs_are_picked_by_declared_name() -> None:
    out = _run("dict", [TensorSpec("a", "FP32")])
    assert list(out) == ["a"] and float(out["a"][0][0, 0]) == 1
    with pytest.raises(ModelFailed, match=r"lack the declared output\(s\) \['c'\]"):
        _run("dict", [TensorSpec("c", "FP32")])


def test_output_count_and_type_mismatches_are_model_failures() -> None:
    with pytest.raises(ModelFailed, match=r"returned 3 tensor\(s\) but its settings declare 1 output"):
        _run("nested", [TensorSpec("y", "FP32")])
    with pytest.raises(ModelFailed, match="returned a str"):
        _run("other", [])
    with pytest.raises(ModelFailed, match=r"returned output 'i' that is torch\.int64 but is declared INT32"):
        _run("int", [TensorSpec("i", "INT32")])
    assert _run("int", [TensorSpec("i", "INT64")])["i"][1] == "INT64"


def test_missing_input_is_invalid_input() -> None:
    runner = TorchRunner("m", Several("int"), CPU, [TensorSpec("x", "FP32")], [])
    try:
        with pytest.raises(InvalidInput, match="needs input 'x'"):
            runner.run({})
    finally:
        runner.close()
