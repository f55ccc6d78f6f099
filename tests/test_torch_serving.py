"""The PyTorch runtime serving the examples (TorchScript, torch.export, state_dict) through a real server.

The artefacts are built once per session, with fixed seeds, into a temporary folder. Every
output the server returns must equal the model's own forward pass on the same inputs exactly
(CPU, float32), over REST with JSON tensors and with binary tensors (tritonclient).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as triton

from .servers import RunningServer, start_server
from .torch_helpers import MODELS, OUTPUTS, build_repository, inputs_for, own_forward, own_module


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
    assert str(torch_repository / "broken" / "missing.pt2") in message
    assert "does not exist" in message
    assert httpx.get(f"{url}/v2/health/ready").status_code == 200
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
