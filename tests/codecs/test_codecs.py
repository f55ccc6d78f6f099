"""MLServer's codec API: NumpyCodec, StringCodec, Base64Codec, request codecs, decode_args, MLModel helpers."""

from __future__ import annotations

import numpy as np
import pytest

from runtime import MLModel, ModelSettings, decode_args
from runtime.codecs import (
    Base64Codec,
    NumpyCodec,
    NumpyRequestCodec,
    StringCodec,
    StringRequestCodec,
    find_input_codec,
    find_request_codec,
)
from runtime.errors import InvalidInput
from runtime.types import InferenceRequest, Parameters, RequestInput, RequestOutput


def test_numpy_codec_round_trip() -> None:
    arr = np.arange(6, dtype=np.int16).reshape(2, 3)
    out = NumpyCodec.encode_output("y", arr)
    assert out.parameters is not None
    assert (out.datatype.value, out.shape, out.parameters.content_type) == ("INT16", [2, 3], "np")
    np.testing.assert_array_equal(NumpyCodec.decode_output(out), arr)
    inp = NumpyCodec.encode_input("x", arr)
    np.testing.assert_array_equal(NumpyCodec.decode_input(inp), arr)


def test_numpy_codec_decodes_wire_lists() -> None:
    inp = RequestInput(name="x", shape=[2, 2], datatype="FP32", data=[1, 2, 3, 4])
    decoded = NumpyCodec.decode_input(inp)
    assert decoded.dtype == np.float32 and decoded.shape == (2, 2)


def test_string_codec() -> None:
    out = StringCodec.encode_output("s", ["a", "\u00fc"])
    assert out.shape == [2, 1] and out.datatype.value == "BYTES"
    assert StringCodec.decode_output(out) == ["a", "\u00fc"]
    inp = RequestInput(name="s", shape=[2], datatype="BYTES", data=["x", "y"])
    assert StringCodec.decode_input(inp) == ["x", "y"]
    bad = RequestInput(name="s", shape=[1], datatype="BYTES", data=np.array([b"\xff"], dtype=object))
    with pytest.raises(InvalidInput, match="UTF-8"):
        StringCodec.decode_input(bad)


def test_base64_codec() -> None:
    payload = [b"\x00\x01binary", b"more"]
    out = Base64Codec.encode_output("b", payload)
    assert Base64Codec.decode_output(out) == payload
    inp = RequestInput(name="b", shape=[1], datatype="BYTES", data=["aGVsbG8="])
    assert Base64Codec.decode_input(inp) == [b"hello"]
    with pytest.raises(InvalidInput, match="base64"):
        Base64Codec.decode_input(RequestInput(name="b", shape=[1], datatype="BYTES", data=["%%%"]))


def test_request_codecs() -> None:
    arr = np.ones((2, 2), dtype=np.float64)
    request = NumpyRequestCodec.encode_request(arr)
    np.testing.assert_array_equal(NumpyRequestCodec.decode_request(request), arr)
    response = NumpyRequestCodec.encode_response("m", arr, "3")
    assert response.model_version == "3"
    np.testing.assert_array_equal(NumpyRequestCodec.decode_response(response), arr)
    request = StringRequestCodec.encode_request(["hi"])
    assert StringRequestCodec.decode_request(request) == ["hi"]
    assert StringRequestCodec.decode_response(StringRequestCodec.encode_response("m", ["ok"])) == ["ok"]


def test_codec_lookup() -> None:
    assert find_input_codec(content_type="np") is NumpyCodec
    assert find_input_codec(content_type="str") is StringCodec
    assert find_input_codec(content_type="base64") is Base64Codec
    assert find_input_codec(payload=np.zeros(1)) is NumpyCodec
    assert find_input_codec(payload=["a"]) is StringCodec
    assert find_request_codec(content_type="np") is NumpyRequestCodec
    assert find_input_codec(content_type="nope") is None


class Typed(MLModel):
    @decode_args
    async def predict(self, x: np.ndarray, words: list[str]) -> np.ndarray:
        return x * len(words)


@pytest.mark.anyio
async def test_decode_args() -> None:
    model = Typed(ModelSettings(name="typed", implementation=Typed))
    request = InferenceRequest(
        inputs=[
            RequestInput(name="x", shape=[2], datatype="INT32", data=np.array([1, 2], dtype=np.int32)),
            RequestInput(name="words", shape=[3], datatype="BYTES", data=["a", "b", "c"]),
        ],
        outputs=[RequestOutput(name="tripled")],
    )
    response = await model.predict(request)
    assert response.outputs[0].name == "tripled"
    np.testing.assert_array_equal(response.outputs[0].data, [3, 6])
    with pytest.raises(InvalidInput, match="Missing input 'words'"):
        await model.predict(InferenceRequest(inputs=request.inputs[:1]))


def test_model_decode_helpers_follow_content_types() -> None:
    settings = ModelSettings(
        name="m",
        inputs=[{"name": "t", "datatype": "BYTES", "shape": [-1], "parameters": {"content_type": "str"}}],
    )
    model = MLModel(settings)
    by_metadata = RequestInput(name="t", shape=[1], datatype="BYTES", data=["hey"])
    assert model.decode(by_metadata) == ["hey"]
    by_parameter = RequestInput(
        name="u", shape=[1], datatype="BYTES", data=["aGk="], parameters=Parameters(content_type="base64")
    )
    assert model.decode(by_parameter) == [b"hi"]
    plain = RequestInput(name="v", shape=[1], datatype="FP32", data=[1.0])
    assert model.decode(plain) is plain
    assert isinstance(model.decode(plain, default_codec=NumpyCodec), np.ndarray)
    response = model.encode_response(np.zeros(2))
    assert response.model_name == "m" and response.outputs[0].shape == [2]
    out = model.encode(["a"], RequestOutput(name="o", parameters=Parameters(content_type="str")))
    assert out.datatype.value == "BYTES"
    request = InferenceRequest(parameters=Parameters(content_type="np"), inputs=[plain])
    assert isinstance(model.decode_request(request), np.ndarray)
