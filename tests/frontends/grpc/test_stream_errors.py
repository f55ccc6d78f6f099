"""A malformed request on ModelStreamInfer is answered in band and the stream goes on.

[good, malformed, good] on one bidirectional stream, in both wire formats, through grpcio's stubs
and tritonclient's stream API: the malformed request (raw contents whose length does not fit its
shape and datatype) gets an INVALID_ARGUMENT error naming the input, tagged with its id; the
requests around it are answered; the call ends OK.
"""

from __future__ import annotations

import asyncio
import queue
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton

from runtime.frontends.grpc.generated import dataplane_pb2 as pb
from tests.frontends.grpc.test_stream_rpc import COUNTER, counted, stream_call
from tests.grpc_support import raw_request
from tests.servers import serving

pytestmark = pytest.mark.anyio


def requests() -> list[pb.ModelInferRequest]:
    bad = raw_request("counter", "bad", n=np.array([2], np.int32))
    bad.raw_input_contents[0] = b"\x02\x00\x00"  # 3 bytes for one INT32
    return [
        raw_request("counter", "first", n=np.array([2], np.int32)),
        bad,
        raw_request("counter", "third", n=np.array([2], np.int32)),
    ]


def answered(messages: list[Any]) -> dict[str, list[Any]]:
    by_id: dict[str, list[Any]] = {}
    for message in messages:
        infer = message.infer_response if isinstance(message, pb.ModelStreamInferResponse) else message
        by_id.setdefault(infer.id, []).append(message)
    return by_id


async def test_mlserver_format_answers_a_malformed_request_in_band_and_goes_on() -> None:
    async with serving(COUNTER) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            call = stream_call(channel, "mlserver")(iter(requests()))
            messages = [message async for message in call]
            assert await call.code() == grpc.StatusCode.OK
    by_id = answered(messages)
    assert sorted(by_id) == ["bad", "first", "third"]
    (error,) = by_id["bad"]
    assert error.parameters["error_code"].string_param == "INVALID_ARGUMENT"
    assert "Input 'n'" in error.parameters["error"].string_param
    assert not error.outputs
    for good in ("first", "third"):
        assert [counted(m) for m in by_id[good]] == [0, 1]
        assert all("error" not in m.parameters for m in by_id[good])


async def test_triton_format_answers_a_malformed_request_in_band_and_goes_on() -> None:
    async with serving(COUNTER, grpc_stream_format="triton") as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            call = stream_call(channel, "triton")(iter(requests()))
            messages = [message async for message in call]
            assert await call.code() == grpc.StatusCode.OK
    by_id = answered(messages)
    assert sorted(by_id) == ["bad", "first", "third"]
    (error,) = by_id["bad"]
    assert "Input 'n'" in error.error_message and "bytes" in error.error_message
    assert error.infer_response.parameters["triton_final_response"].bool_param is True
    for good in ("first", "third"):
        assert [m.error_message for m in by_id[good]] == ["", ""]
        assert [counted(m.infer_response) for m in by_id[good]] == [0, 1]


def tritonclient_stream(address: str) -> list[tuple[Any, Any]]:
    """[good, malformed, good] through tritonclient's start_stream / async_stream_infer."""
    got: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = triton.InferenceServerClient(address)
    try:
        client.start_stream(callback=lambda result, error: got.put((result, error)))
        for request_id in ("first", "bad", "third"):
            n = triton.InferInput("n", [1], "INT32")
            n.set_data_from_numpy(np.array([2], np.int32))
            if request_id == "bad":
                n._raw_content = b"\x02\x00\x00"  # what a broken client would send
            client.async_stream_infer("counter", [n], request_id=request_id)
        client.stop_stream()  # half-closes, then waits for the server to end the call
    finally:
        client.close()
    return [got.get_nowait() for _ in range(got.qsize())]


async def test_tritonclient_stream_gets_the_malformed_requests_error_and_the_next_answer() -> None:
    async with serving(COUNTER, grpc_stream_format="triton") as server:
        got = await asyncio.to_thread(tritonclient_stream, f"127.0.0.1:{server.grpc_port}")
    errors = [error for _, error in got if error is not None]
    assert len(errors) == 1
    assert "Input 'n'" in str(errors[0])
    results = [result.get_response() for result, error in got if error is None]
    assert sorted({r.id for r in results}) == ["first", "third"]
    for request_id in ("first", "third"):
        mine = [r for r in results if r.id == request_id]
        assert [int(np.frombuffer(r.raw_output_contents[0], np.int32)[0]) for r in mine] == [0, 1]
