"""Continuous batching's waiting side: how a stream is admitted, waits to join, and leaves.

Part of the continuous batcher (``continuous_batching.ContinuousScheduler`` mixes it in; its
stepper calls ``_joiners`` for the streams that join at a step). A new stream is refused at once
when the batcher stops or is not started, its ``timeout`` is bad, or the bounded FIFO queue is full
(``max_queue_size``: 503); it fails with 503 when ``queue_timeout`` passes while it waits. With
``sequence_batching`` it is also admitted in its sequence (the sequence rules may refuse it, or end
its sequence while it waits), a sequence's requests join in order, and a START waits for the
streams of the sequence it replaces to leave. A caller that gives up on a stream (``leave``) drops
it from the queue, or marks it gone so that it leaves the running set before the next step; a
given-up request of a sequence cancels its sequence, and with it its other running streams.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from typing import TYPE_CHECKING, Any

from runtime.continuous import Stream
from runtime.errors import ModelNotReady, ShuttingDown
from runtime.ids import assign_id
from runtime.scheduling.callers import ERROR, Call, Entry
from runtime.scheduling.continuous_sequences import RunningSet
from runtime.scheduling.queueing import WaitQueue, queue_timeout
from runtime.sequences.identity import parse_control
from runtime.settings import ModelSettings
from runtime.streams.pipeline import StreamError
from runtime.types import InferenceRequest, InferenceResponse


class ContinuousAdmission:
    """The continuous batcher's admission, waiting queue and leaving; see the module docstring."""

    settings: ModelSettings
    sequences: RunningSet[Entry] | None
    _queue: WaitQueue
    _closing: bool
    _stepper: asyncio.Task[None] | None
    _orders: itertools.count[int]

    if TYPE_CHECKING:

        @property
        def name(self) -> str: ...

        def wake(self) -> None: ...

        def _fail(self, entry: Entry, error: BaseException) -> None: ...

    def admit(self, request: InferenceRequest, call: Call, collect: bool = False) -> Entry:
        """Queue a new stream (or raise at once: shutting down, bad timeout, queue full)."""
        if self._closing:
            raise ShuttingDown(f"Model {self.name!r} is unloading")
        if self._stepper is None:
            raise ModelNotReady(f"Model {self.name!r} is not started")
        timeout = queue_timeout(request, self.settings.queue_timeout)
        control = parse_control(request.parameters) if self.sequences is not None else None
        entry = Entry(
            request=request,
            key=control.key if control is not None else None,  # a sequence's requests join in order
            future=asyncio.get_running_loop().create_future(),
            stream=Stream(request, assign_id(request)),
            call=call,
            collect=collect,
            order=next(self._orders),
        )
        self._queue.put(entry, timeout)
        if control is not None:
            assert self.sequences is not None
            try:
                self.sequences.admit(entry, control)
            except BaseException:
                self._queue.discard(entry)
                raise
            assert entry.pending is not None
            entry.pending.future.add_done_callback(self._refused_by_sequence(entry))
        entry.future.add_done_callback(self._timed_out(entry))
        self.wake()
        return entry

    def _timed_out(self, entry: Entry) -> Any:
        def done(future: asyncio.Future[None]) -> None:
            if not future.cancelled() and future.exception() is not None:  # it timed out in the queue
                self._cancel_sequence(entry)
                self._fail(entry, future.exception())  # type: ignore[arg-type]

        return done

    def _refused_by_sequence(self, entry: Entry) -> Any:
        def done(future: asyncio.Future[InferenceResponse]) -> None:
            # the sequence ended (or was cancelled) while this request waited to join
            if not future.cancelled() and future.exception() is not None and not entry.future.done():
                self._queue.discard(entry)
                entry.future.cancel()
                self._fail(entry, future.exception())  # type: ignore[arg-type]

        return done

    def leave(self, entry: Entry) -> None:
        """The caller no longer wants this stream."""
        if entry.ended:
            return
        self._cancel_sequence(entry)
        if not entry.future.done():  # still waiting: it never runs
            entry.ended = True
            self._queue.discard(entry)
            entry.future.cancel()
            return
        entry.gone = True
        self.wake()

    def _cancel_sequence(self, entry: Entry) -> None:
        """A request of a sequence was given up on: the sequence is cancelled, and with it its other
        running streams, which end with ``Cancelled`` and leave before the next step."""
        if self.sequences is None or entry.pending is None:
            return
        for other in self.sequences.cancel(entry):
            if not other.ended and not other.gone:
                other.call.push(
                    (ERROR, other, StreamError(self.sequences.cancelled_error(other), other.stream.id))
                )
                other.gone = True
        self.wake()

    def _joiners(self, free: int) -> list[Entry]:
        """Up to ``free`` waiting streams that may join now, oldest first."""
        if self.sequences is None:
            return self._queue.take(None, free)  # type: ignore[return-value]
        heads = [(head.order, key) for key, head, _ in self._queue.heads()]  # type: ignore[attr-defined]
        heapq.heapify(heads)
        chosen: list[Entry] = []
        while heads and len(chosen) < free:
            _, key = heapq.heappop(heads)
            head = self._queue.head(key)
            assert isinstance(head, Entry)
            if head.pending is not None and not self.sequences.may_join(head):
                continue  # a START waits for the streams of the sequence it replaces to leave
            chosen += self._queue.take(key, 1)  # type: ignore[arg-type]
            following = self._queue.head(key)
            if following is not None:
                heapq.heappush(heads, (following.order, key))  # type: ignore[attr-defined]
        return chosen
