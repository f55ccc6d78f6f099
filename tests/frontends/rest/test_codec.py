"""The REST wire format (``runtime.frontends.rest.codec``): JSON bodies and the binary tensor data extension."""

from __future__ import annotations

import math

import numpy as np
import orjson
import pytest

from runtime.errors import InvalidInput
from runtime.frontends.rest import codec
from runtime.frontends.rest.codec import encode_response, parse_json, parse_request, split_body
from runtime.tensors import to_json_data
from runtime.types import InferenceRequest, InferenceResponse, Parameters, ResponseOutput, UInt64


def test_parse_json_accepts_non_finite_tokens_and_refuses_malformed_json() -> None:
    assert parse_json(b'{"a": [1, 2]}') == {"a": [1, 2]}
    values = parse_json(b"[NaN, Infinity, -Infinity]")
    assert math.isnan(values[0]) and values[1:] == [math.inf, -math.inf]
    with pytest.raises(InvalidInput, match="Malformed JSON"):
        parse_json(b'{"a": ')
    with pytest.raises(InvalidInput, match="Malformed JSON"):
        parse_json(b"[NaN,")


def test_split_body_cuts_the_json_header_from_the_binary_part() -> None:
    assert split_body(b"{}", None) == (b"{}", None)
    json_part, binary = split_body(b"{}\x01\x02", "2")
    assert json_part == b"{}" and binary is not None and bytes(binary) == b"\x01\x02"
    with pytest.raises(InvalidInput, match="must be an integer"):
        split_body(b"{}", "two")
    with pytest.raises(InvalidInput, match="is 5 but the body has 2 bytes"):
        split_body(b"{}", "5")
    with pytest.raises(InvalidInput):
        split_body(b"{}", "-1")


def _binary_request(*sizes: int | None) -> bytes:
    inputs = []
    for i, size in enumerate(sizes):
        doc: dict[str, object] = {"name": f"x{i}", "shape": [2], "datatype": "INT32"}
        if size is None:
            doc["data"] = [1, 2]
        else:
            doc["parameters"] = {"binary_data_size": size}
        inputs.append(doc)
    return orjson.dumps({"inputs": inputs})


def test_binary_inputs_take_their_bytes_in_input_order() -> None:
    first = np.array([1, 2], dtype=np.int32).tobytes()
    second = np.array([3, 4], dtype=np.int32).tobytes()
    request = parse_request(_binary_request(8, None, 8), memoryview(first + second))
    assert bytes(request.inputs[0].data) == first
    assert request.inputs[1].data == [1, 2]
    assert bytes(request.inputs[2].data) == second


@pytest.mark.parametrize(
    ("sizes", "binary", "message"),
    [
        ((8,), b"\x00" * 4, "claims 8 binary bytes but only 4 remain"),
        ((4,), b"\x00" * 8, "4 binary bytes that no input's binary_data_size accounts for"),
        ((-1,), b"", "binary_data_size must be a non-negative integer"),
    ],
)
def test_binary_sizes_that_do_not_fit_the_body_are_refused(
    sizes: tuple[int, ...], binary: bytes, message: str
) -> None:
    with pytest.raises(InvalidInput, match=message):
        parse_request(_binary_request(*sizes), memoryview(binary))


def test_an_input_with_both_json_data_and_a_binary_size_is_refused() -> None:
    body = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "shape": [1],
                    "datatype": "INT32",
                    "data": [1],
                    "parameters": {"binary_data_size": 4},
                }
            ]
        }
    )
    with pytest.raises(InvalidInput, match="both JSON data and binary_data_size"):
        parse_request(body, memoryview(b"\x00" * 4))


def test_a_request_that_does_not_validate_names_the_field() -> None:
    with pytest.raises(InvalidInput, match=r"^Invalid request: inputs\.0\.shape"):
        parse_request(b'{"inputs": [{"name": "x", "shape": "no", "datatype": "INT32", "data": [1]}]}', None)


def _response() -> InferenceResponse:
    return InferenceResponse(
        model_name="m",
        id="r1",
        outputs=[
            ResponseOutput(name="a", shape=[2], datatype="FP32", data=np.array([1.5, 2.5], dtype=np.float32)),
            ResponseOutput(name="b", shape=[1], datatype="INT64", data=np.array([7], dtype=np.int64)),
        ],
    )


