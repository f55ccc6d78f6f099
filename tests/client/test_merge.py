"""Lines merged into one request and its answer split back (``runtime.client.merge``)."""

from __future__ import annotations

import pytest

from runtime.client.merge import flat, merge, mergeable, split


def body(rows: list[list[float]], **extra: object) -> dict[str, object]:
    return {"inputs": [{"name": "x", "datatype": "FP32", "shape": [len(rows), 2], "data": rows}], **extra}


def test_data_flatten_row_major() -> None:
    assert flat([[1, 2], [3, [4, 5]]]) == [1, 2, 3, 4, 5] and flat([1, 2]) == [1, 2] and flat(7) == [7]


def test_bodies_merge_only_when_their_inputs_parameters_and_outputs_agree() -> None:
    a = body([[1, 2]])
    assert mergeable(a, body([[3, 4], [5, 6]]))
    other = {"inputs": [{"name": "x", "datatype": "FP64", "shape": [1, 2], "data": [1, 2]}]}
    assert not mergeable(a, other)
    assert not mergeable(a, body([[1, 2]], parameters={"p": 1}))
    assert not mergeable(a, body([[1, 2]], outputs=[{"name": "x"}]))
    assert not mergeable({"inputs": []}, a) and not mergeable({"inputs": [{"name": "x"}]}, a)


def test_a_merged_request_concatenates_rows_and_its_answer_splits_back() -> None:
    bodies = [body([[1, 2]], id="a"), body([[3, 4], [5, 6]]), body([[7, 8]], id="c")]
    merged = merge(bodies)
    assert merged["inputs"] == [
        {"name": "x", "datatype": "FP32", "shape": [4, 2], "data": [1, 2, 3, 4, 5, 6, 7, 8]}
    ]
    answer = {"model_name": "m", "id": "merged", "outputs": [{**merged["inputs"][0], "name": "y"}]}
    parts = list(split(answer, bodies))
    assert [p.get("id") for p in parts] == ["a", None, "c"]
    assert [p["outputs"][0]["data"] for p in parts] == [[1, 2], [3, 4, 5, 6], [7, 8]]
    assert [p["outputs"][0]["shape"] for p in parts] == [[1, 2], [2, 2], [1, 2]]
    assert all(p["model_name"] == "m" for p in parts)
    assert merge(bodies[:1]) is bodies[0] and list(split(answer, bodies[:1])) == [answer]


def test_an_answer_without_a_row_per_merged_row_cannot_be_split() -> None:
    bodies = [body([[1, 2]]), body([[3, 4]])]
    answer = {"outputs": [{"name": "sum", "datatype": "FP32", "shape": [1], "data": [10]}]}
    with pytest.raises(ValueError, match="does not have one row per merged row"):
        list(split(answer, bodies))
