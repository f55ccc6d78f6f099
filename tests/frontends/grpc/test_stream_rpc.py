"""gRPC ModelStreamInfer with streaming models: order, many streams, cancellation, back-pressure.

The order and concurrency tests run against server processes; the cancellation, back-pressure and
shutdown tests run a real server inside the test's event loop (``tests.servers.serving``), so
that they can read the model's counters and the DataPlane's count of running streams directly.
Both wire formats are covered: MLServer's (the default) and Triton's.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

import grpc
import numpy as np
import pytest

from runtime.frontends.grpc.generated import dataplane_pb2 as pb
from runtime.frontends.grpc.generated import dataplane_pb2_grpc
from runtime.server.serving import Server
from runtime.settings import ModelSettings
from runtime.streams.window import BUFFERED
from tests.grpc_support import inference_stub, raw_request
from tests.servers import RunningServer, serving
from tests.stream_models import Counter, Endless, Words

pytestmark = pytest.mark.anyio

METHOD = "/inference.GRPCInferenceService/ModelStreamInfer"
FORMATS = ["mlserver", "triton"]
ENDLESS = ModelSettings(name="endless", implementation=Endless)
COUNTER = ModelSettings(
    name="counter",
    implementation=Counter,
    inputs=[{"name": "n", "datatype": "INT32", "shape": [1]}],
)
WORDS = ModelSettings(name="words", implementation=Words)


def stream_call(channel: grpc.aio.Channel, stream_format: str) -> Callable[..., Any]:
    """ModelStreamInfer on an asyncio channel, reading the messages of the server's format."""
    response = pb.ModelStreamInferResponse if stream_format == "triton" else pb.ModelInferResponse
    call: Callable[..., Any] = channel.stream_stream(
        METHOD,
        request_serializer=pb.ModelInferRequest.SerializeToString,
        response_deserializer=response.FromString,
    )
    return call


def infer_response(message: Any) -> pb.ModelInferResponse:
    """The ModelInferResponse of a message of either format (Triton's errors raise here)."""
    if isinstance(message, pb.ModelStreamInferResponse):
        assert not message.error_message, message.error_message
        return message.infer_response
    assert "error" not in message.parameters, message.parameters["error"].string_param
    return cast(pb.ModelInferResponse, message)


def counter_request(n: int, request_id: str) -> pb.ModelInferRequest:
    return raw_request("counter", request_id, n=np.array([n], np.int32))


def words_request(text: str, request_id: str, **parameters: int | bool) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="words", id=request_id)
    request.inputs.add(name="text_input", datatype="BYTES", shape=[1]).contents.bytes_contents.append(
        text.encode()
    )
    for key, value in parameters.items():
        if isinstance(value, bool):
            request.parameters[key].bool_param = value
        else:
            request.parameters[key].int64_param = value
    return request


def counted(response: pb.ModelInferResponse) -> int:
    return int(np.frombuffer(response.raw_output_contents[0], np.int32)[0])


def spoken(response: pb.ModelInferResponse) -> str:
    return response.outputs[0].contents.bytes_contents[0].decode()


def endless_model(server: Server) -> Endless:
    model = server.registry.get("endless").model
    assert isinstance(model, Endless)
    return model


def endless_request(request_id: str, size: int = 16) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="endless", id=request_id)
    request.parameters["size"].int64_param = size
    return request


# ---------------------------------------------------------------------- order (server processes)


def test_stream_models_answer_in_order_with_their_request_ids(streaming_server: RunningServer) -> None:
    """One stream, MLServer's format: a stream-to-stream model answers each of its requests in
    order, every response tagged with its own request, and an error in one request does not end
    the stream nor the model stream's successors."""
    requests = [
        counter_request(4, "c1"),
        counter_request(2, "c2"),
        words_request("one two three", "w1"),
        words_request("four five six", "w2", fail_after=1),
        words_request("seven eight", "w3", repeat=2),
    ]
    with inference_stub(streaming_server.grpc_address) as stub:
        responses = list(stub.ModelStreamInfer(iter(requests)))
    got = []
    for r in responses:
        if "error" in r.parameters:
            got.append((r.id, r.parameters["error_code"].string_param))
        elif r.model_name == "counter":
            got.append((r.id, counted(r)))
        else:
            got.append((r.id, spoken(r)))
    assert got == [
        ("c1", 0), ("c1", 1), ("c1", 2), ("c1", 3), ("c2", 0), ("c2", 1),
        ("w1", "one"), ("w1", "two"), ("w1", "three"),
        ("w2", "four"), ("w2", "INTERNAL"),
        ("w3", "seven"), ("w3", "eight"), ("w3", "seven"), ("w3", "eight"),
    ]  # fmt: skip
    finish = [
        r.parameters["finish_reason"].string_param for r in responses if "finish_reason" in r.parameters
    ]
    assert finish == ["length", "length"]  # on the last word of w1 and of w3 only


