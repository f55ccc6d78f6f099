"""The DataPlane's own contract (``runtime.core.dataplane``), whatever the transport: an unknown model
or version is ModelNotFound, a model that is not ready ModelNotReady, a request is checked against
the model's declared inputs, a response is named after the model and carries the request's id, a
failing model is ModelFailed with what it raised as the cause, and readiness says why not in words.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from runtime.core.dataplane import DataPlane
from runtime.core.registry import Registry
from runtime.errors import (
    InvalidInput,
    ModelFailed,
    ModelNotFound,
    ModelNotReady,
    ShuttingDown,
    Unauthenticated,
)
from runtime.settings import ModelSettings, Settings
from runtime.types import InferenceRequest, MetadataTensor, RequestInput
from tests.models import zoo

pytestmark = pytest.mark.anyio

DECLARED = ModelSettings(
    name="declared",
    implementation=zoo.Echo,
    inputs=[MetadataTensor(name="x", datatype="FP32", shape=[-1, 2])],
)


def _request(name: str = "x", datatype: str = "FP32", id_: str | None = "req-1") -> InferenceRequest:
    return InferenceRequest(
        id=id_, inputs=[RequestInput(name=name, shape=[1, 2], datatype=datatype, data=[1.0, 2.0])]
    )


@pytest.fixture
async def dataplane(tmp_path: Path) -> AsyncIterator[DataPlane]:
    registry = Registry()
    plane = DataPlane(Settings(model_repository_root=str(tmp_path), repository_token_auth=False), registry)
    plane.started = True
    await registry.load(ModelSettings(name="echo", implementation=zoo.Echo))
    await registry.load(ModelSettings(name="raising", implementation=zoo.Raising))
    await registry.load(ModelSettings(name="broken", implementation=zoo.FailingLoad))
    await registry.load(DECLARED)
    yield plane
    await registry.unload_all()


async def test_an_unknown_model_or_version_is_model_not_found(dataplane: DataPlane) -> None:
    with pytest.raises(ModelNotFound, match="nothere"):
        await dataplane.infer(_request(), "nothere")
    with pytest.raises(ModelNotFound):
        await dataplane.infer(_request(), "echo", "7")
    with pytest.raises(ModelNotFound):
        dataplane.check_model("nothere")
    with pytest.raises(ModelNotFound):
        dataplane.model_ready("nothere")


async def test_a_model_that_failed_to_load_is_not_ready(dataplane: DataPlane) -> None:
    assert not dataplane.model_ready("broken")
    with pytest.raises(ModelNotReady) as caught:
        await dataplane.infer(_request(), "broken")
    assert "broken" in caught.value.message
    assert dataplane.model_ready("echo")


async def test_the_response_is_named_after_the_model_and_carries_the_request_id(dataplane: DataPlane) -> None:
    response = await dataplane.infer(_request(id_="abc-123"), "echo")
    assert response.model_name == "echo" and response.id == "abc-123"
    (output,) = response.outputs
    assert output.name == "x" and output.shape == [1, 2]
    assert np.array_equal(np.asarray(output.data).reshape(-1), [1.0, 2.0])
    unnamed = await dataplane.infer(_request(id_=None), "echo")
    assert unnamed.id  # a request without an id gets one of its own
    assert unnamed.id != (await dataplane.infer(_request(id_=None), "echo")).id


async def test_requests_are_checked_against_the_declared_inputs(dataplane: DataPlane) -> None:
    ok = await dataplane.infer(_request(), "declared")
    assert ok.model_name == "declared"
    with pytest.raises(InvalidInput, match="'x'"):
        await dataplane.infer(_request(datatype="INT64"), "declared")
    doubled = _request()
    doubled.inputs.append(doubled.inputs[0].model_copy())
    with pytest.raises(InvalidInput, match="more than once"):
        await dataplane.infer(doubled, "echo")


async def test_a_failing_model_is_model_failed_with_its_cause(dataplane: DataPlane) -> None:
    with pytest.raises(ModelFailed) as caught:
        await dataplane.infer(_request(), "raising")
    assert "raising" in caught.value.message
    assert isinstance(caught.value.__cause__, ValueError)
    assert str(caught.value.__cause__) == "the model broke"
    assert (await dataplane.infer(_request(), "echo")).model_name == "echo"  # the server serves on


async def test_readiness_says_why_not(dataplane: DataPlane) -> None:
    assert dataplane.live()
    strict = DataPlane(Settings(strict_readiness=True), dataplane.registry)
    assert strict.not_ready_because() == "it is starting"
    strict.started = True
    reason = strict.not_ready_because()
    assert reason is not None and "broken" in reason  # a model that failed to load
    await dataplane.registry.unload("broken")
    assert strict.ready()
    strict.expect([ModelSettings(name="later", implementation=zoo.Echo)], [])
    assert "later" in (strict.not_ready_because() or "")
    strict.draining = True
    assert strict.not_ready_because() == "it is shutting down"
    with pytest.raises(ShuttingDown):
        await strict.infer(_request(), "echo")


async def test_metadata_names_the_server_and_the_model(dataplane: DataPlane) -> None:
    server = dataplane.metadata()
    assert server.name == dataplane.settings.server_name and "model_repository" in server.extensions
    model = await dataplane.model_metadata("declared")
    assert model.name == "declared"
    assert [tensor.name for tensor in dataplane.model_inputs("declared")] == ["x"]


async def test_the_repository_index_load_and_unload(dataplane: DataPlane, tmp_path: Path) -> None:
    folder = tmp_path / "summer"
    folder.mkdir()
    (folder / "model-settings.json").write_text(
        json.dumps({"name": "summer", "implementation": "tests.models.zoo.Summer"})
    )
    index = {item.name: item for item in await dataplane.repository_index()}
    assert index["summer"].state.value == "UNAVAILABLE" and index["summer"].reason == "not loaded"
    assert index["echo"].state.value == "READY"
    assert "summer" not in {item.name for item in await dataplane.repository_index(ready_only=True)}
    await dataplane.repository_load("summer")
    response = await dataplane.infer(_request(), "summer")
    assert np.array_equal(np.asarray(response.outputs[0].data).reshape(-1), [3.0])
    await dataplane.repository_unload("summer")
    with pytest.raises(ModelNotFound):
        await dataplane.infer(_request(), "summer")
    with pytest.raises(ModelNotFound):
        await dataplane.repository_load("absent")


async def test_loading_and_unloading_need_the_key_by_default(dataplane: DataPlane, tmp_path: Path) -> None:
    guarded = DataPlane(Settings(model_repository_root=str(tmp_path)), dataplane.registry)
    with pytest.raises(Unauthenticated, match="management key"):
        await guarded.repository_load("echo")
    with pytest.raises(Unauthenticated, match="management key"):
        await guarded.repository_unload("echo", "Bearer wrong")
    assert dataplane.registry.get("echo").model is not None  # nothing was unloaded
    assert "echo" in {item.name for item in await guarded.repository_index()}  # the index stays open
