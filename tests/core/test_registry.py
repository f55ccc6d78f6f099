"""The registry: reloads swap instances without unloading a model under a request."""

from __future__ import annotations

import asyncio

import pytest

from runtime import MLModel, ModelSettings
from runtime.types import InferenceRequest, InferenceResponse
from tests.conftest import InProcess

pytestmark = pytest.mark.anyio

EVENTS: list[str] = []
GATE: dict[str, asyncio.Event] = {}


class Held(MLModel):
    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        EVENTS.append(f"predict-start {id(self)}")
        GATE["entered"].set()
        await GATE["release"].wait()
        EVENTS.append(f"predict-end {id(self)}")
        return InferenceResponse(model_name=self.name, outputs=[])

    async def unload(self) -> bool:
        EVENTS.append(f"unload {id(self)}")
        return True


async def test_a_reload_unloads_the_old_instance_only_after_its_requests_finish(inprocess: InProcess) -> None:
    """Guards the race where a reload swaps in the new instance and unloads the old one while a
    request is still inside the old one's predict."""
    EVENTS.clear()
    GATE.update(entered=asyncio.Event(), release=asyncio.Event())
    settings = ModelSettings(name="held", implementation=Held)
    await inprocess.load(settings)
    old = inprocess.registry.get("held").model
    call = asyncio.create_task(inprocess.dataplane.infer(InferenceRequest(inputs=[]), "held"))
    await GATE["entered"].wait()
    reload = asyncio.create_task(inprocess.registry.load(ModelSettings(name="held", implementation=Held)))
    # the new instance is swapped in first; nothing signals that, so yield until it happens
    while inprocess.registry.get("held").model is old:  # noqa: ASYNC110
        await asyncio.sleep(0)
    assert f"unload {id(old)}" not in EVENTS
    GATE["release"].set()
    await call
    await reload
    assert EVENTS.index(f"predict-end {id(old)}") < EVENTS.index(f"unload {id(old)}")
