"""Sequences over gRPC: parameter kinds echoed, status codes, pipelined streams in both formats
(MLServer's and Triton's, the latter driven by tritonclient), cancellation; and tritonclient over HTTP."""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from typing import Any, cast

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from runtime.frontends.grpc.generated import dataplane_pb2 as pb
from runtime.frontends.grpc.generated import dataplane_pb2_grpc
from tests.conftest import TEST_MODELS
from tests.grpc_support import InferenceStub
from tests.servers import RunningServer, start_server


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    running = start_server(TEST_MODELS / "sequences")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def triton_server() -> Iterator[RunningServer]:
    running = start_server(TEST_MODELS / "sequences", "--grpc-stream-format", "triton")
    yield running
    running.stop()


@pytest.fixture
def stub(server: RunningServer) -> Iterator[dataplane_pb2_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(server.grpc_address) as channel:
        yield dataplane_pb2_grpc.GRPCInferenceServiceStub(channel)


def step(model: str, x: int, request_id: str = "", **params: Any) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model, id=request_id)
    request.inputs.add(name="x", datatype="INT64", shape=[1])
    request.raw_input_contents.append(np.array([x], np.int64).tobytes())
    for key, value in params.items():
        if isinstance(value, tuple):  # (kind, value), e.g. ("uint64_param", 5)
            setattr(request.parameters[key], value[0], value[1])
        elif isinstance(value, bool):
            request.parameters[key].bool_param = value
        elif isinstance(value, int):
            request.parameters[key].int64_param = value
        else:
            request.parameters[key].string_param = value
    return request


def total(response: pb.ModelInferResponse) -> int:
    assert "error" not in response.parameters, response.parameters["error"].string_param
    return int(np.frombuffer(response.raw_output_contents[0], np.int64)[0])


def test_ids_are_echoed_in_the_kind_the_client_used(stub: InferenceStub) -> None:
    for kind, value in (("int64_param", 101), ("uint64_param", 102), ("string_param", "g-103")):
        first = stub.ModelInfer(step("recorder", 2, sequence_id=(kind, value), sequence_start=True))
        assert total(first) == 2
        echoed = first.parameters["sequence_id"]
        assert echoed.WhichOneof("parameter_choice") == kind and getattr(echoed, kind) == value
        last = stub.ModelInfer(step("recorder", 3, sequence_id=(kind, value), sequence_end=True))
        assert total(last) == 5 and last.parameters["sequence_end"].bool_param is True


def test_sequence_errors_have_their_status_codes(stub: InferenceStub) -> None:
    with pytest.raises(grpc.RpcError) as unknown:
        stub.ModelInfer(step("recorder", 1, sequence_id="never-started"))
    assert unknown.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "sequence_start=true" in unknown.value.details()
    stub.ModelInfer(step("tiny", 1, sequence_id="only", sequence_start=True))
    with pytest.raises(grpc.RpcError) as full:
        stub.ModelInfer(step("tiny", 1, sequence_id="second", sequence_start=True))
    assert full.value.code() == grpc.StatusCode.UNAVAILABLE and "max_sequences" in full.value.details()
    stub.ModelInfer(step("tiny", 1, sequence_id="only", sequence_end=True))
    with pytest.raises(grpc.RpcError) as ended:
        stub.ModelInfer(step("tiny", 1, sequence_id="only"))
    assert ended.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "reason: end" in ended.value.details()


@pytest.mark.parametrize(
    "name, value",
    [("sequence_start", "yes"), ("sequence_start", 1), ("sequence_end", 1), ("sequence_end", "true")],
)
def test_sequence_flags_of_another_type_than_bool_are_refused_naming_them(
    server: RunningServer, stub: InferenceStub, name: str, value: Any
) -> None:
    body = {
        "parameters": {"sequence_id": "typed", name: value},
        "inputs": [{"name": "x", "datatype": "INT64", "shape": [1], "data": [1]}],
    }
    rest = httpx.post(f"{server.http_url}/v2/models/recorder/infer", json=body, timeout=30)
    assert rest.status_code == 400 and name in rest.json()["error"]
    with pytest.raises(grpc.RpcError) as refused:
        stub.ModelInfer(step("recorder", 1, sequence_id="typed", **{name: value}))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and name in refused.value.details()
    assert httpx.get(f"{server.http_url}/v2/health/ready").status_code == 200


