"""The pandas codec (``runtime.codecs.pandas``): a request's inputs as DataFrame columns and a
DataFrame as one output per column, both ways, each column by its own content type."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime
from typing import Any

import numpy as np
import pytest

from runtime.codecs import PandasCodec, find_request_codec
from runtime.errors import InvalidInput
from runtime.types import InferenceRequest, InferenceResponse, MetadataTensor, Parameters, RequestInput

pd = pytest.importorskip("pandas", reason="the pd codec needs pandas: pip install 'mlserver-like[pandas]'")


def _input(
    name: str, shape: list[int], datatype: str, data: Any, content_type: str | None = None
) -> RequestInput:
    parameters = Parameters(content_type=content_type) if content_type else None
    return RequestInput(name=name, shape=shape, datatype=datatype, data=data, parameters=parameters)


def test_inputs_become_columns_whatever_their_shape_n_or_n_by_1() -> None:
    request = InferenceRequest(
        inputs=[
            _input("a", [2], "FP64", np.array([1.5, 2.5])),
            _input("b", [2, 1], "INT64", np.array([[1], [2]])),
            _input("s", [2], "BYTES", np.array([b"x", b"y"], dtype=object), "str"),
            _input("rows", [2, 2], "FP32", np.ones((2, 2), np.float32)),
        ]
    )
    frame = PandasCodec.decode_request(request)
    assert list(frame.columns) == ["a", "b", "s", "rows"]
    assert frame.a.tolist() == [1.5, 2.5] and frame.b.dtype == np.int64 and frame.s.tolist() == ["x", "y"]
    assert [row.tolist() for row in frame["rows"]] == [[1.0, 1.0], [1.0, 1.0]]


def test_the_declared_tensor_gives_a_column_its_content_type() -> None:
    request = InferenceRequest(
        inputs=[_input("when", [1], "BYTES", np.array([b"2024-01-02T03:04:05"], dtype=object))]
    )
    declared = {
        "when": MetadataTensor(
            name="when", datatype="BYTES", shape=[-1], parameters=Parameters(content_type="datetime")
        )
    }
    assert PandasCodec.decode_request(request, inputs=declared).when.tolist() == [
        datetime(2024, 1, 2, 3, 4, 5)
    ]
    assert PandasCodec.decode_request(request).when.tolist() == [b"2024-01-02T03:04:05"]


def test_columns_of_different_lengths_are_refused_naming_them() -> None:
    request = InferenceRequest(
        inputs=[_input("a", [2], "FP64", np.zeros(2)), _input("b", [3], "FP64", np.zeros(3))]
    )
    with pytest.raises(InvalidInput, match="Input 'b' has 3 rows but input 'a' has 2"):
        PandasCodec.decode_request(request)


def test_a_dataframe_is_one_output_per_column_as_mlserver_answers() -> None:
    frame = pd.DataFrame(
        {
            "y": [1.0, 2.0],
            "n": np.array([1, 2], np.int32),
            "label": ["a", "b"],
            "when": pd.to_datetime(["2024-01-01", "2024-01-02"]),
            "obj": [{"k": 1}, [1, 2]],
        }
    )
    response = PandasCodec.encode_response("m", frame, "1")
    assert response.parameters is not None and response.parameters.content_type == "pd"
    shown = {
        o.name: (o.datatype.value, o.shape, o.parameters.content_type if o.parameters else None)
        for o in response.outputs
    }
    assert shown == {
        "y": ("FP64", [2, 1], None),
        "n": ("INT32", [2, 1], None),
        "label": ("BYTES", [2, 1], "str"),
        "when": ("BYTES", [2, 1], "datetime"),
        "obj": ("BYTES", [2, 1], "pd_json"),
    }
    back = PandasCodec.decode_response(response)
    assert back.y.tolist() == [1.0, 2.0] and back.label.tolist() == ["a", "b"]
    assert back.obj.tolist() == [{"k": 1}, [1, 2]] and back.when.tolist()[0] == datetime(2024, 1, 1)


def test_a_dataframe_request_travels_both_ways() -> None:
    frame = pd.DataFrame({"a": [0.5, 1.5], "s": ["x", "y"]})
    request = PandasCodec.encode_request(frame)
    assert request.parameters is not None and request.parameters.content_type == "pd"
    assert [(i.name, i.datatype.value, i.shape) for i in request.inputs] == [
        ("a", "FP64", [2, 1]),
        ("s", "BYTES", [2, 1]),
    ]
    assert PandasCodec.decode_request(request).equals(
        pd.DataFrame({"a": [0.5, 1.5], "s": pd.Series(["x", "y"], dtype=object)})
    )


def test_it_is_found_by_content_type_payload_and_type_hint() -> None:
    frame = pd.DataFrame({"a": [1]})
    assert find_request_codec(content_type="pd") is PandasCodec
    assert find_request_codec(payload=frame) is PandasCodec
    assert find_request_codec(type_hint=pd.DataFrame) is PandasCodec
    assert PandasCodec.can_encode(frame) and not PandasCodec.can_encode({"a": [1]})
    assert repr(PandasCodec.TypeHint) == "pandas.DataFrame"


def test_a_json_column_that_is_not_json_is_refused() -> None:
    request = InferenceRequest(inputs=[_input("j", [1], "BYTES", np.array([b"{"], dtype=object), "pd_json")])
    with pytest.raises(InvalidInput, match="Input 'j' holds a row that is not JSON"):
        PandasCodec.decode_request(request)


def test_a_text_column_must_be_one_value_per_row() -> None:
    request = InferenceRequest(
        inputs=[_input("s", [1, 2], "BYTES", np.array([[b"a", b"b"]], dtype=object), "str")]
    )
    with pytest.raises(InvalidInput, match=r"shape must be \[N\] or \[N, 1\]"):
        PandasCodec.decode_request(request)


def test_importing_the_codecs_does_not_import_pandas() -> None:
    code = "import sys, runtime.codecs; print('pandas' in sys.modules)"
    assert (
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout.strip()
        == "False"
    )


def test_the_response_of_a_dataframe_model_is_plain() -> None:
    assert isinstance(PandasCodec.encode_response("m", pd.DataFrame({"a": [1]})), InferenceResponse)
