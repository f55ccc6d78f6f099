"""Limits a real server keeps, seen from its clients (REST and gRPC on a subprocess).

Request deadlines (a model's ``request_timeout``, a request's OIP ``timeout``), the bound on work
in flight for a model without batching, a plain ``predict`` that blocks (run on threads), an
``async`` one that blocks the loop (named in the log), odd input (a huge model name, raw contents
that do not fit), and requests still running when the shutdown grace period ends.
"""

from __future__ import annotations

import concurrent.futures
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest

from runtime.frontends.grpc.generated import dataplane_pb2 as pb
from tests.grpc_support import inference_stub, raw_request
from tests.servers import RunningServer, start_server

LIMITS = Path(__file__).resolve().parents[1] / "models" / "limits"


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    running = start_server(LIMITS)
    try:
        yield running
    finally:
        running.stop()


def body(seconds: float, **parameters: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"inputs": [{"name": "x", "shape": [1], "datatype": "FP64", "data": [seconds]}]}
    if parameters:
        doc["parameters"] = parameters
    return doc


def post(server: RunningServer, model: str, doc: dict[str, Any], timeout: float = 60) -> httpx.Response:
    return httpx.post(f"{server.http_url}/v2/models/{model}/infer", json=doc, timeout=timeout)


def grpc_infer(server: RunningServer, model: str, seconds: float, **parameters: int) -> pb.ModelInferResponse:
    request = raw_request(model, x=np.array([seconds], dtype=np.float64))
    for key, value in parameters.items():
        request.parameters[key].int64_param = value
    with inference_stub(server.grpc_address) as stub:
        response: pb.ModelInferResponse = stub.ModelInfer(request, timeout=60)
        return response


# ---------------------------------------------------------------------- odd input over gRPC


def test_a_huge_model_name_is_not_found_with_a_short_message(server: RunningServer) -> None:
    name = "m" * 20_000
    with inference_stub(server.grpc_address) as stub, pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(pb.ModelInferRequest(model_name=name), timeout=30)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    details = caught.value.details()
    assert "not found" in details and "20000 characters" in details and len(details) < 1000
    rest = httpx.get(f"{server.http_url}/v2/models/{name}", timeout=30)
    assert rest.status_code == 404 and len(rest.json()["error"]) < 1000