def test_a_server_made_sequence_id_comes_from_secrets(
    stub: InferenceStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    import secrets

    from runtime import ids
    from runtime.sequences.identity import parse_control
    from runtime.types import Parameters

    made: list[int] = []
    real = secrets.randbits

    def spy(bits: int) -> int:
        made.append(real(bits))
        return made[-1]

    monkeypatch.setattr(secrets, "randbits", spy)
    control = parse_control(Parameters(sequence_start=True))
    assert control is not None and control.generated and len(made) == 1
    assert control.key == f"seq-{ids._uuid_text(made[0])}"


def test_a_pipelined_mlserver_stream_keeps_order_and_reports_errors_for_their_request(
    stub: InferenceStub,
) -> None:
    """Race: forty requests of two interleaved sequences, plus two bad ones, written without waiting
    for answers; the server reads ahead, yet each sequence sees its requests in order, every answer
    carries its request's id, and an error is reported for the request that caused it."""
    requests = [step("recorder", 1, "a0", sequence_id="ma", sequence_start=True)]
    requests.append(step("recorder", 100, "b0", sequence_id="mb", sequence_start=True))
    for i in range(1, 20):
        requests.append(step("recorder", 1, f"a{i}", sequence_id="ma"))
        requests.append(step("recorder", 100, f"b{i}", sequence_id="mb"))
        if i == 10:
            requests.append(step("recorder", 1, "ghost", sequence_id="m-ghost"))
    requests.append(step("recorder", 1, "late", sequence_id="mb", sequence_start="maybe"))
    responses = list(stub.ModelStreamInfer(iter(requests)))
    assert [r.id for r in responses] == [r.id for r in requests]
    by_id = {r.id: r for r in responses}
    assert [total(by_id[f"a{i}"]) for i in range(20)] == list(range(1, 21))
    assert [total(by_id[f"b{i}"]) for i in range(20)] == [100 * i for i in range(1, 21)]
    for bad in ("ghost", "late"):
        assert by_id[bad].parameters["error_code"].string_param == "INVALID_ARGUMENT"
    assert "sequence_start=true" in by_id["ghost"].parameters["error"].string_param


def test_tritonclient_streams_sequences_in_triton_format(triton_server: RunningServer) -> None:
    """tritonclient's own sequence API (sequence_id / sequence_start / sequence_end) over a stream:
    three sequences interleaved, all requests sent before any answer is read."""
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(triton_server.grpc_address)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        plan = [(seq, value) for value in range(1, 9) for seq in (1001, 1002, 1003)]
        for seq, value in plan:
            x = grpcclient.InferInput("x", [1], "INT64")
            x.set_data_from_numpy(np.array([value * (seq - 1000)], np.int64))
            client.async_stream_infer(
                "recorder", [x], request_id=f"{seq}-{value}", sequence_id=seq,
                sequence_start=value == 1, sequence_end=value == 8,
            )  # fmt: skip
        results = {}
        for _ in plan:
            result, error = answers.get(timeout=30)
            assert error is None, error
            response = result.get_response()
            results[response.id] = (result.as_numpy("history").tolist(), response.parameters)
    finally:
        client.stop_stream()
        client.close()
    for seq in (1001, 1002, 1003):
        history, params = results[f"{seq}-8"]
        assert history == [value * (seq - 1000) for value in range(1, 9)]
        assert params["sequence_id"].int64_param == seq and params["sequence_end"].bool_param


def test_tritonclient_http_sequences(server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(server.http_address)
    try:
        sums = []
        for value in range(1, 5):
            x = httpclient.InferInput("x", [1], "INT64")
            x.set_data_from_numpy(np.array([value], np.int64))
            result = client.infer(
                "recorder", [x], sequence_id=77, sequence_start=value == 1, sequence_end=value == 4
            )
            sums.append(int(result.as_numpy("total")[0]))
        assert sums == [1, 3, 6, 10]
        assert result.get_response()["parameters"] == {"sequence_id": 77, "sequence_end": True}
    finally:
        client.close()


def test_a_cancelled_grpc_call_cancels_its_sequence(server: RunningServer, stub: InferenceStub) -> None:
    """Race: the gRPC client cancels a call whose request waits behind a running one of the same
    sequence; the sequence must be cancelled before the queued request reaches the model."""
    stats_url = f"{server.http_url}/v2/models/recorder"

    def stats() -> dict[str, Any]:
        return cast("dict[str, Any]", httpx.get(stats_url).json()["parameters"]["stats"])

    def wait_for(condition: Any) -> None:
        deadline = time.monotonic() + 20
        while not condition():
            assert time.monotonic() < deadline
            time.sleep(0.01)

    stub.ModelInfer(step("recorder", 1, sequence_id="gc", sequence_start=True))
    held = stub.ModelInfer.future(step("recorder", 1, sequence_id="gc", hold_s="1.0"))
    wait_for(lambda: stats()["running_requests"] == 1)
    doomed = stub.ModelInfer.future(step("recorder", 50, sequence_id="gc"))
    wait_for(lambda: stats()["queued_requests"] == 1)
    doomed.cancel()
    wait_for(lambda: stats()["queued_requests"] == 0)
    with pytest.raises(grpc.RpcError) as refused:
        stub.ModelInfer(step("recorder", 1, sequence_id="gc"))
    assert (
        refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        and "reason: cancel" in refused.value.details()
    )
    assert total(held.result(timeout=30)) == 2


def test_metadata_carries_the_sequence_and_step_numbers_make_steps_exactly_once(stub: InferenceStub) -> None:
    first, call = stub.ModelInfer.with_call(
        step("recorder", 4),
        metadata=(
            ("ts_request_sequence_id", "meta-1"),
            ("ts_request_sequence_start", "true"),
            ("sequence_step", "1"),
        ),
    )
    assert total(first) == 4 and first.parameters["sequence_id"].string_param == "meta-1"
    assert ("ts_request_sequence_id", "meta-1") in tuple(call.trailing_metadata())
    second = stub.ModelInfer(step("recorder", 3, sequence_id="meta-1", sequence_step=2))
    retried = stub.ModelInfer(step("recorder", 3, sequence_id="meta-1", sequence_step=2))
    assert total(second) == total(retried) == 7
    with pytest.raises(grpc.RpcError) as ahead:
        stub.ModelInfer(step("recorder", 1, sequence_id="meta-1", sequence_step=5))
    assert (
        ahead.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        and "sequence_step=3" in ahead.value.details()
    )
    stub.ModelInfer(step("recorder", 1, sequence_id="meta-1", sequence_end=True))
