"""Continuous batching over real sockets: SSE, gRPC ModelStreamInfer (MLServer's and Triton's formats).

The server serves ``tests/models/continuous`` (the ticker, at most 2 streams at a time, each step
sleeping ``delay_ms`` off the event loop, like a model's forward pass). Long streams are ended by
their clients going away; each test first waits until the running set is empty (a probe stream
that runs alone), so that it knows which slots are free.
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import orjson
import pytest
import tritonclient.grpc as triton
from httpx_sse import aconnect_sse

from runtime.frontends.grpc.generated import dataplane_pb2 as pb
from runtime.frontends.grpc.generated import dataplane_pb2_grpc
from tests.servers import RunningServer, start_server

pytestmark = pytest.mark.anyio

MODELS = Path(__file__).resolve().parents[1] / "models" / "continuous"
LONG = {"length": 5000, "delay_ms": 5}  # 25 s at least: every test ends it long before


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    running = start_server(MODELS)
    yield running
    assert running.stop() == 0


@pytest.fixture(scope="module")
def triton_server() -> Iterator[RunningServer]:
    running = start_server(MODELS, "--grpc-stream-format", "triton")
    yield running
    assert running.stop() == 0


# ---------------------------------------------------------------------- SSE


class Sse:
    """One SSE stream of the ticker, read in a task: its events, and its error if it got one."""

    def __init__(self, client: httpx.AsyncClient, request_id: str, **parameters: Any) -> None:
        self.events: list[dict[str, Any]] = []
        self.error: str | None = None
        self.status = 0
        self.first = asyncio.Event()
        self.task = asyncio.create_task(
            self._run(client, {"id": request_id, "inputs": [], "parameters": parameters})
        )

    async def _run(self, client: httpx.AsyncClient, body: dict[str, Any]) -> None:
        async with aconnect_sse(client, "POST", "/v2/models/ticker/infer_stream", json=body) as source:
            self.status = source.response.status_code
            if self.status != 200:
                await source.response.aread()
                self.error = source.response.json()["error"]
                return
            async for event in source.aiter_sse():
                if event.event == "error":
                    self.error = orjson.loads(event.data)["error"]
                    return
                self.events.append(orjson.loads(event.data))
                self.first.set()

    @property
    def ticks(self) -> list[int]:
        return [event["outputs"][0]["data"][0] for event in self.events]

    def sizes(self) -> set[int]:
        return {event["parameters"]["batch_size"] for event in self.events}

    async def leave(self) -> None:
        """The client goes away (the connection closes)."""
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


def http_client(server: RunningServer) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=server.http_url,
        timeout=httpx.Timeout(60.0),
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=0),
    )


async def quiet(client: httpx.AsyncClient) -> None:
    """Until no stream of an earlier test still runs: a probe stream that runs alone."""
    for _ in range(500):
        probe = Sse(client, "probe", length=1)
        await probe.task
        if probe.sizes() == {1}:
            return
    raise AssertionError("streams of an earlier test never left")


async def test_sse_a_short_stream_started_during_a_long_one_finishes_first(server: RunningServer) -> None:
    async with http_client(server) as client:
        await quiet(client)
        long = Sse(client, "long", **LONG)
        await long.first.wait()
        short = Sse(client, "short", length=3)
        await short.task
        assert short.error is None and short.ticks == [1, 2, 3]
        assert not long.task.done() and len(long.events) < LONG["length"]
        assert short.sizes() == {2}  # it ran in the long one's steps
        assert {event["id"] for event in short.events} == {"short"}
        await long.leave()


async def test_sse_a_disconnect_frees_its_slot_for_a_waiting_stream(server: RunningServer) -> None:
    async with http_client(server) as client:
        await quiet(client)
        a, b = Sse(client, "a", **LONG), Sse(client, "b", **LONG)
        await a.first.wait()
        await b.first.wait()
        waiting = Sse(client, "c", length=3, delay_ms=5)  # both slots are held: it waits
        await b.leave()
        await waiting.task
        assert waiting.error is None and waiting.ticks == [1, 2, 3]
        assert waiting.sizes() == {2}  # it ran beside a, in b's slot, while a went on
        assert not a.task.done()
        await a.leave()


async def test_sse_a_failing_stream_does_not_disturb_the_other(server: RunningServer) -> None:
    async with http_client(server) as client:
        await quiet(client)
        ok = Sse(client, "ok", length=12, delay_ms=2)
        await ok.first.wait()
        bad = Sse(client, "bad", length=12, fail_at=4, delay_ms=2)
        await bad.task
        await ok.task
        assert bad.status == 200 and bad.ticks == [1, 2, 3]
        assert bad.error is not None and "failed at 4" in bad.error  # in band, after its chunks
        assert ok.error is None and ok.ticks == list(range(1, 13))
        refused = Sse(client, "refused", refuse=1)
        await refused.task
        assert refused.status == 400 and refused.error == "refused as asked" and not refused.events


async def test_sse_the_running_set_never_exceeds_its_bound(server: RunningServer) -> None:
    async with http_client(server) as client:
        await quiet(client)
        streams = [Sse(client, f"s{i}", length=4, delay_ms=2) for i in range(6)]
        await asyncio.gather(*(s.task for s in streams))
        for s in streams:
            assert s.error is None and s.ticks == [1, 2, 3, 4]
            assert s.sizes() <= {1, 2}
        assert max(max(s.sizes()) for s in streams) == 2


# ---------------------------------------------------------------------- gRPC, MLServer's format


def grpc_request(request_id: str, **parameters: int) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="ticker", id=request_id)
    for key, value in parameters.items():
        request.parameters[key].int64_param = value
    return request


def tick(response: pb.ModelInferResponse) -> int:
    return response.outputs[0].contents.int64_contents[0]


def test_grpc_a_short_request_on_the_same_call_finishes_before_the_long_one(server: RunningServer) -> None:
    """Both requests of one ModelStreamInfer call run at once (the call is read ahead), each
    response tagged with its own request's id."""
    outbox: queue.Queue[pb.ModelInferRequest | None] = queue.Queue()

    def requests() -> Iterator[pb.ModelInferRequest]:
        while (item := outbox.get()) is not None:
            yield item

    with grpc.insecure_channel(server.grpc_address) as channel:
        stub = dataplane_pb2_grpc.GRPCInferenceServiceStub(channel)
        outbox.put(grpc_request("long", **LONG))
        call = stub.ModelStreamInfer(requests(), timeout=60)
        seen: dict[str, list[int]] = {"long": [], "short": []}
        sizes = []
        for response in call:
            assert not response.parameters["error"].string_param, response
            seen[response.id].append(tick(response))
            if response.id == "long" and len(seen["long"]) == 1:
                outbox.put(grpc_request("short", length=3))
            if response.id == "short":
                sizes.append(response.parameters["batch_size"].int64_param)
                if len(seen["short"]) == 3:
                    break
        call.cancel()
        outbox.put(None)
    assert seen["short"] == [1, 2, 3] and sizes == [2, 2, 2]
    assert 1 <= len(seen["long"]) < LONG["length"] and seen["long"] == list(range(1, len(seen["long"]) + 1))


