"""``set_field`` and ``set_extra`` do what pydantic's ``setattr`` does on these models."""

from __future__ import annotations

from runtime.types import InferenceResponse, Parameters, ResponseOutput, set_extra, set_field


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
