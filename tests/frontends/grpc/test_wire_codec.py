"""The gRPC converters' fast paths against the plain pydantic / protobuf paths they replace, on
valid and invalid messages: the same objects (values, field order, fields set), the same errors,
the same bytes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from runtime.errors import InvalidInput
from runtime.frontends.grpc import converters, wire_codec
from runtime.frontends.grpc.converters import request_from_proto, response_to_proto
from runtime.frontends.grpc.generated import dataplane_pb2 as pb
from runtime.frontends.grpc.wire_codec import response_bytes
from runtime.types import (
    Datatype,
    InferenceRequest,
    InferenceResponse,
    Parameters,
    RequestInput,
    RequestOutput,
    ResponseOutput,
)

# ---------------------------------------------------------------------- requests


def reference_request(msg: pb.ModelInferRequest) -> InferenceRequest:
    """request_from_proto as it was, building the models through pydantic's validation."""
    raw = msg.raw_input_contents
    tensors = msg.inputs
    if raw and len(raw) != len(tensors):
        raise InvalidInput(
            f"The request has {len(tensors)} inputs but {len(raw)} raw_input_contents entries; "
            "raw contents need one entry per input, in order"
        )
    inputs = []
    for index, tensor in enumerate(tensors):
        name = tensor.name
        datatype = converters._DATATYPES.get(tensor.datatype)
        if datatype is None:
            raise InvalidInput(f"Input {name!r} has unknown datatype {tensor.datatype!r}")
        if raw:
            if tensor.HasField("contents") and tensor.contents.ByteSize():
                raise InvalidInput(
                    f"Input {name!r} has typed contents in a request that uses raw_input_contents"
                )
            data: Any = raw[index]
        else:
            data = reference_typed_array(tensor, datatype.value)
        inputs.append(
            RequestInput(
                name=name,
                shape=list(tensor.shape),
                datatype=datatype,
                parameters=converters.parameters_from_proto(tensor.parameters, f"input {name!r}")
                if tensor.parameters
                else None,
                data=data,
            )
        )
    outputs = None
    if msg.outputs:
        outputs = [
            RequestOutput(
                name=out.name,
                parameters=converters.parameters_from_proto(out.parameters, f"output {out.name!r}")
                if out.parameters
                else None,
            )
            for out in msg.outputs
        ]
    return InferenceRequest(
        id=msg.id or None,
        parameters=converters.parameters_from_proto(msg.parameters, "the request")
        if msg.parameters
        else None,
        inputs=inputs,
        outputs=outputs,
    )


_SPECIAL = np.array([0x7F800001, 0x7FC00001, 0xFF800000, 0x7F800000, 0x80000000, 1], dtype=np.uint32)
"""FP32 bits: a signalling NaN, a quiet NaN with a payload, -inf, inf, -0.0, the smallest subnormal."""


def reference_typed_array(tensor: pb.ModelInferRequest.InferInputTensor, datatype: str) -> np.ndarray | None:
    """_typed_array as it was: every field through protobuf's repeated containers."""
    fields = tensor.contents.ListFields() if tensor.HasField("contents") else []
    spec = converters._CONTENTS.get(datatype)
    if spec is None:
        if fields:
            raise InvalidInput(
                f"Input {tensor.name!r} is {datatype}, which has no typed contents field; "
                "send it in raw_input_contents"
            )
        return None
    field, dtype = spec
    if not fields:
        return np.empty(0, dtype=dtype)
    if len(fields) != 1 or fields[0][0].name != field:
        sent = ", ".join(f.name for f, _ in fields)
        raise InvalidInput(f"Input {tensor.name!r} of {datatype} must carry its data in {field}, not {sent}")
    values = fields[0][1]
    if datatype == "BYTES":
        array = np.empty(len(values), dtype=object)
        array[:] = list(values)
        return array
    array = np.asarray(values)
    if array.dtype == dtype:
        return array
    info = np.iinfo(dtype)
    if array.size and (array.min() < info.min or array.max() > info.max):
        raise InvalidInput(
            f"Input {tensor.name!r} has data that is not valid {datatype}: "
            f"values must lie in [{info.min}, {info.max}]"
        )
    return array.astype(dtype)


def _raw(values: np.ndarray) -> bytes:
    return values.tobytes()


