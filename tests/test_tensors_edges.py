"""runtime.tensors at its edges: unknown datatypes, malformed BYTES data, lenient inputs, model
outputs in every form a model may return them, and arrays that JSON cannot take as they are."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from runtime.errors import InvalidInput, ModelFailed
from runtime.tensors import (
    datatype_of,
    dtype_of,
    input_array,
    output_array,
    pack_bytes,
    to_json_data,
    unpack_bytes,
)
from runtime.types import Datatype, RequestInput, ResponseOutput


def test_a_datatype_the_protocol_lacks_is_invalid_input() -> None:
    with pytest.raises(InvalidInput, match="Unknown datatype 'FP8'"):
        dtype_of("FP8")
    with pytest.raises(InvalidInput, match="complex64 has no protocol datatype"):
        datatype_of(np.dtype(np.complex64))
    assert dtype_of("UINT16") == np.dtype(np.uint16)
    assert datatype_of(np.dtype("U3")) == "BYTES"


@pytest.mark.parametrize(
    ("raw", "count", "message"),
    [
        (b"\x01\x00", None, "truncated length prefix"),
        (struct.pack("<I", 5) + b"abc", None, "element of 5 bytes runs past the data"),
        (struct.pack("<I", 1) + b"a", 2, "shape needs 2 BYTES elements but the data holds 1"),
    ],
)
def test_malformed_length_prefixed_bytes_are_refused(raw: bytes, count: int | None, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        unpack_bytes("t", raw, count)


def test_bytes_elements_of_every_python_kind_pack_alike() -> None:
    items = np.empty(4, dtype=object)
    items[:] = ["é", bytearray(b"ab"), memoryview(b"cd"), np.bytes_(b"ef")]
    assert unpack_bytes("t", pack_bytes(items)).tolist() == ["é".encode(), b"ab", b"cd", b"ef"]


def test_an_input_array_of_another_dtype_is_converted_to_the_declared_one() -> None:
    inp = RequestInput(name="x", shape=[2], datatype=Datatype.FP32, data=np.array([1, 2], dtype=np.int64))
    arr = input_array(inp)
    assert arr.dtype == np.float32
    assert arr.tolist() == [1.0, 2.0]


def test_a_scalar_input_is_taken_as_one_element() -> None:
    assert input_array(RequestInput(name="x", shape=[1], datatype=Datatype.INT32, data=7)).tolist() == [7]


def test_an_input_with_no_data_or_a_negative_dimension_is_invalid() -> None:
    with pytest.raises(InvalidInput, match="negative dimension"):
        input_array(RequestInput(name="x", shape=[-1], datatype=Datatype.INT32, data=[1]))
    with pytest.raises(InvalidInput, match="has no data"):
        input_array(RequestInput.model_construct(name="x", shape=[1], datatype=Datatype.INT32, data=None))


def test_outputs_in_raw_array_and_list_forms() -> None:
    raw = output_array(
        ResponseOutput(
            name="y", shape=[2], datatype=Datatype.INT32, data=np.array([3, 4], np.int32).tobytes()
        )
    )
    assert raw.tolist() == [3, 4]
    same = np.array([1.5, 2.5], dtype=np.float32)
    assert output_array(ResponseOutput(name="y", shape=[2], datatype=Datatype.FP32, data=same)) is same
    words = output_array(ResponseOutput(name="y", shape=[1, 2], datatype=Datatype.BYTES, data=[["a", b"b"]]))
    assert words.tolist() == [b"a", b"b"]


def test_a_bf16_output_given_as_floats_is_kept_as_bit_patterns() -> None:
    arr = output_array(ResponseOutput(name="y", shape=[2], datatype=Datatype.BF16, data=[1.0, -2.0]))
    assert arr.dtype == np.uint16
    assert arr.tolist() == [0x3F80, 0xC000]


@pytest.mark.parametrize(
    ("output", "message"),
    [
        (ResponseOutput(name="y", shape=[2], datatype=Datatype.INT32, data=["a", "b"]), "not valid INT32"),
        (
            ResponseOutput(name="y", shape=[3], datatype=Datatype.INT32, data=[1, 2]),
            r"shape \[3\] \(3 elements\)",
        ),
        (ResponseOutput(name="y", shape=[2], datatype=Datatype.INT32, data=b"\x00" * 4), "invalid output"),
    ],
)
def test_a_bad_model_output_is_a_model_failure(output: ResponseOutput, message: str) -> None:
    with pytest.raises(ModelFailed, match=message):
        output_array(output)


def test_bytes_that_are_not_utf8_cannot_be_written_as_json() -> None:
    items = np.empty(1, dtype=object)
    items[0] = b"\xff\xfe"
    with pytest.raises(InvalidInput, match="binary_data"):
        to_json_data(items, "BYTES")


def test_strided_and_big_endian_arrays_become_contiguous_native_data() -> None:
    strided = np.arange(6, dtype=np.int32)[::2]
    assert to_json_data(strided, "INT32").tolist() == [0, 2, 4]
    big = np.array([1.0, 2.0], dtype=">f4")
    flat = to_json_data(big, "FP32")
    assert flat.dtype.isnative and flat.flags.c_contiguous
    assert flat.tolist() == [1.0, 2.0]
