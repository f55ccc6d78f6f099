"""The continuous batcher's callers (``runtime.scheduling.callers``): one call's requests each run
as a stream as they arrive, their chunks read in the order made and each stamped with its stream's
id and its step's size and id; a refused request is one ``StreamError`` and the others go on; a
caller that stops reading takes its streams out of the batch. With the real continuous batcher and
the ticker model, in process."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from runtime.core.registry import Registry
from runtime.errors import InvalidInput
from runtime.scheduling import ContinuousScheduler
from runtime.scheduling.callers import serve_stream
from runtime.streams.pipeline import StreamError
from runtime.types import InferenceRequest, InferenceResponse
from tests.continuous_helpers import extra, request, ticker_settings, ticks
from tests.continuous_models import Ticker

pytestmark = pytest.mark.anyio


@pytest.fixture
async def batcher() -> AsyncIterator[tuple[ContinuousScheduler, Ticker]]:
    registry = Registry()
    entry = await registry.load(ticker_settings(max_batch_size=4))
    assert isinstance(entry.scheduler, ContinuousScheduler) and isinstance(entry.model, Ticker)
    yield entry.scheduler, entry.model
    await registry.unload_all()


async def _requests(*items: InferenceRequest) -> AsyncIterator[InferenceRequest]:
    for item in items:
        yield item


def _by_stream(items: list[InferenceResponse | StreamError]) -> dict[str, list[InferenceResponse]]:
    streams: dict[str, list[InferenceResponse]] = {}
    for item in items:
        if isinstance(item, InferenceResponse):
            assert item.id is not None
            streams.setdefault(item.id, []).append(item)
    return streams


async def test_each_request_of_a_call_runs_as_a_stream(
    batcher: tuple[ContinuousScheduler, Ticker],
) -> None:
    scheduler, model = batcher
    items = [item async for item in serve_stream(scheduler, _requests(request("a", length=2), request("b")))]
    streams = _by_stream(items)
    assert ticks(streams["a"]) == [1, 2] and ticks(streams["b"]) == [1, 2, 3]
    for chunks in streams.values():
        step_ids = [extra(chunk)["step_id"] for chunk in chunks]
        assert step_ids == sorted(step_ids) and len(set(step_ids)) == len(step_ids)
        assert all(1 <= extra(chunk)["batch_size"] <= 2 for chunk in chunks)
    assert sorted(model.ended) == [("a", "finished"), ("b", "finished")]


async def test_a_refused_request_is_one_stream_error_and_the_others_go_on(
    batcher: tuple[ContinuousScheduler, Ticker],
) -> None:
    scheduler, _ = batcher
    items = [
        item
        async for item in serve_stream(
            scheduler, _requests(request("bad", refuse=1), request("good", length=2))
        )
    ]
    errors = [item for item in items if isinstance(item, StreamError)]
    assert len(errors) == 1 and errors[0].request_id == "bad"
    assert isinstance(errors[0].error, InvalidInput) and "refused as asked" in str(errors[0].error)
    assert ticks(_by_stream(items)["good"]) == [1, 2]


async def test_a_failing_stream_is_reported_in_band(batcher: tuple[ContinuousScheduler, Ticker]) -> None:
    scheduler, model = batcher
    items = [
        item
        async for item in serve_stream(
            scheduler, _requests(request("f", length=3, fail_at=2), request("ok", length=3))
        )
    ]
    (error,) = [item for item in items if isinstance(item, StreamError)]
    assert error.request_id == "f" and "failed at 2" in str(error.error.__cause__ or error.error)
    streams = _by_stream(items)
    assert ticks(streams["f"]) == [1] and ticks(streams["ok"]) == [1, 2, 3]
    assert ("f", "failed") in model.ended


async def test_a_caller_that_stops_reading_takes_its_streams_out(
    batcher: tuple[ContinuousScheduler, Ticker],
) -> None:
    scheduler, model = batcher
    reading = serve_stream(scheduler, _requests(request("long", length=1000)))
    first: Any = await reading.__anext__()
    assert isinstance(first, InferenceResponse) and first.id == "long"
    await reading.aclose()
    follow = [item async for item in serve_stream(scheduler, _requests(request("next", length=1)))]
    assert ticks(_by_stream(follow)["next"]) == [1]
    assert ("long", "cancelled") in model.ended
