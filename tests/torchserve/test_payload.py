"""TorchServe requests and answers as OIP tensors (``runtime.torchserve.payload``): built by the
front ends, merged by the batcher, read back row by row by the handler model."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from runtime.errors import InvalidInput, ModelFailed
from runtime.torchserve.payload import (
    ANSWER,
    BODY,
    META,
    Answer,
    Entry,
    answers_response,
    build_instances_request,
    build_request,
    decode_value,
    read_answers,
    read_rows,
)
from runtime.types import InferenceRequest, InferenceResponse, RequestInput, ResponseOutput


def _merged(*requests: InferenceRequest) -> InferenceRequest:
    """The requests merged along their first dimension, as the adaptive batcher merges them."""
    names = [inp.name for inp in requests[0].inputs]
    inputs = []
    for name in names:
        columns = [next(inp for inp in r.inputs if inp.name == name).data for r in requests]
        data = np.concatenate(columns)
        inputs.append(RequestInput(name=name, shape=[len(data)], datatype="BYTES", data=data))
    return InferenceRequest(inputs=inputs)


def test_a_request_is_one_row_of_bytes_tensors_and_its_meta() -> None:
    request = build_request(
        [Entry("body", b'{"a": 1}', "application/json"), Entry("q", b"text")], {"X-Key": "v"}
    )
    assert request.id is not None
    assert [(inp.name, inp.shape, inp.datatype.value) for inp in request.inputs] == [
        ("body", [1], "BYTES"),
        ("q", [1], "BYTES"),
        (META, [1], "BYTES"),
    ]
    meta = orjson.loads(request.inputs[2].data[0])
    assert meta == {
        "id": request.id,
        "headers": {"X-Key": "v"},
        "content_types": {"body": "application/json"},
    }


def test_merged_requests_read_back_as_one_row_each() -> None:
    first = build_request([Entry("body", b'{"a": 1}', "application/json")], {"h": "1"})
    second = build_request([Entry("body", "héllo".encode(), "text/plain; charset=utf-8")], {"h": "2"})
    rows = read_rows(_merged(first, second), "fallback")
    assert [row.request_id for row in rows] == [first.id, second.id]
    assert [row.data for row in rows] == [{"body": {"a": 1}}, {"body": "héllo"}]
    assert [row.headers for row in rows] == [{"h": "1"}, {"h": "2"}]
    assert rows[1].content_types == {"body": "text/plain; charset=utf-8"}
    assert not any(row.instance for row in rows)


def test_kserve_instances_are_one_row_each_with_their_own_id() -> None:
    request = build_instances_request([{"x": 1}, [2, 3]], {})
    rows = read_rows(request, "unused")
    assert [row.request_id for row in rows] == [f"{request.id}-0", f"{request.id}-1"]
    assert [row.data[BODY] for row in rows] == [{"x": 1}, [2, 3]]
    assert all(row.instance for row in rows)
    one = build_instances_request([5], {})
    (single,) = read_rows(one, "unused")
    assert single.data == {BODY: 5} and single.request_id == one.id


def test_a_plain_oip_request_is_rows_without_headers_named_after_the_fallback_id() -> None:
    data = np.array([b"a", b"b"], dtype=object)
    request = InferenceRequest(inputs=[RequestInput(name="x", shape=[2], datatype="BYTES", data=data)])
    rows = read_rows(request, "r")
    assert [(row.request_id, row.data, row.headers) for row in rows] == [
        ("r-0", {"x": b"a"}, {}),
        ("r-1", {"x": b"b"}, {}),
    ]


def test_inputs_that_are_not_bytes_or_not_the_same_length_are_refused() -> None:
    numbers = RequestInput(name="x", shape=[1], datatype="FP32", data=np.zeros(1, np.float32))
    with pytest.raises(InvalidInput, match="takes BYTES inputs; 'x' is FP32"):
        read_rows(InferenceRequest(inputs=[numbers]), "r")
    a = RequestInput(name="a", shape=[1], datatype="BYTES", data=np.array([b"1"], dtype=object))
    b = RequestInput(name="b", shape=[2], datatype="BYTES", data=np.array([b"1", b"2"], dtype=object))
    with pytest.raises(InvalidInput, match="same number of rows"):
        read_rows(InferenceRequest(inputs=[a, b]), "r")


def test_values_are_decoded_as_torchserves_worker_decodes_them() -> None:
    assert decode_value(b'{"a": [1]}', "application/json") == {"a": [1]}
    assert decode_value(b"not json", "application/json") == b"not json"
    assert decode_value(b"text", "text/plain") == "text"
    assert decode_value(b"\xff", "text/plain") == b"\xff"
    assert decode_value(b'{"a": 1}', None) == b'{"a": 1}'
    assert decode_value(b"raw", "application/octet-stream") == b"raw"


def test_answers_round_trip_through_a_response() -> None:
    answers = [
        Answer(b"ok"),
        Answer(b"part", status=201, phrase="Created", headers={"ts_stream_next": "true"}),
    ]
    back = read_answers(answers_response(answers))
    assert back == answers
    assert [answer.streams_on for answer in back] == [False, True]


def test_a_response_without_meta_is_plain_200_answers_and_one_without_body_is_a_failure() -> None:
    bodies = np.array([b"x", "y"], dtype=object)
    plain = InferenceResponse(outputs=[ResponseOutput(name=BODY, shape=[2], datatype="BYTES", data=bodies)])
    assert read_answers(plain) == [Answer(b"x"), Answer(b"y")]
    meta = np.array([b"{}"], dtype=object)
    headless = InferenceResponse(
        outputs=[ResponseOutput(name=ANSWER, shape=[1], datatype="BYTES", data=meta)]
    )
    with pytest.raises(ModelFailed, match="without a 'body' output"):
        read_answers(headless)
