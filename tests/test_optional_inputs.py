"""Declared inputs a request leaves out: by default the model gets what the client sent (as in
MLServer), over every path; ``require_declared_inputs`` refuses such a request with 400 (as Triton
does), except for inputs marked ``"parameters": {"optional": true}`` (Triton's ``optional``)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import httpx
import numpy as np
import pytest

from runtime.grpc.generated import dataplane_pb2 as pb
from runtime.grpc.generated import dataplane_pb2_grpc
from runtime.model import MLModel
from runtime.server import Server
from runtime.settings import ModelSettings
from runtime.types import InferenceRequest, InferenceResponse, MetadataTensor, ResponseOutput

from .servers import serving

pytestmark = pytest.mark.anyio


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


def _settings(name: str, **extra: object) -> ModelSettings:
    return ModelSettings(
        name=name,
        implementation=Names,
        inputs=[
            MetadataTensor(name="x", datatype="FP32", shape=[-1]),
            MetadataTensor(name="text_input", datatype="BYTES", shape=[-1]),
            MetadataTensor.model_validate(
                {"name": "hint", "datatype": "FP32", "shape": [-1], "parameters": {"optional": True}}
            ),
        ],
        **extra,  # type: ignore[arg-type]
    )


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def server() -> AsyncIterator[Server]:
    async with serving(_settings("lenient"), _settings("strict", require_declared_inputs=True)) as running:
        yield running


@pytest.fixture
async def client(server: Server) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}", timeout=30) as client:
        yield client


def _body(*names: str) -> dict[str, object]:
    def tensor(name: str) -> dict[str, object]:
        if name == "text_input":
            return {"name": name, "datatype": "BYTES", "shape": [1], "data": ["a"]}
        return {"name": name, "datatype": "FP32", "shape": [1], "data": [1.0]}

    return {"inputs": [tensor(name) for name in names]}


async def test_a_subset_of_the_declared_inputs_reaches_the_model_by_default(
    client: httpx.AsyncClient,
) -> None:
    for names in (("x", "hint"), ("x",), ("hint",)):
        response = await client.post("/v2/models/lenient/infer", json=_body(*names))
        assert response.status_code == 200, response.text
        assert response.json()["outputs"][0]["data"] == [len(names)]
    # a stream (SSE) and generate too: generate sends only text_input
    stream = await client.post("/v2/models/lenient/infer_stream", json=_body("x"))
    assert stream.status_code == 200 and '"data":[1]' in stream.text
    generated = await client.post("/v2/models/lenient/generate", json={"text_input": "hello"})
    assert generated.status_code == 200, generated.text
    assert generated.json()["text_output"] == "text_input"


async def test_a_subset_of_the_declared_inputs_reaches_the_model_over_grpc(server: Server) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        stub = dataplane_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = pb.ModelInferRequest(model_name="lenient")
        request.inputs.add(name="x", datatype="FP32", shape=[1])
        request.raw_input_contents.append(np.array([1.0], np.float32).tobytes())
        response = await stub.ModelInfer(request)
        assert np.frombuffer(response.raw_output_contents[0], np.int64).tolist() == [1]
        request.model_name = "strict"
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.ModelInfer(request)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "expects input(s) ['text_input']" in (refused.value.details() or "")


async def test_require_declared_inputs_refuses_all_but_optional_ones(client: httpx.AsyncClient) -> None:
    both = await client.post("/v2/models/strict/infer", json=_body("x", "text_input", "hint"))
    without_hint = await client.post("/v2/models/strict/infer", json=_body("x", "text_input"))
    only_hint = await client.post("/v2/models/strict/infer", json=_body("hint"))
    config = (await client.get("/v2/models/strict/config")).json()
    assert both.status_code == 200 and both.json()["outputs"][0]["data"] == [3]
    assert without_hint.status_code == 200 and without_hint.json()["outputs"][0]["data"] == [2]
    assert only_hint.status_code == 400
    assert "expects input(s) ['x', 'text_input']" in only_hint.json()["error"]
    assert [tensor.get("optional", False) for tensor in config["input"]] == [False, False, True]
    assert (await client.get("/v2/health/ready")).status_code == 200


def test_only_a_true_optional_parameter_counts() -> None:
    def tensor(parameters: object) -> MetadataTensor:
        return MetadataTensor.model_validate(
            {"name": "t", "datatype": "FP32", "shape": [1], "parameters": parameters}
        )

    assert tensor({"optional": True}).optional
    assert not tensor({"optional": "yes"}).optional
    assert not tensor({}).optional
    assert not tensor(None).optional
