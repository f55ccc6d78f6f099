"""Every OIP datatype round-trips through JSON and raw forms, as numpy arrays."""

from __future__ import annotations

import re

import numpy as np
import orjson
import pytest

from runtime.errors import InvalidInput, ModelFailed
from runtime.frontends.rest.codec import JSON_OPTIONS
from runtime.tensors import bf16_to_float32, input_array, output_array, to_json_data, to_raw
from runtime.types import RequestInput, ResponseOutput

NUMERIC = {
    "BOOL": np.array([[True, False, True], [False, False, True]]),
    "UINT8": np.array([[0, 1, 255], [2, 3, 4]], dtype=np.uint8),
    "UINT16": np.array([[0, 1, 65535], [2, 3, 4]], dtype=np.uint16),
    "UINT32": np.array([[0, 1, 2**32 - 1], [2, 3, 4]], dtype=np.uint32),
    "UINT64": np.array([[0, 1, 2**64 - 1], [2, 3, 4]], dtype=np.uint64),
    "INT8": np.array([[-128, 0, 127], [1, 2, 3]], dtype=np.int8),
    "INT16": np.array([[-32768, 0, 32767], [1, 2, 3]], dtype=np.int16),
    "INT32": np.array([[-(2**31), 0, 2**31 - 1], [1, 2, 3]], dtype=np.int32),
    "INT64": np.array([[-(2**63), 0, 2**63 - 1], [1, 2, 3]], dtype=np.int64),
    "FP16": np.array([[0.5, -1.25, 65504], [1, 2, 3]], dtype=np.float16),
    "FP32": np.array([[0.1, -1.5, 3.4e38], [1, 2, 3]], dtype=np.float32),
    "FP64": np.array([[0.1, -1.5, 1e308], [1, 2, 3]], dtype=np.float64),
}


@pytest.mark.parametrize("datatype", sorted(NUMERIC))
def test_numeric_json_round_trip(datatype: str) -> None:
    original = NUMERIC[datatype]
    wire = orjson.loads(orjson.dumps(to_json_data(original, datatype), option=JSON_OPTIONS))
    arr = input_array(RequestInput(name="t", shape=[2, 3], datatype=datatype, data=wire))
    assert arr.dtype == original.dtype
    np.testing.assert_array_equal(arr, original)


@pytest.mark.parametrize("datatype", sorted(NUMERIC))
def test_numeric_raw_round_trip_is_a_view(datatype: str) -> None:
    original = NUMERIC[datatype]
    raw = bytes(to_raw(original, datatype))
    assert len(raw) == original.nbytes
    arr = input_array(RequestInput(name="t", shape=[2, 3], datatype=datatype, data=raw))
    np.testing.assert_array_equal(arr, original)
    assert arr.base is not None and not arr.flags.owndata  # np.frombuffer view, no copy


@pytest.mark.parametrize("shape", [(0,), (2, 0), (0, 3)])
def test_an_empty_tensor_has_no_raw_bytes(shape: tuple[int, ...]) -> None:
    assert bytes(to_raw(np.zeros(shape, dtype=np.float32), "FP32")) == b""


def test_nested_json_data() -> None:
    arr = input_array(RequestInput(name="t", shape=[2, 2], datatype="INT32", data=[[1, 2], [3, 4]]))
    np.testing.assert_array_equal(arr, [[1, 2], [3, 4]])


def test_bytes_round_trip_json_and_raw() -> None:
    items = np.array([b"hello", b"", "\u00e9t\u00e9".encode()], dtype=object)
    raw = to_raw(items, "BYTES")
    assert raw[:4] == (5).to_bytes(4, "little")
    back = input_array(RequestInput(name="s", shape=[3], datatype="BYTES", data=raw))
    assert list(back) == list(items)
    as_json = to_json_data(items, "BYTES")
    assert as_json == ["hello", "", "\u00e9t\u00e9"]
    again = input_array(RequestInput(name="s", shape=[3, 1], datatype="BYTES", data=as_json))
    assert again.shape == (3, 1) and list(again.reshape(-1)) == list(items)


def test_bf16_json_and_raw() -> None:
    values = [1.0, -2.5, 0.15625]
    arr = input_array(RequestInput(name="b", shape=[3], datatype="BF16", data=values))
    assert arr.dtype == np.uint16
    np.testing.assert_array_equal(bf16_to_float32(arr), np.array(values, dtype=np.float32))
    raw = bytes(to_raw(arr, "BF16"))
    again = input_array(RequestInput(name="b", shape=[3], datatype="BF16", data=raw))
    np.testing.assert_array_equal(again, arr)
    assert list(to_json_data(arr, "BF16")) == values


@pytest.mark.parametrize(
    ("shape", "datatype", "data", "message"),
    [
        ([3], "FP32", [1.0, 2.0], "has shape [3] (3 elements) but its data has 2"),
        ([2], "INT8", [1, 300], "not valid INT8"),
        ([1], "FP32", ["x"], "not valid FP32"),
        ([2], "FP32", b"\x00" * 7, "needs 8 bytes"),
        ([-1], "FP32", [1.0], "negative dimension"),
        ([2], "BYTES", [1, 2], "must be strings"),
        ([2], "BYTES", b"\x05\x00\x00\x00ab", "runs past the data"),
        ([1], "BOOL", ["yes"], "not valid BOOL"),
        ([2], "FP32", [[1.0], [2.0, 3.0]], "not valid FP32"),
        ([1], "FP32", None, "has no data"),
    ],
)
def test_bad_tensors_are_invalid_input(shape: list[int], datatype: str, data: object, message: str) -> None:
    with pytest.raises(InvalidInput, match=re.escape(message)):
        input_array(RequestInput(name="t", shape=shape, datatype=datatype, data=data))


def test_output_with_wrong_size_is_a_model_failure() -> None:
    with pytest.raises(ModelFailed, match="3 elements"):
        output_array(ResponseOutput(name="y", shape=[3], datatype="FP32", data=[1.0]))


def test_output_lists_become_arrays() -> None:
    arr = output_array(ResponseOutput(name="y", shape=[2], datatype="BYTES", data=["a", b"b"]))
    assert list(arr) == [b"a", b"b"]
    arr = output_array(ResponseOutput(name="y", shape=[2], datatype="FP64", data=[1, 2]))
    assert arr.dtype == np.float64
