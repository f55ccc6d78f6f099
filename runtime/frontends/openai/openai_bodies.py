"""The OpenAI API's bodies, translated: requests into InferenceRequests, model answers into OpenAI's documents.

Transport-free (no Starlette here): :mod:`.openai_routes` reads the bytes and writes the answers.
What a request becomes:

- ``/v1/completions``: one stream per prompt and per choice (``n``): a BYTES ``text_input`` for a
  text prompt, an INT64 ``input_ids`` for a prompt given as token ids; OpenAI's default
  ``max_tokens`` (16) when the request names none.
- ``/v1/chat/completions``: one stream per choice, whose BYTES ``messages`` input holds the
  messages as JSON (the model renders them with its chat template); ``max_completion_tokens`` or
  ``max_tokens``, else up to the context's end.
- The sampling parameters pass through as request parameters under their own names
  (``temperature``, ``top_p``, ``seed``, ``stop``, ``logprobs``, and vLLM's ``top_k``,
  ``min_tokens``, ``ignore_eos``, ``stop_token_ids``); choice ``i`` of a seeded request samples
  with ``seed + i``, so that its ``n`` choices differ and a second request repeats them.
- ``/v1/embeddings``: a BYTES ``text_input`` with every text.

The models' answers carry the text (``text_output``), ``finish_reason`` (``eos_token`` and
``stop_sequence`` become OpenAI's ``stop``), ``prompt_tokens``, ``completion_tokens`` and, when
asked, ``logprobs`` (see ``runtime.huggingface``).
"""

from __future__ import annotations

import base64
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import orjson

from runtime.errors import InvalidInput, ModelNotFound, ServerError
from runtime.tensors import output_array
from runtime.types import Datatype, InferenceRequest, InferenceResponse, Parameters, RequestInput

Kind = Literal["completion", "chat"]

COMPLETIONS_DEFAULT_MAX_TOKENS = 16
"""What OpenAI's completions route generates when a request names no ``max_tokens``."""

PASSED = (
    "temperature",
    "top_p",
    "top_k",
    "min_tokens",
    "ignore_eos",
    "stop_token_ids",
    "stop",
    "presence_penalty",
    "frequency_penalty",
)
"""Request fields passed to the model as parameters of the same name."""


class OpenAIError(InvalidInput):
    """A bad request, with the request field it concerns (OpenAI's ``param``)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass
class Plan:
    """The streams one OpenAI request runs: one InferenceRequest per choice, in index order."""

    kind: Kind
    model: str
    requests: list[InferenceRequest]
    stream: bool = False
    include_usage: bool = False
    choices: int = 1
    """Choices per prompt (``n``)."""
    logprobs: bool = False
    echo: bool = False
    token_ids: bool = False
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))


def error_body(exc: ServerError, status: int) -> dict[str, Any]:
    """OpenAI's error document for ``exc``, answered with ``status``."""
    kind = {
        400: "invalid_request_error",
        401: "authentication_error",
        404: "not_found_error",
        413: "invalid_request_error",
        429: "rate_limit_error",
        499: "invalid_request_error",
        503: "service_unavailable_error",
    }.get(status, "server_error")
    code = "model_not_found" if isinstance(exc, ModelNotFound) else None
    return {
        "error": {"message": exc.message, "type": kind, "param": getattr(exc, "param", None), "code": code}
    }


# ---------------------------------------------------------------------- requests


