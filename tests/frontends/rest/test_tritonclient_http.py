"""tritonclient's HTTP client, written by others, against a real server: JSON and binary tensors."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.servers import RunningServer


@pytest.fixture(scope="module")
def client(example_server: RunningServer) -> Iterator[httpclient.InferenceServerClient]:
    c = httpclient.InferenceServerClient(example_server.http_address)
    yield c
    c.close()


def test_health_and_metadata(client: httpclient.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("echo")
    assert client.get_server_metadata()["name"] == "mlserver-like"
    meta = client.get_model_metadata("scaler")
    assert meta["inputs"][0]["name"] == "x"
    assert not client.is_model_ready("missing")
    config = client.get_model_config("scaler")
    assert config["input"][0] == {"name": "x", "data_type": "TYPE_FP32", "dims": [-1, 4]}


@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize(
    ("datatype", "array"),
    [
        ("FP32", np.random.default_rng(0).random((3, 4), dtype=np.float32)),
        ("FP64", np.linspace(-1, 1, 8).reshape(2, 4)),
        ("FP16", np.array([[0.5, 1.5]], dtype=np.float16)),
        ("INT8", np.array([[-3, 4]], dtype=np.int8)),
        ("INT64", np.array([[2**40, -(2**40)]], dtype=np.int64)),
        ("UINT16", np.array([[1, 65535]], dtype=np.uint16)),
        ("UINT64", np.array([[2**63]], dtype=np.uint64)),
        ("BOOL", np.array([[True, False, True]])),
        ("BYTES", np.array([[b"hello", b"w\xc3\xb6rld"]], dtype=object)),
    ],
)
def test_infer_round_trip(
    client: httpclient.InferenceServerClient, datatype: str, array: np.ndarray, binary: bool
) -> None:
    inp = httpclient.InferInput("t", list(array.shape), datatype)
    inp.set_data_from_numpy(array, binary_data=binary)
    outputs = [httpclient.InferRequestedOutput("t", binary_data=binary)]
    result = client.infer("echo", [inp], outputs=outputs, request_id="abc")
    assert result.get_response()["id"] == "abc"
    got = result.as_numpy("t")
    assert got.shape == array.shape
    if datatype == "BYTES" and not binary:
        # tritonclient returns JSON BYTES as the strings it read, against Triton too
        array = np.vectorize(lambda b: b.decode(), otypes=[object])(array)
    np.testing.assert_array_equal(got, array)


def test_default_binary_outputs_when_none_requested(client: httpclient.InferenceServerClient) -> None:
    x = np.array([[5.84, 3.05, 3.76, 1.20]], dtype=np.float32)
    inp = httpclient.InferInput("x", [1, 4], "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer("scaler", [inp])
    np.testing.assert_allclose(result.as_numpy("scaled"), np.zeros((1, 4)), atol=1e-5)


def test_errors_surface_as_exceptions(client: httpclient.InferenceServerClient) -> None:
    inp = httpclient.InferInput("y", [1, 4], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 4), dtype=np.float32))
    with pytest.raises(InferenceServerException, match="no input 'y'"):
        client.infer("scaler", [inp])
    with pytest.raises(InferenceServerException, match="not found"):
        client.infer("missing", [inp])
    assert client.is_server_ready()
