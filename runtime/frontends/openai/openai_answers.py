"""The OpenAI API's answers, written from the models' answers: a whole completion, streamed chunks, embeddings.

The models' answers carry the text (``text_output``), ``finish_reason`` (``eos_token`` and
``stop_sequence`` become OpenAI's ``stop``), ``prompt_tokens``, ``completion_tokens`` and, when
asked, ``logprobs`` and ``token_ids`` (see ``runtime.huggingface``); the request's
:class:`~.openai_requests.Plan` says which document to write.
"""

from __future__ import annotations

import base64
from typing import Any

from runtime.frontends.openai.openai_errors import OpenAIError
from runtime.frontends.openai.openai_requests import Plan
from runtime.tensors import output_array
from runtime.types import InferenceResponse


def extra(response: InferenceResponse) -> dict[str, Any]:
    return dict(response.parameters.model_extra or {}) if response.parameters is not None else {}


def text_of(response: InferenceResponse) -> str:
    output = next((out for out in response.outputs if out.datatype == "BYTES"), None)
    if output is None:
        return ""
    items = output_array(output).reshape(-1)
    item = items[0] if items.size else b""
    return bytes(item).decode("utf-8", "replace") if isinstance(item, (bytes, bytearray)) else str(item)


def finish_reason(found: Any) -> str | None:
    if found is None:
        return None
    return "length" if found == "length" else "stop"


def usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def logprobs_of(plan: Plan, entries: list[dict[str, Any]] | None, offset: int) -> Any:
    """OpenAI's ``logprobs`` of a choice (or of a chunk's tokens): chat's ``content`` list, or the
    completions' columns (``text_offset`` counting from ``offset``)."""
    if not plan.logprobs:
        return None
    entries = entries or []
    if plan.kind == "chat":
        return {
            "content": [
                {
                    "token": e["token"],
                    "logprob": e["logprob"],
                    "bytes": e["bytes"],
                    "top_logprobs": [
                        {"token": t["token"], "logprob": t["logprob"], "bytes": t["bytes"]}
                        for t in e["top_logprobs"]
                    ],
                }
                for e in entries
            ]
        }
    offsets = []
    for e in entries:
        offsets.append(offset)
        offset += len(e["token"])
    return {
        "tokens": [e["token"] for e in entries],
        "token_logprobs": [e["logprob"] for e in entries],
        "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries],
        "text_offset": offsets,
    }


def answer(plan: Plan, responses: list[InferenceResponse]) -> dict[str, Any]:
    """The answer to a request that did not stream: one choice per response, in order."""
    choices = []
    prompt_tokens = completion_tokens = 0
    for index, response in enumerate(responses):
        found = extra(response)
        if index % plan.choices == 0:
            prompt_tokens += int(found.get("prompt_tokens", 0))
        completion_tokens += int(found.get("completion_tokens", 0))
        text = text_of(response)
        choice: dict[str, Any] = {"index": index, "finish_reason": finish_reason(found.get("finish_reason"))}
        if plan.kind == "chat":
            choice["message"] = {"role": "assistant", "content": text}
            choice["logprobs"] = logprobs_of(plan, found.get("logprobs"), 0)
        else:
            choice["text"] = text
            choice["logprobs"] = logprobs_of(plan, found.get("logprobs"), 0)
        if plan.token_ids:
            choice["token_ids"] = found.get("token_ids")
        choices.append(choice)
    return {
        "id": _id(plan),
        "object": "chat.completion" if plan.kind == "chat" else "text_completion",
        "created": plan.created,
        "model": plan.model,
        "choices": choices,
        "usage": usage(prompt_tokens, completion_tokens),
    }


def _id(plan: Plan) -> str:
    return ("chatcmpl-" if plan.kind == "chat" else "cmpl-") + plan.id


class Chunks:
    """The streamed chunks of one request: each model chunk becomes one OpenAI chunk."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.started: set[int] = set()
        self.offsets: dict[int, int] = {}

    def _base(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        chunk: dict[str, Any] = {
            "id": _id(self.plan),
            "object": "chat.completion.chunk" if self.plan.kind == "chat" else "text_completion",
            "created": self.plan.created,
            "model": self.plan.model,
            "choices": choices,
        }
        if self.plan.include_usage:
            chunk["usage"] = None
        return chunk

    def chunk(self, index: int, response: InferenceResponse) -> dict[str, Any]:
        found = extra(response)
        text = text_of(response)
        reason = finish_reason(found.get("finish_reason"))
        if reason is not None:
            if index % self.plan.choices == 0:
                self.prompt_tokens += int(found.get("prompt_tokens", 0))
            self.completion_tokens += int(found.get("completion_tokens", 0))
        offset = self.offsets.get(index, 0)
        self.offsets[index] = offset + len(text)
        choice: dict[str, Any] = {"index": index}
        if self.plan.kind == "chat":
            delta: dict[str, Any] = {}
            if index not in self.started:
                delta["role"] = "assistant"
            if text or index not in self.started:
                delta["content"] = text
            choice["delta"] = delta
        else:
            choice["text"] = text
        self.started.add(index)
        choice["logprobs"] = logprobs_of(self.plan, found.get("logprobs"), offset)
        choice["finish_reason"] = reason
        if self.plan.token_ids and reason is not None:
            choice["token_ids"] = found.get("token_ids")
        return self._base([choice])

    def usage_chunk(self) -> dict[str, Any]:
        chunk = self._base([])
        chunk["usage"] = usage(self.prompt_tokens, self.completion_tokens)
        return chunk


def embeddings_answer(model: str, response: InferenceResponse, encoding: str) -> dict[str, Any]:
    output = next((out for out in response.outputs if out.name == "embedding"), None)
    if output is None:
        raise OpenAIError(f"Model {model!r} does not answer embeddings (no output 'embedding')", "model")
    vectors = output_array(output).astype("<f4", copy=False)
    vectors = vectors.reshape(vectors.shape[0], -1)
    data = []
    for index, row in enumerate(vectors):
        embedding: Any = base64.b64encode(row.tobytes()).decode() if encoding == "base64" else row.tolist()
        data.append({"object": "embedding", "index": index, "embedding": embedding})
    tokens = int(extra(response).get("prompt_tokens", 0))
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
