"""Helpers for the continuous batching tests: ticker settings, stream clients in the test's loop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from runtime.core.dataplane import DataPlane
from runtime.errors import ServerError
from runtime.scheduling import ContinuousScheduler
from runtime.settings import ModelSettings
from runtime.types import InferenceRequest, InferenceResponse, Parameters
from tests.conftest import InProcess
from tests.continuous_models import Ticker


def ticker_settings(max_batch_size: int = 4, **fields: Any) -> ModelSettings:
    return ModelSettings(
        name="ticker",
        implementation="tests.continuous_models.Ticker",
        continuous_batching=True,
        max_batch_size=max_batch_size,
        **fields,
    )


def request(request_id: str, **parameters: Any) -> InferenceRequest:
    return InferenceRequest(id=request_id, inputs=[], parameters=Parameters(**parameters))


async def one(item: InferenceRequest) -> AsyncIterator[InferenceRequest]:
    yield item


def ticks(chunks: list[InferenceResponse]) -> list[int]:
    return [int(chunk.outputs[0].data.reshape(-1)[0]) for chunk in chunks]


def extra(chunk: InferenceResponse) -> dict[str, Any]:
    assert chunk.parameters is not None
    return chunk.parameters.model_dump(exclude_none=True)


class Client:
    """One stream read in its own task, as a transport would: its chunks, its error, when it ended."""

    def __init__(
        self, dataplane: DataPlane, request_id: str, model: str = "ticker", **parameters: Any
    ) -> None:
        self.id = request_id
        self.chunks: list[InferenceResponse] = []
        self.error: ServerError | None = None
        self.done = asyncio.Event()
        self.task = asyncio.create_task(self._run(dataplane, request(request_id, **parameters), model))

    async def _run(self, dataplane: DataPlane, item: InferenceRequest, model: str) -> None:
        try:
            async for chunk in dataplane.infer_stream(one(item), model):
                self.chunks.append(chunk)
        except ServerError as exc:
            self.error = exc
        finally:
            self.done.set()

    async def finished(self) -> Client:
        await self.done.wait()
        return self


async def loaded(inprocess: InProcess, settings: ModelSettings) -> tuple[Ticker, ContinuousScheduler]:
    await inprocess.load(settings)
    entry = inprocess.registry.get(settings.name)
    assert isinstance(entry.model, Ticker) and isinstance(entry.scheduler, ContinuousScheduler)
    return entry.model, entry.scheduler


async def turns_until(condition: Callable[[], bool], limit: int = 10_000) -> None:
    """Give the event loop turns (no sleeping) until ``condition`` holds."""
    for _ in range(limit):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")
