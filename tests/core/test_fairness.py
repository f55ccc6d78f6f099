"""REST and gRPC take fair turns in the one event loop (runtime/core/fairness.py).

While gRPC inference calls are being served, REST inference requests start at most one per loop
iteration, in order of arrival; with gRPC quiet (or the setting off) nothing waits. The figures
(throughput alone and together) come from benchmarks/bench_mixed.py; these tests pin the rules.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc
import httpx
import numpy as np
import pytest

from runtime.core import fairness
from runtime.core.fairness import LoopTurns
from runtime.frontends.grpc.generated import dataplane_pb2_grpc
from runtime.settings import ModelSettings
from tests.frontends.grpc.test_stream_rpc import COUNTER, stream_call
from tests.grpc_support import raw_request
from tests.models import zoo
from tests.servers import serving

pytestmark = pytest.mark.anyio

ECHO = ModelSettings(name="echo", implementation=zoo.Echo)


def iteration_counter() -> tuple[Callable[[], int], Callable[[], None]]:
    """A callback re-scheduled in every loop iteration: (read the count, stop)."""
    loop = asyncio.get_running_loop()
    state = {"count": 0, "on": True}

    def tick() -> None:
        if state["on"]:
            state["count"] += 1
            loop.call_soon(tick)

    loop.call_soon(tick)
    return (lambda: state["count"]), (lambda: state.update(on=False))


async def take_turns(turns: LoopTurns, n: int) -> list[tuple[int, int]]:
    """Start n requests at once; return (request, iteration) in the order they got their turn."""
    count, stop = iteration_counter()
    started: list[tuple[int, int]] = []

    async def request(i: int) -> None:
        await turns.rest_turn()
        started.append((i, count()))

    await asyncio.gather(*(request(i) for i in range(n)))
    stop()
    return started


async def test_rest_requests_never_wait_while_grpc_is_quiet() -> None:
    turns = LoopTurns()
    assert not turns.contended()
    started = await take_turns(turns, 8)
    assert len({iteration for _, iteration in started}) == 1  # all in one iteration


async def test_rest_requests_start_one_per_iteration_in_order_while_grpc_is_served() -> None:
    turns = LoopTurns()
    turns.grpc_call()
    assert turns.contended()
    started = await take_turns(turns, 6)
    assert [i for i, _ in started] == list(range(6))  # arrival order
    iterations = [iteration for _, iteration in started]
    assert iterations == sorted(set(iterations))  # never two in one iteration
    assert turns.waiting == 0


async def test_the_setting_off_turns_it_off() -> None:
    turns = LoopTurns(enabled=False)
    turns.grpc_call()
    assert not turns.contended()
    started = await take_turns(turns, 4)
    assert len({iteration for _, iteration in started}) == 1


async def test_a_request_cancelled_while_waiting_gives_its_turn_away() -> None:
    """The race: a client disconnects while its request waits; the requests behind it must not strand."""
    turns = LoopTurns()
    turns.grpc_call()
    tasks = [asyncio.create_task(turns.rest_turn()) for _ in range(3)]
    await asyncio.sleep(0)  # one of them got this iteration's turn, the others wait
    waiting = [task for task in tasks if not task.done()]
    assert len(waiting) == turns.waiting == 2
    waiting[0].cancel()
    await asyncio.wait_for(waiting[1], 5)
    assert waiting[0].cancelled()
    assert turns.waiting == 0


async def test_waiting_requests_all_start_once_grpc_goes_quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    turns = LoopTurns()
    turns.grpc_call()
    await turns.rest_turn()
    count, stop = iteration_counter()
    started: list[int] = []

    async def request() -> None:
        await turns.rest_turn()
        started.append(count())

    waiting = [asyncio.create_task(request()) for _ in range(6)]
    await asyncio.sleep(0)
    assert turns.waiting >= 5
    monkeypatch.setattr(fairness, "GRPC_ACTIVE_WINDOW", 0.0)  # gRPC went quiet
    assert not turns.contended()
    await asyncio.wait_for(asyncio.gather(*waiting), 5)
    stop()
    assert len(set(started)) <= 2  # the waiting ones together, not one per iteration
    assert turns.waiting == 0


async def test_grpc_inference_makes_rest_take_turns_and_rest_is_still_answered() -> None:
    async with serving(ECHO) as server:
        turns = server.dataplane.turns
        assert not turns.contended()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            stub = dataplane_pb2_grpc.GRPCInferenceServiceStub(channel)
            await stub.ModelInfer(raw_request("echo", x=np.arange(4, dtype=np.float32)))
        assert turns.contended()
        body = {"inputs": [{"name": "x", "shape": [4], "datatype": "FP32", "data": [0, 1, 2, 3]}]}
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}") as client:
            answers = await asyncio.gather(
                *(client.post("/v2/models/echo/infer", json=body) for _ in range(8))
            )
        assert [answer.status_code for answer in answers] == [200] * 8
        assert all(answer.json()["outputs"][0]["data"] == [0, 1, 2, 3] for answer in answers)
        assert turns.waiting == 0


async def test_a_grpc_stream_message_makes_rest_take_turns() -> None:
    async with serving(COUNTER) as server:
        assert not server.dataplane.turns.contended()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            request = raw_request("counter", "one", n=np.array([1], np.int32))
            call = stream_call(channel, "mlserver")(iter([request]))
            assert len([message async for message in call]) == 1
            assert await call.code() == grpc.StatusCode.OK
        assert server.dataplane.turns.contended()


async def test_grpc_inference_leaves_rest_alone_when_the_setting_is_off() -> None:
    async with serving(ECHO, transport_fairness=False) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            stub = dataplane_pb2_grpc.GRPCInferenceServiceStub(channel)
            await stub.ModelInfer(raw_request("echo", x=np.arange(4, dtype=np.float32)))
        assert not server.dataplane.turns.contended()