def test_grpc_a_failing_stream_is_answered_in_band_and_the_other_goes_on(server: RunningServer) -> None:
    with grpc.insecure_channel(server.grpc_address) as channel:
        stub = dataplane_pb2_grpc.GRPCInferenceServiceStub(channel)
        long = stub.ModelStreamInfer(iter([grpc_request("long", **LONG)]), timeout=60)
        first = next(long)
        assert first.id == "long" and tick(first) == 1
        answers = list(
            stub.ModelStreamInfer(iter([grpc_request("bad", length=9, fail_at=3, delay_ms=2)]), timeout=60)
        )
        assert [tick(r) for r in answers[:-1]] == [1, 2]
        error = answers[-1]
        assert error.id == "bad" and "failed at 3" in error.parameters["error"].string_param
        assert error.parameters["error_code"].string_param == "INTERNAL"
        following = [tick(next(long)) for _ in range(3)]  # the long one went on
        assert following == list(range(following[0], following[0] + 3))
        long.cancel()


def test_grpc_a_cancelled_call_frees_its_slot_for_a_waiting_stream(server: RunningServer) -> None:
    with grpc.insecure_channel(server.grpc_address) as channel:
        stub = dataplane_pb2_grpc.GRPCInferenceServiceStub(channel)
        a = stub.ModelStreamInfer(iter([grpc_request("a", **LONG)]), timeout=60)
        b = stub.ModelStreamInfer(iter([grpc_request("b", **LONG)]), timeout=60)
        assert tick(next(a)) == 1 and tick(next(b)) == 1  # both slots are held
        waiting = stub.ModelStreamInfer(iter([grpc_request("c", length=3, delay_ms=5)]), timeout=60)
        b.cancel()  # its client cancels the call: the server drops its stream
        answers = list(waiting)
        assert [tick(r) for r in answers] == [1, 2, 3]
        assert {r.parameters["batch_size"].int64_param for r in answers} == {2}  # beside a, in b's slot
        assert tick(next(a)) > 1  # a went on
        a.cancel()


# ---------------------------------------------------------------------- gRPC, Triton's format


def base(value: int) -> list[triton.InferInput]:
    """The ticker's optional input (tritonclient sends it raw, so the answers come raw)."""
    tensor = triton.InferInput("base", [1], "INT64")
    tensor.set_data_from_numpy(np.array([value], dtype=np.int64))
    return [tensor]


def test_triton_stream_a_short_request_finishes_first(triton_server: RunningServer) -> None:
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = triton.InferenceServerClient(triton_server.grpc_address)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer(
            "ticker", base(0), request_id="long", parameters=LONG, enable_empty_final_response=True
        )
        got: dict[str, list[int]] = {"long": [], "short": []}
        finished: list[str] = []
        while "short" not in finished:
            result, error = results.get(timeout=60)
            assert error is None, error
            response = result.get_response()
            if response.outputs:
                got[response.id].append(int(result.as_numpy("tick")[0]))
                assert response.parameters["batch_size"].int64_param in (1, 2)
            if response.parameters["triton_final_response"].bool_param:
                finished.append(response.id)
            if response.id == "long" and len(got["long"]) == 1:
                client.async_stream_infer(
                    "ticker",
                    base(100),
                    request_id="short",
                    parameters={"length": 3},
                    enable_empty_final_response=True,
                )
        assert got["short"] == [101, 102, 103] and finished == ["short"]
        assert len(got["long"]) < LONG["length"]
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()
