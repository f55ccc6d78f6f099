"""The wire format between the server and a worker process (``runtime.workers.wire``), read back
as its docstring lays it out: ``u32 body length | u32 buffer count | u64 length of each buffer |
body | buffers``, with requests and responses sent as their fields."""

from __future__ import annotations

import pickle
import struct
from typing import Any

import numpy as np
import pytest

from runtime.types import (
    Datatype,
    InferenceRequest,
    InferenceResponse,
    Parameters,
    RequestInput,
    RequestOutput,
    ResponseOutput,
)
from runtime.workers.wire import (
    COUNT,
    DIRECT,
    FLAT_REQUEST,
    FLAT_RESPONSE,
    FORMS,
    HEAD,
    Encoder,
    _flat_parameters,
    _Form,
    _parameters,
    encode,
    rebuilt,
)


def _decode(pieces: list[bytes | memoryview]) -> tuple[Any, int, int]:
    """The message in ``pieces``, its flat mark and how many out-of-band buffers it had."""
    data = b"".join(bytes(piece) for piece in pieces)
    size, count = HEAD.unpack_from(data)
    flat, count = count & ~COUNT, count & COUNT
    lengths = struct.unpack_from(f"<{count}Q", data, HEAD.size)
    at = HEAD.size + 8 * count
    body = data[at : at + size]
    at += size
    buffers = []
    for length in lengths:
        buffers.append(bytearray(data[at : at + length]))
        at += length
    assert at == len(data)
    message = pickle.loads(body, buffers=buffers)
    return (rebuilt(message, flat) if flat else message), flat, count


def test_a_plain_message_has_no_buffers_and_no_mark() -> None:
    message = ("ping", 7, {"a": [1, 2], "b": "text"})
    assert _decode(encode(message)) == (message, 0, 0)


