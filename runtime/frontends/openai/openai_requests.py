"""The OpenAI API's requests, read: each becomes the InferenceRequests of its streams (a :class:`Plan`).

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

A bad field is an :class:`~.openai_errors.OpenAIError` naming it.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import orjson

from runtime.frontends.openai.openai_errors import OpenAIError
from runtime.types import Datatype, InferenceRequest, Parameters, RequestInput

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
