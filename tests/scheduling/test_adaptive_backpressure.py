"""Adaptive batching: a bounded queue per model, and a bounded wait in it."""

from __future__ import annotations

import asyncio

import pytest

from runtime.errors import QueueTimeout
from tests.adaptive_helpers import (
    body,
    infer_task,
    model_of,
    output,
    params,
    post,
    row_settings,
    scheduler_of,
    until,
)
from tests.conftest import InProcess

pytestmark = pytest.mark.anyio


async def test_a_full_queue_answers_503_at_once_and_recovers(inprocess: InProcess) -> None:
    await inprocess.load(row_settings(max_batch_size=2, max_queue_size=2))
    model, scheduler = model_of(inprocess), scheduler_of(inprocess)
    model.hold()
    running = [infer_task(inprocess.dataplane, body([[0, i]])) for i in range(2)]
    await model.entered.wait()  # the first batch occupies the only running slot
    queued = [infer_task(inprocess.dataplane, body([[1, i]])) for i in range(2)]
    await until(lambda: scheduler.queued == 2)
    async with inprocess.client() as client:
        refused = await post(client, body([[2, 2]]))
        assert refused.status_code == 503
        assert refused.json() == {
            "error": "Model 'rows' has 2 requests queued, its max_queue_size; try again later"
        }
        model.release()
        await asyncio.gather(*running, *queued)
        accepted = await asyncio.gather(post(client, body([[3, 3]])), post(client, body([[4, 4]])))
    assert [output(r, "y")["data"] for r in accepted] == [[3, 3], [4, 4]]


async def test_the_timeout_parameter_bounds_the_wait_in_the_queue(inprocess: InProcess) -> None:
    """Guards: a request that timed out in the queue must leave it (not be served later, nor
    count toward the batch it would have joined)."""
    await inprocess.load(row_settings(max_batch_size=2))
    model, scheduler = model_of(inprocess), scheduler_of(inprocess)
    model.hold()
    running = [infer_task(inprocess.dataplane, body([[0, i]])) for i in range(2)]
    await model.entered.wait()
    async with inprocess.client() as client:
        # 20 ms (Triton: uint64 microseconds); the running batch is held, so it cannot be served
        late = await post(client, body([[1, 1]], parameters={"timeout": 20_000}))
        assert late.status_code == 503
        assert "longer than its timeout of 0.02s" in late.json()["error"]
        assert scheduler.queued == 0
        model.release()
        await asyncio.gather(*running)
        # a generous timeout does not stop a request from being served
        served = await asyncio.gather(
            post(client, body([[2, 2]], parameters={"timeout": 60_000_000})), post(client, body([[3, 3]]))
        )
    assert [params(r)["batch_size"] for r in served] == [2, 2]
    assert model.batch_rows == [2, 2]


async def test_the_model_default_queue_timeout_applies_and_a_request_may_shorten_it(
    inprocess: InProcess,
) -> None:
    await inprocess.load(row_settings(max_batch_size=2, queue_timeout=0.03))
    model = model_of(inprocess)
    model.hold()
    running = [infer_task(inprocess.dataplane, body([[0, i]])) for i in range(2)]
    await model.entered.wait()
    default = infer_task(inprocess.dataplane, body([[1, 1]]))
    longer = infer_task(inprocess.dataplane, body([[1, 2]], parameters={"timeout": 60_000_000}))
    for caller in (default, longer):
        with pytest.raises(QueueTimeout, match=r"timeout of 0\.03s"):
            await caller
    model.release()
    await asyncio.gather(*running)


@pytest.mark.parametrize("timeout", [-1, 1.5, "soon", True])
async def test_a_malformed_timeout_parameter_is_a_400(inprocess: InProcess, timeout: object) -> None:
    await inprocess.load(row_settings(max_batch_size=2))
    async with inprocess.client() as client:
        response = await post(client, body([[1, 1]], parameters={"timeout": timeout}))
    assert response.status_code == 400
    assert "timeout" in response.json()["error"]
    assert scheduler_of(inprocess).queued == 0
