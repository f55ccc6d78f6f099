"""The Hugging Face runtime served from MLServer's settings, through the Open Inference Protocol:
``generate``, ``generate_stream``, ``infer`` and gRPC ``ModelStreamInfer`` on the continuous batcher,
greedy tokens against ``model.generate`` alone; refused requests; embeddings over ``infer``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import orjson
import pytest

from runtime.frontends.grpc.generated import dataplane_pb2 as pb
from runtime.frontends.grpc.generated import dataplane_pb2_grpc
from runtime.server.serving import Server
from runtime.settings import ModelSettings
from tests.huggingface.tiny_llm import reference, tokenize
from tests.servers import serving

pytestmark = pytest.mark.anyio

MLSERVER = "mlserver_huggingface.HuggingFaceRuntime"


@pytest.fixture(scope="module")
async def server(tiny_llm: Path) -> AsyncIterator[Server]:
    generator = ModelSettings(
        name="tiny",
        implementation=MLSERVER,
        parameters={"uri": str(tiny_llm), "extra": {"task": "text-generation", "max_tokens": 20}},
    )
    embedder = ModelSettings(
        name="embedder",
        implementation="runtime.huggingface.HuggingFaceModel",
        parameters={
            "extra": {"task": "feature-extraction", "pretrained_model": str(tiny_llm), "normalize": True}
        },
    )
    async with serving(generator, embedder) as running:
        yield running


@pytest.fixture
async def http(server: Server) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}", timeout=60) as client:
        yield client


async def test_generate_and_generate_stream_answer_the_greedy_tokens(
    http: httpx.AsyncClient, tiny_llm: Path
) -> None:
    prompt = "the quick fox"
    body = {"text_input": prompt, "parameters": {"max_tokens": 12, "temperature": 0, "details": True}}
    answer = (await http.post("/v2/models/tiny/generate", json=body)).json()
    assert answer["details"]["finish_reason"] in ("length", "eos_token")
    assert answer["details"]["prompt_tokens"] == len(tokenize(tiny_llm, prompt))
    streamed = await http.post("/v2/models/tiny/generate_stream", json=body)
    events = [
        orjson.loads(b[len("data: ") :]) for b in streamed.text.split("\r\n\r\n") if b.startswith("data: ")
    ]
    assert "".join(e["text_output"] for e in events) == answer["text_output"]
    assert events[-1]["details"]["finish_reason"] == answer["details"]["finish_reason"]
    # text_output is the generated text only: the prompt is not repeated
    infer = {
        "inputs": [{"name": "text_input", "shape": [1], "datatype": "BYTES", "data": [prompt]}],
        "parameters": {"max_tokens": 12, "temperature": 0},
    }
    response = (await http.post("/v2/models/tiny/infer", json=infer)).json()
    assert response["outputs"][0]["data"] == [answer["text_output"]]
    assert response["parameters"]["token_ids"] == reference(tiny_llm, prompt, 12)
    assert response["parameters"]["completion_tokens"] == len(response["parameters"]["token_ids"])


async def test_token_ids_in_and_the_default_max_tokens(http: httpx.AsyncClient, tiny_llm: Path) -> None:
    ids = tokenize(tiny_llm, "red mountain")
    infer = {"inputs": [{"name": "input_ids", "shape": [len(ids)], "datatype": "INT64", "data": ids}]}
    response = (
        await http.post("/v2/models/tiny/infer", json={**infer, "parameters": {"temperature": 0}})
    ).json()
    expected = reference(tiny_llm, ids, 20)  # parameters.extra.max_tokens: 20
    assert response["parameters"]["token_ids"] == expected
    echo = {**infer, "parameters": {"temperature": 0, "max_tokens": 3, "echo": True}}
    echoed = (await http.post("/v2/models/tiny/infer", json=echo)).json()
    assert echoed["outputs"][0]["data"][0].startswith("red mountain")


async def test_bad_requests_are_refused_naming_the_parameter(http: httpx.AsyncClient) -> None:
    for parameters, named in (
        ({"top_p": 2}, "top_p"),
        ({"temperature": "hot"}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 300}, "256"),
        ({"stop": [1]}, "stop"),
        ({"n": 2}, "n must be 1"),
        ({"logprobs": 50}, "top_logprobs"),
        ({"min_tokens": 9, "max_tokens": 3}, "min_tokens"),
    ):
        body = {"text_input": "a cat", "parameters": parameters}
        response = await http.post("/v2/models/tiny/generate", json=body)
        assert response.status_code == 400, parameters
        assert named in response.json()["error"], (parameters, response.json())
    missing = {"inputs": [{"name": "other", "shape": [1], "datatype": "BYTES", "data": ["x"]}]}
    response = await http.post("/v2/models/tiny/infer", json=missing)
    assert response.status_code == 400 and "text_input" in response.json()["error"]
    chat = {"inputs": [{"name": "messages", "shape": [1], "datatype": "BYTES", "data": ["{not json"]}]}
    response = await http.post("/v2/models/tiny/infer", json=chat)
    assert response.status_code == 400 and "messages" in response.json()["error"]


async def test_grpc_model_stream_infer_streams_each_prompt(server: Server, http: httpx.AsyncClient) -> None:
    prompts = {"a": "the cat runs", "b": "blue river"}

    async def requests() -> AsyncIterator[pb.ModelInferRequest]:
        for request_id, prompt in prompts.items():
            request = pb.ModelInferRequest(model_name="tiny", id=request_id)
            request.parameters["max_tokens"].int64_param = 10
            request.parameters["temperature"].double_param = 0.0
            tensor = request.inputs.add(name="text_input", datatype="BYTES", shape=[1])
            tensor.contents.bytes_contents.append(prompt.encode())
            yield request

    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        stub = dataplane_pb2_grpc.GRPCInferenceServiceStub(channel)
        replies = [reply async for reply in stub.ModelStreamInfer(requests())]
    texts: dict[str, str] = {}
    for response in replies:  # MLServer's wire format: the responses themselves, tagged by id
        assert "error" not in response.parameters
        texts[response.id] = (
            texts.get(response.id, "") + response.outputs[0].contents.bytes_contents[0].decode()
        )
    for request_id, prompt in prompts.items():
        body = {"text_input": prompt, "parameters": {"max_tokens": 10, "temperature": 0}}
        assert (
            texts[request_id]
            == (await http.post("/v2/models/tiny/generate", json=body)).json()["text_output"]
        )


async def test_streams_beyond_the_batch_wait_and_all_finish(server: Server, http: httpx.AsyncClient) -> None:
    """MLServer's settings set no max_batch_size: 16 streams run together, the rest wait."""
    entry = next(e for e in server.registry.entries() if e.name == "tiny")
    scheduler: Any = entry.scheduler
    assert scheduler.max_streams == 16 and entry.settings.continuous_batching
    body = {"text_input": "a dog", "parameters": {"max_tokens": 8, "ignore_eos": True}}
    answers = await asyncio.gather(*(http.post("/v2/models/tiny/generate", json=body) for _ in range(20)))
    assert all(a.status_code == 200 for a in answers)
    assert scheduler.largest_batch <= 16


async def test_embeddings_over_infer(http: httpx.AsyncClient) -> None:
    texts = ["a cat", "the lazy dog runs over the river"]
    infer = {"inputs": [{"name": "text_input", "shape": [2], "datatype": "BYTES", "data": texts}]}
    response = (await http.post("/v2/models/embedder/infer", json=infer)).json()
    output = response["outputs"][0]
    assert output["name"] == "embedding" and output["shape"] == [2, 64]
    vectors = np.asarray(output["data"], dtype=np.float32).reshape(2, 64)
    assert np.linalg.norm(vectors, axis=1) == pytest.approx([1.0, 1.0], abs=1e-5)  # normalize: true
    assert response["parameters"]["prompt_tokens"] > 0
    # generate asks for a text_output the embedder has not: the generate extension's ModelFailed
    refused = await http.post("/v2/models/embedder/generate", json={"text_input": "x"})
    assert refused.status_code == 500 and "text_output" in refused.json()["error"]
