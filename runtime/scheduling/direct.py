"""No batching: each request goes straight to the model."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from contextlib import aclosing
from time import monotonic

from runtime.errors import Overloaded
from runtime.model import MLModel
from runtime.scheduling.scheduler import Scheduler
from runtime.settings import ModelSettings
from runtime.telemetry import tracing
from runtime.telemetry.tracing import direct_span, direct_stream
from runtime.types import InferenceRequest, InferenceResponse


class DirectScheduler(Scheduler):
    """Calls ``predict`` for each request and ``predict_stream`` for each stream, as they come.

    At most ``max_queue_size`` requests and streams are inside the model at once; one more gets
    ``Overloaded`` (503) at once. It counts the calls inside the model so that ``stop`` (a reload swapping in a new instance,
    or shutdown) returns only once they have left, and the model is never unloaded under them.
    """

    def __init__(self, model: MLModel, settings: ModelSettings) -> None:
        super().__init__(model, settings)
        self._inside = 0
        self._idle: asyncio.Future[None] | None = None
        """What ``stop`` waits on while calls are inside (made by ``stop``: a request pays no event)."""
        self._calls = itertools.count(1)

    def _leave(self) -> None:
        self._inside -= 1
        if self._inside == 0 and self._idle is not None:
            self._leave_last()

    def _leave_last(self) -> None:
        """The last call left the model: wake ``stop``."""
        if self._idle is not None and not self._idle.done():
            self._idle.set_result(None)
        self._idle = None

    def _enter(self) -> None:
        if self._inside >= self.settings.max_queue_size:
            raise Overloaded(
                f"Model {self.settings.name!r} has {self._inside} requests in flight, its max_queue_size; "
                "try again later"
            )
        self._inside += 1

    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        self._enter()
        start = monotonic()
        try:
            if tracing._active is None:  # no span to open: no context manager around the call
                response = await self.executor.call_predict(request)
            else:
                with direct_span(self.settings.name, next(self._calls), start):
                    response = await self.executor.call_predict(request)
        finally:
            self._leave()
        # an execution that served its request (a failed one counts as a failure alone)
        self.stats.executed(1, 0.0, monotonic() - start)
        return response

    async def stream(self, requests: AsyncIterator[InferenceRequest]) -> AsyncIterator[InferenceResponse]:
        self._enter()
        try:
            responses = direct_stream(
                self.settings.name, next(self._calls), self.executor.open_stream(requests)
            )
            async with aclosing(responses):  # type: ignore[type-var]
                async for response in responses:
                    yield response
        finally:
            self._leave()

    async def stop(self) -> None:
        """Return once no call is inside the model."""
        if self._inside == 0:
            return
        if self._idle is None:
            self._idle = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._idle)
