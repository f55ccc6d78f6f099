"""The checks every request and response go through (``runtime.core.request_checks``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from runtime.core.request_checks import finish_response, prepare_request, raw_request
from runtime.errors import InvalidInput, ModelFailed
from runtime.settings import ModelParameters, ModelSettings
from runtime.types import (
    Datatype,
    InferenceRequest,
    InferenceResponse,
    MetadataTensor,
    Parameters,
    RequestOutput,
    ResponseOutput,
)


def _settings(**settings: Any) -> ModelSettings:
    return ModelSettings(name="m", **settings)


def _tensor(name: str, shape: list[int], datatype: str = "FP32", **extra: Any) -> MetadataTensor:
    return MetadataTensor(name=name, shape=shape, datatype=Datatype(datatype), **extra)


def _request(
    *inputs: tuple[str, list[int], str, list[Any]], outputs: list[str] | None = None
) -> InferenceRequest:
    return InferenceRequest.model_validate(
        {
            "inputs": [
                {"name": name, "shape": shape, "datatype": datatype, "data": data}
                for name, shape, datatype, data in inputs
            ],
            "outputs": [{"name": name} for name in outputs] if outputs is not None else None,
        }
    )


def test_prepare_request_turns_data_into_arrays_of_the_input_shape() -> None:
    request = _request(("x", [2, 2], "INT32", [1, 2, 3, 4]))
    prepare_request(request, _settings())
    data = request.inputs[0].data
    assert isinstance(data, np.ndarray) and data.shape == (2, 2) and data.dtype == np.int32


def test_an_input_sent_twice_is_refused() -> None:
    request = _request(("x", [1], "INT32", [1]), ("x", [1], "INT32", [2]))
    with pytest.raises(InvalidInput, match="appears more than once"):
        prepare_request(request, _settings())


@pytest.mark.parametrize(
    ("inp", "message"),
    [
        (("y", [1, 3], "FP32", [1, 2, 3]), "has no input 'y'; its inputs are \\['x'\\]"),
        (("x", [1, 3], "INT32", [1, 2, 3]), "must be FP32, got INT32"),
        (("x", [1, 2], "FP32", [1, 2]), r"must have shape \[-1, 3\] \(-1: any\), got \[1, 2\]"),
        (("x", [3], "FP32", [1, 2, 3]), "must have shape"),
    ],
)
def test_inputs_are_checked_against_the_declared_ones(
    inp: tuple[str, list[int], str, list[Any]], message: str
) -> None:
    settings = _settings(inputs=[_tensor("x", [-1, 3])])
    with pytest.raises(InvalidInput, match=message):
        prepare_request(_request(inp), settings)
    prepare_request(_request(("x", [4, 3], "FP32", list(range(12)))), settings)  # -1 takes any size


def test_missing_inputs_are_refused_only_when_required_and_not_optional() -> None:
    declared = [
        _tensor("x", [1]),
        _tensor("y", [1]),
        _tensor("z", [1], parameters=Parameters.model_validate({"optional": True})),
    ]
    prepare_request(_request(("x", [1], "FP32", [1])), _settings(inputs=declared))
    with pytest.raises(InvalidInput, match=r"expects input\(s\) \['y'\] which the request lacks"):
        prepare_request(
            _request(("x", [1], "FP32", [1])), _settings(inputs=declared, require_declared_inputs=True)
        )


def test_a_requested_output_must_be_declared() -> None:
    settings = _settings(outputs=[_tensor("out", [1])])
    with pytest.raises(InvalidInput, match="has no output 'other'; its outputs are \\['out'\\]"):
        prepare_request(_request(("x", [1], "FP32", [1]), outputs=["other"]), settings)


def test_raw_request_sizes_the_one_unknown_dimension_from_the_body() -> None:
    body = np.arange(6, dtype=np.float32).tobytes()
    request = raw_request(body, [_tensor("x", [-1, 3])])
    assert request.inputs[0].shape == [2, 3] and request.inputs[0].data == body
    with pytest.raises(InvalidInput, match="does not fit input 'x'"):
        raw_request(body[:8], [_tensor("x", [-1, 3])])
    with pytest.raises(InvalidInput, match="cannot say its size"):
        raw_request(body, [_tensor("x", [-1, -1])])
    with pytest.raises(InvalidInput, match="declares exactly one input; this one declares 2"):
        raw_request(body, [_tensor("x", [6]), _tensor("y", [6])])


def test_finish_response_names_the_answer_and_keeps_only_the_outputs_asked_for() -> None:
    settings = _settings(parameters=ModelParameters(version="v2"))
    outputs = [
        ResponseOutput(name="a", shape=[1], datatype=Datatype.INT32, data=[1]),
        ResponseOutput(name="b", shape=[1], datatype=Datatype.INT32, data=[2]),
    ]
    request = InferenceRequest(id="req-1", inputs=[], outputs=[RequestOutput(name="b")])
    response = finish_response(InferenceResponse(model_name="", outputs=outputs), request, settings)
    assert (response.model_name, response.model_version, response.id) == ("m", "v2", "req-1")
    assert [out.name for out in response.outputs] == ["b"]
    assert isinstance(response.outputs[0].data, np.ndarray)
    missing = InferenceRequest(inputs=[], outputs=[RequestOutput(name="c")])
    with pytest.raises(
        InvalidInput, match="Output 'c' was requested but model 'm' returned only \\['a', 'b'\\]"
    ):
        finish_response(InferenceResponse(outputs=list(outputs)), missing, settings)


def test_finish_response_refuses_what_is_not_a_response() -> None:
    with pytest.raises(ModelFailed, match="returned a dict, not an InferenceResponse"):
        finish_response({"outputs": []}, None, _settings())  # type: ignore[arg-type]
