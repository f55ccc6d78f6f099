"""Triton's clients against the server: tritonclient.grpc unchanged, and Triton-format streams."""

from __future__ import annotations

import queue
from collections.abc import AsyncIterator, Iterator
from typing import Any, cast

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
import tritonclient.grpc.aio as triton_aio
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.grpc_support import serving_copy, wait_for_log
from tests.servers import RunningServer


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    folder = tmp_path_factory.mktemp("grpc-triton") / "models"
    with serving_copy(folder, "--grpc-stream-format", "triton") as running:
        yield running


@pytest.fixture(scope="module")
def client(server: RunningServer) -> Iterator[triton.InferenceServerClient]:
    client = triton.InferenceServerClient(server.grpc_address)
    yield client
    client.close()


def tensor(name: str, array: np.ndarray, datatype: str | None = None) -> triton.InferInput:
    inp = triton.InferInput(name, list(array.shape), datatype or triton_datatype(array))
    inp.set_data_from_numpy(array)
    return inp


def triton_datatype(array: np.ndarray) -> str:
    from tritonclient.utils import np_to_triton_dtype

    return cast(str, np_to_triton_dtype(array.dtype))


def test_health_and_metadata(client: triton.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("mirror") and client.is_model_ready("mirror", "1")
    assert "binary_tensor_data" in client.get_server_metadata().extensions
    meta = client.get_model_metadata("strict", as_json=True)
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": ["-1", "2"]}]
    with pytest.raises(InferenceServerException) as info:
        client.is_model_ready("nope")
    assert info.value.status() == "StatusCode.NOT_FOUND"


ARRAYS = [
    np.array([[True, False]]),
    np.arange(-3, 3, dtype=np.int8),
    np.arange(6, dtype=np.uint16).reshape(2, 3),
    np.array([2**64 - 1, 0], dtype=np.uint64),
    np.array([-(2**63), 2**63 - 1], dtype=np.int64),
    np.linspace(0, 1, 4, dtype=np.float16),
    np.linspace(0, 1, 4, dtype=np.float32).reshape(2, 2),
    np.array([1e-300, 1e300]),
    np.array([b"hello", b"", "héllo".encode()], dtype=object),
]


@pytest.mark.parametrize("array", ARRAYS, ids=lambda a: str(a.dtype))
def test_infer_every_datatype(client: triton.InferenceServerClient, array: np.ndarray) -> None:
    result = client.infer("mirror", [tensor("x", array)], request_id="dt")
    out = result.as_numpy("x")
    assert out.dtype == array.dtype and out.shape == array.shape
    assert out.tolist() == array.tolist()
    assert result.get_response().id == "dt"


def test_infer_many_inputs_and_requested_outputs(client: triton.InferenceServerClient) -> None:
    inputs = [tensor("a", np.ones((2, 2), np.float32)), tensor("b", np.array([b"x"], dtype=object))]
    result = client.infer("mirror", inputs, outputs=[triton.InferRequestedOutput("b")])
    assert [o.name for o in result.get_response().outputs] == ["b"]
    assert result.as_numpy("b").tolist() == [b"x"]


def test_parameters_tritonclient_can_send_come_back_in_kind(client: triton.InferenceServerClient) -> None:
    result = client.infer(
        "mirror",
        [tensor("x", np.zeros(1, np.int32))],
        parameters={"text": "t", "flag": True, "count": -7},
        priority=2**64 - 2,
        timeout=1_000_000,
    )
    params = result.get_response().parameters
    kinds = {
        key: (value.WhichOneof("parameter_choice"), getattr(value, value.WhichOneof("parameter_choice")))
        for key, value in params.items()
    }
    assert kinds == {
        "text": ("string_param", "t"),
        "flag": ("bool_param", True),
        "count": ("int64_param", -7),
        "priority": ("uint64_param", 2**64 - 2),
        "timeout": ("int64_param", 1_000_000),
    }


def test_triton_messages_typed_and_double_parameters(server: RunningServer) -> None:
    """tritonclient's own messages and stub, with what its high-level client cannot send."""
    request = service_pb2.ModelInferRequest(model_name="mirror", id="typed")
    tensor_ = request.inputs.add(name="x", datatype="FP64", shape=[3])
    tensor_.contents.fp64_contents.extend([0.5, 1.5, 2.5])
    request.parameters["ratio"].double_param = 0.125
    request.parameters["big"].uint64_param = 3
    with grpc.insecure_channel(server.grpc_address) as channel:
        response = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request)
    assert list(response.outputs[0].contents.fp64_contents) == [0.5, 1.5, 2.5]
    assert response.parameters["ratio"].double_param == 0.125
    assert response.parameters["big"].WhichOneof("parameter_choice") == "uint64_param"


@pytest.mark.parametrize(
    ("model", "inputs", "parameters", "status"),
    [
        ("nope", [("x", np.zeros(1, np.float32))], None, "StatusCode.NOT_FOUND"),
        ("strict", [("x", np.zeros((1, 2), np.int32))], None, "StatusCode.INVALID_ARGUMENT"),
        ("mirror", [("x", np.zeros(1, np.float32))], {"fail": "model"}, "StatusCode.INTERNAL"),
        ("mirror", [("x", np.zeros(1, np.float32))], {"fail": "input"}, "StatusCode.INVALID_ARGUMENT"),
    ],
)
def test_errors_reach_tritonclient_with_their_status(
    client: triton.InferenceServerClient,
    model: str,
    inputs: list[tuple[str, np.ndarray]],
    parameters: dict[str, str] | None,
    status: str,
) -> None:
    with pytest.raises(InferenceServerException) as info:
        client.infer(model, [tensor(n, a) for n, a in inputs], parameters=parameters)
    assert info.value.status() == status
    assert info.value.message()