def _valid() -> list[pb.ModelInferRequest]:
    messages = []
    one = pb.ModelInferRequest(model_name="echo", id="a")
    one.inputs.add(name="x", datatype="FP32", shape=[1, 4])
    one.raw_input_contents.append(_raw(np.arange(4, dtype=np.float32)))
    messages.append(one)
    two = pb.ModelInferRequest(model_name="m", model_version="2")  # no id
    two.inputs.add(name="a", datatype="INT64", shape=[2])
    b = two.inputs.add(name="b", datatype="BYTES", shape=[1])
    b.parameters["content_type"].string_param = "str"
    two.raw_input_contents.extend([_raw(np.arange(2, dtype=np.int64)), b"\1\0\0\0z"])
    two.outputs.add(name="y").parameters["binary_data"].bool_param = True
    two.parameters["sequence_id"].uint64_param = 7
    two.parameters["sequence_start"].bool_param = True
    messages.append(two)
    typed = pb.ModelInferRequest(model_name="m", id="t")
    typed.inputs.add(name="f", datatype="FP32", shape=[3]).contents.fp32_contents.extend([1, 2.5, -3])
    typed.inputs.add(name="i", datatype="INT8", shape=[1, 2]).contents.int_contents.extend([-5, 7])
    typed.inputs.add(name="s", datatype="BYTES", shape=[2]).contents.bytes_contents.extend([b"p", b""])
    typed.inputs.add(name="e", datatype="UINT16", shape=[0])
    typed.inputs.add(name="h", datatype="FP16", shape=[0])
    messages.append(typed)
    special = pb.ModelInferRequest(model_name="m")
    contents = pb.InferTensorContents.FromString(  # bits no Python float can carry (a signalling NaN)
        b"\x32" + bytes([len(_SPECIAL.tobytes())]) + _SPECIAL.tobytes()
    )
    special.inputs.add(name="n", datatype="FP32", shape=[6]).contents.CopyFrom(contents)
    special.inputs.add(name="d", datatype="FP64", shape=[2]).contents.fp64_contents.extend([np.nan, -1e300])
    special.inputs.add(name="b", datatype="BOOL", shape=[3]).contents.bool_contents.extend(
        [True, False, True]
    )
    special.inputs.add(name="l", datatype="FP32", shape=[300]).contents.fp32_contents.extend(range(300))
    special.inputs.add(name="u", datatype="FP64", shape=[1]).contents.MergeFromString(
        b"\x39" + np.float64(2.5).tobytes()  # one value sent unpacked: protobuf reads it all the same
    )
    messages.append(special)
    empty = pb.ModelInferRequest(model_name="m")
    messages.append(empty)
    empty_contents = pb.ModelInferRequest(model_name="m")
    empty_contents.inputs.add(name="x", datatype="FP32", shape=[1]).contents.SetInParent()
    empty_contents.raw_input_contents.append(_raw(np.zeros(1, np.float32)))
    messages.append(empty_contents)
    return messages


def _same(ours: Any, theirs: Any) -> None:
    """Two pydantic models alike: type, fields in the same order, fields set, extra, private."""
    assert type(ours) is type(theirs)
    assert list(ours.__dict__) == list(theirs.__dict__)
    assert ours.model_fields_set == theirs.model_fields_set
    assert ours.__pydantic_extra__ == theirs.__pydantic_extra__
    assert ours.__pydantic_private__ == theirs.__pydantic_private__
    for key, value in theirs.__dict__.items():
        mine = ours.__dict__[key]
        if isinstance(value, np.ndarray):
            assert isinstance(mine, np.ndarray) and mine.dtype == value.dtype and mine.shape == value.shape
            assert mine.tobytes() == value.tobytes()  # bit for bit (NaNs too)
            assert mine.flags.writeable == value.flags.writeable
        elif isinstance(value, list) and value and hasattr(value[0], "__dict__"):
            assert len(mine) == len(value)
            for a, b in zip(mine, value, strict=True):
                _same(a, b)
        else:
            assert type(mine) is type(value) and mine == value


