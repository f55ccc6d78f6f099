"""Sequence identity: parameters and TorchServe headers, checked in the core; the LRU state store."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from runtime.errors import SequenceError
from runtime.sequences import LRUStateStore, parse_control
from runtime.sequences.identity import (
    SequenceControl,
    _control,
    _id,
    apply_transport_fields,
    mark_response,
)
from runtime.types import InferenceRequest, InferenceResponse, Parameters


def control(**params: Any) -> SequenceControl | None:
    return parse_control(Parameters(**params))


def test_int_and_string_ids_name_the_same_sequence_and_keep_their_type() -> None:
    as_int, as_str = control(sequence_id=42), control(sequence_id="42")
    assert as_int is not None and as_str is not None
    assert as_int.key == as_str.key == "42"
    assert as_int.echo == 42 and isinstance(as_int.echo, int)
    assert as_str.echo == "42"


def test_no_sequence_fields_or_zero_or_empty_id_is_not_a_sequence() -> None:
    assert parse_control(None) is None
    assert parse_control(Parameters(content_type="np")) is None
    assert control(sequence_id=0) is None
    assert control(sequence_id="") is None
    assert control(sequence_id=0, sequence_start=False) is None


def test_start_without_id_gets_a_server_made_id() -> None:
    made = control(sequence_start=True)
    assert made is not None and made.generated and made.start
    assert made.key.startswith("seq-") and len(made.key) == len("seq-") + 36


@pytest.mark.parametrize(
    "params",
    [
        {"sequence_id": -1},
        {"sequence_id": 2**64},
        {"sequence_id": 1.5},
        {"sequence_id": True},
        {"sequence_id": [1]},
        {"sequence_id": "x" * 129},
        {"sequence_id": "é" * 65},  # 130 bytes
        {"sequence_id": "tab\there"},
        {"sequence_id": "nul\x00"},
        {"sequence_id": "a", "sequence_start": "maybe"},
        {"sequence_id": "a", "sequence_end": 2},
        {"sequence_id": "a", "sequence_start": "yes"},
        {"sequence_id": "a", "sequence_start": "true"},
        {"sequence_id": "a", "sequence_end": 1},
        {"sequence_id": "a", "sequence_end": 0},
        {"sequence_end": True},
    ],
)
def test_malformed_sequence_fields_are_refused(params: dict[str, Any]) -> None:
    with pytest.raises(SequenceError):
        control(**params)


def test_limits_are_inclusive_and_only_header_flags_may_be_text() -> None:
    assert control(sequence_id="x" * 128) is not None
    assert control(sequence_id=2**64 - 1) is not None
    for text, value in (
        ("true", True),
        ("TRUE", True),
        ("1", True),
        ("yes", True),
        ("false", False),
        ("0", False),
    ):
        request = InferenceRequest(inputs=[], parameters=Parameters(sequence_id="a"))
        apply_transport_fields(request, {"sequence_start": text})
        parsed = parse_control(request.parameters)
        assert parsed is not None and parsed.start is value
    assert control(sequence_id="a with spaces") is not None


def test_transport_fields_fill_in_and_must_agree_with_the_body() -> None:
    request = InferenceRequest(inputs=[], parameters=Parameters(sequence_id=7))
    apply_transport_fields(request, {"sequence_id": "7", "sequence_start": "true"})
    parsed = parse_control(request.parameters)
    assert parsed is not None and parsed.key == "7" and parsed.echo == 7 and parsed.start
    clash = InferenceRequest(inputs=[], parameters=Parameters(sequence_id="a"))
    with pytest.raises(SequenceError, match="headers say"):
        apply_transport_fields(clash, {"sequence_id": "b"})
    bare = InferenceRequest(inputs=[])
    apply_transport_fields(bare, {"sequence_end": "1", "sequence_id": "z"})
    parsed = parse_control(bare.parameters)
    assert parsed is not None and parsed.end and not parsed.start


def test_responses_echo_the_id_and_mark_the_end() -> None:
    response = InferenceResponse(parameters=Parameters(sequence_end=True))
    parsed = control(sequence_id=9)
    assert parsed is not None
    mark_response(response, parsed, ended=False)
    assert response.parameters is not None
    assert response.parameters.model_dump(exclude_none=True) == {"sequence_id": 9}
    mark_response(response, parsed, ended=True)
    assert response.parameters.model_dump(exclude_none=True) == {"sequence_id": 9, "sequence_end": True}


def _outcome(request: InferenceRequest, fields: dict[str, Any]) -> Any:
    """What ``apply_transport_fields`` leaves: the parameters as dumped, the fields set, or the error."""
    try:
        apply_transport_fields(request, fields)
    except (SequenceError, ValueError) as exc:
        outcome: Any = (type(exc), str(exc))
    else:
        outcome = None
    parameters = request.parameters
    assert parameters is not None
    return outcome, parameters.model_dump(), parameters.model_extra, parameters.model_fields_set


@pytest.mark.parametrize(
    "fields",
    [
        {"sequence_id": "s1"},
        {"sequence_id": "s1", "sequence_start": "true"},
        {"sequence_start": "TRUE", "sequence_id": "s1", "sequence_end": " false "},
        {"sequence_id": "s1", "sequence_end": "yes", "sequence_step": "3"},
        {"sequence_id": "s1", "sequence_start": "1", "sequence_step": " 1 "},
        {"sequence_id": "s1", "sequence_start": "maybe"},
        {"sequence_id": "s1", "sequence_end": ""},
        {"sequence_id": "s1", "sequence_step": "x"},
        {"sequence_id": "s1", "sequence_step": "0"},
        {"sequence_id": "s1", "sequence_start": "true", "other": "1"},
        {"other": "1"},
        {"sequence_start": True},
        {"sequence_end": 1},
    ],
)
def test_transport_fields_into_a_request_without_parameters_as_into_empty_ones(
    fields: dict[str, Any],
) -> None:
    """The fast path (no parameters in the body: fresh ones built without validation) leaves what
    filling empty validated parameters leaves, errors (and what was set before them) included."""
    bare = InferenceRequest(inputs=[])
    empty = InferenceRequest(inputs=[], parameters=Parameters())
    assert _outcome(bare, fields) == _outcome(empty, fields)
    assert type(bare.parameters) is Parameters
    assert "parameters" in bare.model_fields_set


@pytest.mark.parametrize("ended", [False, True])
@pytest.mark.parametrize("replica", [None, "r1"])
@pytest.mark.parametrize("echo", ["s1", 7])
def test_marking_a_response_without_parameters_is_validating_them(
    echo: Any, replica: str | None, ended: bool
) -> None:
    parsed = control(sequence_id=echo)
    assert parsed is not None
    response = InferenceResponse(outputs=[])
    mark_response(response, parsed, ended, replica)
    values: dict[str, Any] = {"sequence_id": echo}
    if replica is not None:
        values["sequence_replica"] = replica
    if ended:
        values["sequence_end"] = True
    expected = Parameters(**values)
    assert response.parameters == expected
    assert response.parameters is not None
    assert response.parameters.model_fields_set == expected.model_fields_set
    assert list(response.parameters.model_extra or {}) == list(values)
    assert "parameters" in response.model_fields_set


@pytest.mark.parametrize(
    "given",
    ["x" * 32, "x" * 33, "é" * 32, "é" * 33, "\ud800" * 32, "\ud800" * 33, "tab\there", "a\x00", " "],
)
def test_short_ids_parse_as_any_id(given: str) -> None:
    """Short printable ids skip the id check's call: same key, echo and errors as the check gives."""
    try:
        expected: Any = _id(given)
    except SequenceError as exc:
        with pytest.raises(SequenceError) as raised:
            control(sequence_id=given)
        assert str(raised.value) == str(exc)
        return
    parsed = control(sequence_id=given)
    assert parsed is not None and parsed.key == expected and parsed.echo is given