def test_small_arrays_travel_inside_the_pickle_and_big_ones_out_of_band() -> None:
    small = np.arange(6, dtype=np.int32).reshape(2, 3)
    big = np.arange(DIRECT // 8 + 1, dtype=np.float64)
    (kind, ident, payload), flat, count = _decode(encode(("state", 3, [small, big])))
    assert (kind, ident, flat, count) == ("state", 3, 0, 1)
    assert np.array_equal(payload[0], small) and payload[0].dtype == np.int32 and payload[0].shape == (2, 3)
    assert np.array_equal(payload[1], big)
    assert payload[0].flags.writeable and payload[1].flags.writeable


def test_arrays_that_are_not_plain_numbers_or_not_contiguous_round_trip() -> None:
    strided = np.arange(12, dtype=np.int64).reshape(3, 4)[:, ::2]
    objects = np.array([b"a", b"bc"], dtype=object)
    (_, _, (a, b)), _, _ = _decode(encode(("x", 1, (strided, objects))))
    assert np.array_equal(a, strided) and b.tolist() == [b"a", b"bc"]


def test_a_request_round_trips_as_its_fields() -> None:
    request = InferenceRequest(
        id="r1",
        parameters=Parameters(content_type="np", custom=5),
        inputs=[
            RequestInput(
                name="x", shape=[2], datatype=Datatype.FP32, data=np.array([1.5, 2.5], dtype=np.float32)
            )
        ],
        outputs=[RequestOutput(name="y")],
    )
    (kind, ident, back), flat, _ = _decode(encode(("infer", 9, request)))
    assert (kind, ident, flat) == ("infer", 9, FLAT_REQUEST)
    assert type(back) is InferenceRequest and back.id == "r1"
    assert back.parameters is not None and back.parameters.content_type == "np"
    assert back.parameters.model_extra == {"custom": 5}
    assert back.inputs[0].name == "x" and back.inputs[0].datatype is Datatype.FP32
    assert back.inputs[0].data.tolist() == [1.5, 2.5]
    assert back.outputs is not None and back.outputs[0].name == "y"


def test_a_response_round_trips_as_its_fields_with_one_encoder_reused() -> None:
    encoder = Encoder()
    for i in range(2):  # the pickler is reused: nothing of one message leaks into the next
        response = InferenceResponse(
            model_name="m",
            id=f"r{i}",
            outputs=[
                ResponseOutput(
                    name="y", shape=[1], datatype=Datatype.INT64, data=np.array([i], dtype=np.int64)
                ),
                ResponseOutput(name="s", shape=[1], datatype=Datatype.BYTES, data=[b"text"]),
            ],
        )
        (_, ident, back), flat, _ = _decode(encoder.encode(("answer", i, response)))
        assert (ident, flat) == (i, FLAT_RESPONSE)
        assert type(back) is InferenceResponse and back.model_name == "m" and back.id == f"r{i}"
        assert back.outputs[0].data.tolist() == [i] and back.outputs[1].data == [b"text"]


# every field of every model type that travels as its fields, set to a value that is not its default
_VALUES: dict[type[Any], dict[str, Any]] = {
    InferenceRequest: {
        "id": "r7",
        "parameters": Parameters(content_type="np", headers={"h": "v"}, custom=[1, 2]),
        "inputs": [RequestInput(name="x", shape=[1], datatype=Datatype.INT8, data=[3])],
        "outputs": [RequestOutput(name="y", parameters=Parameters(binary_data=True))],
    },
    InferenceResponse: {
        "model_name": "m",
        "model_version": "2",
        "id": "r7",
        "parameters": Parameters(sequence_id="s"),
        "outputs": [ResponseOutput(name="y", shape=[1], datatype=Datatype.BYTES, data=[b"a"])],
    },
    RequestInput: {
        "name": "x",
        "shape": [2, 1],
        "datatype": Datatype.FP64,
        "parameters": Parameters(content_type="np"),
        "data": np.array([[1.0], [2.0]]),
    },
    ResponseOutput: {
        "name": "y",
        "shape": [2],
        "datatype": Datatype.UINT16,
        "parameters": Parameters(other=1),
        "data": np.array([4, 5], dtype=np.uint16),
    },
    RequestOutput: {"name": "y", "parameters": Parameters(binary_data=False)},
}


def _dumped(model: Any) -> Any:
    """A model's fields, arrays as lists, for comparing two models."""
    return {
        name: value.tolist() if isinstance(value, np.ndarray) else value
        for name, value in model.model_dump().items()
    }


def test_every_field_of_every_type_that_travels_as_its_fields_comes_back() -> None:
    assert {form.cls for form in FORMS} == set(_VALUES)
    for form in FORMS:
        values = _VALUES[form.cls]
        assert set(values) == set(form.cls.model_fields), f"a value for every field of {form.cls.__name__}"
        model = form.cls(**values)
        for name, value in values.items():
            assert value is not form.cls.model_fields[name].default, (form.cls.__name__, name)
        back = form.rebuilt(pickle.loads(pickle.dumps(form.flat(model), protocol=5)))
        assert type(back) is form.cls
        assert _dumped(back) == _dumped(model)
        assert back.model_fields_set == set(form.cls.model_fields)
    request = InferenceRequest(**_VALUES[InferenceRequest])
    (_, _, back), _, _ = _decode(encode(("infer", 1, request)))
    assert _dumped(back) == _dumped(request)


def test_a_field_added_to_a_model_travels_without_a_change_to_the_wire() -> None:
    class Wider(InferenceResponse):  # InferenceResponse with one field more
        trace: str | None = None

    form = _Form(Wider, {"parameters": (_flat_parameters, _parameters)})
    model = Wider(model_name="m", outputs=[], trace="t-1", parameters=Parameters(a=1))
    back = form.rebuilt(pickle.loads(pickle.dumps(form.flat(model))))
    assert type(back) is Wider and back.trace == "t-1" and back.model_name == "m"
    assert back.parameters is not None and back.parameters.model_extra == {"a": 1}


def test_a_form_refuses_a_field_its_model_does_not_have() -> None:
    with pytest.raises(TypeError, match="no field"):
        _Form(RequestOutput, {"data": (_flat_parameters, _parameters)})
