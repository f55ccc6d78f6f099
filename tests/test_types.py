"""``set_field`` and ``set_extra`` do what pydantic's ``setattr`` does on these models; ``extra_parameters``
what its validation makes."""

from __future__ import annotations

from runtime.types import (
    InferenceRequest,
    InferenceResponse,
    Parameters,
    ResponseOutput,
    built,
    extra_parameters,
    extras,
    fields_set,
    model_state,
    request_from_json,
    set_extra,
    set_field,
    set_fields,
)


def test_set_extra_is_setattr() -> None:
    direct, through = Parameters(content_type="np"), Parameters(content_type="np")
    set_extra(direct, "sequence_id", "s1")
    set_extra(direct, "content_type", "str")  # a declared field: set as pydantic sets it
    through.sequence_id = "s1"  # type: ignore[attr-defined]
    through.content_type = "str"
    assert direct.model_dump() == through.model_dump()
    assert direct.model_extra == through.model_extra == {"sequence_id": "s1"}
    assert direct.model_fields_set == through.model_fields_set


def test_set_field_is_setattr() -> None:
    direct = InferenceResponse(outputs=[ResponseOutput(name="y", shape=[1], datatype="FP32", data=[1.0])])
    through = direct.model_copy(deep=True)
    set_field(direct, "id", "a")
    set_field(direct.outputs[0], "data", [2.0])
    through.id = "a"
    through.outputs[0].data = [2.0]
    assert direct.model_dump() == through.model_dump()
    assert direct.model_fields_set == through.model_fields_set


def test_extra_parameters_is_validation() -> None:
    values = {"sequence_id": "s1", "sequence_replica": "r0", "sequence_end": True}
    built, validated = extra_parameters(dict(values)), Parameters(**values)
    assert type(built) is Parameters
    assert built.model_dump() == validated.model_dump()
    assert built.model_dump_json() == validated.model_dump_json()
    assert built.model_extra == validated.model_extra == values
    assert built.model_fields_set == validated.model_fields_set
    assert built.__pydantic_private__ == validated.__pydantic_private__
    assert built == validated
    empty = extra_parameters({})
    assert empty == Parameters() and empty.model_fields_set == set() and empty.model_extra == {}
    set_extra(empty, "sequence_id", 3)  # its extras are its own, as a validated instance's
    assert empty.model_extra == {"sequence_id": 3} and empty.model_fields_set == {"sequence_id"}


def test_the_named_helpers_read_and_write_what_pydantic_does() -> None:
    parameters = Parameters(content_type="np", custom=1)
    assert extras(parameters) == parameters.model_extra == {"custom": 1}
    assert extras(None) is None
    assert fields_set(parameters) == parameters.model_fields_set == {"content_type", "custom"}
    values, given, extra = model_state(parameters)
    assert (values, given, extra) == (parameters.__dict__, parameters.model_fields_set, {"custom": 1})
    copy = built(Parameters, dict(values), set(given), dict(extra or {}))
    assert copy == parameters and copy.model_extra == {"custom": 1}

    response = InferenceResponse(outputs=[])
    set_fields(response, {"model_name": "m", "id": "r"})
    assert (response.model_name, response.id) == ("m", "r")
    assert response.model_fields_set == {"outputs", "model_name", "id"}

    body = b'{"id": "a", "inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]}'
    assert request_from_json(body) == InferenceRequest.model_validate_json(body)
