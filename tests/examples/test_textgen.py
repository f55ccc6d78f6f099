"""The streaming text-generation example (examples/streaming/textgen) and its client snippets
(httpx-sse, and gRPC ModelStreamInfer in both wire formats)."""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import sys
from types import ModuleType
from typing import Any
from unittest.mock import ANY

import httpx
import orjson
import pytest

from runtime.frontends.grpc.generated import dataplane_pb2 as pb
from runtime.settings import ModelSettings
from tests.conftest import ROOT, STREAMING_EXAMPLES
from tests.grpc_support import inference_stub
from tests.servers import RunningServer, serving


def generate(server: RunningServer, text: str, **parameters: Any) -> httpx.Response:
    return httpx.post(
        f"{server.http_url}/v2/models/textgen/generate",
        json={"text_input": text, "parameters": parameters},
        timeout=60,
    )


def generate_stream(server: RunningServer, text: str, **parameters: Any) -> list[dict[str, Any]]:
    response = httpx.post(
        f"{server.http_url}/v2/models/textgen/generate_stream",
        json={"text_input": text, "parameters": parameters},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    events = [block for block in response.text.split("\r\n\r\n") if block]
    assert all(block.startswith("data: ") for block in events), events
    return [orjson.loads(block[len("data: ") :]) for block in events]


def load_example(name: str) -> ModuleType:
    path = ROOT / "examples" / "clients" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_trained_model_is_deterministic(textgen_server: RunningServer) -> None:
    first = generate(textgen_server, "In the morning", max_tokens=40, temperature=0)
    assert first.status_code == 200, first.text
    again = generate(textgen_server, "In the morning", max_tokens=40, temperature=0)
    assert first.json() == again.json()
    assert first.json()["model_name"] == "textgen" and first.json()["model_version"] == "1"
    assert len(first.json()["text_output"]) == 40
    sampled = [generate(textgen_server, "The", max_tokens=30, seed=7).json() for _ in range(2)]
    assert sampled[0] == sampled[1]


def test_streamed_tokens_arrive_in_order_and_spell_the_unary_answer(textgen_server: RunningServer) -> None:
    parameters = {"max_tokens": 50, "temperature": 0.8, "seed": 3, "details": True}
    whole = generate(textgen_server, "The keeper", **parameters).json()
    events = generate_stream(textgen_server, "The keeper", **parameters)
    assert "".join(event["text_output"] for event in events) == whole["text_output"]
    assert [len(event["text_output"]) for event in events] == [1] * 50  # one character per event
    assert events[-1]["details"]["finish_reason"] == "length"
    assert all("finish_reason" not in event["details"] for event in events[:-1])
    assert [event["details"]["token"]["text"] for event in events] == list(whole["text_output"])
    assert whole["details"]["finish_reason"] == "length" and len(whole["details"]["logprobs"]) == 50


def test_stop_sequences_and_the_end_of_sequence_token(textgen_server: RunningServer) -> None:
    stopped = generate(
        textgen_server, "In the morning", max_tokens=200, temperature=0, stop=["the"], details=True
    )
    assert stopped.json()["text_output"].endswith("the")
    assert stopped.json()["details"]["finish_reason"] == "stop_sequence"
    events = generate_stream(textgen_server, "In the morning", max_tokens=400, temperature=0, details=True)
    assert events[-1]["details"]["finish_reason"] == "eos_token"
    assert events[-1]["text_output"] == "" and events[-1]["details"]["token"]["special"] is True


def test_a_tensor_request_streams_inference_responses(textgen_server: RunningServer) -> None:
    body = {
        "id": "t-1",
        "inputs": [{"name": "text_input", "shape": [1], "datatype": "BYTES", "data": ["The keeper"]}],
        "parameters": {"max_tokens": 5, "temperature": 0},
    }
    response = httpx.post(f"{textgen_server.http_url}/v2/models/textgen/infer_stream", json=body, timeout=60)
    assert response.status_code == 200
    events = [orjson.loads(block[6:]) for block in response.text.split("\r\n\r\n") if block]
    assert len(events) == 5 and {event["id"] for event in events} == {"t-1"}
    # served with continuous batching: every chunk also says how many streams shared its step
    assert events[-1]["parameters"] == {"finish_reason": "length", "batch_size": 1, "step_id": ANY}
    bad = {**body, "parameters": {"max_tokens": 0}}
    response = httpx.post(f"{textgen_server.http_url}/v2/models/textgen/infer_stream", json=bad, timeout=60)
    assert response.status_code == 400 and "max_tokens" in response.json()["error"]


def test_the_httpx_sse_client_snippet(textgen_server: RunningServer) -> None:
    client = load_example("textgen_sse")
    pieces = list(client.stream_text(textgen_server.http_url, "In the morning", max_tokens=30, temperature=0))
    assert (
        "".join(pieces)
        == generate(textgen_server, "In the morning", max_tokens=30, temperature=0).json()["text_output"]
    )
    with pytest.raises(client.GenerateError, match="max_tokens"):
        list(client.stream_text(textgen_server.http_url, "x", max_tokens=0))
    with pytest.raises(client.GenerateError, match="not found"):
        list(client.stream_text(textgen_server.http_url, "x", model="nope"))


def test_the_grpc_client_snippet_builds_oip_messages() -> None:
    """Offline: the gRPC snippet's requests and its decoding of both answer forms (raw, typed)."""
    client = load_example("textgen_grpc")
    request = client._request("textgen", "p0", "The keeper", 12)
    assert (request.model_name, request.id) == ("textgen", "p0")
    assert request.parameters["max_tokens"].int64_param == 12
    assert request.parameters["temperature"].WhichOneof("parameter_choice") == "double_param"
    tensor = request.inputs[0]
    assert (tensor.name, tensor.datatype, list(tensor.shape)) == ("text_input", "BYTES", [1])
    assert list(tensor.contents.bytes_contents) == [b"The keeper"]
    pb = client.pb
    raw = pb.ModelInferResponse(raw_output_contents=[len(b"abc").to_bytes(4, "little") + b"abc"])
    assert client._text(raw) == "abc"
    typed = pb.ModelInferResponse()
    typed.outputs.add(name="text_output", datatype="BYTES", shape=[1]).contents.bytes_contents.append(b"xyz")
    assert client._text(typed) == "xyz"


# ---------------------------------------------------------------------- gRPC ModelStreamInfer


def textgen_request(
    request_id: str, prompt: str, raw: bool = False, **parameters: Any
) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="textgen", id=request_id)
    for key, value in parameters.items():
        if isinstance(value, float):
            request.parameters[key].double_param = value
        else:
            request.parameters[key].int64_param = value
    tensor = request.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    if raw:
        request.raw_input_contents.append(len(prompt.encode()).to_bytes(4, "little") + prompt.encode())
    else:
        tensor.contents.bytes_contents.append(prompt.encode())
    return request