def _contents_cases() -> list[tuple[str, bytes]]:
    """Serialized InferTensorContents: what protobuf writes for each packed datatype, and bytes
    it reads but that the hand-written reader leaves to it (unpacked, two fields, a long varint)."""
    cases: list[tuple[str, bytes]] = []
    for datatype, field, values in (
        ("FP32", "fp32_contents", [1.0, -2.5, float("inf")]),
        ("FP64", "fp64_contents", [float(n) for n in range(200)]),  # a length of two varint bytes
        ("BOOL", "bool_contents", [True, False, True]),
    ):
        contents = pb.InferTensorContents()
        getattr(contents, field).extend(values)
        cases.append((datatype, contents.SerializeToString()))
    cases.append(("FP32", b"\x32" + bytes([len(_SPECIAL.tobytes())]) + _SPECIAL.tobytes()))  # NaN bits
    cases.append(("FP64", b"\x39" + np.float64(2.5).tobytes()))  # unpacked
    cases.append(("FP32", b"\x32\x04" + np.float32(1).tobytes() + b"\x32\x04" + np.float32(2).tobytes()))
    cases.append(("FP32", b"\x32\x84\x00" + np.float32(3).tobytes()))  # a length in a longer varint
    cases.append(("BOOL", b""))
    return cases


@pytest.mark.parametrize(("datatype", "contents"), _contents_cases())
def test_packed_contents_read_as_protobuf_reads_them(datatype: str, contents: bytes) -> None:
    theirs = np.asarray(
        getattr(pb.InferTensorContents.FromString(contents), converters._CONTENTS[datatype][0]),
        dtype=wire_codec.PACKED[datatype][1],
    )
    ours = wire_codec.packed_array(contents, datatype)
    if ours is None:  # left to protobuf: the general path reads it
        assert contents[:1] != bytes([wire_codec.PACKED[datatype][0]]) or len(contents) > 2 + theirs.nbytes
        return
    assert ours.dtype == theirs.dtype and ours.tobytes() == theirs.tobytes() and ours.flags.writeable


@pytest.mark.parametrize("message", _valid(), ids=lambda m: f"{len(m.inputs)}-inputs")
def test_requests_are_the_models_pydantic_makes(message: pb.ModelInferRequest) -> None:
    ours, theirs = request_from_proto(message), reference_request(message)
    _same(ours, theirs)
    assert ours.model_dump(exclude={"inputs"}) == theirs.model_dump(exclude={"inputs"})
    assert repr(ours.inputs[0].shape if ours.inputs else None) == repr(
        theirs.inputs[0].shape if theirs.inputs else None
    )


def _two_fields(r: pb.ModelInferRequest, datatype: str) -> None:
    contents = r.inputs.add(name="x", datatype=datatype, shape=[2]).contents
    contents.fp32_contents.append(1)
    contents.fp64_contents.append(1)
    contents.bool_contents.append(True)


def _too_few_raw(r: pb.ModelInferRequest) -> None:
    r.inputs.add(name="x", datatype="FP32")
    r.raw_input_contents.extend([b"", b""])


def _typed_and_raw(r: pb.ModelInferRequest) -> None:
    r.inputs.add(name="x", datatype="FP32", shape=[1]).contents.fp32_contents.append(1)
    r.raw_input_contents.append(b"\0" * 4)


INVALID: list[Callable[[pb.ModelInferRequest], object]] = [
    lambda r: r.inputs.add(name="x", datatype="FP99", shape=[1]),
    lambda r: r.inputs.add(name="x", datatype="FP32", shape=[1]).contents.int_contents.append(1),
    lambda r: r.inputs.add(name="x", datatype="FP16", shape=[1]).contents.fp32_contents.append(1),
    lambda r: r.inputs.add(name="x", datatype="INT8", shape=[1]).contents.int_contents.append(1000),
    lambda r: _two_fields(r, "FP32"),
    lambda r: _two_fields(r, "FP64"),
    lambda r: _two_fields(r, "BOOL"),
    _too_few_raw,
    _typed_and_raw,
    lambda r: r.parameters["p"],
    lambda r: setattr(r.parameters["content_type"], "int64_param", 3),
    lambda r: r.inputs.add(name="x", datatype="FP32", shape=[1]).parameters["q"],
    lambda r: setattr(r.inputs.add(name="x", datatype="FP32").parameters["headers"], "bool_param", True),
    lambda r: (r.inputs.add(name="x", datatype="FP32"), r.outputs.add(name="y").parameters["z"]),
    lambda r: (  # the first error met is the one reported: the input's before the request's
        r.inputs.add(name="x", datatype="FP99"),
        r.parameters["p"],
    ),
]


