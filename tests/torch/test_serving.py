"""The PyTorch runtime serving the examples (TorchScript, torch.export, state_dict) through a real server.

The artefacts are built once per session, with fixed seeds, into a temporary folder. Every
output the server returns must equal the model's own forward pass on the same inputs exactly
(CPU, float32): over REST with JSON tensors and with binary tensors (tritonclient.http), and
over gRPC with raw contents (tritonclient.grpc), typed contents and ModelStreamInfer (the stubs).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton

from runtime.frontends.grpc.generated import dataplane_pb2 as pb
from tests.grpc_support import inference_stub, raw_request
from tests.servers import RunningServer, start_server
from tests.torch_helpers import MODELS, OUTPUTS, build_repository, inputs_for, own_forward, own_module


@pytest.fixture(scope="session")
def torch_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_repository(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="module")
def torch_server(torch_repository: Path) -> Iterator[RunningServer]:
    server = start_server(torch_repository)
    yield server
    assert server.stop() == 0


@pytest.mark.parametrize("folder", MODELS)
@pytest.mark.parametrize("batch", [1, 3])
def test_rest_json_equals_own_forward(
    torch_server: RunningServer, torch_repository: Path, folder: str, batch: int
) -> None:
    inputs = inputs_for(folder, batch, seed=batch)
    body = {
        "inputs": [
            {"name": name, "datatype": "FP32", "shape": list(array.shape), "data": array.ravel().tolist()}
            for name, array in inputs.items()
        ]
    }
    response = httpx.post(f"{torch_server.http_url}/v2/models/{folder}/infer", json=body, timeout=30)
    assert response.status_code == 200, response.text
    document = response.json()
    expected = own_forward(own_module(torch_repository, folder), folder, inputs)
    assert [out["name"] for out in document["outputs"]] == list(OUTPUTS[folder.split("-")[0]])
    for out in document["outputs"]:
        assert out["datatype"] == "FP32"
        got = np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])
        assert got.shape == expected[out["name"]].shape
        assert np.array_equal(got, expected[out["name"]]), out["name"]


@pytest.mark.parametrize("folder", ["mlp-export", "lstm-torchscript", "lstm-state-dict"])
def test_rest_binary_tritonclient_equals_own_forward(
    torch_server: RunningServer, torch_repository: Path, folder: str
) -> None:
    inputs = inputs_for(folder, 4, seed=7)
    client = triton.InferenceServerClient(url=torch_server.http_address)
    try:
        request_inputs = []
        for name, array in inputs.items():
            tensor = triton.InferInput(name, list(array.shape), "FP32")
            tensor.set_data_from_numpy(array, binary_data=True)
            request_inputs.append(tensor)
        net = folder.split("-")[0]
        outputs = [triton.InferRequestedOutput(name, binary_data=True) for name in OUTPUTS[net]]
        result = client.infer(folder, request_inputs, outputs=outputs)
    finally:
        client.close()
    expected = own_forward(own_module(torch_repository, folder), folder, inputs)
    for name, array in expected.items():
        got = result.as_numpy(name)
        assert got is not None and got.dtype == np.float32
        assert np.array_equal(got, array), name


def test_metadata_names_the_platform(torch_server: RunningServer) -> None:
    platforms = {}
    for folder in ("mlp-torchscript", "mlp-export", "mlp-state-dict"):
        document = httpx.get(f"{torch_server.http_url}/v2/models/{folder}").json()
        platforms[folder] = document["platform"]
        assert [t["name"] for t in document["inputs"]] == ["x"]
    assert platforms == {
        "mlp-torchscript": "pytorch_torchscript",
        "mlp-export": "pytorch_export",
        "mlp-state-dict": "pytorch",
    }


def test_missing_file_fails_that_model_only(torch_server: RunningServer, torch_repository: Path) -> None:
    url = torch_server.http_url
    ready = httpx.get(f"{url}/v2/models/broken/ready")
    assert ready.status_code == 503
    message = ready.json()["error"]
    assert "'broken/missing.pt2'" in message and str(torch_repository) not in message
    assert "does not exist" in message
    assert httpx.get(f"{url}/v2/health/ready").status_code == 503  # strict: 'broken' failed
    assert httpx.get(f"{url}/v2/models/mlp-export/ready").status_code == 200
    infer = httpx.post(
        f"{url}/v2/models/broken/infer",
        json={"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]},
    )
    assert infer.status_code == 503
    assert "missing.pt2" in infer.json()["error"]


@pytest.mark.parametrize(
    ("folder", "change", "expected"),
    [
        ("mlp-torchscript", {"name": "features"}, "has no input 'features'; its inputs are ['x']"),
        ("mlp-export", {"datatype": "FP64"}, "Input 'x' must be FP32, got FP64"),
        ("mlp-state-dict", {"shape": [2, 5]}, "Input 'x' must have shape [-1, 4]"),
    ],
)
def test_wrong_input_is_400_naming_the_tensor(
    torch_server: RunningServer, folder: str, change: dict[str, object], expected: str
) -> None:
    tensor: dict[str, object] = {"name": "x", "datatype": "FP32", "shape": [2, 4], "data": list(range(8))}
    tensor.update(change)
    if change.get("shape") == [2, 5]:
        tensor["data"] = list(range(10))
    response = httpx.post(f"{torch_server.http_url}/v2/models/{folder}/infer", json={"inputs": [tensor]})
    assert response.status_code == 400
    assert expected in response.json()["error"]
    assert httpx.get(f"{torch_server.http_url}/v2/models/{folder}/ready").status_code == 200


# ---------------------------------------------------------------------- gRPC


def assert_equals_own_forward(
    torch_repository: Path, folder: str, inputs: dict[str, np.ndarray], got: dict[str, np.ndarray]
) -> None:
    expected = own_forward(own_module(torch_repository, folder), folder, inputs)
    assert list(got) == list(OUTPUTS[folder.split("-")[0]])
    for name, array in expected.items():
        assert got[name].dtype == np.float32 and got[name].shape == array.shape, name
        assert np.array_equal(got[name], array), name


@pytest.mark.parametrize("folder", MODELS)
def test_grpc_raw_tritonclient_equals_own_forward(
    torch_server: RunningServer, torch_repository: Path, folder: str
) -> None:
    inputs = inputs_for(folder, 3, seed=11)
    client = triton_grpc.InferenceServerClient(torch_server.grpc_address)
    try:
        request_inputs = []
        for name, array in inputs.items():
            tensor = triton_grpc.InferInput(name, list(array.shape), "FP32")
            tensor.set_data_from_numpy(array)  # raw_input_contents
            request_inputs.append(tensor)
        result = client.infer(folder, request_inputs)
    finally:
        client.close()
    assert result.get_response().raw_output_contents  # answered raw, as asked
    got = {out.name: result.as_numpy(out.name) for out in result.get_response().outputs}
    assert_equals_own_forward(torch_repository, folder, inputs, got)


@pytest.mark.parametrize("folder", MODELS)
def test_grpc_typed_contents_equal_own_forward(
    torch_server: RunningServer, torch_repository: Path, folder: str
) -> None:
    inputs = inputs_for(folder, 2, seed=12)
    request = pb.ModelInferRequest(model_name=folder, id="typed")
    for name, array in inputs.items():
        tensor = request.inputs.add(name=name, datatype="FP32", shape=array.shape)
        tensor.contents.fp32_contents.extend(array.ravel().tolist())
    with inference_stub(torch_server.grpc_address) as stub:
        response = stub.ModelInfer(request)
    assert not response.raw_output_contents and response.id == "typed"
    got = {
        out.name: np.array(out.contents.fp32_contents, dtype=np.float32).reshape(list(out.shape))
        for out in response.outputs
    }
    assert all(out.datatype == "FP32" for out in response.outputs)
    assert_equals_own_forward(torch_repository, folder, inputs, got)


def test_grpc_stream_of_torch_requests_equals_own_forward(
    torch_server: RunningServer, torch_repository: Path
) -> None:
    """ModelStreamInfer feeds a torch model's (default) predict_stream: every answer is exact."""
    folder = "lstm-state-dict"
    batches = [inputs_for(folder, batch, seed=20 + batch) for batch in (1, 2, 4)]
    requests = [raw_request(folder, f"b{i}", **inputs) for i, inputs in enumerate(batches)]
    with inference_stub(torch_server.grpc_address) as stub:
        responses = list(stub.ModelStreamInfer(iter(requests)))
    assert [r.id for r in responses] == ["b0", "b1", "b2"]
    for inputs, response in zip(batches, responses, strict=True):
        assert "error" not in response.parameters
        got = {
            out.name: np.frombuffer(raw, np.float32).reshape(list(out.shape))
            for out, raw in zip(response.outputs, response.raw_output_contents, strict=True)
        }
        assert_equals_own_forward(torch_repository, folder, inputs, got)
