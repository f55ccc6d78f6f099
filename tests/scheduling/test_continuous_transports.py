"""Continuous batching step by step over real SSE and gRPC connections.

A real server runs in the test's event loop (uvicorn and grpc.aio on 127.0.0.1, free ports), so the
test holds the ticker's steps and checks, step by step, what reaches the model over each transport.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import httpx
import pytest

from runtime.frontends.grpc.generated import dataplane_pb2 as pb
from runtime.frontends.grpc.generated import dataplane_pb2_grpc
from runtime.scheduling import ContinuousScheduler
from runtime.server.serving import Server
from tests.continuous_helpers import ticker_settings
from tests.continuous_models import Ticker
from tests.scheduling.test_continuous_server import Sse
from tests.servers import serving

pytestmark = pytest.mark.anyio


async def until(condition: Callable[[], bool], seconds: float = 30.0) -> None:
    """Until ``condition`` holds (it depends on sockets: the loop needs turns, not a signal we own)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("the condition never held")
        await asyncio.sleep(0.001)


def parts(server: Server) -> tuple[Ticker, ContinuousScheduler]:
    entry = server.registry.get("ticker")
    assert isinstance(entry.model, Ticker) and isinstance(entry.scheduler, ContinuousScheduler)
    return entry.model, entry.scheduler


def gone(scheduler: ContinuousScheduler) -> list[str]:
    """Streams whose caller went away and that the batcher will drop before its next step."""
    return [entry.stream.id for entry in scheduler._running if entry.gone]


class GrpcStream:
    """One ModelStreamInfer call of the ticker (one request), read in a task."""

    def __init__(self, stub: Any, request_id: str, **parameters: int) -> None:
        request = pb.ModelInferRequest(model_name="ticker", id=request_id)
        for key, value in parameters.items():
            request.parameters[key].int64_param = value
        self.steps: list[int] = []
        self.first = asyncio.Event()
        self.call = stub.ModelStreamInfer(_once(request))
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for response in self.call:
            self.steps.append(response.parameters["step_id"].int64_param)
            self.first.set()


async def _once(request: pb.ModelInferRequest) -> AsyncIterator[pb.ModelInferRequest]:
    yield request


async def test_sse_a_joiner_takes_part_in_the_next_step_and_a_disconnect_frees_its_slot_at_once() -> None:
    """Races, over SSE: (1) a stream that arrives while a step runs must be in the very next step;
    (2) a client that disconnects during a held step must be out of the next one, which a waiting
    stream joins in its place."""
    async with serving(ticker_settings(max_batch_size=2)) as server:
        model, scheduler = parts(server)
        model.hold()
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{server.http_port}", limits=limits
        ) as client:
            a = Sse(client, "a", length=100)
            await model.wait_stepping()  # step 1: [a], held
            b = Sse(client, "b", length=100)
            await until(lambda: scheduler.queued == 1)
            model.advance()
            await model.wait_stepping()
            assert model.batches == [["a"], ["a", "b"]]  # (1): b joined at the next step
            c = Sse(client, "c", length=2)
            await until(lambda: scheduler.queued == 1)  # both slots are held: c waits
            await b.leave()
            await until(lambda: gone(scheduler) == ["b"])
            model.advance()
            await model.wait_stepping()
            assert model.batches[-1] == ["a", "c"] and ("b", "cancelled") in model.ended  # (2)
            model.release()
            await c.task
            assert c.ticks == [1, 2] and [e["parameters"]["step_id"] for e in c.events] == [3, 4]
            await a.leave()


async def test_grpc_a_joiner_takes_part_in_the_next_step_and_a_cancelled_call_frees_its_slot_at_once() -> (
    None
):
    """The same races over gRPC ModelStreamInfer: a call that arrives during a step joins the next
    one; a call cancelled during a held step is out of the next one."""
    async with serving(ticker_settings(max_batch_size=2)) as server:
        model, scheduler = parts(server)
        model.hold()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            stub = dataplane_pb2_grpc.GRPCInferenceServiceStub(channel)
            a = GrpcStream(stub, "a", length=100)
            await model.wait_stepping()
            b = GrpcStream(stub, "b", length=100)
            await until(lambda: scheduler.queued == 1)
            model.advance()
            await model.wait_stepping()
            assert model.batches == [["a"], ["a", "b"]]
            c = GrpcStream(stub, "c", length=2)
            await until(lambda: scheduler.queued == 1)
            b.call.cancel()
            await until(lambda: gone(scheduler) == ["b"])
            model.advance()
            await model.wait_stepping()
            assert model.batches[-1] == ["a", "c"] and ("b", "cancelled") in model.ended
            model.release()
            await c.task
            assert c.steps == [3, 4]
            a.call.cancel()
            await asyncio.gather(a.task, b.task, return_exceptions=True)
