"""The unary RPCs and MLServer-format streams on a real server, through the checked-in stubs."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import grpc
import numpy as np
import pytest
from google.protobuf.message import Message

from runtime.frontends.grpc.generated import dataplane_pb2 as pb
from runtime.frontends.grpc.generated import dataplane_pb2_grpc
from runtime.tensors import unpack_bytes
from tests.grpc_support import MAX_MESSAGE, InferenceStub, inference_stub, raw_request, wait_for_log
from tests.servers import RunningServer


@pytest.fixture(scope="module")
def stub(grpc_server: RunningServer) -> Iterator[dataplane_pb2_grpc.GRPCInferenceServiceStub]:
    with inference_stub(grpc_server.grpc_address) as stub:
        yield stub


def status_of(call: Callable[[Any], object], request: Message) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        call(request)
    return info.value.code(), info.value.details()


# ---------------------------------------------------------------------- health and metadata


def test_health_and_metadata(stub: InferenceStub) -> None:
    assert stub.ServerLive(pb.ServerLiveRequest()).live
    assert stub.ServerReady(pb.ServerReadyRequest()).ready
    assert stub.ModelReady(pb.ModelReadyRequest(name="mirror")).ready
    assert stub.ModelReady(pb.ModelReadyRequest(name="mirror", version="1")).ready
    meta = stub.ServerMetadata(pb.ServerMetadataRequest())
    assert meta.name == "mlserver-like" and "model_repository" in meta.extensions
    model = stub.ModelMetadata(pb.ModelMetadataRequest(name="strict"))
    assert (model.name, model.platform) == ("strict", "numpy")
    assert [(t.name, t.datatype, list(t.shape)) for t in model.inputs] == [("x", "FP32", [-1, 2])]
    assert [(t.name, t.datatype, list(t.shape)) for t in model.outputs] == [("y", "FP32", [-1, 2])]


@pytest.mark.parametrize(
    ("rpc", "request_"),
    [
        ("ModelReady", pb.ModelReadyRequest(name="nope")),
        ("ModelReady", pb.ModelReadyRequest(name="mirror", version="9")),
        ("ModelMetadata", pb.ModelMetadataRequest(name="nope")),
        ("ModelInfer", pb.ModelInferRequest(model_name="nope")),
    ],
)
def test_unknown_models_are_not_found(stub: InferenceStub, rpc: str, request_: Message) -> None:
    code, details = status_of(getattr(stub, rpc), request_)
    assert code is grpc.StatusCode.NOT_FOUND and "not found" in details


def test_a_model_that_failed_to_load_is_unavailable(stub: InferenceStub) -> None:
    assert not stub.ModelReady(pb.ModelReadyRequest(name="broken")).ready
    code, details = status_of(stub.ModelInfer, raw_request("broken", x=np.zeros(1, np.int8)))
    assert code is grpc.StatusCode.UNAVAILABLE and "broken on purpose" in details


# ---------------------------------------------------------------------- inference


def test_raw_request_is_answered_raw(stub: InferenceStub) -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    flags = np.array([True, False])
    request = raw_request("mirror", "r-1", x=x, flags=flags)
    request.inputs.add(name="text", datatype="BYTES", shape=[2])
    request.raw_input_contents.append(b"\x02\x00\x00\x00hi\x00\x00\x00\x00")
    response = stub.ModelInfer(request)
    assert (response.model_name, response.model_version, response.id) == ("mirror", "1", "r-1")
    assert [o.name for o in response.outputs] == ["x", "flags", "text"]
    assert all(not o.HasField("contents") for o in response.outputs)
    assert np.array_equal(np.frombuffer(response.raw_output_contents[0], np.float32).reshape(2, 3), x)
    assert np.frombuffer(response.raw_output_contents[1], np.bool_).tolist() == [True, False]
    assert unpack_bytes("text", response.raw_output_contents[2]).tolist() == [b"hi", b""]


def test_typed_request_is_answered_typed(stub: InferenceStub) -> None:
    request = pb.ModelInferRequest(model_name="strict", id="t-1")
    request.inputs.add(name="x", datatype="FP32", shape=[2, 2]).contents.fp32_contents.extend([1, 2, 3, 4])
    response = stub.ModelInfer(request)
    assert not response.raw_output_contents
    assert list(response.outputs[0].contents.fp32_contents) == [2, 4, 6, 8]
    assert list(response.outputs[0].shape) == [2, 2]


def test_requested_outputs_filter_the_response(stub: InferenceStub) -> None:
    request = raw_request("mirror", a=np.zeros(1, np.int8), b=np.ones(1, np.int8))
    request.outputs.add(name="b")
    response = stub.ModelInfer(request)
    assert [o.name for o in response.outputs] == ["b"] and response.raw_output_contents == [b"\x01"]
    assert response.id  # the server names a request that had no id


def test_parameters_of_every_kind_round_trip(stub: InferenceStub) -> None:
    request = raw_request("mirror", x=np.zeros(1, np.int32))
    for params in (request.parameters, request.inputs[0].parameters):
        params["b"].bool_param = True
        params["i"].int64_param = -(2**63)
        params["s"].string_param = "text"
        params["d"].double_param = 2.5
        params["u"].uint64_param = 2**64 - 1
        params["u_small"].uint64_param = 1
    response = stub.ModelInfer(request)
    assert response.parameters == request.parameters
    assert response.outputs[0].parameters == request.inputs[0].parameters
    assert response.parameters["u_small"].WhichOneof("parameter_choice") == "uint64_param"


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (raw_request("strict", x=np.zeros((2, 2), np.int32)), "must be FP32"),
        (raw_request("strict", x=np.zeros((2, 3), np.float32)), "must have shape"),
        (raw_request("strict", y=np.zeros((2, 2), np.float32)), "has no input"),
        (
            pb.ModelInferRequest(
                model_name="mirror",
                inputs=[{"name": "x", "datatype": "FP32", "shape": [2]}],
                raw_input_contents=[b"\0" * 4],
            ),
            "needs 8 bytes",
        ),
        (
            pb.ModelInferRequest(
                model_name="mirror",
                inputs=[{"name": "x", "datatype": "FP32", "shape": [-1]}],
                raw_input_contents=[b""],
            ),
            "negative dimension",
        ),
        (
            pb.ModelInferRequest(
                model_name="mirror", inputs=[{"name": "x", "datatype": "FP32", "shape": [3]}]
            ),
            "3 elements",
        ),
        (
            pb.ModelInferRequest(
                model_name="mirror", inputs=[{"name": "x", "datatype": "INT4", "shape": [1]}]
            ),
            "unknown datatype",
        ),
    ],
)
def test_bad_requests_are_invalid_argument(stub: InferenceStub, request_: Message, message: str) -> None:
    code, details = status_of(stub.ModelInfer, request_)
    assert code is grpc.StatusCode.INVALID_ARGUMENT
    assert message in details


@pytest.mark.parametrize(
    ("fail", "code", "message"),
    [
        ("input", grpc.StatusCode.INVALID_ARGUMENT, "mirror was told the input is bad"),
        ("model", grpc.StatusCode.INTERNAL, "RuntimeError: mirror was told to break"),
    ],
)
def test_model_errors_map_to_status_codes(
    stub: InferenceStub, fail: str, code: grpc.StatusCode, message: str
) -> None:
    request = raw_request("mirror", x=np.zeros(1, np.int32))
    request.parameters["fail"].string_param = fail
    got, details = status_of(stub.ModelInfer, request)
    assert got is code and message in details
    assert stub.ServerReady(pb.ServerReadyRequest()).ready


def test_messages_over_the_limit_are_resource_exhausted(stub: InferenceStub) -> None:
    request = raw_request("mirror", x=np.zeros(MAX_MESSAGE, np.uint8))
    code, _ = status_of(stub.ModelInfer, request)
    assert code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert stub.ServerLive(pb.ServerLiveRequest()).live


# ---------------------------------------------------------------------- MLServer-format streams


def stream_request(model: str, request_id: str, value: int, fail: str | None = None) -> pb.ModelInferRequest:
    request = raw_request(model, request_id, x=np.full((1, 2), value, np.float32))
    if fail:
        request.parameters["fail"].string_param = fail
    return request


def test_stream_answers_each_request_with_its_id(stub: InferenceStub) -> None:
    requests = [stream_request("mirror", f"s-{i}", i) for i in range(5)]
    responses = list(stub.ModelStreamInfer(iter(requests)))
    assert [r.id for r in responses] == [f"s-{i}" for i in range(5)]
    assert [np.frombuffer(r.raw_output_contents[0], np.float32)[0] for r in responses] == [0, 1, 2, 3, 4]


def test_stream_reports_errors_in_band_and_stays_open(stub: InferenceStub) -> None:
    requests = [
        stream_request("mirror", "ok-1", 1),
        stream_request("mirror", "bad-input", 2, fail="input"),
        stream_request("mirror", "ok-2", 3),
        stream_request("mirror", "broken", 4, fail="model"),
        stream_request("nope", "unknown", 5),
        raw_request("strict", "wrong-type", x=np.zeros((1, 2), np.int32)),
        stream_request("mirror", "ok-3", 7),
    ]
    responses = list(stub.ModelStreamInfer(iter(requests)))
    assert [r.id for r in responses] == [r.id for r in requests]
    errors = {
        r.id: (r.parameters["error_code"].string_param, r.parameters["error"].string_param)
        for r in responses
        if "error" in r.parameters
    }
    assert errors.keys() == {"bad-input", "broken", "unknown", "wrong-type"}
    assert errors["bad-input"][0] == "INVALID_ARGUMENT"
    assert errors["broken"] == ("INTERNAL", "Model 'mirror' failed: RuntimeError: mirror was told to break")
    assert errors["unknown"] == ("NOT_FOUND", "Model 'nope' not found")
    assert errors["wrong-type"] == ("INVALID_ARGUMENT", "Input 'x' must be FP32, got INT32")
    for response in responses:
        if response.id.startswith("ok"):
            assert len(response.outputs) == 1 and response.model_name == "mirror"
        else:
            assert not response.outputs


def test_stream_switches_models_between_requests(stub: InferenceStub) -> None:
    strict = pb.ModelInferRequest(model_name="strict", id="to-strict")
    strict.raw_input_contents.append(np.ones((1, 2), np.float32).tobytes())
    strict.inputs.add(name="x", datatype="FP32", shape=[1, 2])
    requests = [stream_request("mirror", "m-1", 1), strict, stream_request("mirror", "m-2", 2)]
    responses = list(stub.ModelStreamInfer(iter(requests)))
    assert [(r.id, r.model_name) for r in responses] == [
        ("m-1", "mirror"),
        ("to-strict", "strict"),
        ("m-2", "mirror"),
    ]
    assert np.frombuffer(responses[1].raw_output_contents[0], np.float32).tolist() == [2, 2]


def test_stream_answers_typed_requests_typed(stub: InferenceStub) -> None:
    typed = pb.ModelInferRequest(model_name="mirror", id="typed")
    typed.inputs.add(name="n", datatype="INT64", shape=[2]).contents.int64_contents.extend([5, -5])
    raw = stream_request("mirror", "raw", 1)
    responses = list(stub.ModelStreamInfer(iter([typed, raw, typed])))
    assert [bool(r.raw_output_contents) for r in responses] == [False, True, False]
    assert list(responses[0].outputs[0].contents.int64_contents) == [5, -5]


def test_half_closed_empty_stream_ends_cleanly(stub: InferenceStub) -> None:
    assert list(stub.ModelStreamInfer(iter([]))) == []


def test_response_headers_travel_as_trailing_metadata(stub: InferenceStub) -> None:
    request = raw_request("mirror", x=np.zeros(1, np.int32))
    request.parameters["reply_header"].string_param = "hello"
    response, call = stub.ModelInfer.with_call(request)
    assert ("x-mirror", "hello") in call.trailing_metadata()
    assert (
        "headers" not in response.parameters and response.parameters["reply_header"].string_param == "hello"
    )


def held(request_id: str, hold_ms: int = 60_000) -> pb.ModelInferRequest:
    request = stream_request("mirror", request_id, 0)
    request.parameters["hold_ms"].int64_param = hold_ms
    return request


def test_a_cancelled_call_cancels_the_model(grpc_server: RunningServer, stub: InferenceStub) -> None:
    """Race guarded: the client goes away while the model works; the work must stop, not finish."""
    call = stub.ModelInfer.future(held("unary-cancel"))
    wait_for_log(grpc_server, "mirror holds request unary-cancel")
    call.cancel()
    wait_for_log(grpc_server, "mirror request unary-cancel was cancelled")


def test_a_cancelled_stream_cancels_the_model(grpc_server: RunningServer, stub: InferenceStub) -> None:
    call = stub.ModelStreamInfer(iter([stream_request("mirror", "before", 1), held("stream-cancel")]))
    assert next(call).id == "before"
    wait_for_log(grpc_server, "mirror holds request stream-cancel")
    call.cancel()
    wait_for_log(grpc_server, "mirror request stream-cancel was cancelled")
    assert stub.ServerReady(pb.ServerReadyRequest()).ready


def test_a_stream_model_sees_the_requests_of_its_stream(stub: InferenceStub) -> None:
    """Consecutive requests for one model feed one model stream; when the model stops reading,
    the next request starts a new one. Each answer carries the id of the last request read."""

    def part(request_id: str, value: float, last: bool = False) -> pb.ModelInferRequest:
        request = raw_request("accumulate", request_id, x=np.array([value]))
        if last:
            request.parameters["last"].bool_param = True
        return request

    requests = [part("a", 1), part("b", 2), part("c", 3, last=True), part("d", 10), part("e", 20)]
    responses = list(stub.ModelStreamInfer(iter(requests)))
    assert [(r.id, np.frombuffer(r.raw_output_contents[0], np.float64).tolist()) for r in responses] == [
        ("c", [6.0]),
        ("e", [30.0]),
    ]
