"""The streaming text-generation example (examples/streaming/textgen) and its httpx-sse client snippet."""

from __future__ import annotations

import importlib.util
from types import ModuleType
from typing import Any

import httpx
import orjson
import pytest

from .conftest import ROOT
from .servers import RunningServer


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
    assert events[-1]["parameters"] == {"finish_reason": "length"}
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
