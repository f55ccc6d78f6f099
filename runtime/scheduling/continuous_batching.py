"""Continuous batching: streams join and leave a running batch at every step.

On when a model's settings have ``continuous_batching: true``; the model subclasses
:class:`runtime.ContinuousModel` (see that module for the model's side). How it behaves:

- **One running set** of at most ``max_batch_size`` streams (at least 1). One task, the stepper,
  makes every model call, one at a time: ``start_stream`` for the streams that join,
  ``step`` for the running ones, ``end_stream`` for those that left.
- **Joining.** A new stream waits in a bounded FIFO queue (``max_queue_size``: beyond it, 503 at
  once; ``queue_timeout`` or the request's OIP ``timeout`` parameter: 503 when it passes) and
  joins at the next step that has a free slot: when there is room, a stream that arrives during a
  step takes part in the very next one, and it never waits for a batch to fill. Admission, the
  waiting queue and leaving it are :mod:`.continuous_admission`'s; this module runs the steps.
- **Leaving.** A stream leaves the set after the step that finished it, failed it, or after its
  client went away: a stream whose caller closes or cancels its iteration (a client disconnect,
  a cancelled gRPC call) is dropped before the next step, and its slot is free for that step;
  a chunk the model produced for it meanwhile is discarded.
- **Isolation.** ``StepResult(error=...)`` ends one stream with that error and the others go on:
  the stream yields a ``StreamError`` for that request (in band on a gRPC call, raised by
  ``infer_stream``: an SSE ``event: error`` after its earlier chunks). If ``step`` itself raises,
  each stream of that step is run again alone, so that only those that fail alone end with the error.
- **Order and back-pressure.** Each caller gets its own chunks, in the order the model produced
  them. A stream whose reader has not taken ``BUFFERED`` of its chunks sits out the next
  steps (it keeps its slot) until the reader catches up, so a slow client never grows a buffer.
- **Observability.** Every chunk carries the response parameters ``batch_size`` (how many streams
  shared its step) and ``step_id`` (counting from 1 per loaded model). A unary request runs as a
  stream and is answered with its chunks combined (``ContinuousModel.combine``), carrying those
  of its last step.
- **Several requests on one stream** (a gRPC ``ModelStreamInfer`` call in MLServer's format) are
  read ahead and run concurrently, each as its own stream, their chunks interleaved and each
  tagged with its request's id. A call has at most ``READ_AHEAD`` of them running or waiting
  (``runtime.streams.window``; then gRPC's flow control holds the client back).
- **Stopping** refuses new streams (503), lets the running and waiting ones finish, then ends.
- **With ``sequence_batching``** a request of a sequence may join while an earlier one of the same
  sequence still streams; the sequence rules and state live in :mod:`runtime.sequences.engine`, with the strategy of
  :mod:`.continuous_sequences`.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import time
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from runtime.continuous import ContinuousModel, StepResult, Stream, StreamEnd
from runtime.errors import ModelFailed, ShuttingDown, model_failed
from runtime.model import MLModel
from runtime.scheduling.callers import CHUNK, END, ERROR, Call, Entry, serve_stream, stamp
from runtime.scheduling.continuous_admission import ContinuousAdmission
from runtime.scheduling.continuous_sequences import RunningSet
from runtime.scheduling.queueing import WaitQueue
from runtime.scheduling.scheduler import Scheduler
from runtime.settings import ModelSettings
from runtime.streams.pipeline import StreamError
from runtime.streams.window import BUFFERED
from runtime.telemetry.tracing import batch_span
from runtime.types import InferenceRequest, InferenceResponse

logger = logging.getLogger(__name__)


class ContinuousScheduler(ContinuousAdmission, Scheduler):
    """Streams advanced together, step by step; see the module's docstring."""

    def __init__(self, model: MLModel, settings: ModelSettings) -> None:
        super().__init__(model, settings)
        if not isinstance(model, ContinuousModel):
            raise TypeError(
                f"{type(model).__qualname__} is served with continuous_batching, so it must subclass "
                "runtime.ContinuousModel and implement step"
            )
        self.stepping: ContinuousModel = model
        self.max_streams = max(1, settings.max_batch_size)
        self._queue = WaitQueue(settings.max_queue_size, settings.name)
        self._running: dict[Entry, None] = {}
        self._wakeup = asyncio.Event()
        self._stepper: asyncio.Task[None] | None = None
        self._closing = False
        self._step_ids = itertools.count(1)
        self._async_step = inspect.iscoroutinefunction(model.step)
        self._executor: ThreadPoolExecutor | None = None
        self._orders = itertools.count()
        self.sequences: RunningSet[Entry] | None = (
            RunningSet(model, settings, self.wake) if settings.sequence_batching else None
        )
        """With ``sequence_batching``: the model's sequences (None without)."""
        self.steps = 0
        """Steps run so far."""
        self.largest_batch = 0
        """The most streams that shared one step so far."""

    @property
    def name(self) -> str:
        return self.settings.name

    @property
    def running(self) -> int:
        """Streams in the running set now."""
        return len(self._running)

    @property
    def queued(self) -> int:
        """Streams waiting to join now."""
        return len(self._queue)

    def describe(self) -> dict[str, Any]:
        described: dict[str, Any] = {
            "scheduler": "continuous",
            "max_batch_size": self.max_streams,
            "max_queue_size": self._queue.max_size,
            "queue_timeout": self.settings.queue_timeout,
            "stats": {
                "running_streams": len(self._running),
                "queued_streams": len(self._queue),
                "steps": self.steps,
                "largest_batch": self.largest_batch,
            },
        }
        if self.sequences is not None:
            described.update(self.sequences.describe())
        return described

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if not self._async_step:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"step-{self.name}")
        self._stepper = asyncio.create_task(self._run(), name=f"steps of {self.name}")
        self._stepper.add_done_callback(self._stepper_done)

    def _stepper_done(self, task: asyncio.Task[None]) -> None:
        if self._closing:
            return
        self._closing = True  # refuse work rather than queue it forever
        if not task.cancelled():  # it ended by itself: a bug (cancelled: the event loop is closing)
            logger.error(
                "Continuous batching of model %r stopped unexpectedly: %r", self.name, task.exception()
            )

    async def stop(self) -> None:
        """Take no new streams; let the running and waiting ones finish, then end."""
        self._closing = True
        self.wake()
        if self._stepper is not None:
            await asyncio.gather(self._stepper, return_exceptions=True)
        if self.sequences is not None:
            await self.sequences.stop()
        if self._executor is not None:
            await asyncio.to_thread(self._executor.shutdown, wait=True)

    def wake(self) -> None:
        self._wakeup.set()

    async def hand_over(self) -> None:
        if self.sequences is not None:
            await self.sequences.engine.hand_over()

    # ------------------------------------------------------------------ callers

    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        """A unary request runs as a stream; its answer is its chunks combined by the model."""
        call = Call()
        entry = self.admit(request, call, collect=True)
        try:
            while True:  # a call that reads no requests never ends: its stream answers or fails
                kind, _, payload = await anext(call)
                if kind == CHUNK:
                    assert isinstance(payload, InferenceResponse)
                    return payload
                if kind == ERROR:
                    raise payload.error
        finally:
            self.leave(entry)
            call.items.clear()

    def stream(
        self, requests: AsyncIterator[InferenceRequest]
    ) -> AsyncIterator[InferenceResponse | StreamError]:
        return serve_stream(self, requests)

    # ------------------------------------------------------------------ the stepper

    async def _run(self) -> None:
        try:
            while True:
                self._wakeup.clear()
                if self.sequences is not None:
                    await self.sequences.deliver_notices()
                await self._drop_gone()
                await self._join()
                active = [e for e in self._running if not e.gone and e.unread < BUFFERED]
                if active:
                    await self._step(active)
                    # a turn for the event loop after every step, even when the model's step never
                    # awaits: readers take their chunks, new streams arrive, disconnects are seen
                    await asyncio.sleep(0)
                    continue
                if self._closing and not self._running and not len(self._queue):
                    return
                await self._wakeup.wait()
        finally:
            # only reached with streams left when this task itself is cancelled or broken
            for waiter in self._queue.drain():
                waiter.future.cancel()
                if isinstance(waiter, Entry):
                    self._fail(waiter, ShuttingDown(f"Model {self.name!r} stopped serving streams"))
            cut = list(self._running)
            for entry in cut:
                self._fail(entry, ShuttingDown(f"Model {self.name!r} stopped while serving the stream"))
            self._running.clear()
            for entry in cut:  # best effort: the task is being torn down
                if entry.started:
                    entry.started = False
                    try:
                        await self.stepping.end_stream(entry.stream, "unload")
                    except BaseException:
                        logger.debug(
                            "end_stream of a cut stream of model %r failed", self.name, exc_info=True
                        )

    async def _drop_gone(self) -> None:
        for entry in [e for e in self._running if e.gone]:
            del self._running[entry]
            entry.ended = True
            await self._left(entry, "cancelled")

    async def _join(self) -> None:
        free = self.max_streams - len(self._running)
        if free <= 0 or not len(self._queue):
            return
        joining = self._joiners(free)
        for entry in joining:  # all at once: a caller that leaves while the others start finds it running
            entry.future.set_result(None)
            self._running[entry] = None
        for entry in joining:
            if entry.gone:
                continue  # it left while those before it started: dropped before the next step
            try:
                if self.sequences is not None and entry.pending is not None:
                    await self.sequences.join(entry)
                await self.stepping.start_stream(entry.stream)
            except Exception as exc:
                self._fail(entry, exc)
                await self._left(entry, "failed")
                continue
            entry.started = True

    async def _call_step(self, streams: list[Stream]) -> Sequence[StepResult]:
        if self._async_step:
            return await self.stepping.step(streams)  # type: ignore[misc,no-any-return]
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self.stepping.step, streams)

    async def _step(self, active: list[Entry]) -> None:
        size = len(active)
        step_id = next(self._step_ids)
        streams = [entry.stream for entry in active]
        start = time.monotonic()
        try:
            with batch_span(self.name, step_id, active, _waited):
                results = list(await self._call_step(streams))
            if len(results) != size:
                raise ModelFailed(
                    f"Model {self.name!r} returned {len(results)} step results for {size} streams"
                )
        except Exception as exc:
            if size == 1:
                results = [StepResult(error=exc)]
            else:
                logger.warning(
                    "Model %r failed a step of %d streams (%s: %s); running each of them alone",
                    self.name,
                    size,
                    type(exc).__name__,
                    exc,
                )
                for entry in active:
                    if entry in self._running and not entry.gone:
                        await self._step([entry])
                return
        compute = time.monotonic() - start
        self.steps += 1
        self.largest_batch = max(self.largest_batch, size)
        # with a shared sequence store, the states are written before the chunks go out
        lost = await self.sequences.stepped(active) if self.sequences is not None else {}
        served, queued = 0, 0.0
        leaving: list[tuple[Entry, StreamEnd]] = []
        for entry, result in zip(active, results, strict=True):
            first = entry.stream.steps == 0
            entry.stream.steps += 1
            if entry.gone or entry.ended:
                continue  # its caller went away during the step
            entry.last = (size, step_id)
            if not isinstance(result, StepResult):
                result = StepResult(
                    error=ModelFailed(
                        f"Model {self.name!r} returned a {type(result).__name__} from step, not a StepResult"
                    )
                )
            if lost and entry.pending is not None and entry.pending.sequence in lost:
                result = StepResult(error=lost[entry.pending.sequence])
            if result.error is not None:
                self._fail(entry, result.error)
                leaving.append((entry, "failed"))
                continue
            if result.response is not None:
                if not self._deliver(entry, result.response, result.finished):
                    leaving.append((entry, "failed"))
                    continue
            served += 1
            if first:
                queued += start - entry.arrival
            if result.finished:
                self._finish(entry)
                leaving.append((entry, "finished"))
        if served:  # the streams the step failed count as failures alone
            self.stats.executed(served, queued, compute)
        for entry, reason in leaving:
            await self._left(entry, reason)

    def _deliver(self, entry: Entry, response: InferenceResponse, last: bool) -> bool:
        if not isinstance(response, InferenceResponse):
            self._fail(
                entry,
                ModelFailed(
                    f"Model {self.name!r} returned a {type(response).__name__} as a chunk, not an InferenceResponse"
                ),
            )
            return False
        stamp(response, entry, last)
        if entry.collect:
            entry.chunks.append(response)
        else:
            entry.unread += 1
            entry.call.push((CHUNK, entry, response))
        return True

    def _finish(self, entry: Entry) -> None:
        """The stream's last chunk was delivered: it leaves, and its caller is told."""
        self._running.pop(entry, None)
        if entry.collect:
            try:
                answer = self.stepping.combine(entry.stream, entry.chunks)
                if not isinstance(answer, InferenceResponse):
                    raise ModelFailed(
                        f"Model {self.name!r} combined chunks into a {type(answer).__name__}, not an InferenceResponse"
                    )
            except Exception as exc:
                self._fail(entry, exc)
                return
            stamp(answer, entry, last=True)
            entry.call.push((CHUNK, entry, answer))
        entry.ended = True
        entry.call.push((END, entry, None))

    def _fail(self, entry: Entry, error: BaseException) -> None:
        self._running.pop(entry, None)
        if entry.ended:
            return
        entry.ended = True
        if not isinstance(error, Exception):
            error = model_failed(self.name, error)
        entry.call.push((ERROR, entry, StreamError(error, entry.stream.id)))

    async def _left(self, entry: Entry, reason: StreamEnd) -> None:
        """A stream left the running set: the model is told (if it started), then its sequence."""
        if entry.started:
            entry.started = False
            try:
                await self.stepping.end_stream(entry.stream, reason)
            except Exception:
                logger.exception("Model %r failed in end_stream (%s)", self.name, reason)
        if self.sequences is not None:
            await self.sequences.left(entry, finished=reason == "finished")


def _waited(entry: Entry) -> float | None:
    """When a stream began to wait, for its first step only (it waits no more once running)."""
    return entry.arrival if entry.stream.steps == 0 else None
