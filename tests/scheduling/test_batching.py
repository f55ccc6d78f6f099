"""Merging requests along the first dimension and splitting the answer back
(``runtime.scheduling.batching``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from runtime.errors import ModelFailed
from runtime.scheduling.batching import batch_shape, merge, split
from runtime.types import Datatype, InferenceRequest, InferenceResponse, Parameters, ResponseOutput


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


def _validated_split(response: InferenceResponse, rows: list[int], extra: list[dict[str, Any]]) -> list[Any]:
    """What split made before it built its pieces without validating them: every piece validated."""
    common = response.parameters.model_dump(exclude_none=True) if response.parameters else {}
    pieces, start = [], 0
    for count, params in zip(rows, extra, strict=True):
        outputs = [
            ResponseOutput(
                name=out.name,
                shape=[count, *out.shape[1:]],
                datatype=out.datatype,
                parameters=out.parameters.model_copy() if out.parameters else None,
                data=np.asarray(out.data).reshape(out.shape)[start : start + count],
            )
            for out in response.outputs
        ]
        pieces.append(
            InferenceResponse(
                model_name=response.model_name,
                model_version=response.model_version,
                parameters=Parameters(**{**common, **params}),
                outputs=outputs,
            )
        )
        start += count
    return pieces


def _response(**parameters: Any) -> InferenceResponse:
    return InferenceResponse(
        model_name="m",
        model_version="2",
        parameters=parameters or None,
        outputs=[
            ResponseOutput(
                name="z", shape=[3, 2], datatype="FP32", data=np.arange(6, dtype=np.float32).reshape(3, 2)
            ),
            ResponseOutput(
                name="w",
                shape=[3],
                datatype="INT64",
                parameters={"content_type": "np", "kept": 1},
                data=np.arange(3),
            ),
        ],
    )


def _same(piece: Any, reference: Any) -> None:
    assert type(piece) is type(reference)
    assert piece.model_fields_set == reference.model_fields_set
    assert piece.model_extra == reference.model_extra
    assert piece.model_dump(exclude={"outputs"}) == reference.model_dump(exclude={"outputs"})
    assert piece.model_dump_json(exclude={"outputs"}) == reference.model_dump_json(exclude={"outputs"})
    for out, ref in zip(piece.outputs, reference.outputs, strict=True):
        assert type(out) is type(ref) and type(out.datatype) is type(ref.datatype)
        assert out.model_fields_set == ref.model_fields_set
        assert out.model_dump(exclude={"data"}) == ref.model_dump(exclude={"data"})
        assert out.data.tolist() == ref.data.tolist()
    if piece.parameters is not None:
        assert piece.parameters.model_fields_set == reference.parameters.model_fields_set


@pytest.mark.parametrize(
    "parameters",
    [{}, {"shared": 1}, {"content_type": "np", "shared": [1, 2]}, {"headers": {"h": "v"}}],
)
def test_split_builds_the_pieces_validation_would(parameters: dict[str, Any]) -> None:
    response = _response(**parameters)
    extra = [{"batch_id": 4, "batch_size": 2}] * 2
    pieces = split(response, [1, 2], "m", extra)
    for piece, reference in zip(
        pieces, _validated_split(_response(**parameters), [1, 2], extra), strict=True
    ):
        _same(piece, reference)
    # each piece owns its parameters: changing one changes no other
    assert pieces[0].parameters is not pieces[1].parameters
    assert pieces[0].outputs[1].parameters is not pieces[1].outputs[1].parameters
    pieces[0].parameters.batch_id = 9  # type: ignore[union-attr]
    assert pieces[1].parameters.batch_id == 4  # type: ignore[union-attr]


def test_split_pieces_are_views_of_the_batch() -> None:
    response = _response()
    pieces = split(response, [2, 1], "m", [{}, {}])
    assert all(np.shares_memory(piece.outputs[0].data, response.outputs[0].data) for piece in pieces)


def test_split_validates_what_a_model_assigned_after_building_its_response() -> None:
    """A model may assign a field a value of another type after building its response (they do not
    validate assignments): the pieces are then validated, as every piece used to be."""
    response, reference = _response(), _response()
    for r in (response, reference):
        r.outputs[0].datatype = "FP32"  # type: ignore[assignment]
    pieces = split(response, [1, 2], "m", [{}, {}])
    for piece, ref in zip(pieces, _validated_split(reference, [1, 2], [{}, {}]), strict=True):
        _same(piece, ref)
        assert piece.outputs[0].datatype is Datatype.FP32