def expected_counter(k: int, tokens: int) -> list[tuple[str, int]]:
    return [(f"s{k}-{part}", i) for part in "ab" for i in range(tokens)]


def expected_words(k: int) -> list[tuple[str, str]]:
    return [(f"t{k}-{part}", word) for part in "ab" for word in [f"w{k}", f"x{k}", part] * 3]


async def two_hundred_streams(address: str, stream_format: str) -> None:
    """200 simultaneous streams, each of two requests, every one complete, in order, with its ids."""
    tokens = 25

    async def counter_stream(call: Callable[..., Any], k: int) -> list[tuple[str, int]]:
        requests = [counter_request(tokens, f"s{k}-a"), counter_request(tokens, f"s{k}-b")]
        got = []
        async for message in call(iter(requests)):
            response = infer_response(message)
            if response.outputs:
                got.append((response.id, counted(response)))
        return got

    async def words_stream(call: Callable[..., Any], k: int) -> list[tuple[str, str]]:
        requests = [words_request(f"w{k} x{k} {part}", f"t{k}-{part}", repeat=3) for part in "ab"]
        got = []
        async for message in call(iter(requests)):
            response = infer_response(message)
            if response.outputs:
                got.append((response.id, spoken(response)))
        return got

    channels = [grpc.aio.insecure_channel(address) for _ in range(4)]
    try:
        calls = [stream_call(channel, stream_format) for channel in channels]
        counters = [asyncio.ensure_future(counter_stream(calls[k % 4], k)) for k in range(100)]
        words = [asyncio.ensure_future(words_stream(calls[k % 4], k)) for k in range(100)]
        counted_results = await asyncio.wait_for(asyncio.gather(*counters), 90)
        words_results = await asyncio.wait_for(asyncio.gather(*words), 90)
    finally:
        for channel in channels:
            await channel.close()
    for k, got in enumerate(counted_results):
        if stream_format == "triton":  # Triton's requests run concurrently: each in order
            got = sorted(got, key=lambda item: item[0])
        assert got == expected_counter(k, tokens)
    for k, got_words in enumerate(words_results):
        if stream_format == "triton":
            got_words = sorted(got_words, key=lambda item: item[0])
        assert got_words == expected_words(k)


async def test_200_concurrent_grpc_streams_all_complete_and_in_order(streaming_server: RunningServer) -> None:
    await two_hundred_streams(streaming_server.grpc_address, "mlserver")


async def test_200_concurrent_triton_format_streams_all_complete_and_in_order() -> None:
    async with serving(COUNTER, WORDS, grpc_stream_format="triton") as server:
        await two_hundred_streams(f"127.0.0.1:{server.grpc_port}", "triton")
        assert server.dataplane.streams.active == 0


async def test_triton_format_streams_tokens_with_final_flags() -> None:
    """Triton's decoupled convention for a stream-to-stream model: every response of a request
    leaves at once with triton_final_response false and an empty final response ends it (when
    asked), or the last response carries true; concurrent requests each keep their order."""
    async with serving(WORDS, grpc_stream_format="triton") as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            requests = [
                words_request("a b c", "asked", triton_enable_empty_final_response=True),
                words_request("d e", "plain"),
                words_request("f g h", "broken", fail_after=2),
            ]
            messages = [m async for m in stream_call(channel, "triton")(iter(requests))]
    got: dict[str, list[tuple[str, bool]]] = {}
    for message in messages:
        response = message.infer_response
        final = response.parameters["triton_final_response"].bool_param
        what = message.error_message or (spoken(response) if response.outputs else "")
        got.setdefault(response.id, []).append((what, final))
    assert got == {
        "asked": [("a", False), ("b", False), ("c", False), ("", True)],
        "plain": [("d", False), ("e", True)],
        "broken": [
            ("f", False),
            ("g", False),
            ("Model 'words' failed: RuntimeError: broke after 2 words", True),
        ],
    }


# ---------------------------------------------------------------------- cancellation and leaks


