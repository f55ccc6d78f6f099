"""Shapes no tensor can have get 400 / INVALID_ARGUMENT naming the input; zero dimensions with
empty data are valid (as in Triton); NaN and infinities cross JSON unchanged, both ways."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest

from runtime.frontends.grpc.generated import dataplane_pb2 as pb
from runtime.frontends.grpc.generated import dataplane_pb2_grpc
from tests.servers import RunningServer, start_server

MODELS = {
    "echo": {"implementation": "tests.models.zoo.Echo"},
    "batched": {"implementation": "tests.models.zoo.Echo", "max_batch_size": 4, "max_batch_time": 0.005},
}
BAD_SHAPES = [
    [-1],
    [2, -3],
    [0, 2**63 - 1],
    [0, 2**62, 2**62],
    [2**62, 0],
    [2**40, 2**40],
    [2**31, 2**33],
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("shapes")
    for name, settings in MODELS.items():
        (repo / name).mkdir()
        (repo / name / "model-settings.json").write_text(json.dumps(settings))
    running = start_server(Path(repo))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server: RunningServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.http_url, timeout=30) as client:
        yield client


def _tensor(shape: list[int], data: list[Any], datatype: str = "FP32") -> dict[str, Any]:
    return {"name": "the_input", "shape": shape, "datatype": datatype, "data": data}


@pytest.mark.parametrize("model", ["echo", "batched"])
@pytest.mark.parametrize("datatype", ["FP32", "BYTES"])
@pytest.mark.parametrize("shape", BAD_SHAPES, ids=str)
def test_impossible_shapes_get_400_naming_the_input(
    client: httpx.Client, model: str, datatype: str, shape: list[int]
) -> None:
    response = client.post(f"/v2/models/{model}/infer", json={"inputs": [_tensor(shape, [], datatype)]})
    assert response.status_code == 400, response.text
    assert "the_input" in response.json()["error"]


@pytest.mark.parametrize("shape", BAD_SHAPES, ids=str)
def test_impossible_shapes_get_invalid_argument_over_grpc(server: RunningServer, shape: list[int]) -> None:
    with grpc.insecure_channel(server.grpc_address) as channel:
        stub = dataplane_pb2_grpc.GRPCInferenceServiceStub(channel)
        for raw in (True, False):
            request = pb.ModelInferRequest(model_name="echo")
            tensor = request.inputs.add(name="the_input", datatype="FP32", shape=shape)
            if raw:
                request.raw_input_contents.append(b"")
            else:
                tensor.contents.fp32_contents.extend([1.0])
            with pytest.raises(grpc.RpcError) as refused:
                stub.ModelInfer(request, timeout=30)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "the_input" in (refused.value.details() or "")


TOO_MANY = [[1] * 33, [1] * 65]
"""More dimensions than any tensor may have (32, numpy 1's limit; numpy 2's is 64)."""


def _binary(shape: list[int]) -> tuple[bytes, dict[str, str]]:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "the_input",
                    "shape": shape,
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": 4},
                }
            ]
        }
    ).encode()
    return header + np.float32(1).tobytes(), {"Inference-Header-Content-Length": str(len(header))}


@pytest.mark.parametrize("model", ["echo", "batched"])
@pytest.mark.parametrize("shape", TOO_MANY, ids=len)
def test_too_many_dimensions_get_400_naming_the_input_over_rest(
    client: httpx.Client, model: str, shape: list[int]
) -> None:
    as_json = client.post(f"/v2/models/{model}/infer", json={"inputs": [_tensor(shape, [1.0])]})
    content, headers = _binary(shape)
    binary = client.post(f"/v2/models/{model}/infer", content=content, headers=headers)
    for response in (as_json, binary):
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert "the_input" in error and f"{len(shape)} dimensions" in error and "32" in error


@pytest.mark.parametrize("shape", TOO_MANY, ids=len)
def test_too_many_dimensions_get_invalid_argument_over_grpc(server: RunningServer, shape: list[int]) -> None:
    with grpc.insecure_channel(server.grpc_address) as channel:
        stub = dataplane_pb2_grpc.GRPCInferenceServiceStub(channel)
        for raw in (True, False):
            request = pb.ModelInferRequest(model_name="echo")
            tensor = request.inputs.add(name="the_input", datatype="FP32", shape=shape)
            if raw:
                request.raw_input_contents.append(np.float32(1).tobytes())
            else:
                tensor.contents.fp32_contents.extend([1.0])
            with pytest.raises(grpc.RpcError) as refused:
                stub.ModelInfer(request, timeout=30)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            details = refused.value.details() or ""
            assert "the_input" in details and f"{len(shape)} dimensions" in details


def test_tritonclient_gets_the_dimension_limit_on_both_protocols(server: RunningServer) -> None:
    tritonhttp = pytest.importorskip("tritonclient.http", reason="tritonclient[http] is not installed")
    tritongrpc = pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] is not installed")
    from tritonclient.utils import InferenceServerException

    array = np.ones([1] * 33, np.float32)
    for module, url in ((tritonhttp, server.http_address), (tritongrpc, server.grpc_address)):
        client = module.InferenceServerClient(url)
        try:
            tensor = module.InferInput("the_input", list(array.shape), "FP32")
            tensor.set_data_from_numpy(array)
            with pytest.raises(InferenceServerException) as refused:
                client.infer("echo", [tensor])
        finally:
            client.close()
        assert "the_input" in str(refused.value) and "33 dimensions" in str(refused.value)


def test_zero_dimensions_with_empty_data_are_valid(client: httpx.Client) -> None:
    for shape in ([0], [0, 3], [4, 0]):
        response = client.post("/v2/models/echo/infer", json={"inputs": [_tensor(shape, [])]})
        assert response.status_code == 200, response.text
        assert response.json()["outputs"][0]["shape"] == shape and response.json()["outputs"][0]["data"] == []
    mismatch = client.post("/v2/models/echo/infer", json={"inputs": [_tensor([0], [1.0])]})
    assert mismatch.status_code == 400 and "the_input" in mismatch.json()["error"]
    assert (client.get("/v2/health/ready")).status_code == 200


def test_nan_and_infinities_cross_json_unchanged(client: httpx.Client) -> None:
    values = [1.5, math.nan, math.inf, -math.inf, 0.1]
    body = json.dumps({"inputs": [_tensor([5], values, "FP64")]})  # Python writes NaN / Infinity
    assert "NaN" in body and "-Infinity" in body
    response = client.post("/v2/models/echo/infer", content=body)
    assert response.status_code == 200, response.text
    assert b"[1.5,NaN,Infinity,-Infinity,0.1]" in response.content
    data = json.loads(response.content)["outputs"][0]["data"]
    assert data[0] == 1.5 and math.isnan(data[1]) and data[2:] == [math.inf, -math.inf, 0.1]
    # FP32 and FP16 too
    for datatype, dtype in (("FP32", np.float32), ("FP16", np.float16)):
        sent = json.dumps({"inputs": [_tensor([3], [math.nan, math.inf, 0.25], datatype)]})
        got = client.post("/v2/models/echo/infer", content=sent)
        assert got.status_code == 200, got.text
        out = np.array(json.loads(got.content)["outputs"][0]["data"], dtype)
        assert np.isnan(out[0]) and out[1] == np.inf and out[2] == dtype(0.25)


def test_the_binary_extension_keeps_non_finite_values_exact(client: httpx.Client) -> None:
    values = np.array([math.nan, math.inf, -math.inf, -0.0, 3.25], np.float32)
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "the_input",
                    "shape": [5],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": values.nbytes},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    response = client.post(
        "/v2/models/echo/infer",
        content=header + values.tobytes(),
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert response.status_code == 200, response.text
    size = int(response.headers["inference-header-content-length"])
    assert response.content[size:] == values.tobytes()


def test_malformed_json_is_still_refused(client: httpx.Client) -> None:
    for body in (b'{"inputs": [NaNa]}', b'{"inputs": Infinity', b"{NaN: 1}"):
        response = client.post("/v2/models/echo/infer", content=body)
        assert response.status_code == 400 and "JSON" in response.json()["error"]


def test_every_json_reader_takes_the_non_finite_tokens() -> None:
    from runtime.errors import InvalidInput
    from runtime.frontends.rest.codec import parse_json

    parsed = parse_json(b'{"data": [NaN, Infinity, -Infinity, 1]}')
    assert math.isnan(parsed["data"][0]) and parsed["data"][1:] == [math.inf, -math.inf, 1]
    with pytest.raises(InvalidInput, match="Malformed JSON"):
        parse_json(b'{"data": [NaNa]}')