def test_a_string_subclass_id_keys_as_plain_text() -> None:
    class Text(str):
        pass

    parsed = control(sequence_id=Text("s1"))
    assert parsed is not None and type(parsed.key) is str and parsed.key == "s1"


@pytest.mark.anyio
async def test_lru_store_evicts_the_least_recently_used_and_says_so() -> None:
    store = LRUStateStore(2)
    assert await store.save([("a", 1), ("b", 2)]) == []
    assert await store.load(["a", "missing"]) == [1, None]  # touches a
    assert await store.save([("c", 3)]) == [("b", 2)]
    assert len(store) == 2
    assert await store.pop("a") == 1
    assert await store.pop("a") is None
    assert await store.clear() == [("c", 3)]
    assert len(store) == 0


@pytest.mark.parametrize(
    ("key", "echo", "start", "end", "step"),
    [("s1", "s1", True, False, None), ("42", 42, False, True, 3), ("x", "x", False, False, 1)],
)
def test_a_parsed_control_is_the_dataclass_built_by_its_constructor(
    key: str, echo: Any, start: bool, end: bool, step: int | None
) -> None:
    built = _control(key, echo, start, end, step)
    expected = SequenceControl(key=key, echo=echo, start=start, end=end, step=step)
    assert type(built) is SequenceControl
    assert built == expected and hash(built) == hash(expected) and repr(built) == repr(expected)
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.key = "other"  # type: ignore[misc]
    params: dict[str, Any] = {"sequence_id": echo, "sequence_start": start, "sequence_end": end}
    if step is not None:
        params["sequence_step"] = step
    assert control(**params) == expected


def test_a_long_id_with_a_lone_surrogate_is_refused_by_its_size() -> None:
    """A lone surrogate takes 3 bytes when the size is counted: the error says so, never a UnicodeEncodeError."""
    with pytest.raises(SequenceError, match="must be at most 128 bytes, got 129"):
        parse_control(Parameters(sequence_id="a" * 126 + "\udc80"))
