"""Requests checked against a signature and answers encoded as mlserver-mlflow encodes them
(``runtime.mlflow.payloads``), without mlflow."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from runtime.errors import InvalidInput
from runtime.mlflow.payloads import checked_inputs, decoded, encoded, params_of
from runtime.mlflow.signature import Param, Signature, Spec
from runtime.types import Datatype, InferenceRequest, Parameters, RequestInput, UInt64

COLUMNS = Signature(
    inputs=[
        Spec("a", Datatype.FP64, [-1, 1], "np", "double"),
        Spec("c", Datatype.INT64, [-1, 1], "np", "long"),
        Spec("s", Datatype.BYTES, [-1, 1], "str", "string", required=False),
    ],
    params=[Param("k", "double", 1.0), Param("n", "long", 1)],
    columns=True,
)
TENSOR = Signature(inputs=[Spec("input-0", Datatype.FP32, [-1, 3], "np", "float32", named=False)])


def _inp(name: str, datatype: str, data: Any) -> RequestInput:
    array = np.asarray(data, dtype=object if datatype == "BYTES" else None)
    return RequestInput(name=name, shape=list(array.shape), datatype=datatype, data=array)


def test_numbers_are_converted_only_without_loss() -> None:
    inputs = checked_inputs(
        InferenceRequest(
            inputs=[_inp("a", "FP32", np.ones(2, np.float32)), _inp("c", "INT32", np.ones(2, np.int32))]
        ),
        COLUMNS,
        "m",
    )
    assert [(i.datatype, i.data.dtype) for i in inputs] == [
        (Datatype.FP64, np.float64),
        (Datatype.INT64, np.int64),
    ]
    with pytest.raises(InvalidInput, match=r"Input 'c' must be INT64 \(long\); FP64 cannot be converted"):
        checked_inputs(
            InferenceRequest(inputs=[_inp("a", "FP64", [1.0]), _inp("c", "FP64", [1.5])]), COLUMNS, "m"
        )


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        (
            [_inp("a", "FP64", [1.0]), _inp("c", "INT64", [1]), _inp("s", "INT64", [1])],
            "Input 's' must hold text",
        ),
        ([_inp("a", "FP64", [[1.0, 2.0]]), _inp("c", "INT64", [1])], r"shape must be \[N\] or \[N, 1\]"),
        (
            [_inp("a", "FP64", [1.0, 2.0]), _inp("c", "INT64", [1])],
            "Input 'c' has 1 rows but input 'a' has 2",
        ),
        ([_inp("a", "FP64", [1.0])], r"expects input\(s\) \['c'\]"),
    ],
)
def test_columns_that_do_not_fit_are_refused_naming_them(inputs: list[RequestInput], message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        checked_inputs(InferenceRequest(inputs=inputs), COLUMNS, "m")


def test_one_unnamed_tensor_takes_any_name_but_only_one() -> None:
    ok = InferenceRequest(inputs=[_inp("whatever", "FP32", np.ones((2, 3), np.float32))])
    assert decoded(ok, TENSOR, "np", "m").shape == (2, 3)
    with pytest.raises(InvalidInput, match="takes one tensor; the request has 2"):
        checked_inputs(InferenceRequest(inputs=[*ok.inputs, _inp("b", "FP32", [1.0])]), TENSOR, "m")


def test_named_tensors_decode_as_a_dict() -> None:
    named = Signature(
        inputs=[
            Spec("x", Datatype.INT64, [-1], "np", "int64"),
            Spec("y", Datatype.INT64, [-1], "np", "int64"),
        ]
    )
    request = InferenceRequest(inputs=[_inp("x", "INT64", [1, 2]), _inp("y", "INT64", [3, 4])])
    value = decoded(request, named, named.content_type, "m")
    assert {k: v.tolist() for k, v in value.items()} == {"x": [1, 2], "y": [3, 4]}


def test_params_are_the_signatures_found_in_the_request() -> None:
    request = InferenceRequest(parameters=Parameters(k=2.5, n=UInt64(3), other=1), inputs=[])
    assert params_of(request, COLUMNS) == {"k": 2.5, "n": 3}
    assert params_of(InferenceRequest(inputs=[]), COLUMNS) is None
    assert params_of(request, TENSOR) is None


def test_answers_are_named_and_shaped_as_mlserver_does() -> None:
    array = encoded("m", None, np.array([1, 0, 1]))
    assert array.parameters is not None and array.parameters.content_type == "np"
    assert [(o.name, o.shape, o.datatype) for o in array.outputs] == [("output-1", [3, 1], Datatype.INT64)]
    texts = encoded("m", "2", ["a", "b"]).outputs[0]
    assert (texts.datatype, texts.data.reshape(-1).tolist()) == (Datatype.BYTES, [b"a", b"b"])
    several = encoded("m", None, {"p": np.zeros((2, 2)), "q": np.zeros(2)})
    assert [(o.name, o.shape) for o in several.outputs] == [("p", [2, 2]), ("q", [2, 1])]
    assert encoded("m", None, 3.0).outputs[0].shape == [1, 1]
