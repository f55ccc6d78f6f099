"""MLServer's content-type rules (``runtime.codecs.content_types``): request level, the model's
default, input-level overrides."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.codecs import Base64Codec, NumpyCodec, StringCodec, decode_inference_request, input_codec
from runtime.codecs.content_types import request_content_type
from runtime.model import MLModel
from runtime.settings import ModelSettings
from runtime.types import InferenceRequest, MetadataTensor, Parameters, RequestInput


def _text(name: str = "t", content_type: str | None = None) -> RequestInput:
    parameters = Parameters(content_type=content_type) if content_type else None
    return RequestInput(
        name=name, shape=[1], datatype="BYTES", data=np.array([b"aGk="], dtype=object), parameters=parameters
    )


def test_the_request_says_first_then_the_model() -> None:
    request = InferenceRequest(parameters=Parameters(content_type="str"), inputs=[_text()])
    assert request_content_type(request, "np") == "str"
    assert request_content_type(InferenceRequest(inputs=[]), "pd") == "pd"
    assert decode_inference_request(request) == ["aGk="]
    assert decode_inference_request(InferenceRequest(inputs=[_text()]), "str") == ["aGk="]


def test_an_input_level_content_type_overrides_the_request_codec() -> None:
    request = InferenceRequest(
        parameters=Parameters(content_type="str"), inputs=[_text(content_type="base64")]
    )
    assert decode_inference_request(request) == [b"hi"]
    declared = {
        "t": MetadataTensor(
            name="t", datatype="BYTES", shape=[-1], parameters=Parameters(content_type="base64")
        )
    }
    assert decode_inference_request(
        InferenceRequest(parameters=Parameters(content_type="str"), inputs=[_text()]), declared=declared
    ) == [b"hi"]


def test_an_input_is_decoded_by_its_own_then_its_declared_content_type() -> None:
    declared = {
        "t": MetadataTensor(
            name="t", datatype="BYTES", shape=[-1], parameters=Parameters(content_type="base64")
        )
    }
    assert input_codec(_text(content_type="str"), declared) is StringCodec
    assert input_codec(_text(), declared) is Base64Codec
    assert input_codec(_text("other"), declared, NumpyCodec) is NumpyCodec


def test_no_codec_leaves_the_request_as_it_came() -> None:
    request = InferenceRequest(inputs=[_text()])
    assert decode_inference_request(request) is request
    assert (
        decode_inference_request(
            InferenceRequest(parameters=Parameters(content_type="nope"), inputs=[_text()])
        )
        is not None
    )


@pytest.mark.parametrize("content_type", ["pd"])
def test_a_model_with_pd_as_its_default_decodes_dataframes(content_type: str) -> None:
    pytest.importorskip("pandas", reason="the pd codec needs pandas")
    model = MLModel(ModelSettings(name="m", parameters={"content_type": content_type}))
    request = InferenceRequest(
        inputs=[RequestInput(name="a", shape=[2], datatype="FP64", data=np.array([1.0, 2.0]))]
    )
    assert model.decode_request(request).a.tolist() == [1.0, 2.0]
