"""Adaptive batching: one caller's bad input, cancellation or failure never reaches the others."""

from __future__ import annotations

import asyncio

import pytest

from runtime.errors import ModelFailed
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


async def test_a_bad_request_fails_alone_and_the_good_ones_batch(inprocess: InProcess) -> None:
    await inprocess.load(row_settings(max_batch_size=3))
    bad = body([[1, 2]])
    bad["inputs"][0]["shape"] = [1, 3]  # three elements promised, two sent
    docs = [body([[0, 0]], id="g0"), bad, body([[1, 1]], id="g1"), body([["x", 1]]), body([[2, 2]], id="g2")]
    async with inprocess.client() as client:
        responses = await asyncio.gather(*(post(client, doc) for doc in docs))
    for response in (responses[1], responses[3]):
        assert response.status_code == 400
        assert "error" in response.json()
    good = [responses[0], responses[2], responses[4]]
    assert [r.json()["id"] for r in good] == ["g0", "g1", "g2"]
    assert [output(r, "y")["data"] for r in good] == [[0, 0], [1, 1], [2, 2]]
    assert {params(r)["batch_size"] for r in good} == {3}
    assert model_of(inprocess).batch_rows == [3]  # nothing of the bad ones reached the model


async def test_a_request_the_model_refuses_fails_alone(inprocess: InProcess) -> None:
    """Guards: the model raises InvalidInput for a merged batch because of one caller's values;
    failing the whole batch with 400 would blame the innocent callers."""
    await inprocess.load(row_settings(max_batch_size=3, extra={"refuse_over": 100}))
    docs = [body([[1, 1]]), body([[500, 1]]), body([[2, 2]])]
    async with inprocess.client() as client:
        first, refused, last = await asyncio.gather(*(post(client, doc) for doc in docs))
    assert refused.status_code == 400
    assert refused.json() == {"error": "values must be at most 100"}
    assert output(first, "y")["data"] == [1, 1] and output(last, "y")["data"] == [2, 2]
    # each was served again alone, in a batch of its own
    assert params(first)["batch_size"] == params(last)["batch_size"] == 1
    assert params(first)["batch_id"] != params(last)["batch_id"]


async def test_a_model_that_raises_fails_its_batch_with_500_and_the_next_batch_runs(
    inprocess: InProcess,
) -> None:
    await inprocess.load(row_settings(max_batch_size=2, extra={"fail_on": -1}))
    async with inprocess.client() as client:
        failed = await asyncio.gather(post(client, body([[-1, 0]])), post(client, body([[5, 5]])))
        for response in failed:
            assert response.status_code == 500
            assert response.json() == {"error": "Model 'rows' failed: RuntimeError: cannot handle -1"}
        fine = await asyncio.gather(
            post(client, body([[3, 3]], id="a")), post(client, body([[4, 4]], id="b"))
        )
        assert [output(r, "y")["data"] for r in fine] == [[3, 3], [4, 4]]
        assert [params(r)["batch_id"] for r in fine] == [2, 2]
        assert (await client.get("/v2/health/ready")).status_code == 200


async def test_a_model_that_returns_the_wrong_number_of_rows_fails_with_500(inprocess: InProcess) -> None:
    await inprocess.load(row_settings(max_batch_size=2, extra={"drop_row": True}))
    async with inprocess.client() as client:
        responses = await asyncio.gather(post(client, body([[1, 1]])), post(client, body([[2, 2], [3, 3]])))
    for response in responses:
        assert response.status_code == 500
        message = response.json()["error"]
        assert "output 'y' of shape [2, 2] for a batch of 3 rows from 2 requests" in message
        assert "must return 3 rows" in message


