"""Declared inputs a request leaves out: by default the model gets what the client sent (as in
MLServer), over every path; ``require_declared_inputs`` refuses such a request with 400 (as Triton
does), except for inputs marked ``"parameters": {"optional": true}`` (Triton's ``optional``)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import grpc
import httpx
import numpy as np
import pytest

from runtime.frontends.grpc.generated import dataplane_pb2 as pb
from runtime.frontends.grpc.generated import dataplane_pb2_grpc
from runtime.model import MLModel
from runtime.types import InferenceRequest, InferenceResponse, MetadataTensor, ResponseOutput
from tests.servers import RunningServer, start_server


class Names(MLModel):
    """Answers with the names of the inputs it was given (``n``: how many; ``text_output``: which)."""

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        names = sorted(inp.name for inp in payload.inputs)
        return InferenceResponse(
            model_name=self.name,
            outputs=[
                ResponseOutput(name="n", shape=[1], datatype="INT64", data=[len(names)]),
                ResponseOutput(name="text_output", shape=[1], datatype="BYTES", data=[",".join(names)]),
            ],
        )


def _settings(**extra: object) -> dict[str, object]:
    return {
        "implementation": "tests.test_optional_inputs.Names",
        "inputs": [
            {"name": "x", "datatype": "FP32", "shape": [-1]},
            {"name": "text_input", "datatype": "BYTES", "shape": [-1]},
            {"name": "hint", "datatype": "FP32", "shape": [-1], "parameters": {"optional": True}},
        ],
        **extra,
    }


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("optional")
    for name, settings in (("lenient", _settings()), ("strict", _settings(require_declared_inputs=True))):
        (repo / name).mkdir()
        (repo / name / "model-settings.json").write_text(json.dumps(settings))
    running = start_server(repo)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server: RunningServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.http_url, timeout=30) as client:
        yield client


def _body(*names: str) -> dict[str, object]:
    def tensor(name: str) -> dict[str, object]:
        if name == "text_input":
            return {"name": name, "datatype": "BYTES", "shape": [1], "data": ["a"]}
        return {"name": name, "datatype": "FP32", "shape": [1], "data": [1.0]}

    return {"inputs": [tensor(name) for name in names]}


def test_a_subset_of_the_declared_inputs_reaches_the_model_by_default(
    client: httpx.Client,
) -> None:
    for names in (("x", "hint"), ("x",), ("hint",)):
        response = client.post("/v2/models/lenient/infer", json=_body(*names))
        assert response.status_code == 200, response.text
        assert response.json()["outputs"][0]["data"] == [len(names)]
    # a stream (SSE) and generate too: generate sends only text_input
    stream = client.post("/v2/models/lenient/infer_stream", json=_body("x"))
    assert stream.status_code == 200 and '"data":[1]' in stream.text
    generated = client.post("/v2/models/lenient/generate", json={"text_input": "hello"})
    assert generated.status_code == 200, generated.text
    assert generated.json()["text_output"] == "text_input"


def test_a_subset_of_the_declared_inputs_reaches_the_model_over_grpc(server: RunningServer) -> None:
    with grpc.insecure_channel(server.grpc_address) as channel:
        stub = dataplane_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = pb.ModelInferRequest(model_name="lenient")
        request.inputs.add(name="x", datatype="FP32", shape=[1])
        request.raw_input_contents.append(np.array([1.0], np.float32).tobytes())
        response = stub.ModelInfer(request, timeout=30)
        assert np.frombuffer(response.raw_output_contents[0], np.int64).tolist() == [1]
        request.model_name = "strict"
        with pytest.raises(grpc.RpcError) as refused:
            stub.ModelInfer(request, timeout=30)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "expects input(s) ['text_input']" in (refused.value.details() or "")


def test_require_declared_inputs_refuses_all_but_optional_ones(client: httpx.Client) -> None:
    both = client.post("/v2/models/strict/infer", json=_body("x", "text_input", "hint"))
    without_hint = client.post("/v2/models/strict/infer", json=_body("x", "text_input"))
    only_hint = client.post("/v2/models/strict/infer", json=_body("hint"))
    config = (client.get("/v2/models/strict/config")).json()
    assert both.status_code == 200 and both.json()["outputs"][0]["data"] == [3]
    assert without_hint.status_code == 200 and without_hint.json()["outputs"][0]["data"] == [2]
    assert only_hint.status_code == 400
    assert "expects input(s) ['x', 'text_input']" in only_hint.json()["error"]
    assert [tensor.get("optional", False) for tensor in config["input"]] == [False, False, True]
    assert (client.get("/v2/health/ready")).status_code == 200


def test_only_a_true_optional_parameter_counts() -> None:
    def tensor(parameters: object) -> MetadataTensor:
        return MetadataTensor.model_validate(
            {"name": "t", "datatype": "FP32", "shape": [1], "parameters": parameters}
        )

    assert tensor({"optional": True}).optional
    assert not tensor({"optional": "yes"}).optional
    assert not tensor({}).optional
    assert not tensor(None).optional
