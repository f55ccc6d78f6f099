"""Declared inputs marked ``"parameters": {"optional": true}`` (Triton's ``optional``) may be omitted."""

from __future__ import annotations

import pytest

from runtime.model import MLModel
from runtime.settings import ModelSettings
from runtime.types import InferenceRequest, InferenceResponse, MetadataTensor, ResponseOutput

from .conftest import InProcess

pytestmark = pytest.mark.anyio


class Names(MLModel):
    """Answers with how many inputs it was given."""

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        count = len(payload.inputs)
        return InferenceResponse(
            model_name=self.name,
            outputs=[ResponseOutput(name="n", shape=[1], datatype="INT64", data=[count])],
        )


def _settings() -> ModelSettings:
    return ModelSettings(
        name="opt",
        implementation=Names,
        inputs=[
            MetadataTensor(name="x", datatype="FP32", shape=[-1]),
            MetadataTensor.model_validate(
                {"name": "hint", "datatype": "FP32", "shape": [-1], "parameters": {"optional": True}}
            ),
        ],
    )


def _body(*names: str) -> dict[str, object]:
    return {"inputs": [{"name": name, "datatype": "FP32", "shape": [1], "data": [1.0]} for name in names]}


async def test_optional_inputs_may_be_omitted_required_ones_may_not(inprocess: InProcess) -> None:
    await inprocess.load(_settings())
    async with inprocess.client() as client:
        both = await client.post("/v2/models/opt/infer", json=_body("x", "hint"))
        only_x = await client.post("/v2/models/opt/infer", json=_body("x"))
        only_hint = await client.post("/v2/models/opt/infer", json=_body("hint"))
        config = (await client.get("/v2/models/opt/config")).json()
    assert both.json()["outputs"][0]["data"] == [2]
    assert only_x.json()["outputs"][0]["data"] == [1]
    assert only_hint.status_code == 400
    assert "expects input(s) ['x']" in only_hint.json()["error"]
    assert [tensor.get("optional", False) for tensor in config["input"]] == [False, True]


def test_only_a_true_optional_parameter_counts() -> None:
    def tensor(parameters: object) -> MetadataTensor:
        return MetadataTensor.model_validate(
            {"name": "t", "datatype": "FP32", "shape": [1], "parameters": parameters}
        )

    assert tensor({"optional": True}).optional
    assert not tensor({"optional": "yes"}).optional
    assert not tensor({}).optional
    assert not tensor(None).optional
