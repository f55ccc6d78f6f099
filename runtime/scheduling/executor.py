"""Where a model's code is called: the one seam between schedulers and models.

Schedulers never call ``predict`` or ``predict_stream`` themselves; they ask their model's
executor (``call_predict`` for a request or a merged batch, ``open_stream`` for a stream). The
in-process executor here is the default; one that runs models in worker processes would plug in
behind the same interface without touching the transports or the schedulers.

In process, a coroutine ``async def predict`` is awaited on the event loop, and a plain
``def predict`` runs on a thread pool of the model's own (``predict_threads`` threads), so that
CPU work that never awaits cannot stall the server. Cancelling ``call_predict`` cancels a
coroutine at once; a thread call cannot be interrupted: its caller is released at once and the
thread finishes the call in the background, its result dropped (its slot of the pool stays taken
until then).
"""

from __future__ import annotations

import abc
import asyncio
import inspect
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

from ..model import MLModel
from ..settings import ModelSettings
from ..types import InferenceRequest, InferenceResponse


class Executor(abc.ABC):
    """Calls one model's code for its scheduler."""

    @abc.abstractmethod
    async def call_predict(self, request: InferenceRequest) -> InferenceResponse:
        """The model's answer to one request (or to one merged batch of requests)."""

    @abc.abstractmethod
    def open_stream(self, requests: AsyncIterator[InferenceRequest]) -> AsyncIterator[InferenceResponse]:
        """The model's responses to a stream of requests; closing the iterator stops the model's work."""

    def close(self) -> None:
        """Free what the executor holds (threads, workers) once its scheduler has stopped."""


class InProcessExecutor(Executor):
    """Calls the model in this process: coroutines on the event loop, plain functions on threads."""

    def __init__(self, model: MLModel, settings: ModelSettings) -> None:
        self.model = model
        self.threads = settings.predict_threads
        self.blocking = not inspect.iscoroutinefunction(model.predict)
        """Whether ``predict`` is a plain function (it runs on the model's thread pool)."""
        self._streams = type(model).predict_stream is not MLModel.predict_stream
        self._pool: ThreadPoolExecutor | None = None

    async def call_predict(self, request: InferenceRequest) -> InferenceResponse:
        if not self.blocking:
            return await self.model.predict(request)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix=f"predict-{self.model.name}")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self.model.predict, request)  # type: ignore[arg-type]

    def open_stream(self, requests: AsyncIterator[InferenceRequest]) -> AsyncIterator[InferenceResponse]:
        if self._streams or not self.blocking:
            return self.model.predict_stream(requests)
        return self._each(requests)  # MLModel's predict_stream awaits predict: not a plain one

    async def _each(self, requests: AsyncIterator[InferenceRequest]) -> AsyncIterator[InferenceResponse]:
        async for request in requests:
            yield await self.call_predict(request)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