@pytest.mark.parametrize(
    ("datatype", "shape", "raw"),
    [
        ("FP32", [4], b"\0" * 7),
        ("INT64", [2, 2], b"\0" * 40),
        ("BOOL", [3], b"\0"),
        ("BYTES", [1], b"\x09\0\0\0ab"),
    ],
)
def test_raw_contents_that_do_not_fit_the_shape_are_invalid_argument(
    server: RunningServer, datatype: str, shape: list[int], raw: bytes
) -> None:
    request = pb.ModelInferRequest(model_name="hang")
    request.inputs.add(name="x", datatype=datatype, shape=shape)
    request.raw_input_contents.append(raw)
    with inference_stub(server.grpc_address) as stub, pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(request, timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'x'" in caught.value.details()


# ---------------------------------------------------------------------- deadlines


def test_the_model_request_timeout_answers_503_and_cancels_the_model(server: RunningServer) -> None:
    started = time.monotonic()
    answer = post(server, "timed", body(30))
    assert time.monotonic() - started < 20
    assert answer.status_code == 503
    assert "timed out" in answer.json()["error"] and "0.3s" in answer.json()["error"]
    assert answer.headers["retry-after"] == "1"
    server.wait_for_log("model timed was cancelled")


def test_the_timeout_parameter_bounds_a_direct_request_on_rest_and_grpc(server: RunningServer) -> None:
    answer = post(server, "hang", body(30, timeout=200_000))  # microseconds, as Triton
    assert answer.status_code == 503 and "timed out" in answer.json()["error"]
    with pytest.raises(grpc.RpcError) as caught:
        grpc_infer(server, "hang", 30, timeout=200_000)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "timed out" in caught.value.details()
    assert ("retry-after", "1") in tuple(caught.value.trailing_metadata() or ())
    assert post(server, "hang", body(30, timeout="soon")).status_code == 400
    assert post(server, "hang", body(0.01, timeout=30_000_000)).status_code == 200


def test_a_batch_whose_only_caller_timed_out_is_cancelled(server: RunningServer) -> None:
    """Guards: a hung batch nobody waits for any more must not hold the model (nor shutdown)."""
    answer = post(server, "batched", body(30, timeout=300_000))
    assert answer.status_code == 503 and "timeout" in answer.json()["error"]
    server.wait_for_log("model batched was cancelled")


# ---------------------------------------------------------------------- bounded work in flight


def test_max_queue_size_bounds_the_requests_in_a_model_without_batching(server: RunningServer) -> None:
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        held = pool.submit(post, server, "bounded", body(30, timeout=3_000_000))
        server.wait_for_log("model bounded holds a request")
        refused = post(server, "bounded", body(0.01))
        assert refused.status_code == 503
        assert "max_queue_size" in refused.json()["error"]
        assert refused.headers["retry-after"] == "1"
        with pytest.raises(grpc.RpcError) as caught:
            grpc_infer(server, "bounded", 0.01)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert held.result().status_code == 503  # its own timeout ended it
    assert post(server, "bounded", body(0.01)).status_code == 200


def test_every_front_ends_try_later_503_carries_retry_after(server: RunningServer) -> None:
    """TorchServe's REST and gRPC inference APIs and KServe V1 say "try later" as OIP does."""
    from runtime.frontends.grpc.generated import ts_inference_pb2, ts_inference_pb2_grpc

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        held = pool.submit(post, server, "bounded", body(31, timeout=10_000_000))  # outlasts a busy machine
        # 31 s: this request's line, not the one an earlier test on this server left
        server.wait_for_log("model bounded holds a request for 31")
        for path, doc in (
            ("/predictions/bounded", {"data": [0]}),
            ("/v1/models/bounded:predict", {"instances": [[0]]}),
        ):
            refused = httpx.post(f"{server.http_url}{path}", json=doc, timeout=30)
            assert refused.status_code == 503, (path, refused.text)
            assert refused.headers.get("retry-after") == "1", path
        with grpc.insecure_channel(server.grpc_address) as channel:
            stub = ts_inference_pb2_grpc.InferenceAPIsServiceStub(channel)
            with pytest.raises(grpc.RpcError) as caught:
                stub.Predictions(
                    ts_inference_pb2.PredictionsRequest(model_name="bounded", input={"data": b"0"}),
                    timeout=30,
                )
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert ("retry-after", "1") in tuple(caught.value.trailing_metadata() or ())
        assert held.result().status_code == 503  # its own timeout ended it


# ---------------------------------------------------------------------- blocking models


def test_a_blocking_plain_predict_runs_off_the_loop_and_health_stays_fast(server: RunningServer) -> None:
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        computing = pool.submit(post, server, "blocking", body(3))
        server.wait_for_log("model blocking computes for 3")
        started = time.monotonic()
        ready = httpx.get(f"{server.http_url}/v2/health/ready", timeout=30)
        took = time.monotonic() - started
        answer = computing.result()
    assert ready.status_code == 200
    assert took < 1.0, f"readiness took {took:.3f}s while a plain predict computed"
    assert answer.status_code == 200
    assert answer.json()["outputs"][0]["data"] == [3]


def test_an_async_predict_that_blocks_the_loop_is_named_in_the_log(server: RunningServer) -> None:
    assert post(server, "hog", body(1.5)).status_code == 200
    line = server.wait_for_log(r"event loop has been blocked for .* by model 'hog'")
    assert "model.py" in line


# ---------------------------------------------------------------------- shutdown


def test_requests_still_running_when_the_grace_period_ends_get_503_and_one_log_line() -> None:
    running = start_server(LIMITS, "--shutdown-grace-period", "0.5")
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            rest = pool.submit(post, running, "hang", body(30))
            running.wait_for_log("model hang holds a request")
            remote = pool.submit(grpc_infer, running, "hang", 30)
            _wait_count(running, "model hang holds a request", 2)
            running.process.send_signal(signal.SIGTERM)
            answer = rest.result(timeout=30)
            with pytest.raises(grpc.RpcError) as caught:
                remote.result(timeout=30)
    finally:
        code = running.stop()
    assert answer.status_code == 503
    assert answer.headers["content-type"] == "application/json"
    assert "shutting down" in answer.json()["error"]
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "shutting down" in caught.value.details()
    log = running.read_log()
    assert "Traceback" not in log
    assert log.count("still running when the shutdown grace period ended") == 2
    assert code == 0


def _wait_count(server: RunningServer, text: str, count: int) -> None:
    assert server._wait(lambda: server.read_log().count(text) >= count, 30), server.read_log()