def piece(response: pb.ModelInferResponse) -> str:
    assert "error" not in response.parameters, response.parameters["error"].string_param
    if response.raw_output_contents:
        raw = response.raw_output_contents[0]
        return raw[4 : 4 + int.from_bytes(raw[:4], "little")].decode()
    return response.outputs[0].contents.bytes_contents[0].decode()


def test_grpc_stream_tokens_arrive_in_order_and_spell_the_unary_answer(textgen_server: RunningServer) -> None:
    """Two prompts up one ModelStreamInfer (the second raw): each streams one character per
    response, in order, tagged with its request, and spells what /generate answers."""
    greedy: dict[str, Any] = {"max_tokens": 40, "temperature": 0.0}
    sampled: dict[str, Any] = {"max_tokens": 30, "temperature": 0.8, "seed": 3}
    requests = [
        textgen_request("greedy", "In the morning", **greedy),
        textgen_request("sampled", "The keeper", raw=True, **sampled),
    ]
    with inference_stub(textgen_server.grpc_address) as stub:
        responses = list(stub.ModelStreamInfer(iter(requests)))
    # served with continuous batching, the two prompts run at once: their responses interleave
    assert sorted(r.id for r in responses) == ["greedy"] * 40 + ["sampled"] * 30
    assert {r.id: bool(r.raw_output_contents) for r in responses} == {"greedy": False, "sampled": True}
    assert max(r.parameters["batch_size"].int64_param for r in responses) == 2
    assert all(len(piece(r)) == 1 for r in responses)
    texts = {
        request_id: "".join(piece(r) for r in responses if r.id == request_id)
        for request_id in ("greedy", "sampled")
    }
    assert texts["greedy"] == generate(textgen_server, "In the morning", **greedy).json()["text_output"]
    assert texts["sampled"] == generate(textgen_server, "The keeper", **sampled).json()["text_output"]
    finish = [
        (r.id, r.parameters["finish_reason"].string_param)
        for r in responses
        if "finish_reason" in r.parameters
    ]
    assert sorted(finish) == [("greedy", "length"), ("sampled", "length")]
    for request_id in ("greedy", "sampled"):  # each one's last response is the one that says why it ended
        assert "finish_reason" in [r for r in responses if r.id == request_id][-1].parameters
    assert {(r.model_name, r.model_version) for r in responses} == {("textgen", "1")}