@pytest.mark.parametrize("build", INVALID)
def test_invalid_requests_fail_with_the_same_error(build: Callable[[pb.ModelInferRequest], object]) -> None:
    message = pb.ModelInferRequest(model_name="m")
    build(message)
    with pytest.raises(InvalidInput) as theirs:
        reference_request(message)
    with pytest.raises(InvalidInput) as ours:
        request_from_proto(message)
    assert str(ours.value) == str(theirs.value)
    assert ours.value.message == theirs.value.message


# ---------------------------------------------------------------------- responses


def _output(
    name: str, datatype: str, data: Any, shape: list[int] | None = None, **extra: Any
) -> ResponseOutput:
    array = np.asarray(data, dtype=object if datatype == "BYTES" else None)
    return ResponseOutput(
        name=name, shape=list(array.shape) if shape is None else shape, datatype=datatype, data=data, **extra
    )


def _responses() -> list[tuple[InferenceResponse, bool]]:
    """Checked responses (as finish_response leaves them) and whether the request was raw."""
    f32 = np.arange(16, dtype=np.float32).reshape(1, 16)
    cases = [
        (
            InferenceResponse(
                model_name="echo", model_version="1", id="bench", outputs=[_output("x", "FP32", f32)]
            ),
            True,
        ),
        (InferenceResponse(model_name="echo", id="bench", outputs=[_output("x", "FP32", f32)]), True),
        (InferenceResponse(model_name="m", outputs=[]), True),
        (
            InferenceResponse(
                model_name="", model_version="", id="", outputs=[_output("", "INT8", np.zeros(0, np.int8))]
            ),
            True,
        ),
        (
            InferenceResponse(
                model_name="modèle-ü" * 20,  # a long UTF-8 name: two-byte lengths
                model_version="v" * 200,
                id="i" * 130,
                outputs=[
                    _output("a", "INT64", np.arange(300, dtype=np.int64).reshape(3, 100)),
                    _output("b" * 200, "BOOL", np.array([True, False])),
                    _output("c", "BYTES", np.array([b"x", b"", b"yz"], dtype=object)),
                    _output("d", "FP16", np.ones((2, 2), np.float16)),
                    _output("e", "BF16", np.ones(3, np.uint16)),
                    _output("f", "UINT64", np.array([2**64 - 1], np.uint64)),
                    _output("g", "FP64", np.array([[1.5]])),
                ],
            ),
            True,
        ),
        (  # a non-contiguous array (a transposed view)
            InferenceResponse(
                model_name="m", outputs=[_output("t", "INT32", np.arange(6, dtype=np.int32).reshape(2, 3).T)]
            ),
            True,
        ),
        (
            InferenceResponse(model_name="m", outputs=[_output("z", "FP32", np.zeros((0, 4), np.float32))]),
            True,
        ),
        (InferenceResponse(model_name="m", outputs=[_output("big", "UINT8", np.zeros(200, np.uint8))]), True),
        (
            InferenceResponse(model_name="m", outputs=[_output("s", "FP32", np.zeros((1, 128), np.float32))]),
            True,
        ),
        (
            InferenceResponse(model_name="m", outputs=[_output("x", "FP32", np.zeros((0, 300), np.float32))]),
            True,
        ),
        # typed requests: raw only when an output has no typed field (then all outputs are raw)
        (
            InferenceResponse(
                model_name="m",
                outputs=[
                    _output("h", "FP16", np.ones(2, np.float16)),
                    _output("i", "INT32", np.ones(2, np.int32)),
                ],
            ),
            False,
        ),
        # typed contents, FP32 and FP64 (NaNs, a signalling one included, and infinities)
        (InferenceResponse(model_name="m", outputs=[_output("x", "FP32", f32)]), False),
        (
            InferenceResponse(
                model_name="m",
                id="t",
                outputs=[
                    _output("n", "FP32", _SPECIAL.view(np.float32)),
                    _output("d", "FP64", np.array([[np.nan, -np.inf, 1e300, -0.0]])),
                    _output("e", "FP32", np.zeros((2, 0), np.float32)),
                    _output("t", "FP64", np.arange(6, dtype=np.float64).reshape(2, 3).T),
                ],
            ),
            False,
        ),
        # cases the fast path leaves to protobuf
        (InferenceResponse(model_name="m", outputs=[_output("x", "INT32", np.ones(2, np.int32))]), False),
        (
            InferenceResponse(
                model_name="m",
                outputs=[_output("x", "FP32", f32), _output("b", "BOOL", np.ones(1, np.bool_))],
            ),
            False,
        ),
        (
            InferenceResponse(
                model_name="m", parameters=Parameters(sequence_id="s"), outputs=[_output("x", "FP32", f32)]
            ),
            True,
        ),
        (
            InferenceResponse(
                model_name="m", outputs=[_output("x", "FP32", f32, parameters=Parameters(content_type="np"))]
            ),
            True,
        ),
        (
            InferenceResponse(
                model_name="m", outputs=[_output("x", "FP32", np.zeros(0, np.float32), shape=[-1, 0])]
            ),
            True,
        ),
    ]
    return cases


