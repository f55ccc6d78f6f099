"""Sequence batching: separate state per sequence under concurrency, strict order within a sequence,
one request per sequence per batch, oldest first across sequences, and the batch window."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator

import httpx
import numpy as np
import pytest

from runtime.types import InferenceRequest, Parameters, RequestInput
from tests.conftest import InProcess
from tests.sequencing import history, scheduler, serve, step, total, until

pytestmark = pytest.mark.anyio


def one_per_sequence(batches: list[list[tuple[str, bool, bool]]]) -> bool:
    return all(len({key for key, _, _ in batch}) == len(batch) for batch in batches)


async def test_concurrent_sequences_keep_separate_sums(inprocess: InProcess) -> None:
    model = await serve(inprocess, max_batch_size=8, max_batch_time=0.05)

    async def run(client: httpx.AsyncClient, n: int) -> list[int]:
        sums = [total(await step(client, n, sequence_id=f"s{n}", sequence_start=True))]
        for _ in range(5):
            sums.append(total(await step(client, n, sequence_id=f"s{n}")))
        return sums

    async with inprocess.client() as client:
        results = await asyncio.gather(*(run(client, n) for n in range(1, 25)))
    for n, sums in enumerate(results, start=1):
        assert sums == [n * k for k in range(1, 7)]
    assert one_per_sequence(model.batches)
    assert max(len(b) for b in model.batches) <= 8
    assert scheduler(inprocess).largest_batch > 1  # 24 concurrent sequences did share batches


async def test_pipelined_requests_of_one_sequence_run_one_at_a_time_in_order(inprocess: InProcess) -> None:
    """Race: ten requests of one sequence sent at once (no waiting for answers) must be served one
    by one, each seeing exactly the requests admitted before it, never two in one batch."""
    model = await serve(inprocess, max_batch_size=16, max_batch_time=0.01)
    async with inprocess.client() as client:
        await step(client, 100, sequence_id="p", sequence_start=True)
        responses = await asyncio.gather(*(step(client, v, sequence_id="p") for v in range(1, 11)))
    chains = sorted((history(r) for r in responses), key=len)
    for shorter, longer in itertools.pairwise(chains):
        assert longer[:-1] == shorter
    assert sorted(chains[-1][1:]) == list(range(1, 11)) and chains[-1][0] == 100
    assert one_per_sequence(model.batches)


async def test_a_stream_keeps_arrival_order_within_each_sequence(inprocess: InProcess) -> None:
    """Race: a stream carrying three interleaved sequences is read ahead (pipelined); each sequence
    must still see its requests in stream order, and answers come back in stream order."""
    model = await serve(inprocess, max_batch_size=4, max_batch_time=0.005)
    sent: list[tuple[str, int]] = [(key, 10 * i + k + 1) for i in range(10) for k, key in enumerate("abc")]

    async def requests() -> AsyncIterator[InferenceRequest]:
        for i, (key, value) in enumerate(sent):
            params = Parameters(sequence_id=key, sequence_start=i < 3)
            data = np.array([value], dtype=np.int64)
            yield InferenceRequest(
                id=f"r{i}",
                parameters=params,
                inputs=[RequestInput(name="x", shape=[1], datatype="INT64", data=data)],
            )

    answers = [r async for r in inprocess.dataplane.infer_stream(requests(), "seq")]
    assert [(a.parameters.model_extra or {})["sequence_id"] for a in answers if a.parameters] == [
        key for key, _ in sent
    ]
    for key in "abc":
        last = [
            a for a in answers if a.parameters and (a.parameters.model_extra or {})["sequence_id"] == key
        ][-1]
        assert list(last.outputs[1].data) == [value for k, value in sent if k == key]
    assert one_per_sequence(model.batches)
    assert max(len(b) for b in model.batches) > 1


async def test_oldest_ready_sequences_go_first(inprocess: InProcess) -> None:
    model = await serve(inprocess, max_batch_size=2)
    async with inprocess.client() as client:
        for key in "abcd":
            await step(client, 1, sequence_id=key, sequence_start=True)
        model.gate.clear()
        held = asyncio.create_task(step(client, 1, sequence_id="d", hold=True))
        await model.holding.wait()
        waiting = []
        for n, key in enumerate("cab", start=1):  # arrival order: c, a, b
            waiting.append(asyncio.create_task(step(client, 1, sequence_id=key)))

            def queued(n: int = n) -> bool:
                return scheduler(inprocess).sequences.queued == n

            await until(queued)
        model.gate.set()
        await asyncio.gather(held, *waiting)
    assert [[key for key, _, _ in batch] for batch in model.batches[-2:]] == [["c", "a"], ["b"]]


async def test_the_batch_waits_at_most_max_batch_time_for_more(inprocess: InProcess) -> None:
    model = await serve(inprocess, max_batch_size=4, max_batch_time=0.2)
    async with inprocess.client() as client:
        for key in "abc":  # c stays open but never sends again
            await step(client, 1, sequence_id=key, sequence_start=True)
        began = time.monotonic()
        a, b = await asyncio.gather(step(client, 1, sequence_id="a"), step(client, 1, sequence_id="b"))
        waited = time.monotonic() - began
    assert total(a) == 2 and total(b) == 2
    assert [key for key, _, _ in model.batches[-1]] == ["a", "b"]
    assert 0.15 <= waited < 10


async def test_no_wait_once_every_open_sequence_is_in_the_batch(inprocess: InProcess) -> None:
    await serve(inprocess, max_batch_size=8, max_batch_time=5.0)
    async with inprocess.client() as client:
        began = time.monotonic()
        await step(client, 1, sequence_id="solo", sequence_start=True)
        assert total(await step(client, 1, sequence_id="solo")) == 2
        assert time.monotonic() - began < 4.0  # far below the 2 x 5 s a blind wait would take