# ---------------------------------------------------------------------- Triton-format streams


def run_stream(
    client: triton.InferenceServerClient, requests: list[dict[str, Any]]
) -> list[tuple[triton.InferResult, InferenceServerException | None]]:
    """Send every request on one stream, half-close, and return all (result, error) callbacks."""
    got: queue.Queue[tuple[triton.InferResult, InferenceServerException | None]] = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        for request in requests:
            client.async_stream_infer(**request)
    finally:
        client.stop_stream()  # half-closes, then waits for the server to end the call
    return [got.get_nowait() for _ in range(got.qsize())]


def final_flag(result: triton.InferResult) -> bool:
    return bool(result.get_response().parameters["triton_final_response"].bool_param)


def test_stream_answers_every_request_with_final_flags(client: triton.InferenceServerClient) -> None:
    requests = [
        {"model_name": "mirror", "inputs": [tensor("x", np.full(2, i, np.int32))], "request_id": f"s-{i}"}
        for i in range(6)
    ]
    got = run_stream(client, requests)
    assert all(error is None for _, error in got)
    by_id = {result.get_response().id: result for result, _ in got}
    assert sorted(by_id) == [f"s-{i}" for i in range(6)]
    for i in range(6):
        assert by_id[f"s-{i}"].as_numpy("x").tolist() == [i, i]
        assert final_flag(by_id[f"s-{i}"]) is True


def test_stream_sends_an_empty_final_response_only_when_asked(client: triton.InferenceServerClient) -> None:
    x = [tensor("x", np.ones(1, np.float32))]
    got = run_stream(
        client,
        [
            {"model_name": "mirror", "inputs": x, "request_id": "asked", "enable_empty_final_response": True},
            {"model_name": "mirror", "inputs": x, "request_id": "plain"},
        ],
    )
    seen = sorted((r.get_response().id, final_flag(r), len(r.get_response().outputs)) for r, _ in got)
    assert seen == [("asked", False, 1), ("asked", True, 0), ("plain", True, 1)]
    # the data response of "asked" comes before its empty final one
    asked = [r for r, _ in got if r.get_response().id == "asked"]
    assert [final_flag(r) for r in asked] == [False, True]


def test_stream_errors_are_in_band_and_the_stream_goes_on(client: triton.InferenceServerClient) -> None:
    x = [tensor("x", np.ones(1, np.float32))]
    got = run_stream(
        client,
        [
            {"model_name": "nope", "inputs": x, "request_id": "unknown"},
            {"model_name": "mirror", "inputs": x, "request_id": "broken", "parameters": {"fail": "model"}},
            {"model_name": "strict", "inputs": x, "request_id": "bad-shape"},
            {"model_name": "mirror", "inputs": x, "request_id": "fine"},
        ],
    )
    errors = sorted(str(error) for _, error in got if error is not None)
    assert len(errors) == 3
    assert any("Model 'nope' not found" in e for e in errors)
    assert any("RuntimeError: mirror was told to break" in e for e in errors)
    assert any("Input 'x' must have shape" in e for e in errors)
    results = [result for result, error in got if error is None]
    assert [r.get_response().id for r in results] == ["fine"]
    assert results[0].as_numpy("x").tolist() == [1.0]


def test_stream_error_names_the_failed_request(server: RunningServer) -> None:
    """Triton's clients correlate an in-band error by infer_response.id."""
    requests = [service_pb2.ModelInferRequest(model_name="nope", id="which")]
    with grpc.insecure_channel(server.grpc_address) as channel:
        responses = list(service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(iter(requests)))
    assert len(responses) == 1
    assert responses[0].error_message == "Model 'nope' not found"
    assert responses[0].infer_response.id == "which"


@pytest.mark.anyio
async def test_asyncio_client_streams(server: RunningServer) -> None:
    client = triton_aio.InferenceServerClient(server.grpc_address)

    async def requests() -> AsyncIterator[dict[str, Any]]:
        for i in range(4):
            yield {
                "model_name": "mirror",
                "inputs": [tensor("x", np.full(1, i, np.int64))],
                "request_id": f"a-{i}",
            }

    try:
        got = {}
        async for result, error in client.stream_infer(requests()):
            assert error is None
            got[result.get_response().id] = result.as_numpy("x").tolist()
            if len(got) == 4:
                break
        assert got == {f"a-{i}": [i] for i in range(4)}
    finally:
        await client.close()


def test_cancelling_a_stream_cancels_its_requests(
    server: RunningServer, client: triton.InferenceServerClient
) -> None:
    """Race guarded: tritonclient cancels the stream while a request is inside the model."""
    got: queue.Queue[tuple[object, object]] = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        client.async_stream_infer(
            "mirror", [tensor("x", np.ones(1, np.float32))], request_id="held", parameters={"hold_ms": 60_000}
        )
        wait_for_log(server, "mirror holds request held")
    finally:
        client.stop_stream(cancel_requests=True)
    wait_for_log(server, "mirror request held was cancelled")
    assert client.is_server_ready()


def test_each_triton_request_is_a_model_stream_of_its_own(client: triton.InferenceServerClient) -> None:
    """Triton's streams are per request: a stream model sees one request and answers it alone."""
    got = run_stream(
        client,
        [
            {"model_name": "accumulate", "inputs": [tensor("x", np.array([float(v)]))], "request_id": f"r{v}"}
            for v in (1, 2)
        ],
    )
    answers = {r.get_response().id: (r.as_numpy("total").tolist(), final_flag(r)) for r, _ in got}
    assert answers == {"r1": ([1.0], True), "r2": ([2.0], True)}
