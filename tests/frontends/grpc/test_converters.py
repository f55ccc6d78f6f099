"""gRPC messages ⇄ core types, without a server: tensors, parameters, response forms."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from runtime.errors import InvalidInput, ModelFailed
from runtime.frontends.grpc.converters import (
    Undecodable,
    parameters_from_proto,
    request_from_proto,
    request_reader,
    response_to_proto,
    set_parameters,
)
from runtime.frontends.grpc.generated import dataplane_pb2 as pb
from runtime.tensors import input_array, unpack_bytes
from runtime.types import Datatype, InferenceResponse, Parameters, ResponseOutput, UInt64

TYPED = [
    ("BOOL", "bool_contents", [True, False, True], np.bool_),
    ("INT8", "int_contents", [-128, 0, 127], np.int8),
    ("INT16", "int_contents", [-300, 0, 300], np.int16),
    ("INT32", "int_contents", [-(2**31), 0, 2**31 - 1], np.int32),
    ("INT64", "int64_contents", [-(2**63), 0, 2**63 - 1], np.int64),
    ("UINT8", "uint_contents", [0, 1, 255], np.uint8),
    ("UINT16", "uint_contents", [0, 1, 65535], np.uint16),
    ("UINT32", "uint_contents", [0, 1, 2**32 - 1], np.uint32),
    ("UINT64", "uint64_contents", [0, 1, 2**64 - 1], np.uint64),
    ("FP32", "fp32_contents", [0.5, -1.25, 3.0], np.float32),
    ("FP64", "fp64_contents", [0.1, -1e300, 3.0], np.float64),
    ("BYTES", "bytes_contents", [b"a", b"", b"\xff\x00"], object),
]


def typed_request(datatype: str, field: str, values: list[Any], shape: list[int]) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m")
    tensor = request.inputs.add(name="x", datatype=datatype, shape=shape)
    getattr(tensor.contents, field).extend(values)
    return request


@pytest.mark.parametrize(("datatype", "field", "values", "dtype"), TYPED)
def test_typed_contents_become_one_array_of_the_datatype(
    datatype: str, field: str, values: list[Any], dtype: type[Any]
) -> None:
    inp = request_from_proto(typed_request(datatype, field, values, [1, 3])).inputs[0]
    assert isinstance(inp.data, np.ndarray) and inp.data.dtype == np.dtype(dtype)
    array = input_array(inp)
    assert array.shape == (1, 3) and array.reshape(-1).tolist() == values


@pytest.mark.parametrize(("datatype", "field", "values", "dtype"), TYPED)
def test_outputs_round_trip_in_both_forms(
    datatype: str, field: str, values: list[Any], dtype: type[Any]
) -> None:
    array = np.array(values, dtype=dtype)
    response = InferenceResponse(
        model_name="m", id="r", outputs=[ResponseOutput(name="y", shape=[3], datatype=datatype, data=array)]
    )
    typed = response_to_proto(response, raw=False)
    assert not typed.raw_output_contents
    assert list(getattr(typed.outputs[0].contents, field)) == values
    raw = response_to_proto(response, raw=True)
    assert not raw.outputs[0].HasField("contents")
    if datatype == "BYTES":
        assert unpack_bytes("y", raw.raw_output_contents[0]).tolist() == values
    else:
        assert np.frombuffer(raw.raw_output_contents[0], dtype=dtype).tolist() == values


def test_raw_contents_stay_bytes_until_the_core_views_them() -> None:
    request = pb.ModelInferRequest(model_name="m")
    request.inputs.add(name="x", datatype="FP16", shape=[2, 2])
    request.raw_input_contents.append(np.arange(4, dtype=np.float16).tobytes())
    inp = request_from_proto(request).inputs[0]
    assert isinstance(inp.data, bytes)
    array = input_array(inp)
    assert array.dtype == np.float16 and array.base is not None  # a frombuffer view, not a copy
    assert array.tolist() == [[0, 1], [2, 3]]


def test_a_typed_request_with_a_fp16_output_is_answered_raw() -> None:
    """A response cannot mix raw and typed outputs, and FP16 has no typed field."""
    response = InferenceResponse(
        model_name="m",
        outputs=[
            ResponseOutput(name="a", shape=[1], datatype="FP16", data=np.ones(1, np.float16)),
            ResponseOutput(name="b", shape=[1], datatype="INT32", data=np.ones(1, np.int32)),
        ],
    )
    message = response_to_proto(response, raw=False)
    assert len(message.raw_output_contents) == 2
    assert not message.outputs[1].HasField("contents")


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda r: r.inputs.add(name="x", datatype="FP99", shape=[1]), "unknown datatype"),
        (
            lambda r: r.inputs.add(name="x", datatype="FP32", shape=[1]).contents.int_contents.append(1),
            "must carry its data in fp32_contents",
        ),
        (
            lambda r: r.inputs.add(name="x", datatype="FP16", shape=[1]).contents.fp32_contents.append(1),
            "no typed contents field",
        ),
        (
            lambda r: r.inputs.add(name="x", datatype="INT8", shape=[1]).contents.int_contents.append(1000),
            "not valid INT8",
        ),
        (
            lambda r: (
                r.inputs.add(name="x", datatype="FP32", shape=[1]),
                r.inputs.add(name="y", datatype="FP32", shape=[1]),
                r.raw_input_contents.append(b"\0" * 4),
            ),
            "raw_input_contents entries",
        ),
        (
            lambda r: (
                r.inputs.add(name="x", datatype="FP32", shape=[1]).contents.fp32_contents.append(1),
                r.raw_input_contents.append(b"\0" * 4),
            ),
            "typed contents in a request that uses raw_input_contents",
        ),
        (lambda r: r.parameters["p"], "has no value"),
        (lambda r: setattr(r.parameters["content_type"], "int64_param", 3), "content_type"),
    ],
)
def test_malformed_requests_are_invalid_input(
    build: Callable[[pb.ModelInferRequest], object], message: str
) -> None:
    request = pb.ModelInferRequest(model_name="m")
    build(request)
    with pytest.raises(InvalidInput, match=message):
        request_from_proto(request)


def test_five_parameter_kinds_keep_their_kind() -> None:
    source = pb.ModelInferRequest()
    source.parameters["b"].bool_param = True
    source.parameters["i"].int64_param = -(2**63)
    source.parameters["s"].string_param = "text"
    source.parameters["d"].double_param = 0.25
    source.parameters["u"].uint64_param = 7
    source.parameters["u_big"].uint64_param = 2**64 - 1
    params = parameters_from_proto(source.parameters, "the request")
    assert params is not None
    extra = params.model_extra
    assert extra is not None and type(extra["u"]) is UInt64 and type(extra["i"]) is int
    echoed = pb.ModelInferResponse()
    set_parameters(echoed.parameters, params, "the response")
    assert {k: v.WhichOneof("parameter_choice") for k, v in echoed.parameters.items()} == {
        "b": "bool_param",
        "i": "int64_param",
        "s": "string_param",
        "d": "double_param",
        "u": "uint64_param",
        "u_big": "uint64_param",
    }
    assert echoed.parameters == source.parameters


def test_plain_integers_pick_the_kind_that_holds_them() -> None:
    message = pb.ModelInferResponse()
    set_parameters(
        message.parameters,
        Parameters(small=-5, large=2**63, numpy=np.int32(3), flag=np.bool_(True), items=[1, "a"]),
        "the response",
    )
    kinds = {k: v.WhichOneof("parameter_choice") for k, v in message.parameters.items()}
    assert kinds == {
        "small": "int64_param",
        "large": "uint64_param",
        "numpy": "int64_param",
        "flag": "bool_param",
        "items": "string_param",
    }
    assert message.parameters["items"].string_param == '[1,"a"]'
    for value in (2**64, -(2**63) - 1):
        with pytest.raises(ModelFailed, match="outside"):
            set_parameters(pb.ModelInferResponse().parameters, Parameters(x=value), "the response")


def test_request_fields_carry_over() -> None:
    request = pb.ModelInferRequest(model_name="m", model_version="2", id="abc")
    tensor = request.inputs.add(name="x", datatype="INT32", shape=[2])
    tensor.contents.int_contents.extend([1, 2])
    tensor.parameters["content_type"].string_param = "np"
    out = request.outputs.add(name="y")
    out.parameters["binary_data"].bool_param = False
    converted = request_from_proto(request)
    assert converted.id == "abc"
    assert converted.inputs[0].datatype is Datatype.INT32
    assert converted.inputs[0].parameters is not None and converted.inputs[0].parameters.content_type == "np"
    assert converted.outputs is not None and converted.outputs[0].name == "y"
    assert converted.outputs[0].parameters is not None
    assert converted.outputs[0].parameters.model_extra == {"binary_data": False}
    assert request_from_proto(pb.ModelInferRequest(model_name="m")).id is None


def test_the_request_reader_gives_the_message_or_what_refuses_it() -> None:
    read = request_reader(pb.ModelInferRequest)
    message = read(pb.ModelInferRequest(model_name="m", id="1").SerializeToString())
    assert (message.model_name, message.id) == ("m", "1")
    refused = read(b"\xff\xff\xff")
    assert isinstance(refused, Undecodable)
    for read_it in (lambda: refused.model_name, refused.decode):
        with pytest.raises(InvalidInput, match=r"not a valid inference\.ModelInferRequest"):
            read_it()