def read_json(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise OpenAIError(f"The body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise OpenAIError("The body must be a JSON object")
    return body


def model_of(body: dict[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise OpenAIError("model is required: the name of a served model", "model")
    return model


def completion_plan(body: dict[str, Any]) -> Plan:
    """The streams of a ``/v1/completions`` request."""
    prompts = _prompts(body.get("prompt"))
    parameters = _parameters(body, "completion")
    parameters.setdefault("max_tokens", COMPLETIONS_DEFAULT_MAX_TOKENS)
    logprobs = body.get("logprobs")
    if logprobs is not None:
        if isinstance(logprobs, bool) or not isinstance(logprobs, int) or not 0 <= logprobs <= 5:
            raise OpenAIError("logprobs must be an integer from 0 to 5", "logprobs")
        parameters["logprobs"] = logprobs
    echo = _flag(body, "echo")
    if echo:
        parameters["echo"] = True
    n = _n(body)
    requests = [
        _request(_prompt_input(prompt), _choice(parameters, i)) for prompt in prompts for i in range(n)
    ]
    return _plan("completion", body, requests, n, logprobs is not None, echo)


def chat_plan(body: dict[str, Any]) -> Plan:
    """The streams of a ``/v1/chat/completions`` request."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise OpenAIError("messages must be a non-empty list", "messages")
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise OpenAIError("each message must be an object with a role", "messages")
        content = message.get("content")
        if isinstance(content, list):  # content parts: the text ones, joined
            texts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"]
            if len(texts) != len(content):
                raise OpenAIError("only text content parts are served", "messages")
            message["content"] = "".join(texts)
        elif content is not None and not isinstance(content, str):
            raise OpenAIError("a message's content must be a string or a list of text parts", "messages")
    parameters = _parameters(body, "chat")
    if body.get("max_completion_tokens") is not None:
        parameters["max_tokens"] = body["max_completion_tokens"]
    logprobs = _flag(body, "logprobs")
    top = body.get("top_logprobs")
    if top is not None:
        if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= 20:
            raise OpenAIError("top_logprobs must be an integer from 0 to 20", "top_logprobs")
        if not logprobs:
            raise OpenAIError("top_logprobs needs logprobs: true", "top_logprobs")
    if logprobs:
        parameters["logprobs"] = top or 0
    for unsupported in ("tools", "functions"):
        if body.get(unsupported):
            raise OpenAIError(f"{unsupported} are not served by this server", unsupported)
    n = _n(body)
    document = orjson.dumps(messages)
    inp = RequestInput(name="messages", shape=[1], datatype=Datatype.BYTES, data=[document])
    requests = [_request(inp, _choice(parameters, i)) for i in range(n)]
    return _plan("chat", body, requests, n, logprobs, False)


def _plan(
    kind: Kind, body: dict[str, Any], requests: list[InferenceRequest], n: int, logprobs: bool, echo: bool
) -> Plan:
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise OpenAIError("stream_options must be an object", "stream_options")
    return Plan(
        kind=kind,
        model=model_of(body),
        requests=requests,
        stream=_flag(body, "stream"),
        include_usage=bool(options.get("include_usage")),
        choices=n,
        logprobs=logprobs,
        echo=echo,
        token_ids=_flag(body, "return_token_ids"),
    )


def _parameters(body: dict[str, Any], kind: Kind) -> dict[str, Any]:
    parameters = {name: body[name] for name in PASSED if body.get(name) is not None}
    for penalty in ("presence_penalty", "frequency_penalty"):
        if parameters.pop(penalty, 0) not in (0, 0.0):
            raise OpenAIError(f"{penalty} is not served (only 0)", penalty)
    if body.get("max_tokens") is not None:
        parameters["max_tokens"] = body["max_tokens"]
    stop = parameters.get("stop")
    if isinstance(stop, list) and len(stop) > 4:
        raise OpenAIError("stop takes at most 4 strings", "stop")
    seed = body.get("seed")
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise OpenAIError("seed must be an integer", "seed")
        parameters["seed"] = seed
    temperature = parameters.get("temperature")
    if temperature is not None and (
        isinstance(temperature, bool)
        or not isinstance(temperature, (int, float))
        or not 0 <= temperature <= 2
    ):
        raise OpenAIError("temperature must be a number from 0 to 2", "temperature")
    return parameters


def _choice(parameters: dict[str, Any], index: int) -> dict[str, Any]:
    if index and "seed" in parameters:
        return {**parameters, "seed": parameters["seed"] + index}
    return parameters


def _n(body: dict[str, Any]) -> int:
    n = body.get("n", 1)
    if n is None:
        return 1
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 128:
        raise OpenAIError("n must be an integer from 1 to 128", "n")
    return n


def _flag(body: dict[str, Any], name: str) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise OpenAIError(f"{name} must be true or false", name)
    return value


def _prompts(prompt: Any) -> list[str | list[int]]:
    """A completions request's prompts: a string, strings, token ids or lists of token ids."""
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return list(prompt)
        if all(_is_int(t) for t in prompt):
            return [list(prompt)]
        if all(isinstance(p, list) and p and all(_is_int(t) for t in p) for p in prompt):
            return list(prompt)
    raise OpenAIError("prompt must be a string, a list of strings, token ids or lists of token ids", "prompt")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _prompt_input(prompt: str | list[int]) -> RequestInput:
    if isinstance(prompt, str):
        return RequestInput(name="text_input", shape=[1], datatype=Datatype.BYTES, data=[prompt.encode()])
    data = np.asarray(prompt, dtype=np.int64)
    return RequestInput(name="input_ids", shape=[len(prompt)], datatype=Datatype.INT64, data=data)


def _request(inp: RequestInput, parameters: dict[str, Any]) -> InferenceRequest:
    return InferenceRequest(inputs=[inp], parameters=Parameters(**parameters))


def embeddings_request(body: dict[str, Any]) -> tuple[InferenceRequest, Literal["float", "base64"]]:
    """The one InferenceRequest of a ``/v1/embeddings`` request, and the encoding asked for."""
    given = body.get("input")
    texts = [given] if isinstance(given, str) else given
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise OpenAIError(
            "input must be a string or a non-empty list of strings (token ids are not served)", "input"
        )
    encoding = body.get("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise OpenAIError("encoding_format must be 'float' or 'base64'", "encoding_format")
    data = [t.encode() for t in texts]
    inp = RequestInput(name="text_input", shape=[len(data)], datatype=Datatype.BYTES, data=data)
    return InferenceRequest(inputs=[inp]), "base64" if encoding == "base64" else "float"


# ---------------------------------------------------------------------- answers


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