def test_the_grpc_client_snippet_against_the_server(textgen_server: RunningServer) -> None:
    client = load_example("textgen_grpc")
    prompts = ["The keeper", "In the morning"]
    texts: dict[str, str] = {}
    for request_id, text in client.stream_text(textgen_server.grpc_address, prompts, max_tokens=30):
        assert isinstance(text, str), text
        texts[request_id] = texts.get(request_id, "") + text
    for i, prompt in enumerate(prompts):
        assert (
            texts[f"p{i}"]
            == generate(textgen_server, prompt, max_tokens=30, temperature=0).json()["text_output"]
        )
    # errors come back in band, for their own prompt
    [(request_id, error)] = list(client.stream_text(textgen_server.grpc_address, ["x"], max_tokens=0))
    assert request_id == "p0" and isinstance(error, client.GenerateError)
    assert str(error).startswith("INVALID_ARGUMENT: ") and "max_tokens" in str(error)
    [(_, missing)] = list(client.stream_text(textgen_server.grpc_address, ["x"], model="nope"))
    assert str(missing) == "NOT_FOUND: Model 'nope' not found"
    # and the script itself, as the README runs it
    script = ROOT / "examples" / "clients" / "textgen_grpc.py"
    run = subprocess.run(
        [
            sys.executable,
            str(script),
            "--address",
            textgen_server.grpc_address,
            "--max-tokens",
            "30",
            *prompts,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert run.stdout.splitlines() == [f"[p{i}] {prompt}{texts[f'p{i}']}" for i, prompt in enumerate(prompts)]


@pytest.mark.anyio
async def test_the_triton_client_snippet_against_a_triton_format_server() -> None:
    """tritonclient's start_stream/async_stream_infer, unchanged, against --grpc-stream-format triton."""
    client = load_example("textgen_grpc")
    settings = ModelSettings.from_file(STREAMING_EXAMPLES / "textgen" / "model-settings.json")
    async with serving(settings, grpc_stream_format="triton") as server:
        address = f"127.0.0.1:{server.grpc_port}"
        pieces = await asyncio.to_thread(
            lambda: list(client.triton_stream_text(address, "The keeper", max_tokens=25))
        )
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}", timeout=60) as http:
            body = {"text_input": "The keeper", "parameters": {"max_tokens": 25, "temperature": 0}}
            whole = (await http.post("/v2/models/textgen/generate", json=body)).json()["text_output"]
        assert len(pieces) == 25 and "".join(pieces) == whole
        with pytest.raises(client.GenerateError, match="max_tokens"):
            await asyncio.to_thread(lambda: list(client.triton_stream_text(address, "x", max_tokens=0)))
        assert server.dataplane.streams.active == 0


def test_the_staggered_client_shows_streams_sharing_steps(textgen_server: RunningServer) -> None:
    """Three streams started 10 ms apart, each hundreds of steps long: they overlap, and every
    character says how many streams shared its step."""
    client = load_example("textgen_staggered")
    runs = asyncio.run(client.staggered(textgen_server.http_url, streams=3, every=0.01, tokens=400))
    assert [len(run.sizes) for run in runs] == [400, 600, 800]  # ignore_eos: exactly max_tokens each
    assert max(max(run.sizes) for run in runs) >= 2 and all(
        1 <= size <= 3 for run in runs for size in run.sizes
    )
    assert client.runs_of([1, 1, 2, 2, 2, 1]) == "1x2 2x3 1x1"
