"""The one interface every scheduling strategy implements (``runtime.scheduling.scheduler``): a
strategy must serve ``infer`` and ``stream``; by default it calls the model in this process, has no
background work to start, stop or hand over, no counts kept elsewhere, and describes itself as
direct. Every strategy the settings can ask for is one, and the DataPlane serves through it
without knowing which."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from runtime.model import MLModel
from runtime.scheduling import make_scheduler
from runtime.scheduling.executor import InProcessExecutor
from runtime.scheduling.scheduler import Scheduler, StreamError
from runtime.settings import ModelSettings
from runtime.types import InferenceRequest, InferenceResponse
from tests.conftest import InProcess
from tests.continuous_models import Ticker
from tests.models import zoo
from tests.models.seqzoo import Recorder

pytestmark = pytest.mark.anyio


class Calls(Scheduler):
    """A strategy of its own: calls the model through its executor, counting the calls."""

    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        self.stats.executed(1)
        return await self.executor.call_predict(request)

    async def stream(
        self, requests: AsyncIterator[InferenceRequest]
    ) -> AsyncIterator[InferenceResponse | StreamError]:
        async for request in requests:
            yield await self.infer(request)


ECHO = ModelSettings(name="echo", implementation=zoo.Echo)


def test_a_strategy_must_serve_infer_and_stream() -> None:
    class Incomplete(Scheduler):
        async def infer(self, request: InferenceRequest) -> InferenceResponse:
            raise NotImplementedError

    with pytest.raises(TypeError, match="stream"):
        Incomplete(zoo.Echo(ECHO), ECHO)  # type: ignore[abstract]


async def test_the_defaults_of_a_strategy() -> None:
    model = zoo.Echo(ECHO)
    scheduler = Calls(model, ECHO)
    assert isinstance(scheduler.executor, InProcessExecutor)
    assert scheduler.model is model and scheduler.settings is ECHO
    assert scheduler.describe() == {"scheduler": "direct"}
    await scheduler.start()
    await scheduler.refresh()
    await scheduler.hand_over()
    response = await scheduler.infer(InferenceRequest(inputs=[]))
    assert response.model_name == "echo"

    async def two() -> AsyncIterator[InferenceRequest]:
        for _ in range(2):
            yield InferenceRequest(inputs=[])

    assert len([item async for item in scheduler.stream(two())]) == 2
    await scheduler.stop()


@pytest.mark.parametrize(
    ("model", "fields", "kind"),
    [
        (zoo.Echo, {}, "direct"),
        (zoo.Echo, {"max_batch_size": 4, "max_batch_time": 0.01}, "adaptive"),
        (Recorder, {"sequence_batching": True}, "sequence"),
        (Ticker, {"continuous_batching": True}, "continuous"),
    ],
)
async def test_every_strategy_the_settings_ask_for_is_a_scheduler(
    model: type[MLModel], fields: dict[str, Any], kind: str
) -> None:
    settings = ModelSettings(name="m", implementation=model, **fields)
    scheduler = make_scheduler(model(settings), settings)
    assert isinstance(scheduler, Scheduler) and scheduler.describe()["scheduler"] == kind


async def test_the_dataplane_serves_through_the_models_scheduler(inprocess: InProcess) -> None:
    await inprocess.load(ECHO)
    entry = inprocess.registry.get("echo")
    assert isinstance(entry.scheduler, Scheduler)
    before = entry.scheduler.stats.snapshot()
    async with inprocess.client() as client:
        answer = await client.post("/v2/models/echo/infer", json={"inputs": []})
    assert answer.status_code == 200
    assert entry.scheduler.stats.snapshot() != before  # the execution was counted by its scheduler
