"""Callers waiting for a model (``runtime.scheduling.queueing``): bounded FIFO groups, queue
timeouts, and leaving the queue when cancelled."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from typing import Any

import pytest

from runtime.errors import InvalidInput, ModelFailed, Overloaded, QueueTimeout
from runtime.scheduling.queueing import (
    Waiter,
    WaitQueue,
    queue_timeout,
    reject,
    resolve,
    wait_for_response,
)
from runtime.types import InferenceRequest, InferenceResponse

pytestmark = pytest.mark.anyio


def _request(**parameters: Any) -> InferenceRequest:
    return InferenceRequest.model_validate({"inputs": [], "parameters": parameters or None})


def _waiter(key: Hashable = "k") -> Waiter[InferenceResponse]:
    return Waiter(request=_request(), key=key, future=asyncio.get_running_loop().create_future())


def test_queue_timeout_is_the_shorter_of_the_model_default_and_the_request_parameter() -> None:
    assert queue_timeout(_request(), 0) is None
    assert queue_timeout(_request(), 2.0) == 2.0
    assert queue_timeout(_request(timeout=500_000), 2.0) == 0.5
    assert queue_timeout(_request(timeout=5_000_000), 2.0) == 2.0
    assert queue_timeout(_request(timeout="250000"), 0) == 0.25  # a string of digits
    assert queue_timeout(_request(timeout=1e6), 0) == 1.0  # a whole double (gRPC double_param)
    assert queue_timeout(_request(timeout=0), 3.0) == 3.0  # 0: no limit of its own


@pytest.mark.parametrize("value", [-1, 1.5, True, "soon"])
def test_a_malformed_timeout_parameter_is_refused(value: object) -> None:
    with pytest.raises(InvalidInput, match="must be a non-negative integer of microseconds"):
        queue_timeout(_request(timeout=value), 1.0)


async def test_groups_are_fifo_and_the_queue_is_bounded_in_total() -> None:
    queue = WaitQueue(max_size=3, model="m")
    a1, b1, a2 = _waiter("a"), _waiter("b"), _waiter("a")
    assert [queue.put(w) for w in (a1, b1, a2)] == [1, 1, 2]
    with pytest.raises(Overloaded, match="has 3 requests queued"):
        queue.put(_waiter("c"))
    assert [(key, head, size) for key, head, size in queue.heads()] == [("a", a1, 2), ("b", b1, 1)]
    assert queue.take("a", 5) == [a1, a2] and queue.group_size("a") == 0 and queue.head("a") is None
    assert len(queue) == 1 and queue.drain() == [b1] and len(queue) == 0


async def test_take_drops_callers_that_went_away_and_discard_is_exact() -> None:
    queue = WaitQueue(max_size=10, model="m")
    gone, kept, later = _waiter(), _waiter(), _waiter()
    for waiter in (gone, kept, later):
        queue.put(waiter)
    gone.future.cancel()
    assert queue.take("k", 1) == [kept]  # the cancelled one is dropped and does not count
    assert queue.discard(later) and not queue.discard(later)
    assert len(queue) == 0


async def test_a_waiter_past_its_queue_timeout_fails_and_leaves_the_queue() -> None:
    queue = WaitQueue(max_size=10, model="m")
    waiter = _waiter()
    queue.put(waiter, timeout=0.01)
    with pytest.raises(QueueTimeout, match=r"longer than its timeout of 0\.01s"):
        await asyncio.wait_for(waiter.future, 5)
    assert len(queue) == 0


async def test_a_cancelled_caller_leaves_the_queue() -> None:
    queue = WaitQueue(max_size=10, model="m")
    waiter = _waiter()
    queue.put(waiter)
    task = asyncio.create_task(wait_for_response(queue, waiter))
    await asyncio.sleep(0)  # let it start waiting
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(queue) == 0 and waiter.future.cancelled()


async def test_resolve_and_reject_skip_futures_that_are_done() -> None:
    done, open_ = _waiter(), _waiter()
    done.future.cancel()
    response = InferenceResponse(model_name="m")
    resolve([done, open_], [response, response])
    assert open_.future.result() is response
    first, second = _waiter(), _waiter()
    reject([first, second], lambda: ModelFailed("boom"))
    errors = [first.future.exception(), second.future.exception()]
    assert all(isinstance(e, ModelFailed) for e in errors) and errors[0] is not errors[1]
