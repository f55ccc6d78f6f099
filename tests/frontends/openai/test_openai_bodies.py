"""OpenAI bodies translated, without a server: requests into InferenceRequests, answers and errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from runtime.errors import InvalidInput, ModelNotFound, Unavailable
from runtime.frontends.openai.openai_bodies import (
    Chunks,
    OpenAIError,
    answer,
    chat_plan,
    completion_plan,
    embeddings_answer,
    embeddings_request,
    error_body,
    read_json,
)
from runtime.types import InferenceResponse, Parameters, ResponseOutput


def test_completion_prompts_choices_and_parameters() -> None:
    plan = completion_plan(
        {"model": "m", "prompt": ["a", "b"], "n": 2, "seed": 5, "top_k": 3, "stop": ["x"], "logprobs": 1}
    )
    assert len(plan.requests) == 4 and plan.choices == 2 and plan.logprobs
    seeds = [(r.parameters.model_extra or {})["seed"] for r in plan.requests if r.parameters]
    assert seeds == [5, 6, 5, 6]
    first = plan.requests[0]
    assert first.inputs[0].name == "text_input" and first.parameters is not None
    assert first.parameters.model_extra == {
        "top_k": 3,
        "stop": ["x"],
        "seed": 5,
        "max_tokens": 16,
        "logprobs": 1,
    }
    ids = completion_plan({"model": "m", "prompt": [[1, 2, 3]], "max_tokens": 4}).requests[0]
    assert ids.inputs[0].name == "input_ids" and np.asarray(ids.inputs[0].data).tolist() == [1, 2, 3]


def test_chat_messages_become_one_json_input() -> None:
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "you"}]}
    ]
    plan = chat_plan(
        {"model": "m", "messages": messages, "max_completion_tokens": 3, "logprobs": True, "top_logprobs": 2}
    )
    request = plan.requests[0]
    assert request.inputs[0].name == "messages"
    assert b'"content":"hi you"' in request.inputs[0].data[0]
    assert request.parameters is not None and request.parameters.model_extra == {
        "max_tokens": 3,
        "logprobs": 2,
    }


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "x"}, "model"),
        ({"model": "m", "prompt": 5}, "prompt"),
        ({"model": "m", "prompt": "x", "n": 0}, "n"),
        ({"model": "m", "prompt": "x", "temperature": 3}, "temperature"),
        ({"model": "m", "prompt": "x", "seed": "s"}, "seed"),
        ({"model": "m", "prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"model": "m", "prompt": "x", "logprobs": 9}, "logprobs"),
        ({"model": "m", "prompt": "x", "presence_penalty": 1}, "presence_penalty"),
        ({"model": "m", "prompt": "x", "stream": "yes"}, "stream"),
        ({"model": "m", "prompt": "x", "stream_options": 3}, "stream_options"),
    ],
)
def test_bad_completion_bodies_name_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(OpenAIError) as error:
        completion_plan(body)
    assert error.value.param == param


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m", "messages": [{"content": "x"}]}, "messages"),
        ({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages"),
        ({"model": "m", "messages": [{"role": "user", "content": 3}]}, "messages"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "top_logprobs"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{}]}, "tools"),
    ],
)
def test_bad_chat_bodies_name_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(OpenAIError) as error:
        chat_plan(body)
    assert error.value.param == param


def test_errors_in_openai_shape() -> None:
    assert error_body(ModelNotFound("gone"), 404)["error"] == {
        "message": "Model 'gone' not found",
        "type": "not_found_error",
        "param": None,
        "code": "model_not_found",
    }
    assert error_body(OpenAIError("bad", "n"), 400)["error"]["param"] == "n"
    assert error_body(Unavailable("busy"), 503)["error"]["type"] == "service_unavailable_error"
    assert error_body(InvalidInput("x"), 500)["error"]["type"] == "server_error"
    with pytest.raises(OpenAIError):
        read_json(b"[1]")


def _response(text: str, **parameters: Any) -> InferenceResponse:
    data = np.array([text.encode()], dtype=object)
    output = ResponseOutput(name="text_output", shape=[1], datatype="BYTES", data=data)
    return InferenceResponse(
        model_name="m", outputs=[output], parameters=Parameters(**parameters) if parameters else None
    )


def test_answers_and_chunks() -> None:
    plan = completion_plan(
        {
            "model": "m",
            "prompt": "p",
            "n": 2,
            "logprobs": 1,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )
    entry = {
        "token": "ab",
        "logprob": -0.5,
        "bytes": [97, 98],
        "top_logprobs": [{"token": "ab", "logprob": -0.5, "bytes": [97, 98]}],
    }
    done = {"finish_reason": "eos_token", "prompt_tokens": 4, "completion_tokens": 2, "logprobs": [entry]}
    whole = answer(plan, [_response("ab", **done), _response("cd", **{**done, "finish_reason": "length"})])
    assert [c["finish_reason"] for c in whole["choices"]] == ["stop", "length"]
    assert whole["usage"] == {"prompt_tokens": 4, "completion_tokens": 4, "total_tokens": 8}
    assert whole["choices"][0]["logprobs"] == {
        "tokens": ["ab"],
        "token_logprobs": [-0.5],
        "top_logprobs": [{"ab": -0.5}],
        "text_offset": [0],
    }
    chunks = Chunks(plan)
    first = chunks.chunk(0, _response("ab", logprobs=[entry]))
    assert first["usage"] is None and first["choices"][0]["finish_reason"] is None
    last = chunks.chunk(0, _response("", **done))
    assert last["choices"][0]["finish_reason"] == "stop" and last["choices"][0]["logprobs"][
        "text_offset"
    ] == [2]
    assert chunks.usage_chunk()["usage"]["prompt_tokens"] == 4

    chat = chat_plan({"model": "m", "messages": [{"role": "user", "content": "x"}], "logprobs": True})
    chat_chunks = Chunks(chat)
    assert chat_chunks.chunk(0, _response(""))["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chat_chunks.chunk(0, _response("", **done))["choices"][0]["delta"] == {}


def test_embeddings() -> None:
    request, encoding = embeddings_request({"model": "e", "input": ["a", "b"]})
    assert encoding == "float" and request.inputs[0].shape == [2]
    with pytest.raises(OpenAIError, match="token ids"):
        embeddings_request({"model": "e", "input": [1, 2]})
    with pytest.raises(OpenAIError):
        embeddings_request({"model": "e", "input": "a", "encoding_format": "hex"})
    vectors = np.arange(4, dtype=np.float32).reshape(2, 2)
    response = InferenceResponse(
        model_name="e",
        outputs=[ResponseOutput(name="embedding", shape=[2, 2], datatype="FP32", data=vectors)],
        parameters=Parameters(prompt_tokens=3),
    )
    assert embeddings_answer("e", response, "float")["data"][1]["embedding"] == [2.0, 3.0]
    assert embeddings_answer("e", response, "float")["usage"] == {"prompt_tokens": 3, "total_tokens": 3}
    with pytest.raises(OpenAIError, match="embedding"):
        embeddings_answer("e", _response("x"), "float")
