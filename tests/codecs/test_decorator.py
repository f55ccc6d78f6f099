"""``decode_args`` (``runtime.codecs.decorator``): typed ``predict`` arguments and results."""

from __future__ import annotations

import numpy as np
import pytest

from runtime import MLModel, ModelSettings
from runtime.codecs.decorator import decode_args
from runtime.types import InferenceRequest, RequestInput

pytestmark = pytest.mark.anyio

ONE = np.array([1])


class Split(MLModel):
    @decode_args
    def predict(self, x: np.ndarray, scale: np.ndarray = ONE) -> tuple[np.ndarray, list[str]]:
        return x * int(scale[0]), [f"n={x.size}"]


def _model() -> Split:
    return Split(ModelSettings(name="split", implementation=Split))


def _x() -> RequestInput:
    return RequestInput(name="x", shape=[2], datatype="INT64", data=np.array([1, 2]))


async def test_a_plain_function_whose_tuple_result_becomes_outputs_named_in_order() -> None:
    response = await _model().predict(InferenceRequest(inputs=[_x()]))
    assert response.model_name == "split"
    assert [(out.name, out.datatype.value) for out in response.outputs] == [
        ("output-0", "INT64"),
        ("output-1", "BYTES"),
    ]
    assert response.outputs[0].data.tolist() == [1, 2]


async def test_an_argument_with_a_default_may_be_left_out() -> None:
    scale = RequestInput(name="scale", shape=[1], datatype="INT64", data=np.array([3]))
    response = await _model().predict(InferenceRequest(inputs=[_x(), scale]))
    assert response.outputs[0].data.tolist() == [3, 6]


def test_an_argument_no_codec_decodes_is_refused_when_the_model_is_written() -> None:
    with pytest.raises(TypeError, match="no codec for argument 'count'"):

        @decode_args
        def predict(self: MLModel, count: int) -> np.ndarray:
            return np.zeros(count)


async def test_a_result_no_codec_encodes_is_refused() -> None:
    class Odd(MLModel):
        @decode_args
        async def predict(self, x: np.ndarray) -> object:
            return {"not": "a tensor"}

    with pytest.raises(TypeError, match="no codec can encode a dict"):
        await Odd(ModelSettings(name="odd", implementation=Odd)).predict(InferenceRequest(inputs=[_x()]))