FAST = 13
"""How many of the cases above the fast path writes (the others it leaves to protobuf)."""


@pytest.mark.parametrize(
    ("response", "raw"), _responses(), ids=lambda v: "" if isinstance(v, bool) else v.model_name[:8]
)
def test_response_bytes_are_what_protobuf_serializes(response: InferenceResponse, raw: bool) -> None:
    expected = response_to_proto(response, raw).SerializeToString()
    ours = response_bytes(response, raw)
    if ours is not None:  # None: the servicer builds the message with response_to_proto
        assert ours == expected
        assert pb.ModelInferResponse.FromString(ours) == response_to_proto(response, raw)


def test_the_fast_path_writes_the_common_cases() -> None:
    written = [response_bytes(response, raw) is not None for response, raw in _responses()]
    assert written == [True] * FAST + [False] * (len(written) - FAST)


def test_outputs_the_cache_knows_under_another_datatype_are_written_afresh() -> None:
    for datatype, dtype in (("FP32", np.float32), ("INT32", np.int32), ("FP32", np.float32)):
        response = InferenceResponse(model_name="m", outputs=[_output("same", datatype, np.ones(2, dtype))])
        assert response_bytes(response, True) == response_to_proto(response, True).SerializeToString()


def test_only_short_output_names_are_cached() -> None:
    """An echo model names its outputs after what a client sent: long names are written, never kept."""
    long_name = "x" * (wire_codec._CACHED_NAME + 1)
    response = InferenceResponse(model_name="m", outputs=[_output(long_name, "FP32", np.ones(2, np.float32))])
    assert response_bytes(response, True) == response_to_proto(response, True).SerializeToString()
    assert long_name not in wire_codec._TENSORS
    short = InferenceResponse(model_name="m", outputs=[_output("short", "FP32", np.ones(2, np.float32))])
    assert response_bytes(short, True) == response_to_proto(short, True).SerializeToString()
    assert "short" in wire_codec._TENSORS


def _unchecked(cls: Any, **fields: Any) -> Any:
    """A model holding what its fields' types do not allow (as model_construct lets one make)."""
    return cls.model_construct(**fields)


def test_what_protobuf_refuses_is_left_to_it() -> None:
    """Values a model slipped past the checks (model_construct): the fast path writes none of them,
    so protobuf answers as it did (an error, or its own conversion)."""
    f32 = np.zeros(2, np.float32)
    fp32 = Datatype.FP32
    odd = [
        _unchecked(ResponseOutput, name=3, shape=[2], datatype=fp32, data=f32, parameters=None),
        _unchecked(ResponseOutput, name="x", shape=[2**70], datatype=fp32, data=f32, parameters=None),
        _unchecked(ResponseOutput, name="x", shape=["2"], datatype=fp32, data=f32, parameters=None),
        _unchecked(ResponseOutput, name="x", shape=[2], datatype="FP32", data=f32, parameters=None),
        _unchecked(ResponseOutput, name="\udc80", shape=[2], datatype=fp32, data=f32, parameters=None),
    ]
    for out in odd:
        response = _unchecked(
            InferenceResponse, model_name="m", model_version=None, id=None, parameters=None, outputs=[out]
        )
        assert response_bytes(response, True) is None
    for ident in (7, "\udc80"):
        response = _unchecked(
            InferenceResponse, model_name="m", model_version=None, id=ident, parameters=None, outputs=[]
        )
        assert response_bytes(response, True) is None


def test_what_protobuf_writes_for_the_packed_datatypes_is_read_by_hand() -> None:
    written = _contents_cases()[:3]  # protobuf's own serialization of FP32, FP64 and BOOL values
    assert sorted(datatype for datatype, _ in written) == sorted(wire_codec.PACKED)
    assert all(wire_codec.packed_array(contents, datatype) is not None for datatype, contents in written)
