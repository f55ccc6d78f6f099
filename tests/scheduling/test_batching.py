"""Merging requests along the first dimension and splitting the answer back
(``runtime.scheduling.batching``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from runtime.errors import ModelFailed
from runtime.scheduling.batching import batch_shape, merge, split
from runtime.types import InferenceRequest, InferenceResponse, ResponseOutput


def _request(rows: int, *, parameters: dict[str, Any] | None = None, **extra: Any) -> InferenceRequest:
    document: dict[str, Any] = {
        "inputs": [
            {"name": "x", "shape": [rows, 2], "datatype": "FP32", "data": list(range(rows * 2))},
            {"name": "y", "shape": [rows], "datatype": "INT32", "data": list(range(rows))},
        ],
        "parameters": parameters,
        **extra,
    }
    return InferenceRequest.model_validate(document)


def test_requests_differing_only_in_rows_and_caller_parameters_share_a_key() -> None:
    plain = batch_shape(_request(1))
    assert plain.rows == 1 and plain.key is not None
    assert batch_shape(_request(3)).key == plain.key
    caller_only = {
        "timeout": 100,
        "priority": 1,
        "binary_data_output": True,
        "triton_enable_empty_final_response": True,
    }
    assert batch_shape(_request(2, parameters=caller_only)).key == plain.key
    reordered = _request(1)
    reordered.inputs.reverse()
    assert batch_shape(reordered).key == plain.key


@pytest.mark.parametrize(
    "parameters",
    [{"content_type": "np"}, {"custom": 1}, {"custom": True}, {"custom": [1, 2]}],
)
def test_parameters_that_reach_the_model_split_the_groups(parameters: dict[str, Any]) -> None:
    assert batch_shape(_request(1, parameters=parameters)).key != batch_shape(_request(1)).key
    assert (
        batch_shape(_request(1, parameters=parameters)).key
        == batch_shape(_request(2, parameters=parameters)).key
    )
    assert (
        batch_shape(_request(1, parameters={"custom": 1})).key
        != batch_shape(_request(1, parameters={"custom": True})).key
    )


def test_a_request_without_one_first_dimension_is_served_alone() -> None:
    disagreeing = InferenceRequest.model_validate(
        {
            "inputs": [
                {"name": "x", "shape": [2], "datatype": "INT32", "data": [1, 2]},
                {"name": "y", "shape": [3], "datatype": "INT32", "data": [1, 2, 3]},
            ]
        }
    )
    scalar = InferenceRequest.model_validate(
        {"inputs": [{"name": "x", "shape": [], "datatype": "INT32", "data": [1]}]}
    )
    for request in (disagreeing, scalar, InferenceRequest(inputs=[])):
        assert (batch_shape(request).key, batch_shape(request).rows) == (None, 1)


def test_merge_stacks_rows_in_order_and_asks_for_the_union_of_outputs() -> None:
    first = _request(
        1,
        parameters={"timeout": 5, "custom": "c"},
        outputs=[{"name": "a", "parameters": {"binary_data": True}}],
    )
    second = _request(2, parameters={"custom": "c"}, outputs=[{"name": "b"}, {"name": "a"}])
    for request in (first, second):
        batch_shape(request)  # turns the data into arrays, as the batcher does
    merged = merge([first, second], [1, 2], batch_id=7)
    assert merged.id == "batch-7"
    assert merged.parameters is not None and merged.parameters.model_extra == {"custom": "c"}
    x = merged.inputs[0]
    assert x.shape == [3, 2] and x.data.tolist() == [[0, 1], [0, 1], [2, 3]]
    assert merged.outputs is not None and [(o.name, o.parameters) for o in merged.outputs] == [
        ("a", None),
        ("b", None),
    ]
    everything = _request(1)
    batch_shape(everything)
    assert merge([first, everything], [1, 1], batch_id=8).outputs is None  # one caller asked for all


def test_split_cuts_the_answer_by_rows_and_adds_each_callers_parameters() -> None:
    response = InferenceResponse(
        model_name="m",
        model_version="1",
        parameters={"shared": 1},
        outputs=[ResponseOutput(name="z", shape=[3, 1], datatype="INT64", data=np.arange(3).reshape(3, 1))],
    )
    pieces = split(response, [1, 2], "m", [{"batch": 0}, {"batch": 1}])
    assert [piece.outputs[0].shape for piece in pieces] == [[1, 1], [2, 1]]
    assert [piece.outputs[0].data.tolist() for piece in pieces] == [[[0]], [[1], [2]]]
    assert [piece.parameters.model_extra for piece in pieces if piece.parameters] == [
        {"shared": 1, "batch": 0},
        {"shared": 1, "batch": 1},
    ]
    assert all((piece.model_name, piece.model_version) == ("m", "1") for piece in pieces)


def test_split_refuses_an_answer_of_the_wrong_rows_or_kind() -> None:
    short = InferenceResponse(outputs=[ResponseOutput(name="z", shape=[2], datatype="INT64", data=[1, 2])])
    with pytest.raises(ModelFailed, match="for a batch of 3 rows from 2 requests"):
        split(short, [1, 2], "m", [{}, {}])
    with pytest.raises(ModelFailed, match="returned a list, not an InferenceResponse"):
        split([], [1], "m", [{}])
