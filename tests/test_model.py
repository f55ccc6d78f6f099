"""The model API (``runtime.model``): a model's identity and declared tensors come from its
settings, ``load``/``unload`` succeed by default, its metadata says what the settings declare, a
model without ``predict`` refuses unary requests with a clear 400 while ``predict_stream`` answers
each request with ``predict`` by default, and the codec helpers decode and encode by content type
(the request's, then the declared input's) or by the value's type."""

from __future__ import annotations

from collections.abc import AsyncIterator

import numpy as np
import pytest

from runtime.codecs import NumpyCodec, StringCodec
from runtime.errors import InvalidInput
from runtime.model import MLModel
from runtime.settings import ModelParameters, ModelSettings
from runtime.types import InferenceRequest, MetadataTensor, Parameters, RequestInput, RequestOutput
from tests.conftest import InProcess
from tests.models import zoo

pytestmark = pytest.mark.anyio


def _settings(**fields: object) -> ModelSettings:
    return ModelSettings(name="m", implementation=MLModel, **fields)  # type: ignore[arg-type]


def _strings(*values: str, content_type: str | None = None) -> RequestInput:
    return RequestInput(
        name="words",
        shape=[len(values)],
        datatype="BYTES",
        data=[v.encode() for v in values],
        parameters=Parameters(content_type=content_type) if content_type else None,
    )


async def test_identity_and_lifecycle_come_from_the_settings() -> None:
    tensor = MetadataTensor(name="x", datatype="FP32", shape=[-1, 2])
    model = MLModel(_settings(parameters=ModelParameters(version="3"), inputs=[tensor]))
    assert (model.name, model.version, model.ready) == ("m", "3", False)
    assert model.inputs == [tensor] and model.outputs == []
    assert await model.load() is True and await model.unload() is True
    model.outputs = [MetadataTensor(name="y", datatype="FP32", shape=[-1])]
    assert [t.name for t in model.settings.outputs] == ["y"]


async def test_metadata_says_what_the_settings_declare() -> None:
    tensor = MetadataTensor(name="x", datatype="FP32", shape=[-1, 2])
    model = MLModel(
        _settings(
            versions=["1", "2"],
            platform="custom",
            inputs=[tensor],
            parameters=ModelParameters(content_type="np"),
        )
    )
    meta = await model.metadata()
    assert meta.name == "m" and meta.versions == ["1", "2"] and meta.platform == "custom"
    assert meta.inputs == [tensor] and meta.outputs == []
    assert meta.parameters is not None and meta.parameters.content_type == "np"
    assert (await MLModel(_settings()).metadata()).parameters is None


async def test_a_model_without_predict_refuses_unary_requests() -> None:
    with pytest.raises(InvalidInput, match="'m' does not implement predict"):
        await MLModel(_settings()).predict(InferenceRequest(inputs=[]))


async def test_predict_stream_answers_each_request_with_predict_by_default() -> None:
    model = zoo.Echo(ModelSettings(name="echo", implementation=zoo.Echo))

    async def requests() -> AsyncIterator[InferenceRequest]:
        for value in (1, 2, 3):
            yield InferenceRequest(inputs=[RequestInput(name="x", shape=[1], datatype="INT64", data=[value])])

    answers = [response async for response in model.predict_stream(requests())]
    assert [a.outputs[0].data for a in answers] == [[1], [2], [3]]


def test_decode_by_the_request_then_the_declared_content_type() -> None:
    plain = MLModel(_settings())
    raw = _strings("a", "b")
    assert plain.decode(raw) is raw  # nothing says how: the input as it is
    assert plain.decode(_strings("a", "b", content_type="str")) == ["a", "b"]
    assert plain.decode(raw, default_codec=StringCodec) == ["a", "b"]
    declared = MLModel(
        _settings(
            inputs=[
                MetadataTensor(
                    name="words", datatype="BYTES", shape=[-1], parameters=Parameters(content_type="str")
                )
            ]
        )
    )
    assert declared.decode(_strings("c")) == ["c"]


def test_encode_by_the_values_type_or_the_asked_content_type() -> None:
    model = MLModel(_settings(parameters=ModelParameters(version="2")))
    response = model.encode_response(np.array([[1.0, 2.0]], dtype=np.float32))
    assert response.model_name == "m" and response.model_version == "2"
    assert response.outputs[0].datatype == "FP32" and response.outputs[0].shape == [1, 2]
    output = model.encode(np.array([1, 2]), RequestOutput(name="y"))
    assert output.name == "y" and output.datatype == "INT64"
    as_strings = model.encode(["a"], RequestOutput(name="s", parameters=Parameters(content_type="str")))
    assert as_strings.datatype == "BYTES"
    assert model.encode(np.array([1.5]), RequestOutput(name="z"), default_codec=NumpyCodec).datatype == "FP64"
    with pytest.raises(TypeError, match="No codec can encode a object"):
        model.encode(object(), RequestOutput(name="o"))
    with pytest.raises(TypeError, match="No request codec can encode a object"):
        model.encode_response(object())


async def test_served_a_model_without_predict_is_a_400_naming_it(inprocess: InProcess) -> None:
    await inprocess.load(ModelSettings(name="bare", implementation=MLModel))
    async with inprocess.client() as client:
        answer = await client.post("/v2/models/bare/infer", json={"inputs": []})
    assert answer.status_code == 400 and "'bare' does not implement predict" in answer.json()["error"]
