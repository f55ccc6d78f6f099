"""Continuous batching in process: joining, leaving, isolation, the bound, back-pressure, unary requests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import anyio
import pytest

from runtime.errors import ModelFailed, ShuttingDown
from runtime.settings import ModelSettings
from runtime.streams.pipeline import StreamError
from runtime.streams.window import BUFFERED
from runtime.types import InferenceRequest
from tests.conftest import InProcess
from tests.continuous_helpers import Client, extra, loaded, one, request, ticker_settings, ticks, turns_until

pytestmark = pytest.mark.anyio


async def test_a_short_stream_started_during_a_long_one_finishes_first(inprocess: InProcess) -> None:
    model, _ = await loaded(inprocess, ticker_settings())
    long = Client(inprocess.dataplane, "long", length=50)
    await turns_until(lambda: len(long.chunks) >= 1)
    short = await Client(inprocess.dataplane, "short", length=3).finished()
    assert ticks(short.chunks) == [1, 2, 3] and short.error is None
    assert not long.done.is_set() and len(long.chunks) < 10
    await long.finished()
    assert ticks(long.chunks) == list(range(1, 51))
    # the short one ran in steps the long one shared
    assert all(extra(chunk)["batch_size"] == 2 for chunk in short.chunks)
    assert ("short", "finished") in model.ended and ("long", "finished") in model.ended


async def test_a_joiner_waits_at_most_one_step(inprocess: InProcess) -> None:
    """Race: a stream that arrives while a step is under way must take part in the very next step,
    not wait for the running streams to finish nor for a batch to fill."""
    model, scheduler = await loaded(inprocess, ticker_settings())
    model.hold()
    first = Client(inprocess.dataplane, "first", length=5)
    await model.wait_stepping()  # step 1, [first], is under way
    assert model.batches == [["first"]]
    joiner = Client(inprocess.dataplane, "joiner", length=2)
    await turns_until(lambda: scheduler.queued == 1)
    model.advance()  # step 1 ends
    await model.wait_stepping()
    assert model.batches[-1] == ["first", "joiner"]  # step 2 has the joiner
    model.release()
    await joiner.finished()
    await first.finished()
    assert [(extra(c)["step_id"], extra(c)["batch_size"]) for c in joiner.chunks] == [(2, 2), (3, 2)]
    assert [extra(c)["batch_size"] for c in first.chunks] == [1, 2, 2, 1, 1]


async def test_a_cancelled_stream_frees_its_slot_within_a_step(inprocess: InProcess) -> None:
    """Race: the client goes away while its stream's step runs. The chunk of that step is dropped,
    the model is told (end_stream, ``cancelled``) and a waiting stream takes the slot in the next step."""
    model, scheduler = await loaded(inprocess, ticker_settings(max_batch_size=2))
    model.hold()
    a = Client(inprocess.dataplane, "a", length=100)
    b = Client(inprocess.dataplane, "b", length=100)
    await model.wait_stepping()
    while model.batches[-1] != ["a", "b"]:
        model.advance()
        await model.wait_stepping()
    waiting = Client(inprocess.dataplane, "c", length=2)
    await turns_until(lambda: scheduler.queued == 1)
    b.task.cancel()  # b's client goes away during the held step
    await b.done.wait()
    model.advance()
    await model.wait_stepping()
    assert model.batches[-1] == ["a", "c"]
    assert ("b", "cancelled") in model.ended
    model.release()
    await waiting.finished()
    a.task.cancel()
    await a.done.wait()
    await turns_until(lambda: scheduler.running == 0)
    assert ticks(waiting.chunks) == [1, 2]


async def test_a_stream_closed_inside_a_cancelled_anyio_scope_still_frees_its_slot(
    inprocess: InProcess,
) -> None:
    """Race: sse-starlette stops a stream by cancelling an anyio task group, whose cancellation is
    level-triggered: every await in the cleanup raises again at once. Leaving the running set must
    not wait on anything, or the stream stays in it forever, holding its slot."""
    _, scheduler = await loaded(inprocess, ticker_settings(max_batch_size=1))
    got = asyncio.Event()

    async def read_forever() -> None:
        async for _ in inprocess.dataplane.infer_stream(one(request("gone", length=10_000)), "ticker"):
            got.set()

    async with anyio.create_task_group() as group:
        group.start_soon(read_forever)
        await got.wait()
        group.cancel_scope.cancel()
    after = await Client(inprocess.dataplane, "after", length=2).finished()  # it needs the only slot
    assert ticks(after.chunks) == [1, 2]
    assert scheduler.running == 0


async def test_a_joiner_whose_client_leaves_while_another_joiner_starts(inprocess: InProcess) -> None:
    """Race: two streams join at the same step; the first one's start_stream awaits, and meanwhile
    the second one's client goes away. The second must simply be dropped (never started, its slot
    freed), and the batcher must go on serving."""
    model, scheduler = await loaded(inprocess, ticker_settings())
    model.hold()
    running = Client(inprocess.dataplane, "running", length=3)
    await model.wait_stepping()
    slow = Client(inprocess.dataplane, "slow", length=2, slow_start=1)
    quitter = Client(inprocess.dataplane, "quitter", length=2)
    await turns_until(lambda: scheduler.queued == 2)
    model.advance()  # step 1 ends; slow and quitter join; slow's start_stream waits
    await model.starting.wait()
    quitter.task.cancel()
    await quitter.done.wait()
    model.start_gate.set()
    model.release()
    for client in (running, slow):
        await client.finished()
        assert client.error is None
    assert ticks(slow.chunks) == [1, 2] and "quitter" not in model.started
    assert all("quitter" not in batch for batch in model.batches)
    await turns_until(lambda: scheduler.running == 0)
    assert ticks((await Client(inprocess.dataplane, "after", length=1).finished()).chunks) == [1]


async def test_a_failing_stream_does_not_disturb_the_others(inprocess: InProcess) -> None:
    model, _ = await loaded(inprocess, ticker_settings(max_batch_size=8))
    model.hold()
    ok = Client(inprocess.dataplane, "ok", length=6)
    await model.wait_stepping()
    fails = Client(inprocess.dataplane, "fails", length=6, fail_at=3)
    breaks = Client(inprocess.dataplane, "breaks", length=6, raise_at=4)
    other = Client(inprocess.dataplane, "other", length=6)
    model.release()
    for client in (ok, fails, breaks, other):
        await client.finished()
    assert ticks(ok.chunks) == ticks(other.chunks) == [1, 2, 3, 4, 5, 6]
    assert ok.error is None and other.error is None
    # StepResult(error): its earlier chunks, then the error; the others never see it
    assert ticks(fails.chunks) == [1, 2]
    assert isinstance(fails.error, ModelFailed) and "failed at 3" in str(fails.error)
    # step() raised: every stream of that step ran again alone; only the one at fault failed
    assert ticks(breaks.chunks) == [1, 2, 3]
    assert isinstance(breaks.error, ModelFailed) and "step broke on breaks" in str(breaks.error)
    assert ["breaks"] in model.batches and ["other"] in model.batches
    ended = dict(model.ended)
    assert ended == {"ok": "finished", "other": "finished", "fails": "failed", "breaks": "failed"}


async def test_the_running_set_never_exceeds_its_bound(inprocess: InProcess) -> None:
    model, _ = await loaded(inprocess, ticker_settings(max_batch_size=3))
    clients = [Client(inprocess.dataplane, f"s{i}", length=1 + i % 6) for i in range(14)]
    for client in clients:
        await client.finished()
    for i, client in enumerate(clients):
        assert client.error is None and ticks(client.chunks) == list(range(1, 2 + i % 6))
        for chunk in client.chunks:
            step = model.batches[extra(chunk)["step_id"] - 1]
            assert client.id in step and extra(chunk)["batch_size"] == len(step)
    assert max(len(batch) for batch in model.batches) == 3
    # a stream joins as soon as there is a slot: every step but the last few is full
    assert sum(len(batch) for batch in model.batches) == sum(1 + i % 6 for i in range(14))


async def test_a_slow_reader_sits_out_steps_instead_of_buffering(inprocess: InProcess) -> None:
    model, _ = await loaded(inprocess, ticker_settings())
    slow = inprocess.dataplane.infer_stream(one(request("slow", length=100)), "ticker")
    first = await anext(slow)  # then it stops reading
    assert ticks([first]) == [1]
    fast = await Client(inprocess.dataplane, "fast", length=40).finished()
    assert ticks(fast.chunks) == list(range(1, 41))
    steps_of_slow = sum("slow" in batch for batch in model.batches)
    assert steps_of_slow <= BUFFERED + 2  # the one read, a full buffer, and the one being read
    rest = [chunk async for chunk in slow]
    assert ticks([first, *rest]) == list(range(1, 101))


async def test_several_requests_on_one_stream_run_together(inprocess: InProcess) -> None:
    """The requests of one call (a gRPC stream) run concurrently, each answered with its own id."""
    model, _ = await loaded(inprocess, ticker_settings())

    async def requests() -> AsyncIterator[InferenceRequest]:
        yield request("r1", length=4)
        yield request("r2", length=2)

    chunks = [chunk async for chunk in inprocess.dataplane.infer_stream(requests(), "ticker")]
    by_id = {rid: ticks([c for c in chunks if c.id == rid]) for rid in ("r1", "r2")}
    assert by_id == {"r1": [1, 2, 3, 4], "r2": [1, 2]}
    assert [c.id for c in chunks].count("r2") == 2 and ["r1", "r2"] in model.batches


async def test_a_failing_request_on_a_stream_of_several_is_answered_in_band(inprocess: InProcess) -> None:
    """On one call of several requests (gRPC), a request that fails gets its own error, in band, and
    the other requests of the call go on (the call is not cut)."""
    await loaded(inprocess, ticker_settings())

    async def requests() -> AsyncIterator[InferenceRequest]:
        yield request("ok1", length=5)
        yield request("bad", length=5, fail_at=2)
        yield request("refused", refuse=1)
        yield request("ok2", length=3)

    items = [item async for item in inprocess.dataplane.infer_stream_in_band(requests(), "ticker")]
    errors = {item.request_id: str(item.error) for item in items if isinstance(item, StreamError)}
    assert errors == {"bad": errors["bad"], "refused": "refused as asked"} and "failed at 2" in errors["bad"]
    chunks = [item for item in items if not isinstance(item, StreamError)]
    assert {rid: ticks([c for c in chunks if c.id == rid]) for rid in ("ok1", "bad", "ok2")} == {
        "ok1": [1, 2, 3, 4, 5],
        "bad": [1],
        "ok2": [1, 2, 3],
    }


async def test_a_unary_request_runs_in_the_batch_and_gets_its_chunks_combined(inprocess: InProcess) -> None:
    model, _ = await loaded(inprocess, ticker_settings())
    model.hold()
    stream = Client(inprocess.dataplane, "stream", length=4)
    await model.wait_stepping()
    unary = asyncio.create_task(inprocess.dataplane.infer(request("unary", length=3), "ticker"))
    model.release()
    response = await unary
    await stream.finished()
    assert response.id == "unary" and response.outputs[0].shape == [3]
    assert list(response.outputs[0].data) == [1, 2, 3]
    assert extra(response)["batch_size"] == 2
    assert ["stream", "unary"] in model.batches


async def test_stopping_finishes_accepted_streams_and_refuses_new_ones(inprocess: InProcess) -> None:
    model, scheduler = await loaded(inprocess, ticker_settings(max_batch_size=1))
    model.hold()
    running = Client(inprocess.dataplane, "running", length=2)
    await model.wait_stepping()
    waiting = Client(inprocess.dataplane, "waiting", length=2)
    await turns_until(lambda: scheduler.queued == 1)
    stopping = asyncio.create_task(scheduler.stop())
    await turns_until(lambda: scheduler._closing)
    with pytest.raises(ShuttingDown):
        await inprocess.dataplane.infer(request("new"), "ticker")
    model.release()
    await stopping
    assert ticks((await running.finished()).chunks) == [1, 2]
    assert ticks((await waiting.finished()).chunks) == [1, 2]


async def test_a_sync_step_runs_off_the_event_loop(inprocess: InProcess) -> None:
    await inprocess.load(
        ModelSettings(
            name="sync",
            implementation="tests.continuous_models.SyncTicker",
            continuous_batching=True,
            max_batch_size=4,
        )
    )
    a, b = (
        Client(inprocess.dataplane, "a", model="sync", length=3),
        Client(inprocess.dataplane, "b", model="sync"),
    )
    for client in (a, b):
        await client.finished()
        assert client.error is None
        assert [int(c.outputs[0].data[0]) for c in client.chunks] == [1, 2, 3]
        assert all(c.outputs[1].data[0].startswith(b"step-sync") for c in client.chunks)


async def test_metadata_and_a_model_that_cannot_step(inprocess: InProcess) -> None:
    await loaded(inprocess, ticker_settings(max_batch_size=5, queue_timeout=2.0))
    async with inprocess.client() as client:
        meta = (await client.get("/v2/models/ticker")).json()
        config = (await client.get("/v2/models/ticker/config")).json()
    assert meta["parameters"] == {
        "scheduler": "continuous",
        "max_batch_size": 5,
        "max_queue_size": 1024,
        "queue_timeout": 2.0,
        "stats": {"running_streams": 0, "queued_streams": 0, "steps": 0, "largest_batch": 0},
    }
    assert config["model_transaction_policy"] == {"decoupled": True} and config["max_batch_size"] == 0
    entry = await inprocess.registry.load(
        ModelSettings(name="plain", implementation="tests.stream_models.Counter", continuous_batching=True)
    )
    assert entry.state.value == "UNAVAILABLE" and "ContinuousModel" in entry.reason


async def test_a_batcher_stopped_by_force_fails_its_streams_and_tells_the_model(inprocess: InProcess) -> None:
    model, scheduler = await loaded(inprocess, ticker_settings(max_batch_size=1))
    model.hold()
    running = Client(inprocess.dataplane, "running", length=5)
    await model.wait_stepping()
    waiting = Client(inprocess.dataplane, "waiting", length=5)
    await turns_until(lambda: scheduler.queued == 1)
    assert scheduler._stepper is not None
    scheduler._stepper.cancel()  # a bug or a torn-down event loop, not a normal stop
    for client in (running, waiting):
        await client.finished()
        assert isinstance(client.error, ShuttingDown)
    assert model.ended == [("running", "unload")]
    with pytest.raises(ShuttingDown):  # it refuses work rather than queue it forever
        await inprocess.dataplane.infer(request("late"), "ticker")
