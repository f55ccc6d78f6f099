"""The string and base64 codecs (``runtime.codecs.string``)."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.codecs.string import Base64Codec, StringCodec, StringRequestCodec
from runtime.errors import InvalidInput
from runtime.types import InferenceRequest, RequestInput


def test_strings_and_bytes_are_told_apart_by_their_items() -> None:
    assert StringCodec.can_encode(["a", "b"]) and not StringCodec.can_encode(["a", b"b"])
    assert Base64Codec.can_encode([b"a"]) and not Base64Codec.can_encode(["a"])
    assert not StringCodec.can_encode("text") and not Base64Codec.can_encode(b"raw")


def test_base64_travels_as_base64_text_in_a_column() -> None:
    out = Base64Codec.encode_output("b", [b"\x00\xff", b"hi"])
    assert out.shape == [2, 1] and out.datatype.value == "BYTES"
    assert out.data.reshape(-1).tolist() == [b"AP8=", b"aGk="]
    assert out.parameters is not None and out.parameters.content_type == "base64"


def test_elements_that_are_not_bytes_are_read_as_their_text() -> None:
    data = np.array(["ü", b"b"], dtype=object)
    assert StringCodec.decode_input(RequestInput(name="s", shape=[2], datatype="BYTES", data=data)) == [
        "ü",
        "b",
    ]
    encoded = StringCodec.encode_input("s", ["x", "ÿ"])
    assert encoded.data.reshape(-1).tolist() == [b"x", "ÿ".encode()]


def test_a_base64_element_that_is_not_base64_names_its_tensor() -> None:
    bad = RequestInput(name="img", shape=[1], datatype="BYTES", data=["not base64!"])
    with pytest.raises(InvalidInput, match="Tensor 'img' holds an element that is not valid base64"):
        Base64Codec.decode_input(bad)


def test_the_request_codec_takes_one_tensor_only() -> None:
    request = StringRequestCodec.encode_request(["a", "b"])
    assert request.parameters is not None and request.parameters.content_type == "str"
    assert request.inputs[0].shape == [2, 1]
    two = InferenceRequest(inputs=[*request.inputs, StringCodec.encode_input("other", ["c"])])
    with pytest.raises(InvalidInput, match="decodes requests of one input, got 2"):
        StringRequestCodec.decode_request(two)
