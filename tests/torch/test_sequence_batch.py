"""Sequence batching of a PyTorch model (``runtime.torch.sequence_batch``), with a TorchScript
accumulator saved here and loaded by the real runtime: a sequence's first step starts from zeros,
each later step from the state its previous step left (kept as the mapped outputs), the steps of
several sequences answered one response each and in order, and a step whose inputs do not fit
fails alone."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from runtime.core.registry import Registry
from runtime.errors import InvalidInput
from runtime.sequences.sequence_model import SequenceStep
from runtime.settings import ModelSettings
from runtime.torch import TorchModel
from runtime.torch.recurrent import Recurrence, read_recurrence
from runtime.torch.sequence_batch import predict_sequences
from runtime.torch.torch_settings import read_config
from runtime.types import InferenceRequest, InferenceResponse, RequestInput

pytestmark = pytest.mark.anyio


class Accumulator(nn.Module):
    """y = h = x + h0: the running sum of a sequence's inputs."""

    def forward(self, x: torch.Tensor, h0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        total = x + h0
        return total, total


@pytest.fixture
async def accumulator(tmp_path: Path) -> AsyncIterator[tuple[TorchModel, Recurrence]]:
    torch.jit.script(Accumulator()).save(str(tmp_path / "m.pt"))
    document = {
        "name": "acc",
        "implementation": "runtime.torch.TorchModel",
        "sequence_batching": True,
        "inputs": [
            {"name": "x", "datatype": "FP32", "shape": [-1, 2]},
            {"name": "h0", "datatype": "FP32", "shape": [-1, 2], "parameters": {"optional": True}},
        ],
        "outputs": [
            {"name": "y", "datatype": "FP32", "shape": [-1, 2]},
            {"name": "h", "datatype": "FP32", "shape": [-1, 2]},
        ],
        "parameters": {"uri": "m.pt", "extra": {"sequence_state": {"h0": "h"}}},
    }
    (tmp_path / "model-settings.json").write_text(json.dumps(document))
    settings = ModelSettings.from_file(tmp_path / "model-settings.json")
    registry = Registry()
    entry = await registry.load(settings)
    assert isinstance(entry.model, TorchModel), entry.reason
    recurrence = read_recurrence(settings, read_config(settings).options)
    assert recurrence is not None
    yield entry.model, recurrence
    await registry.unload_all()


def _step(key: str, values: list[list[float]], start: bool, state: object = None) -> SequenceStep:
    x = np.array(values, dtype=np.float32)
    request = InferenceRequest(inputs=[RequestInput(name="x", shape=list(x.shape), datatype="FP32", data=x)])
    return SequenceStep(request, key, start, False, state)


def _y(response: InferenceResponse | BaseException) -> np.ndarray:
    assert isinstance(response, InferenceResponse), response
    return np.asarray(next(o.data for o in response.outputs if o.name == "y"))


async def test_each_step_starts_from_the_state_its_previous_step_left(
    accumulator: tuple[TorchModel, Recurrence],
) -> None:
    model, recurrence = accumulator
    a1, b1 = _step("a", [[1, 2]], True), _step("b", [[10, 20], [30, 40]], True)
    first = await predict_sequences(model, recurrence, [a1, b1])
    assert np.array_equal(_y(first[0]), [[1, 2]]) and np.array_equal(_y(first[1]), [[10, 20], [30, 40]])
    assert np.array_equal(a1.state["h0"], [[1, 2]])  # the state: the mapped output
    a2 = _step("a", [[1, 1]], False, a1.state)
    b2 = _step("b", [[1, 1], [2, 2]], False, b1.state)
    second = await predict_sequences(model, recurrence, [a2, b2])
    assert np.array_equal(_y(second[0]), [[2, 3]])
    assert np.array_equal(_y(second[1]), [[11, 21], [32, 42]])
    assert np.array_equal(b2.state["h0"], [[11, 21], [32, 42]])


async def test_a_step_that_does_not_fit_fails_alone(accumulator: tuple[TorchModel, Recurrence]) -> None:
    model, recurrence = accumulator
    a1 = _step("a", [[1, 2]], True)
    await predict_sequences(model, recurrence, [a1])
    wrong_rows = _step("a", [[1, 1], [1, 1]], False, a1.state)  # two rows where the sequence has one
    missing = SequenceStep(InferenceRequest(inputs=[]), "c", True, False, None)
    good = _step("d", [[5, 5]], True)
    results = await predict_sequences(model, recurrence, [wrong_rows, missing, good])
    assert isinstance(results[0], InvalidInput) and "rows of its first request" in results[0].message
    assert isinstance(results[1], InvalidInput) and "'x'" in results[1].message
    assert np.array_equal(_y(results[2]), [[5, 5]])
    assert wrong_rows.state is a1.state  # a failed step leaves the previous state
