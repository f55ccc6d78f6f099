"""OpenAI answers written without a server (``runtime.frontends.openai.openai_answers``): completions, chunks, embeddings."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from runtime.frontends.openai.openai_answers import Chunks, answer, embeddings_answer
from runtime.frontends.openai.openai_errors import OpenAIError
from runtime.frontends.openai.openai_requests import chat_plan, completion_plan
from runtime.types import InferenceResponse, Parameters, ResponseOutput


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


def test_embeddings_answer() -> None:
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
