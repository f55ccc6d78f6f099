"""Continuous batching's waiting side (``runtime.scheduling.continuous_admission``): refusals at
admission, the bounded queue and its timeout, a stream whose caller leaves while it waits, and the
id a stream is named by."""

from __future__ import annotations

import uuid

import pytest

from runtime.errors import InvalidInput, Overloaded, QueueTimeout
from runtime.types import InferenceRequest, Parameters
from tests.conftest import InProcess
from tests.continuous_helpers import Client, loaded, request, ticker_settings, ticks, turns_until

pytestmark = pytest.mark.anyio


async def test_a_stream_that_leaves_while_it_waits_never_runs(inprocess: InProcess) -> None:
    model, scheduler = await loaded(inprocess, ticker_settings(max_batch_size=1))
    model.hold()
    running = Client(inprocess.dataplane, "running", length=2)
    await model.wait_stepping()
    waiting = Client(inprocess.dataplane, "waiting", length=2)
    await turns_until(lambda: scheduler.queued == 1)
    waiting.task.cancel()
    await waiting.done.wait()
    assert scheduler.queued == 0
    model.release()
    await running.finished()
    assert all("waiting" not in batch for batch in model.batches)
    assert "waiting" not in model.started


async def test_a_request_without_an_id_is_named_by_assign_id(inprocess: InProcess) -> None:
    """The batcher names a stream by the id ``assign_id`` gives the request, the one place request
    ids are made: the model's stream, the request and the answer carry the same id."""
    model, _ = await loaded(inprocess, ticker_settings())
    unnamed = InferenceRequest(inputs=[], parameters=Parameters(length=2))
    response = await inprocess.dataplane.infer(unnamed, "ticker")
    assert unnamed.id is not None and uuid.UUID(unnamed.id).version == 4
    assert response.id == unnamed.id
    assert [unnamed.id] in model.batches


async def test_refusals_and_back_pressure(inprocess: InProcess) -> None:
    model, scheduler = await loaded(inprocess, ticker_settings(max_batch_size=1, max_queue_size=1))
    with pytest.raises(InvalidInput, match="refused as asked"):
        await inprocess.dataplane.infer(request("r", refuse=1), "ticker")
    refused = await Client(inprocess.dataplane, "refused", refuse=1).finished()
    assert isinstance(refused.error, InvalidInput) and not refused.chunks
    model.hold()
    running = Client(inprocess.dataplane, "running", length=2)
    await model.wait_stepping()
    queued = Client(inprocess.dataplane, "queued", length=1)
    await turns_until(lambda: scheduler.queued == 1)
    full = await Client(inprocess.dataplane, "full").finished()
    assert isinstance(full.error, Overloaded) and "max_queue_size" in str(full.error)
    queued.task.cancel()
    await queued.done.wait()
    late = await Client(inprocess.dataplane, "late", timeout=20_000).finished()  # 20 ms in the queue
    assert isinstance(late.error, QueueTimeout)
    model.release()
    await running.finished()
    assert running.error is None and ticks(running.chunks) == [1, 2]
    # refused in start_stream: never started, so no end_stream; the one cancelled in the queue never ran
    assert model.ended == [("running", "finished")] and model.started == ["running"]
