"""MLflow's scoring formats to requests and answers to ``predictions``
(``runtime.frontends.mlflow.formats``), without a model."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.errors import InvalidInput
from runtime.frontends.mlflow.formats import (
    UnsupportedContentType,
    content_type_of,
    parse_csv,
    parse_json,
    to_predictions,
    to_request,
)
from runtime.types import Datatype, InferenceResponse, MetadataTensor, Parameters, ResponseOutput

DECLARED = [
    MetadataTensor(name="a", datatype="FP64", shape=[-1, 1], parameters=Parameters(content_type="np")),
    MetadataTensor(name="s", datatype="BYTES", shape=[-1, 1], parameters=Parameters(content_type="str")),
]


def test_content_types_as_mlflow_reads_them() -> None:
    assert content_type_of("application/json; charset=UTF-8") == "application/json"
    assert content_type_of("text/csv") == "text/csv"
    for header, message in [
        ("text/plain", "only supports"),
        ("text/csv; charset=ascii", "UTF-8"),
        ("text/csv; x=1", "x"),
    ]:
        with pytest.raises(UnsupportedContentType, match=message):
            content_type_of(header)


def test_json_formats_become_columns_or_one_tensor() -> None:
    assert parse_json(b'{"dataframe_split": {"columns": ["a"], "data": [[1], [2]]}}', True, ["a"])[0] == {
        "a": [1, 2]
    }
    assert parse_json(b'{"dataframe_split": {"data": [[1, 2]]}}', True, [])[0] == {"0": [1], "1": [2]}
    records = parse_json(b'{"dataframe_records": [{"a": 1}, {"s": "x"}], "params": {"k": 1}}', True, ["a"])
    assert records == ({"a": [1, None], "s": [None, "x"]}, None, {"k": 1})
    assert parse_json(b'{"inputs": {"a": 1}}', True, ["a"])[0] == {"a": [1]}
    assert parse_json(b'{"instances": [[1, 2]]}', False, []) == (None, [[1, 2]], None)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"dataframe_split": {"data": [[1]], "extra": 1}}', "must have 'data' field"),
        (b'{"dataframe_split": {"columns": ["a", "b"], "data": [[1]]}}', "must have 2 values"),
        (b'{"dataframe_split": {"data": [1]}}', "list of rows"),
        (b'{"dataframe_records": {"a": 1}}', "must be a list of records"),
        (b'{"inputs": [[1]], "params": 3}', "'params' must be an object"),
        (b'{"inputs": 3}', "must be a list of rows"),
        (b"3", "unexpected input type"),
    ],
)
def test_malformed_json_bodies_are_refused(body: bytes, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        parse_json(body, False, [])


def test_csv_has_a_header_row_and_is_typed_by_the_declared_inputs() -> None:
    columns = parse_csv(b"a,s,n\n1.5,x,3\n,y,4\n")
    request = to_request(columns, None, None, DECLARED, columns_model=True, from_csv=True)
    by_name = {i.name: i for i in request.inputs}
    assert request.parameters is not None and request.parameters.content_type == "pd"
    assert by_name["a"].datatype == Datatype.FP64 and np.isnan(by_name["a"].data[1])
    assert by_name["s"].data.tolist() == [b"x", b"y"] and by_name["n"].datatype == Datatype.INT64
    for body, message in [
        (b"", "no header row"),
        (b"a,b\n1\n", "every row must have 2 fields"),
        (b"\xff", "UTF-8"),
    ]:
        with pytest.raises(InvalidInput, match=message):
            parse_csv(body)


def test_values_are_typed_by_the_json_when_nothing_is_declared() -> None:
    request = to_request(
        {"b": [True], "i": [1], "f": [1.5], "t": ["x"]}, None, {"k": 2}, [], columns_model=False
    )
    assert [i.datatype for i in request.inputs] == [
        Datatype.BOOL,
        Datatype.INT64,
        Datatype.FP64,
        Datatype.BYTES,
    ]
    assert request.parameters is not None and request.parameters.model_extra == {"k": 2}
    with pytest.raises(InvalidInput, match="Input 'a' must hold FP64 values"):
        to_request({"a": ["x"]}, None, None, DECLARED, columns_model=True)
    with pytest.raises(InvalidInput, match="rows of one length"):
        to_request(None, [[1], [1, 2]], None, [], columns_model=False)


def test_predictions_follow_mlflows_json() -> None:
    one = ResponseOutput(name="output-1", shape=[2, 1], datatype="INT64", data=np.array([[1], [0]]))
    assert to_predictions(InferenceResponse(outputs=[one]), two_dimensional=False) == [1, 0]
    assert to_predictions(InferenceResponse(outputs=[one]), two_dimensional=True) == [[1], [0]]
    frame = InferenceResponse(
        parameters=Parameters(content_type="pd"),
        outputs=[
            ResponseOutput(name="y", shape=[2, 1], datatype="FP64", data=np.array([[0.5], [1.5]])),
            ResponseOutput(
                name="t",
                shape=[2, 1],
                datatype="BYTES",
                parameters=Parameters(content_type="str"),
                data=np.array([[b"a"], [b"b"]], dtype=object),
            ),
        ],
    )
    assert to_predictions(frame, False) == [{"y": 0.5, "t": "a"}, {"y": 1.5, "t": "b"}]
    texts = ResponseOutput(name="p", shape=[1], datatype="BYTES", data=np.array([b"\xff"], dtype=object))
    assert to_predictions(InferenceResponse(outputs=[one, texts]), False) == {"output-1": [1, 0], "p": ["ff"]}