async def test_a_caller_cancelled_while_its_batch_forms_leaves_it(inprocess: InProcess) -> None:
    """Guards: a cancelled caller left in the queue would still count toward max_batch_size and
    max_queue_size, send its rows to the model, and have a result set on its cancelled future."""
    await inprocess.load(row_settings(max_batch_size=3))
    scheduler = scheduler_of(inprocess)
    a = infer_task(inprocess.dataplane, body([[1, 1]], id="a"))
    b = infer_task(inprocess.dataplane, body([[2, 2]], id="b"))
    await until(lambda: scheduler.queued == 2)
    a.cancel()
    await until(lambda: scheduler.queued == 1)
    c = infer_task(inprocess.dataplane, body([[3, 3]], id="c"))
    d = infer_task(inprocess.dataplane, body([[4, 4]], id="d"))
    responses = await asyncio.gather(b, c, d)
    with pytest.raises(asyncio.CancelledError):
        await a
    assert [r.id for r in responses] == ["b", "c", "d"]
    assert [r.outputs[0].data.reshape(-1).tolist() for r in responses] == [[2, 2], [3, 3], [4, 4]]
    assert model_of(inprocess).batch_rows == [3]  # a's rows never reached the model


async def test_a_caller_cancelled_while_its_batch_runs_does_not_fail_the_others(inprocess: InProcess) -> None:
    """Guards MLServer's adaptive batcher bug: setting a result on the future of a caller that
    was cancelled mid-batch raised InvalidStateError and stranded every other caller."""
    await inprocess.load(row_settings(max_batch_size=3))
    model = model_of(inprocess)
    model.hold()
    callers = [infer_task(inprocess.dataplane, body([[i, i]], id=str(i))) for i in range(3)]
    await model.entered.wait()
    callers[1].cancel()
    await until(lambda: callers[1].done())
    model.release()
    first, last = await asyncio.gather(callers[0], callers[2])
    assert callers[1].cancelled()
    assert (first.id, last.id) == ("0", "2")
    assert last.outputs[0].data.reshape(-1).tolist() == [2, 2]
    assert last.parameters is not None and (last.parameters.model_extra or {})["batch_size"] == 3
    # and the model serves the next batch as usual
    more = await asyncio.gather(*(infer_task(inprocess.dataplane, body([[9, i]])) for i in range(3)))
    assert [r.outputs[0].data.reshape(-1).tolist() for r in more] == [[9, 0], [9, 1], [9, 2]]


async def test_callers_all_cancelled_before_their_batch_runs_skip_the_model(inprocess: InProcess) -> None:
    """Guards: a batch whose callers all went away while it waited for a running slot must not
    call the model, nor stall the batches behind it."""
    await inprocess.load(row_settings(max_batch_size=2, max_concurrent_batches=1))
    model = model_of(inprocess)
    scheduler = scheduler_of(inprocess)
    model.hold()
    running = [infer_task(inprocess.dataplane, body([[0, i]])) for i in range(2)]
    await model.entered.wait()
    gone = [infer_task(inprocess.dataplane, body([[1, i]])) for i in range(2)]
    await until(lambda: scheduler.queued == 2)
    for caller in gone:
        caller.cancel()
    await until(lambda: scheduler.queued == 0)
    later = [infer_task(inprocess.dataplane, body([[2, i]])) for i in range(2)]
    model.release()
    await asyncio.gather(*running, *later)
    assert all(caller.cancelled() for caller in gone)
    assert model.batch_rows == [2, 2]
    assert [b.inputs[0].data[:, 0].tolist() for b in model.batches] == [[0, 0], [2, 2]]


async def test_a_batch_failure_reaches_every_caller_as_its_own_error(inprocess: InProcess) -> None:
    await inprocess.load(row_settings(max_batch_size=3, extra={"fail_on": 7}))
    callers = [infer_task(inprocess.dataplane, body([[7, i]])) for i in range(3)]
    errors = await asyncio.gather(*callers, return_exceptions=True)
    assert all(isinstance(e, ModelFailed) for e in errors)
    assert len({id(e) for e in errors}) == 3
    assert all(isinstance(e, BaseException) and isinstance(e.__cause__, RuntimeError) for e in errors)
