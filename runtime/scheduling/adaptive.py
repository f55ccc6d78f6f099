"""Adaptive batching: independent requests to a model merged into one ``predict`` call.

On when a model's settings have ``max_batch_size`` > 1 and ``max_batch_time`` > 0 (MLServer's
settings; KServe's maxBatchSize / maxLatency). How it behaves:

- Requests wait in one bounded queue per model (``max_queue_size``: beyond it, 503 at once),
  in groups of requests that can be merged (:mod:`.batching`: same input names, datatypes,
  dimensions after the first, model-visible parameters). Each group forms its own batch, so a
  request of another shape neither blocks nor reorders the others.
- A group leaves as a batch as soon as it holds ``max_batch_size`` requests, or when its oldest
  request has waited ``max_batch_time`` seconds; when several are ready, the one whose oldest
  request came first leaves first. ``max_batch_size`` counts requests, as in MLServer.
- At most ``max_concurrent_batches`` batches run ``predict`` at once; meanwhile the next
  batches form (and keep filling up to ``max_batch_size`` while they wait for a slot).
- A request waits in the queue at most ``queue_timeout`` seconds, or less if its OIP
  ``timeout`` parameter (microseconds) says so; then it gets 503 (QueueTimeout). Once its batch
  has started, it is no longer timed.
- Each caller owns a future. A caller cancelled (or gone) while queued leaves the queue; one
  cancelled while its batch runs has its result dropped, and the others get theirs. Results
  are set only on futures that are not done.
- A batch whose callers have all gone (cancelled, timed out, or cut at shutdown) is cancelled:
  the model's coroutine sees ``CancelledError``.
- A model that raises fails every caller of that batch (500, ModelFailed, logged once), and the
  next batch runs as usual. If the model raises InvalidInput for a merged batch, each of its
  requests is served again alone, so that only the one at fault gets the 400. A model that
  returns outputs whose first dimension is not the batch's row count fails the batch (500).
- Each response carries the parameters ``batch_id`` (counting from 1 per loaded model) and
  ``batch_size`` (requests in that batch).

The model's ``predict`` is called through the scheduler's executor (``executor.py``) and never
replaced: an ``async def predict`` is awaited on the event loop (a model whose work is CPU-heavy
runs it off the loop itself, e.g. ``await loop.run_in_executor(...)``; torch and numpy release the
GIL while they compute), a plain ``def predict`` runs on the model's own threads, so that the
server keeps reading, queueing and answering requests while a batch computes.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import itertools
import logging
import math
import time
from collections.abc import AsyncIterator, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from runtime.errors import InvalidInput, ModelFailed, ModelNotReady, ServerError, ShuttingDown, model_failed
from runtime.model import MLModel
from runtime.scheduling import gc_threshold
from runtime.scheduling.batching import batch_shape, merge, split
from runtime.scheduling.queueing import Waiter, WaitQueue, queue_timeout, reject, resolve, wait_for_response
from runtime.scheduling.scheduler import Scheduler
from runtime.settings import ModelSettings
from runtime.telemetry.tracing import batch_span, direct_stream
from runtime.types import InferenceRequest, InferenceResponse, Parameters

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class _Caller(Waiter[InferenceResponse]):
    rows: int = 1
    alone: bool = False
    """The request cannot be merged with any other; it is a batch of its own."""


class AdaptiveScheduler(Scheduler):
    """Merges compatible requests into batches; see the module's docstring."""

    def __init__(self, model: MLModel, settings: ModelSettings) -> None:
        super().__init__(model, settings)
        self.max_batch_size = settings.max_batch_size
        self.max_batch_time = settings.max_batch_time
        self.max_concurrent_batches = settings.max_concurrent_batches
        self._queue = WaitQueue(settings.max_queue_size, settings.name)
        self._running: set[asyncio.Task[None]] = set()
        self._former: asyncio.Task[None] | None = None
        self._waker: asyncio.Future[None] | None = None
        self._closing = False
        self._batch_ids = itertools.count(1)
        self._holds_collector = False
        self._default_is_all = model.default_outputs_all

    @property
    def name(self) -> str:
        return self.settings.name

    @property
    def queued(self) -> int:
        """Requests waiting for a batch now."""
        return len(self._queue)

    @property
    def running(self) -> int:
        """Batches whose ``predict`` runs now."""
        return len(self._running)

    def describe(self) -> dict[str, Any]:
        return {
            "scheduler": "adaptive",
            "max_batch_size": self.max_batch_size,
            "max_batch_time": self.max_batch_time,
            "max_concurrent_batches": self.max_concurrent_batches,
            "max_queue_size": self._queue.max_size,
            "queue_timeout": self.settings.queue_timeout,
        }

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self._former = asyncio.create_task(self._form_batches(), name=f"batches of {self.name}")
        self._former.add_done_callback(self._former_done)
        if not self._holds_collector:
            self._holds_collector = True
            gc_threshold.hold()

    def _former_done(self, task: asyncio.Task[None]) -> None:
        if not self._closing:  # it ended by itself: a bug; refuse work rather than queue it forever
            self._closing = True
            exc = None if task.cancelled() else task.exception()
            logger.error("Batching of model %r stopped unexpectedly: %r", self.name, exc)

    async def stop(self) -> None:
        """Take no new requests; serve those queued (without waiting for batches to fill) and
        those running, then end."""
        self._closing = True
        self._wake()
        try:
            if self._former is not None:
                await self._former
        finally:
            if self._holds_collector:
                self._holds_collector = False
                gc_threshold.release()

    def hurry(self) -> None:
        """Send every waiting group now, and each new one as it comes (no more waiting for a
        batch to fill: the unload waits for these requests)."""
        self.max_batch_time = 0.0
        self._wake()

    # ------------------------------------------------------------------ callers

    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        if self._closing:
            raise ShuttingDown(f"Model {self.name!r} is unloading")
        if self._former is None:
            raise ModelNotReady(f"Model {self.name!r} is not started")
        shape = batch_shape(request, self._default_is_all)
        timeout = queue_timeout(request, self.settings.queue_timeout)
        alone = shape.key is None
        caller = _Caller(
            request=request,
            key=object() if alone else shape.key,
            future=asyncio.get_running_loop().create_future(),
            rows=shape.rows,
            alone=alone,
        )
        size = self._queue.put(caller, timeout)
        if (size == 1 or size >= self.max_batch_size) and len(self._running) < self.max_concurrent_batches:
            # a new group (a new deadline) or a full one; while every batch slot is taken the
            # former sleeps until a batch ends (it looks at every group then): no use waking it
            self._wake()
        return await wait_for_response(self._queue, caller)

    def stream(self, requests: AsyncIterator[InferenceRequest]) -> AsyncIterator[InferenceResponse]:
        """A streaming model streams as it would without batching; a unary model's requests,
        sent on a stream, are batched like any other."""
        if type(self.model).predict_stream is not MLModel.predict_stream:
            return direct_stream(self.name, next(self._batch_ids), self.executor.open_stream(requests))
        return self._each_batched(requests)

    async def _each_batched(
        self, requests: AsyncIterator[InferenceRequest]
    ) -> AsyncIterator[InferenceResponse]:
        async for request in requests:
            yield await self.infer(request)

    # ------------------------------------------------------------------ forming batches

    async def _form_batches(self) -> None:
        try:
            while True:
                if len(self._running) >= self.max_concurrent_batches:
                    await self._sleep(None)
                    continue
                key, delay = self._next_batch(time.monotonic())
                if key is not None:
                    callers = self._queue.take(key, self.max_batch_size)
                    if callers:
                        self._launch(callers)
                    continue
                if self._closing and not self._running and not len(self._queue):
                    return
                await self._sleep(delay)
        finally:
            # only reached with work left when this task itself is cancelled or broken
            reject(self._queue.drain(), lambda: ShuttingDown(f"Model {self.name!r} stopped batching"))

    def _next_batch(self, now: float) -> tuple[Hashable | None, float | None]:
        """The group to send now (oldest first among those ready), or how long until one is ready."""
        best: Hashable | None = None
        best_arrival = math.inf
        next_deadline = math.inf
        for key, head, size in self._queue.heads():
            deadline = head.arrival + self.max_batch_time
            ready = size >= self.max_batch_size or deadline <= now or self._closing
            if ready or (isinstance(head, _Caller) and head.alone):
                if head.arrival < best_arrival:
                    best, best_arrival = key, head.arrival
            elif deadline < next_deadline:
                next_deadline = deadline
        if best is not None:
            return best, None
        return None, (next_deadline - now if next_deadline < math.inf else None)

    async def _sleep(self, delay: float | None) -> None:
        """Wait until woken (a group filled or appeared, a batch ended) or ``delay`` passed."""
        loop = asyncio.get_running_loop()
        waker = self._waker = loop.create_future()
        timer = loop.call_later(delay, _wake_up, waker) if delay is not None else None
        try:
            await waker
        finally:
            self._waker = None
            if timer is not None:
                timer.cancel()

    def _wake(self) -> None:
        if self._waker is not None:
            _wake_up(self._waker)

    def _launch(self, callers: list[Waiter[InferenceResponse]]) -> None:
        batch_id = next(self._batch_ids)
        task = asyncio.create_task(self._run_batch(batch_id, callers), name=f"{self.name} batch {batch_id}")
        self._running.add(task)  # keeps a reference until it is done
        task.add_done_callback(self._batch_done)

    def _batch_done(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            logger.error("Batch of model %r ended with %s: %s", self.name, type(exc).__name__, exc)
        self._wake()

    # ------------------------------------------------------------------ running batches

    async def _run_batch(self, batch_id: int, callers: Sequence[Waiter[InferenceResponse]]) -> None:
        live = [c for c in callers if not c.future.done()]  # drop callers that went away
        if not live:
            return
        start = time.monotonic()
        abandon = _Abandon(live)
        try:
            with batch_span(self.name, batch_id, live):
                responses = await self._predict(batch_id, live)
        except InvalidInput as exc:
            if len(live) == 1:
                reject(live, functools.partial(_copy, exc))
            else:
                # the model refused the merged rows: serve each alone so only the one at fault fails
                for caller in live:
                    if not caller.future.done():
                        await self._run_batch(next(self._batch_ids), [caller])
        except ServerError as exc:
            self._log_failure(batch_id, len(live), exc)
            reject(live, functools.partial(_copy, exc))
        except asyncio.CancelledError:
            reject(live, lambda: ShuttingDown(f"Model {self.name!r} stopped while serving the request"))
            raise
        except Exception as exc:
            self._log_failure(batch_id, len(live), exc)
            reject(live, functools.partial(model_failed, self.name, exc))
        else:
            compute = time.monotonic() - start
            resolve(live, responses)
            queued = sum(start - caller.arrival for caller in live)
            items = sum(c.rows if isinstance(c, _Caller) else 1 for c in live)
            self.stats.executed(len(live), queued, compute, items)
        finally:
            abandon.close()
            # nothing may strand a caller, whatever went wrong above
            reject(live, lambda: ModelFailed(f"Model {self.name!r}: batch {batch_id} ended without a result"))

    async def _predict(
        self, batch_id: int, callers: list[Waiter[InferenceResponse]]
    ) -> list[InferenceResponse]:
        first = callers[0]
        if isinstance(first, _Caller) and first.alone:
            response = await self.executor.call_predict(first.request)
            if not isinstance(response, InferenceResponse):
                raise ModelFailed(
                    f"Model {self.name!r} returned a {type(response).__name__}, not an InferenceResponse"
                )
            own = response.parameters.model_dump(exclude_none=True) if response.parameters else {}
            response.parameters = Parameters(**{**own, "batch_id": batch_id, "batch_size": 1})
            return [response]
        rows = [c.rows if isinstance(c, _Caller) else 1 for c in callers]
        merged = merge([c.request for c in callers], rows, batch_id)
        response = await self.executor.call_predict(merged)
        extra = [{"batch_id": batch_id, "batch_size": len(callers)}] * len(callers)
        return split(response, rows, self.name, extra)

    def _log_failure(self, batch_id: int, size: int, exc: BaseException) -> None:
        logger.error(
            "Model %r failed on batch %d (%d requests): %s: %s",
            self.name,
            batch_id,
            size,
            type(exc).__name__,
            exc,
            exc_info=logger.isEnabledFor(logging.DEBUG),
        )


class _Abandon:
    """Cancels the running batch once every one of its callers has gone (cancelled, timed out, cut
    at shutdown): nobody waits for its result, and a hung model must not hold the scheduler."""

    __slots__ = ("callers", "open", "remaining", "task")

    def __init__(self, callers: Sequence[Waiter[InferenceResponse]]) -> None:
        self.task = asyncio.current_task()
        self.callers = callers
        self.remaining = len(callers)
        self.open = True
        for caller in callers:
            caller.future.add_done_callback(self._left)

    def _left(self, future: asyncio.Future[InferenceResponse]) -> None:
        self.remaining -= 1
        if self.remaining == 0 and self.open and self.task is not None:
            self.task.cancel()

    def close(self) -> None:
        self.open = False
        for caller in self.callers:
            caller.future.remove_done_callback(self._left)


def _wake_up(waker: asyncio.Future[None]) -> None:
    if not waker.done():
        waker.set_result(None)


def _copy(exc: ServerError) -> BaseException:
    """A copy of an error for each caller of a batch (one instance raised in many tasks would
    gather all of their tracebacks)."""
    try:
        twin = copy.copy(exc)
    except Exception:
        return exc
    twin.__cause__ = exc.__cause__
    return twin
