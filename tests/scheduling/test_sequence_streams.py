"""Sequences over streams (what gRPC ModelStreamInfer uses): read-ahead in order, errors in band,
back-pressure instead of 503 for a stream's own pipelined requests, cancellation on close."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

from runtime.streams.pipeline import StreamError
from runtime.types import InferenceRequest, InferenceResponse, Parameters, RequestInput
from tests.conftest import InProcess
from tests.sequencing import scheduler, serve, until

pytestmark = pytest.mark.anyio


def request(rid: str, key: str, x: int, **flags: Any) -> InferenceRequest:
    data = np.array([x], dtype=np.int64)
    return InferenceRequest(
        id=rid,
        parameters=Parameters(sequence_id=key, **flags),
        inputs=[RequestInput(name="x", shape=[1], datatype="INT64", data=data)],
    )


async def feed(requests: list[InferenceRequest]) -> AsyncIterator[InferenceRequest]:
    for r in requests:
        yield r


def totals(items: list[InferenceResponse | StreamError]) -> list[tuple[str | None, Any]]:
    return [
        (item.request_id, type(item.error).__name__)
        if isinstance(item, StreamError)
        else (item.id, int(item.outputs[0].data[0]))
        for item in items
    ]


async def test_one_bad_request_is_answered_in_band_and_the_stream_goes_on(inprocess: InProcess) -> None:
    """Race: requests are read ahead; a refused request in the middle must be reported for itself
    (not for the latest request read) and must not cancel the read-ahead requests behind it."""
    model = await serve(inprocess, max_batch_size=4)
    sent = [
        request("1", "a", 1, sequence_start=True),
        request("2", "b", 10, sequence_start=True),
        request("3", "ghost", 5),  # never started: 400 in band
        request("4", "a", 2),
        request("5", "b", 20, sequence_end=True),
        request("6", "b", 1),  # b has ended: 400 in band
        request("7", "a", 3),
    ]
    items = [i async for i in inprocess.dataplane.infer_stream_in_band(feed(sent), "seq")]
    assert totals(items) == [
        ("1", 1),
        ("2", 10),
        ("3", "SequenceNotOpen"),  # a SequenceError: never started
        ("4", 3),
        ("5", 30),
        ("6", "SequenceError"),
        ("7", 6),
    ]
    assert model.reasons("a") == [] and model.reasons("b") == ["end"]


async def test_a_stream_waits_for_room_in_its_own_sequence_queue(inprocess: InProcess) -> None:
    """Thirty pipelined requests of one sequence on one stream, with room for two waiting: the
    stream holds back instead of drawing 503s, and every answer comes in order."""
    await serve(inprocess, max_sequence_queue_size=2)
    sent = [request("0", "p", 1, sequence_start=True)] + [request(str(i), "p", 1) for i in range(1, 30)]
    items = [i async for i in inprocess.dataplane.infer_stream_in_band(feed(sent), "seq")]
    assert totals(items) == [(str(i), i + 1) for i in range(30)]
    assert scheduler(inprocess).sequences.rejected["queue_full"] == 0


async def test_closing_a_stream_cancels_its_unanswered_sequences(inprocess: InProcess) -> None:
    """Race: the consumer goes away while one request runs and others of the same stream are
    queued; every sequence with an unanswered request is cancelled and the model is told."""
    model = await serve(inprocess, max_batch_size=1)
    model.gate.clear()
    sent = [
        request("1", "x", 1, sequence_start=True, hold=True),
        request("2", "y", 1, sequence_start=True),
        request("3", "x", 1),
    ]
    stream = inprocess.dataplane.infer_stream_in_band(feed(sent), "seq")
    first = asyncio.ensure_future(stream.__anext__())
    await model.holding.wait()
    await until(lambda: scheduler(inprocess).sequences.queued == 2)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    await stream.aclose()
    model.gate.set()
    assert (await model.ending("x"))[0] == "cancel"
    assert model.reasons("y") == []  # y never reached the model: nothing to tell
    assert scheduler(inprocess).sequences.ended == {"x": "cancel", "y": "cancel"}
