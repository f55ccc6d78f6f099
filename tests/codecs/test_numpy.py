"""The numpy codecs (``runtime.codecs.numpy``): dtypes to datatypes, arrays kept as they are."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.codecs.numpy import NumpyCodec, NumpyRequestCodec
from runtime.errors import InvalidInput
from runtime.types import InferenceRequest, InferenceResponse, RequestInput


@pytest.mark.parametrize(
    ("array", "datatype"),
    [
        (np.array([True, False]), "BOOL"),
        (np.zeros(2, np.uint8), "UINT8"),
        (np.zeros(2, np.int64), "INT64"),
        (np.zeros(2, np.float16), "FP16"),
        (np.zeros(2, np.float64), "FP64"),
        (np.array(["a", "bc"]), "BYTES"),
        (np.array([b"a", b"bc"]), "BYTES"),
    ],
)
def test_an_array_is_encoded_with_the_datatype_of_its_dtype(array: np.ndarray, datatype: str) -> None:
    out = NumpyCodec.encode_output("y", array)
    assert (out.datatype.value, out.shape) == (datatype, [2])
    assert NumpyCodec.can_encode(array) and not NumpyCodec.can_encode([1, 2])


def test_a_dtype_without_a_datatype_is_refused() -> None:
    with pytest.raises(InvalidInput, match="has no protocol datatype"):
        NumpyCodec.encode_output("y", np.zeros(2, np.complex64))


def test_an_input_already_an_array_of_its_shape_is_taken_as_it_is() -> None:
    array = np.arange(4, dtype=np.int32).reshape(2, 2)
    inp = RequestInput(name="x", shape=[2, 2], datatype="INT32", data=array)
    assert NumpyCodec.decode_input(inp) is array
    flat = RequestInput(name="x", shape=[2, 2], datatype="INT32", data=array.reshape(-1))
    assert NumpyCodec.decode_input(flat).shape == (2, 2)


def test_the_request_codec_takes_one_tensor_only() -> None:
    two = InferenceRequest(
        inputs=[NumpyCodec.encode_input("a", np.zeros(1)), NumpyCodec.encode_input("b", np.zeros(1))]
    )
    with pytest.raises(InvalidInput, match="decodes requests of one input, got 2"):
        NumpyRequestCodec.decode_request(two)
    with pytest.raises(InvalidInput, match="decodes responses of one output, got 0"):
        NumpyRequestCodec.decode_response(InferenceResponse(model_name="m"))
    request = NumpyRequestCodec.encode_request(np.zeros(3))
    assert request.parameters is not None and request.parameters.content_type == "np"
    assert [inp.name for inp in request.inputs] == ["input-1"]
