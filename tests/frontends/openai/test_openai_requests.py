"""OpenAI requests read without a server (``runtime.frontends.openai.openai_requests``): the streams they become."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from runtime.frontends.openai.openai_errors import OpenAIError
from runtime.frontends.openai.openai_requests import chat_plan, completion_plan, embeddings_request, read_json


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


def test_the_body_must_be_a_json_object() -> None:
    with pytest.raises(OpenAIError, match="JSON object"):
        read_json(b"[1]")
    with pytest.raises(OpenAIError, match="not valid JSON"):
        read_json(b"{")
    assert read_json(b'{"model": "m"}') == {"model": "m"}


def test_embeddings_request() -> None:
    request, encoding = embeddings_request({"model": "e", "input": ["a", "b"]})
    assert encoding == "float" and request.inputs[0].shape == [2]
    with pytest.raises(OpenAIError, match="token ids"):
        embeddings_request({"model": "e", "input": [1, 2]})
    with pytest.raises(OpenAIError):
        embeddings_request({"model": "e", "input": "a", "encoding_format": "hex"})
