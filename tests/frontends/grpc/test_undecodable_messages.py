"""A gRPC message that does not parse as protobuf is bad input, not a server failure.

Raw bytes through grpcio's generic stubs (no generated serializer on the client side): a unary
ModelInfer whose body is not a ModelInferRequest is answered INVALID_ARGUMENT with a message; on
ModelStreamInfer such a message is answered in band (both wire formats) and the next valid message
of the same stream is answered as usual. Each such message is logged on one line, with no
traceback (grpc's own "Unexpected [DecodeError]" traceback used to come with an UNKNOWN status).
"""

from __future__ import annotations

import logging
from typing import Any

import grpc
import numpy as np
import pytest

from runtime.frontends.grpc.generated import dataplane_pb2 as pb
from runtime.settings import ModelSettings
from tests.frontends.grpc.test_stream_rpc import COUNTER, counted, counter_request
from tests.grpc_support import raw_request
from tests.models import zoo
from tests.servers import serving

pytestmark = pytest.mark.anyio

SERVICE = "/inference.GRPCInferenceService"
ECHO = ModelSettings(name="echo", implementation=zoo.Echo)
CORRUPT = b"\xff\xff\xff\xff"
"""Not a protobuf message: field number 0x1fffffff... with a truncated varint."""


def _refusals(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "not a valid" in r.getMessage()]


def _assert_one_line_no_traceback(caplog: pytest.LogCaptureFixture, times: int = 1) -> None:
    assert len(_refusals(caplog)) == times, [r.getMessage() for r in caplog.records]
    assert all(r.exc_info is None for r in caplog.records), [r.getMessage() for r in caplog.records]
    assert not [r for r in caplog.records if "DecodeError" in r.getMessage() and r.levelno >= logging.ERROR]


async def test_unary_model_infer_answers_invalid_argument(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    async with serving(ECHO) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            infer = channel.unary_unary(
                f"{SERVICE}/ModelInfer",
                request_serializer=lambda data: data,
                response_deserializer=pb.ModelInferResponse.FromString,
            )
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await infer(CORRUPT)
            # the server goes on serving the same channel
            valid = raw_request("echo", "after", x=np.arange(3, dtype=np.float32))
            answer = await infer(valid.SerializeToString())
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = refused.value.details() or ""
    assert "not a valid inference.ModelInferRequest" in details, details
    assert answer.id == "after"
    assert np.frombuffer(answer.raw_output_contents[0], np.float32).tolist() == [0, 1, 2]
    _assert_one_line_no_traceback(caplog)


async def test_other_unary_methods_answer_invalid_argument(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    async with serving(COUNTER) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            metadata = channel.unary_unary(
                f"{SERVICE}/ModelMetadata",
                request_serializer=lambda data: data,
                response_deserializer=pb.ModelMetadataResponse.FromString,
            )
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await metadata(CORRUPT)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a valid inference.ModelMetadataRequest" in (refused.value.details() or "")
    _assert_one_line_no_traceback(caplog)


def _stream(channel: grpc.aio.Channel, stream_format: str) -> Any:
    response = pb.ModelStreamInferResponse if stream_format == "triton" else pb.ModelInferResponse
    return channel.stream_stream(
        f"{SERVICE}/ModelStreamInfer",
        request_serializer=lambda data: data,
        response_deserializer=response.FromString,
    )


@pytest.mark.parametrize("stream_format", ["mlserver", "triton"])
async def test_a_stream_answers_the_message_in_band_and_goes_on(
    stream_format: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    messages = [
        counter_request(1, "first").SerializeToString(),
        CORRUPT,
        counter_request(2, "third").SerializeToString(),
    ]
    async with serving(COUNTER, grpc_stream_format=stream_format) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            call = _stream(channel, stream_format)(iter(messages))
            got = [message async for message in call]
            assert await call.code() == grpc.StatusCode.OK
    if stream_format == "triton":
        errors = [m for m in got if m.error_message]
        (error,) = errors
        assert "not a valid inference.ModelInferRequest" in error.error_message
        assert error.infer_response.parameters["triton_final_response"].bool_param is True
        answers = [m.infer_response for m in got if not m.error_message]
    else:
        errors = [m for m in got if "error" in m.parameters]
        (error,) = errors
        assert error.parameters["error_code"].string_param == "INVALID_ARGUMENT"
        assert "not a valid inference.ModelInferRequest" in error.parameters["error"].string_param
        answers = [m for m in got if "error" not in m.parameters]
    assert sorted((a.id, counted(a)) for a in answers) == [("first", 0), ("third", 0), ("third", 1)]
    _assert_one_line_no_traceback(caplog)


async def test_the_access_log_names_nothing_for_such_a_message(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    async with serving(COUNTER, access_log=True) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            infer = channel.unary_unary(f"{SERVICE}/ModelInfer", request_serializer=lambda data: data)
            with pytest.raises(grpc.aio.AioRpcError):
                await infer(CORRUPT)
            call = _stream(channel, "mlserver")(
                iter([CORRUPT, counter_request(1, "next").SerializeToString()])
            )
            got = [message async for message in call]
    assert [m.id for m in got] == ["", "next"]
    lines = {r.route: r for r in caplog.records if hasattr(r, "route")}  # the access log's records
    unary = lines[f"{SERVICE}/ModelInfer"]
    assert (unary.status, unary.model) == ("INVALID_ARGUMENT", None)  # type: ignore[attr-defined]
    stream = lines[f"{SERVICE}/ModelStreamInfer"]
    assert (stream.status, stream.model) == ("OK", "counter")  # type: ignore[attr-defined]
    _assert_one_line_no_traceback(caplog, times=2)
