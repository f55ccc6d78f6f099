"""Callers waiting for a model: each owns a future, in a bounded queue of FIFO groups.

The machinery every queueing strategy shares (adaptive batching groups requests by shape,
sequence batching by sequence id):

- a :class:`Waiter` is one caller: its request, the future its response arrives on (or, for
  continuous batching, the future that says its stream has joined the running set), when it
  arrived (``time.monotonic()``) and the group it waits in;
- a :class:`WaitQueue` holds waiters in FIFO groups, bounded in total (``max_queue_size``: a
  caller beyond it gets :class:`~runtime.errors.Overloaded` at once) and expires those that wait
  longer than their queue timeout (:class:`~runtime.errors.QueueTimeout`);
- :func:`wait_for_response` is how a caller waits: if it is cancelled while still queued, it
  leaves the queue at once; if its batch already runs, the batch goes on for the others and
  its own result is dropped (its future is cancelled, and results are only set on futures
  that are not done: :func:`resolve`, :func:`reject`).

Nothing here knows about batches or models: a strategy takes waiters out of the queue with
:meth:`WaitQueue.take` and settles their futures.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from runtime.errors import InvalidInput, Overloaded, QueueTimeout
from runtime.types import InferenceRequest, InferenceResponse, extras

# Triton's request parameter bounding the wait in the queue, in microseconds
TIMEOUT_PARAMETER = "timeout"

R = TypeVar("R")


@dataclass(eq=False)
class Waiter(Generic[R]):
    """One caller waiting in a queue (compared by identity)."""

    request: InferenceRequest
    key: Hashable
    """The group this caller waits in (requests of one group may be served together)."""
    future: asyncio.Future[R]
    arrival: float = field(default_factory=time.monotonic)
    context: contextvars.Context = field(default_factory=contextvars.copy_context, repr=False)
    """The caller's context (its trace span, for the batch's spans)."""
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)


def queue_timeout(request: InferenceRequest, default: float) -> float | None:
    """Seconds ``request`` may wait in the queue: the model's default, shortened by the request's
    own ``timeout`` parameter (uint64 microseconds; 0 means none); None for no limit."""
    limit = default if default > 0 else None
    params = request.parameters
    if params is None:
        return limit
    extra = extras(params)
    if not extra or TIMEOUT_PARAMETER not in extra:
        return limit
    value = extra[TIMEOUT_PARAMETER]
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    elif isinstance(value, float) and value.is_integer():
        value = int(value)  # a client that sends numbers as doubles (gRPC double_param)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInput(
            f"Request parameter 'timeout' must be a non-negative integer of microseconds, got {value!r}"
        )
    if value == 0:
        return limit
    own = value / 1_000_000
    return own if limit is None else min(own, limit)


class WaitQueue:
    """Waiters in FIFO groups by key, at most ``max_size`` in all.

    Groups are insertion-ordered dicts, so a waiter that leaves (cancelled, expired) is removed
    in O(1) and the count used for back-pressure is always exact.
    """

    def __init__(self, max_size: int, model: str) -> None:
        self.max_size = max_size
        self.model = model
        self._groups: dict[Hashable, dict[Waiter[Any], None]] = {}
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def group_size(self, key: Hashable) -> int:
        group = self._groups.get(key)
        return len(group) if group else 0

    def put(self, waiter: Waiter[Any], timeout: float | None = None) -> int:
        """Queue a waiter (expiring after ``timeout`` seconds); return its group's new size."""
        if self._size >= self.max_size:
            raise Overloaded(
                f"Model {self.model!r} has {self._size} requests queued, its max_queue_size; try again later"
            )
        group = self._groups.get(waiter.key)
        if group is None:
            group = self._groups[waiter.key] = {}
        group[waiter] = None
        self._size += 1
        if timeout is not None:
            delay = max(0.0, waiter.arrival + timeout - time.monotonic())
            waiter.timer = asyncio.get_running_loop().call_later(delay, self._expire, waiter, timeout)
        return len(group)

    def discard(self, waiter: Waiter[Any]) -> bool:
        """Take a waiter out of the queue; False if it was not queued (taken or gone already)."""
        group = self._groups.get(waiter.key)
        if group is None or waiter not in group:
            return False
        del group[waiter]
        if not group:
            del self._groups[waiter.key]
        self._size -= 1
        _cancel_timer(waiter)
        return True

    def heads(self) -> Iterator[tuple[Hashable, Waiter[Any], int]]:
        """Each group's key, oldest waiter and size, in the order the groups appeared."""
        for key, group in self._groups.items():
            yield key, next(iter(group)), len(group)

    def head(self, key: Hashable) -> Waiter[Any] | None:
        """The oldest waiter of a group (None when the group is empty)."""
        group = self._groups.get(key)
        return next(iter(group)) if group else None

    def take(self, key: Hashable, limit: int) -> list[Waiter[Any]]:
        """Remove and return up to ``limit`` of the oldest waiters of a group (dropping any whose
        future is already done: a caller that went away)."""
        group = self._groups.get(key)
        taken: list[Waiter[Any]] = []
        while group and len(taken) < limit:
            waiter = next(iter(group))
            del group[waiter]
            self._size -= 1
            _cancel_timer(waiter)
            if not waiter.future.done():
                taken.append(waiter)
        if group is not None and not group:
            del self._groups[key]
        return taken

    def drain(self) -> list[Waiter[Any]]:
        """Remove and return every waiter."""
        waiters = [w for group in self._groups.values() for w in group]
        for waiter in waiters:
            _cancel_timer(waiter)
        self._groups.clear()
        self._size = 0
        return waiters

    def _expire(self, waiter: Waiter[Any], timeout: float) -> None:
        waiter.timer = None
        if self.discard(waiter) and not waiter.future.done():
            waited = time.monotonic() - waiter.arrival
            waiter.future.set_exception(
                QueueTimeout(
                    f"The request waited {waited:.3f}s in the queue of model {self.model!r}, "
                    f"longer than its timeout of {timeout:g}s"
                )
            )


def _cancel_timer(waiter: Waiter[Any]) -> None:
    if waiter.timer is not None:
        waiter.timer.cancel()
        waiter.timer = None


async def wait_for_response(queue: WaitQueue, waiter: Waiter[InferenceResponse]) -> InferenceResponse:
    """Wait for a queued caller's response. Cancelling the caller cancels its future (so no batch
    will set it) and takes it out of the queue if it is still there."""
    try:
        return await waiter.future
    except asyncio.CancelledError:
        queue.discard(waiter)
        raise


def resolve(waiters: Iterable[Waiter[InferenceResponse]], responses: Sequence[InferenceResponse]) -> None:
    """Give each waiter its response, unless its caller went away (its future is done)."""
    for waiter, response in zip(waiters, responses, strict=True):
        if not waiter.future.done():
            waiter.future.set_result(response)


def reject(waiters: Iterable[Waiter[Any]], error: Callable[[], BaseException]) -> None:
    """Fail every waiter whose future is not done yet, each with its own exception from ``error``
    (one instance raised in many tasks would gather all their tracebacks)."""
    for waiter in waiters:
        if not waiter.future.done():
            waiter.future.set_exception(error())