def test_a_json_response_has_no_binary_part() -> None:
    body, headers = encode_response(_response(), None)
    assert headers == {}
    assert orjson.loads(body) == {
        "model_name": "m",
        "id": "r1",
        "outputs": [
            {"name": "a", "datatype": "FP32", "shape": [2], "data": [1.5, 2.5]},
            {"name": "b", "datatype": "INT64", "shape": [1], "data": [7]},
        ],
    }


def test_binary_outputs_follow_the_json_header_and_an_output_flag_overrides_the_request_flag() -> None:
    request = InferenceRequest.model_validate(
        {
            "inputs": [],
            "parameters": {"binary_data_output": True},
            "outputs": [{"name": "b", "parameters": {"binary_data": False}}],
        }
    )
    body, headers = encode_response(_response(), request)
    size = int(headers["Inference-Header-Content-Length"])
    document = orjson.loads(body[:size])
    a, b = document["outputs"]
    assert a["parameters"] == {"binary_data_size": 8} and "data" not in a
    assert b["data"] == [7] and "parameters" not in b
    assert np.frombuffer(body[size:], dtype=np.float32).tolist() == [1.5, 2.5]


def _checked_everywhere(response: InferenceResponse) -> bytes:
    """What encode_response wrote before it left finite float arrays unchecked: every output's data
    through to_json_data with its check."""
    document = {
        "model_name": response.model_name,
        **({"id": response.id} if response.id is not None else {}),
        **({"parameters": response.parameters.model_dump(exclude_none=True)} if response.parameters else {}),
        "outputs": [
            {
                "name": out.name,
                "datatype": out.datatype.value,
                "shape": out.shape,
                "data": to_json_data(out.data, out.datatype.value),
            }
            for out in response.outputs
        ],
    }
    return orjson.dumps(document, option=orjson.OPT_SERIALIZE_NUMPY)


@pytest.mark.parametrize("datatype", ["FP16", "FP32", "FP64", "BF16"])
@pytest.mark.parametrize(
    "values",
    [[1.5, -2.0], [math.nan, 1.0], [1.0, math.inf], [-math.inf, math.nan], [0.0, -0.0], []],
)
def test_float_outputs_are_written_as_the_checked_path_writes_them(
    datatype: str, values: list[float]
) -> None:
    dtype = {"FP16": np.float16, "FP32": np.float32, "FP64": np.float64, "BF16": np.float32}[datatype]
    array = np.array(values, dtype=dtype)
    if datatype == "BF16":
        array = (array.view(np.uint32) >> 16).astype(np.uint16)
    response = InferenceResponse(
        model_name="m",
        id="r",
        outputs=[
            ResponseOutput(name="f", shape=[len(values)], datatype=datatype, data=array),
            ResponseOutput(name="s", shape=[1], datatype="BYTES", data=np.array([b"null"], dtype=object)),
        ],
    )
    body, headers = encode_response(response, None)
    assert headers == {} and body == _checked_everywhere(response)
    if any(not math.isfinite(v) for v in values):
        assert b"NaN" in body or b"Infinity" in body
        assert b"[null" not in body and b",null" not in body


def test_a_null_elsewhere_with_finite_floats_changes_nothing() -> None:
    response = InferenceResponse(
        model_name="m",
        id="r",
        parameters=Parameters(note=None, other="null"),
        outputs=[
            ResponseOutput(name="f", shape=[2], datatype="FP32", data=np.array([1, 2], dtype=np.float32))
        ],
    )
    body, _ = encode_response(response, None)
    assert orjson.loads(body)["outputs"][0]["data"] == [1.0, 2.0]
    assert body == _checked_everywhere(response)


class _Named(Parameters):
    pass


@pytest.mark.parametrize(
    "parameters",
    [
        Parameters(),
        Parameters(a=None),
        Parameters(sequence_id="s", sequence_end=True),
        Parameters(sequence_id=7, sequence_replica="r1", sequence_end=False),
        Parameters(x=1.5, z=None, w=3),
        Parameters(content_type="np", a=1),
        Parameters(headers={"h": "v"}),
        Parameters(u=UInt64(5)),
        Parameters(items=[1, None], nested={"a": None}),
        Parameters(inner=Parameters(a=None, b=1)),
        _Named(a=1),
    ],
)
def test_parameters_are_written_as_pydantic_dumps_them(parameters: Parameters) -> None:
    """The direct path for plain extras writes what model_dump(exclude_none=True) gives, in its order."""
    written = codec._parameters(parameters)
    dumped = parameters.model_dump(exclude_none=True) or None
    assert written == dumped
    assert list(written or {}) == list(dumped or {})
    assert [type(v) for v in (written or {}).values()] == [type(v) for v in (dumped or {}).values()]
