"""Where a model's code is called: the one seam between schedulers and models.

Schedulers never call ``predict``, ``predict_stream``, ``predict_sequences`` or ``sequence_ended``
themselves; they ask their model's executor (``call_predict`` for a request or a merged batch,
``open_stream`` for a stream, ``predict_sequences`` / ``sequence_ended`` for the sequence batcher).
The in-process executor here is the default; ``worker_executor.WorkerExecutor`` runs the model in
worker processes behind the same interface, so the transports and the schedulers do not know where
a model runs. (Under continuous batching with workers, each worker runs the model's own batcher and
the server forwards to it: ``forwarding.py``.)

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
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from runtime.model import MLModel
from runtime.sequences.sequence_model import EndReason, SequenceModel, SequenceStep
from runtime.settings import ModelSettings
from runtime.types import InferenceRequest, InferenceResponse

LostSequences = Callable[[list[str], str], None]
"""Told the keys of sequences whose state was lost with a worker, and why."""


class Executor(abc.ABC):
    """Calls one model's code for its scheduler."""

    @abc.abstractmethod
    async def call_predict(self, request: InferenceRequest) -> InferenceResponse:
        """The model's answer to one request (or to one merged batch of requests)."""

    @abc.abstractmethod
    def open_stream(self, requests: AsyncIterator[InferenceRequest]) -> AsyncIterator[InferenceResponse]:
        """The model's responses to a stream of requests; closing the iterator stops the model's work."""

    @abc.abstractmethod
    async def predict_sequences(
        self, steps: list[SequenceStep]
    ) -> Sequence[InferenceResponse | BaseException]:
        """One step of each sequence in ``steps`` (a ``SequenceModel``'s batch call)."""

    @abc.abstractmethod
    async def sequence_ended(self, key: str, reason: EndReason, state: Any) -> None:
        """Tell the model that a sequence ended, with the reason and what the scheduler holds of its state."""

    def on_lost(self, callback: LostSequences) -> None:
        """Register who is told when sequences are lost with the process that held them (in
        process they never are)."""

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

    async def predict_sequences(
        self, steps: list[SequenceStep]
    ) -> Sequence[InferenceResponse | BaseException]:
        return await self._sequence_model().predict_sequences(steps)

    async def sequence_ended(self, key: str, reason: EndReason, state: Any) -> None:
        await self._sequence_model().sequence_ended(key, reason, state)

    def _sequence_model(self) -> SequenceModel:
        if not isinstance(self.model, SequenceModel):
            raise TypeError(f"{type(self.model).__qualname__} is not a runtime.SequenceModel")
        return self.model

    async def _each(self, requests: AsyncIterator[InferenceRequest]) -> AsyncIterator[InferenceResponse]:
        async for request in requests:
            yield await self.call_predict(request)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
