"""SSE over real sockets: many concurrent streams, disconnecting clients, slow readers.

The concurrency test runs against a server process; the disconnect and back-pressure tests run a
real server (uvicorn on 127.0.0.1, port 0) inside the test's event loop, so that they can read the
model's counters and the DataPlane's count of running streams directly.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from httpx_sse import aconnect_sse

from runtime.server.serving import Server
from runtime.settings import ModelSettings
from tests.servers import RunningServer, serving
from tests.stream_models import Endless

pytestmark = pytest.mark.anyio

INFINITE: dict[str, Any] = {"inputs": []}


def endless_model(server: Server) -> Endless:
    model = server.registry.get("endless").model
    assert isinstance(model, Endless)
    return model


async def test_200_concurrent_streams_all_complete_and_in_order(streaming_server: RunningServer) -> None:
    """Every one of 200 simultaneous streams gets all its events, in order, tagged with its own id."""
    tokens = 25
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    timeout = httpx.Timeout(60.0)

    async def one(client: httpx.AsyncClient, k: int) -> list[tuple[str, int]]:
        body = {"id": f"s{k}", "inputs": [{"name": "n", "shape": [1], "datatype": "INT32", "data": [tokens]}]}
        async with aconnect_sse(client, "POST", "/v2/models/counter/infer_stream", json=body) as source:
            assert source.response.status_code == 200
            got = []
            async for event in source.aiter_sse():
                assert event.event == "message", event.data
                doc = orjson.loads(event.data)
                got.append((doc["id"], doc["outputs"][0]["data"][0]))
            return got

    async def words(client: httpx.AsyncClient, k: int) -> list[str]:
        body = {"text_input": f"w{k} x{k} y{k} z{k}", "parameters": {"repeat": 5}}
        async with aconnect_sse(client, "POST", "/v2/models/words/generate_stream", json=body) as source:
            return [orjson.loads(event.data)["text_output"] async for event in source.aiter_sse()]

    async with httpx.AsyncClient(
        base_url=streaming_server.http_url, limits=limits, timeout=timeout
    ) as client:
        counted = [asyncio.ensure_future(one(client, k)) for k in range(100)]
        spoken = [asyncio.ensure_future(words(client, k)) for k in range(100)]
        results = await asyncio.gather(*counted)
        texts = await asyncio.gather(*spoken)
    for k, got in enumerate(results):
        assert got == [(f"s{k}", i) for i in range(tokens)]
    for k, said in enumerate(texts):
        assert said == [f"w{k}", f"x{k}", f"y{k}", f"z{k}"] * 5


async def test_disconnecting_clients_cancel_their_models_and_nothing_leaks() -> None:
    """Race: 50 clients leave mid-stream, while the server is writing or the model is computing.

    Each model generator must see the cancellation (GeneratorExit or CancelledError) and the
    DataPlane's count of running streams must come back to 0.
    """
    clients = 50
    async with serving(ModelSettings(name="endless", implementation=Endless)) as server:
        model = endless_model(server)
        url = f"http://127.0.0.1:{server.http_port}"
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)

        async def leave_after(client: httpx.AsyncClient, events: int) -> None:
            async with aconnect_sse(
                client, "POST", "/v2/models/endless/infer_stream", json=INFINITE
            ) as source:
                seen = 0
                async for _ in source.aiter_sse():
                    seen += 1
                    if seen == events:
                        break  # leaving the block closes the connection mid-stream

        async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60.0) as client:
            await asyncio.gather(*(leave_after(client, 1 + k % 7) for k in range(clients)))
        await asyncio.wait_for(model.all_closed.wait(), 30)
        await asyncio.wait_for(server.dataplane.streams.wait_idle(), 30)
        assert (model.started, model.cancelled, model.active) == (clients, clients, 0)
        assert server.dataplane.streams.active == 0
        assert server.dataplane.streams.total == clients


async def test_a_client_that_leaves_before_the_first_event_cancels_the_model() -> None:
    """Race: the model has not produced its first item (no headers sent yet) when the client leaves."""
    async with serving(ModelSettings(name="endless", implementation=Endless)) as server:
        model = endless_model(server)
        url = f"http://127.0.0.1:{server.http_port}"
        async with httpx.AsyncClient(base_url=url, timeout=60.0) as client:
            waiting = asyncio.ensure_future(
                client.post("/v2/models/endless/infer_stream", json={"inputs": [], "parameters": {"hold": 1}})
            )
            await asyncio.wait_for(model.holding.wait(), 30)
            waiting.cancel()  # httpx closes the connection
            with pytest.raises(asyncio.CancelledError):
                await waiting
        await asyncio.wait_for(model.all_closed.wait(), 30)
        await asyncio.wait_for(server.dataplane.streams.wait_idle(), 30)
        assert (model.started, model.cancelled) == (1, 1)


def _send_buffer_limit() -> int:
    """The most a Linux socket's send buffer can grow to (tcp_wmem max), or a generous guess."""
    try:
        return int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])
    except (OSError, ValueError, IndexError):
        return 16 * 1024 * 1024


