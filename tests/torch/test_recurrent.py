"""What carries over between calls of a recurrent model (``runtime.torch.recurrent``): the
recurrence read and checked from the settings (each mistake refused with what to write instead),
a first call's state as zeros and a later call's from the kept state, and ``run_together``
serving several callers with one forward call where their shapes agree, with a small torch
module built here."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from runtime.errors import InvalidInput, ModelFailed
from runtime.settings import ModelSettings
from runtime.torch import TensorSpec, TorchRunner, TorchSettings
from runtime.torch.recurrent import part, read_recurrence, rows, run_together
from runtime.types import MetadataTensor, Parameters

pytestmark = pytest.mark.anyio

STATE = {"sequence_state": {"h0": "h"}}


def _settings(**fields: Any) -> ModelSettings:
    return ModelSettings(
        name="rnn",
        implementation="runtime.torch.TorchModel",
        inputs=[
            MetadataTensor(name="x", datatype="FP32", shape=[-1, 2]),
            MetadataTensor(name="h0", datatype="FP32", shape=[-1, 2], parameters=Parameters(optional=True)),
        ],
        outputs=[
            MetadataTensor(name="y", datatype="FP32", shape=[-1, 2]),
            MetadataTensor(name="h", datatype="FP32", shape=[-1, 2]),
        ],
        **fields,
    )


@pytest.mark.parametrize(
    ("fields", "options", "expected"),
    [
        ({"sequence_batching": True}, {}, "needs parameters.extra.sequence_state"),
        ({}, STATE, "this model's settings set neither"),
        ({"sequence_batching": True}, {**STATE, "max_steps": 3}, "max_steps is used with"),
        ({"continuous_batching": True}, STATE, "needs parameters.extra.max_steps"),
        (
            {"continuous_batching": True},
            {**STATE, "max_steps": 3, "feedback": {"h0": "y"}},
            "'h0' is in both feedback and sequence_state",
        ),
        (
            {"continuous_batching": True},
            {**STATE, "max_steps": 3, "stop": {"output": "z", "values": [0]}},
            "stop watches output 'z'",
        ),
    ],
)
def test_mistakes_in_the_recurrence_are_refused(
    fields: dict[str, Any], options: dict[str, Any], expected: str
) -> None:
    with pytest.raises(ValueError, match=expected):
        read_recurrence(_settings(**fields), TorchSettings(**options))


def test_a_model_without_state_or_steps_has_no_recurrence() -> None:
    assert read_recurrence(_settings(), TorchSettings()) is None


def test_the_state_starts_as_zeros_then_comes_from_the_kept_state() -> None:
    recurrence = read_recurrence(_settings(sequence_batching=True), TorchSettings(**STATE))
    assert recurrence is not None and recurrence.state == {"h0": "h"} and recurrence.max_steps == 0
    first = recurrence.with_state({"x": np.ones((3, 2), np.float32)}, None)
    assert first["h0"].shape == (3, 2) and first["h0"].dtype == np.float32 and not first["h0"].any()
    kept = {"h0": np.full((3, 2), 5, np.float32)}
    assert recurrence.with_state({"x": np.ones((3, 2), np.float32)}, kept)["h0"] is kept["h0"]
    seeded = np.full((3, 2), 7, np.float32)  # the client's own value wins
    assert recurrence.with_state({"x": np.ones((3, 2), np.float32), "h0": seeded}, kept)["h0"] is seeded
    with pytest.raises(InvalidInput, match="keeps the number of rows of its first request"):
        recurrence.with_state({"x": np.ones((1, 2), np.float32)}, kept)
    outputs = {"y": (np.zeros((3, 2), np.float32), "FP32"), "h": (np.ones((3, 2), np.float32), "FP32")}
    assert np.array_equal(recurrence.next_state(outputs)["h0"], np.ones((3, 2)))
    assert not recurrence.stops(outputs)


def test_a_stop_rule_ends_a_stream_when_every_value_is_a_stop_value() -> None:
    options = TorchSettings(sequence_state={"h0": "h"}, max_steps=4, stop={"output": "y", "values": [0]})
    recurrence = read_recurrence(_settings(continuous_batching=True), options)
    assert recurrence is not None and recurrence.max_steps == 4
    assert recurrence.stops({"y": (np.zeros((2, 2), np.float32), "FP32")})
    assert not recurrence.stops({"y": (np.array([[0, 1], [0, 0]], np.float32), "FP32")})


class Adder(nn.Module):
    """y = x + h0 and h = y; counts its forward calls. ``rows_off`` returns one row too many."""

    def __init__(self, rows_off: bool = False) -> None:
        super().__init__()
        self.calls = 0
        self.rows_off = rows_off

    def forward(self, x: torch.Tensor, h0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.calls += 1
        y = x + h0
        if self.rows_off:
            y = torch.cat([y, y[:1]])
        return y, y


def _runner(module: Adder) -> TorchRunner:
    specs = [TensorSpec("x", "FP32"), TensorSpec("h0", "FP32")]
    return TorchRunner(
        "rnn", module, torch.device("cpu"), specs, [TensorSpec("y", "FP32"), TensorSpec("h", "FP32")]
    )


def _arrays(value: float, count: int, width: int = 2) -> dict[str, np.ndarray]:
    return {"x": np.full((count, width), value, np.float32), "h0": np.ones((count, width), np.float32)}


async def test_callers_whose_shapes_agree_share_one_forward_call() -> None:
    module = Adder()
    runner = _runner(module)
    try:
        items = [_arrays(1, 1), _arrays(2, 2), _arrays(3, 1, width=3)]
        results = await run_together(runner, items)
        assert module.calls == 2  # the first two together, the wider one alone
        for result, value, count in zip(results, (1, 2, 3), (1, 2, 1), strict=True):
            assert not isinstance(result, Exception)
            mine = part(*result)
            assert mine["y"][0].shape[0] == count and (mine["y"][0] == value + 1).all()
    finally:
        runner.close()


async def test_a_model_that_breaks_the_rows_fails_its_callers() -> None:
    runner = _runner(Adder(rows_off=True))
    try:
        (result,) = await run_together(runner, [_arrays(1, 2)])
        assert isinstance(result, ModelFailed) and "must return one row per input row" in result.message
    finally:
        runner.close()


def test_rows_are_the_first_dimension_the_inputs_agree_on() -> None:
    assert rows(_arrays(0, 4)) == 4
    with pytest.raises(InvalidInput, match="share their first"):
        rows({"x": np.zeros((2, 2)), "h0": np.zeros((3, 2))})