@pytest.mark.parametrize("stream_format", FORMATS)
async def test_cancelling_clients_cancel_their_models_and_nothing_leaks(stream_format: str) -> None:
    """Race: 50 clients cancel mid-stream, while the server writes or the model computes; half of
    them had half-closed first. Every model generator must see the cancellation (GeneratorExit or
    CancelledError) and the DataPlane's count of running streams must come back to 0."""
    clients = 50
    async with serving(ENDLESS, grpc_stream_format=stream_format) as server:
        model = endless_model(server)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            call_stream = stream_call(channel, stream_format)

            async def leave_after(k: int, events: int) -> None:
                call = call_stream()
                await call.write(endless_request(f"c{k}"))
                if k % 2:
                    await call.done_writing()
                for _ in range(events):
                    assert infer_response(await call.read()).id == f"c{k}"
                call.cancel()

            await asyncio.gather(*(leave_after(k, 1 + k % 7) for k in range(clients)))
        await asyncio.wait_for(model.all_closed.wait(), 30)
        await asyncio.wait_for(server.dataplane.streams.wait_idle(), 30)
        assert (model.started, model.cancelled, model.active) == (clients, clients, 0)
        assert (server.dataplane.streams.active, server.dataplane.streams.total) == (0, clients)


async def test_streams_open_at_shutdown_close_before_their_model_unloads() -> None:
    """Race: the server stops while a gRPC stream runs; after the grace period the call is
    cancelled, and the model's generator is closed before the model is unloaded."""
    async with serving(ENDLESS, grace=0.5) as server:
        model = endless_model(server)
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}")
        try:
            call = stream_call(channel, "mlserver")()
            await call.write(endless_request("open"))
            await call.read()
            await server.stop()
            with pytest.raises(grpc.aio.AioRpcError):
                while True:
                    await call.read()
        finally:
            await channel.close()
        assert (model.cancelled, model.active_at_unload) == (1, 0)
        assert server.dataplane.streams.active == 0


# ---------------------------------------------------------------------- back-pressure

FIXED_WINDOW = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 64 * 1024)]


@pytest.mark.parametrize("stream_format", FORMATS)
async def test_a_client_that_stops_reading_holds_the_model_back(stream_format: str) -> None:
    """A reader that stops reading stops the model, after at most a few bounded buffers.

    The client's channel has a fixed HTTP/2 window of 64 KiB (BDP probing off), so the bound is
    exact whatever the network: with 64 KiB messages, what may sit between the model and a paused
    reader is one message received by the client's transport, one in flight in the window, the one
    the server is writing and the one in the model's hand, with margin (6); in Triton's format,
    also the replies waiting for the transport (``BUFFERED``), the one the request's task holds,
    and the response held back to learn whether it is the request's last. Without back-pressure
    the endless model would produce for as long as the reader pauses. (With a channel's default
    options, grpc grows the window by BDP probing to a few MiB; the model then stops after that.)
    """
    size = 64 * 1024
    bound = 6 + (BUFFERED + 2 if stream_format == "triton" else 0)
    async with serving(ENDLESS, grpc_stream_format=stream_format) as server:
        model = endless_model(server)
        address = f"127.0.0.1:{server.grpc_port}"
        async with grpc.aio.insecure_channel(address, options=FIXED_WINDOW) as channel:
            call = stream_call(channel, stream_format)()
            await call.write(endless_request("slow", size=size))
            received = 0
            for _ in range(3):
                await call.read()
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
            assert model.yielded - received <= bound, (model.yielded, received, bound)
            paused_at = model.yielded
            for _ in range(3 * bound):  # reading again lets the model go on
                response = infer_response(await call.read())
                received += 1
                assert response.outputs[0].contents.bytes_contents == [b"x" * size]
            assert model.yielded > paused_at
            call.cancel()
        await asyncio.wait_for(model.all_closed.wait(), 30)
        assert model.cancelled == 1


async def stream_of(*requests: pb.ModelInferRequest) -> AsyncIterator[pb.ModelInferRequest]:
    for request in requests:
        yield request


async def test_an_asyncio_stub_with_an_async_request_iterator(streaming_server: RunningServer) -> None:
    """The generated stub on an asyncio channel, fed by an async generator (how asyncio clients stream)."""
    async with grpc.aio.insecure_channel(streaming_server.grpc_address) as channel:
        stub = dataplane_pb2_grpc.GRPCInferenceServiceStub(channel)
        call = stub.ModelStreamInfer(stream_of(counter_request(3, "x"), counter_request(2, "y")))
        got = [(r.id, counted(r)) async for r in call]
    assert got == [("x", 0), ("x", 1), ("x", 2), ("y", 0), ("y", 1)]