async def test_a_slow_reader_holds_the_model_back() -> None:
    """A reader that stops reading stops the model, after at most the transport's bounded buffers.

    What may sit between the model and a paused reader: the client's receive buffer (set small
    here), the server's socket send buffer (at most tcp_wmem's maximum), uvicorn's write buffer
    (64 KiB high-water mark) and one event in hand. Without back-pressure, the endless model would
    produce events for as long as the reader pauses.
    """
    size = 64 * 1024
    receive_buffer = 64 * 1024
    bound = (_send_buffer_limit() + 2 * receive_buffer + 1024 * 1024) // size + 2
    async with serving(ModelSettings(name="endless", implementation=Endless)) as server:
        model = endless_model(server)
        transport = httpx.AsyncHTTPTransport(
            socket_options=[(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)]
        )
        url = f"http://127.0.0.1:{server.http_port}"
        async with httpx.AsyncClient(base_url=url, transport=transport, timeout=60.0) as client:
            body = {"inputs": [], "parameters": {"size": size}}
            async with aconnect_sse(client, "POST", "/v2/models/endless/infer_stream", json=body) as source:
                events = source.aiter_sse()
                received = 0
                for _ in range(3):
                    await anext(events)
                    received += 1
                # the reader pauses; wait until the model stops (nothing can signal that it stopped)
                last, steady = -1, 0
                for _ in range(300):
                    await asyncio.sleep(0.05)
                    steady = steady + 1 if model.yielded == last else 0
                    last = model.yielded
                    if steady == 10:
                        break
                assert steady == 10, f"the model kept producing: {model.yielded} events for {received} read"
                assert model.yielded - received <= bound
                paused_at = model.yielded
                # reading again lets the model go on, in order
                for _ in range(2 * bound):
                    event = await anext(events)
                    received += 1
                    assert orjson.loads(event.data)["outputs"][0]["shape"] == [1]
                assert model.yielded > paused_at
                await events.aclose()
        await asyncio.wait_for(model.all_closed.wait(), 30)
        assert model.cancelled == 1


async def test_streams_still_open_at_shutdown_end_with_an_error_event_before_their_model_unloads(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Race: the server stops while a stream runs; when the grace period ends the stream ends with
    an ``event: error`` saying the server shuts down (not cut mid-air), the model's generator is
    closed before the model is unloaded, and the log says so in one line, without a traceback."""
    async with serving(ModelSettings(name="endless", implementation=Endless), grace=1) as server:
        model = endless_model(server)
        url = f"http://127.0.0.1:{server.http_port}"
        started = asyncio.Event()
        events: list[tuple[str, str]] = []

        async def read() -> None:
            async with httpx.AsyncClient(base_url=url, timeout=60.0) as client:
                async with aconnect_sse(
                    client, "POST", "/v2/models/endless/infer_stream", json=INFINITE
                ) as source:
                    async for event in source.aiter_sse():
                        events.append((event.event, event.data))
                        started.set()

        reader = asyncio.ensure_future(read())
        await asyncio.wait_for(started.wait(), 30)
        await server.stop()
        await asyncio.wait_for(reader, 30)  # the stream ended cleanly, with its error event
        assert events[-1][0] == "error"
        assert "shutting down" in orjson.loads(events[-1][1])["error"]
        assert all(name == "message" for name, _ in events[:-1])
        assert (model.cancelled, model.active_at_unload) == (1, 0)
        assert server.dataplane.streams.active == 0
        cut = [r for r in caplog.records if "grace period ended" in r.getMessage()]
        assert len(cut) == 1 and cut[0].exc_info is None
        assert not [r for r in caplog.records if r.exc_info is not None]


async def test_a_stream_waiting_for_its_first_item_at_the_end_of_the_grace_period_gets_503() -> None:
    """Race: the server stops while a stream waits for its model's first item; when the grace
    period ends the model is cancelled and the client gets a JSON 503 (no event was sent yet)."""
    async with serving(ModelSettings(name="endless", implementation=Endless), grace=0.5) as server:
        model = endless_model(server)
        url = f"http://127.0.0.1:{server.http_port}"
        body = {"inputs": [], "parameters": {"hold": True}}
        async with httpx.AsyncClient(base_url=url, timeout=60.0) as client:
            answer = asyncio.ensure_future(client.post("/v2/models/endless/infer_stream", json=body))
            await asyncio.wait_for(model.holding.wait(), 30)
            await server.stop()
            response = await asyncio.wait_for(answer, 30)
        assert response.status_code == 503
        assert "shutting down" in response.json()["error"]
        assert (model.cancelled, model.active_at_unload) == (1, 0)
