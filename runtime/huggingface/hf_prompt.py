"""A generation request's prompt, read: its tokens and its text (``echo`` repeats the text).

Three inputs say it: a BYTES ``messages`` (the chat messages as JSON, rendered by the
tokenizer's chat template), an INT64 ``input_ids`` (the tokens themselves, each checked against
the vocabulary), or the BYTES text input (``generate.text_input``: one prompt). Each refusal is
an :class:`~runtime.errors.InvalidInput` that names the input.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from runtime.errors import InvalidInput
from runtime.types import InferenceRequest


def prompt_of(
    request: InferenceRequest, tokenizer: Any, model: str, text_input: str
) -> tuple[list[int], str]:
    """The prompt's tokens, and its text, for model ``model`` whose text input is ``text_input``."""
    inputs = {inp.name: inp for inp in request.inputs}
    if "messages" in inputs:
        messages = json_input(inputs["messages"])
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise InvalidInput("messages must be a JSON list of objects with a role and a content")
        if not tokenizer.chat_template:
            raise InvalidInput(
                f"Model {model!r} has no chat template: its tokenizer has none and "
                "parameters.extra.chat_template sets none"
            )
        try:
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        except Exception as exc:  # the template's own checks (roles, alternation) speak to the client
            raise InvalidInput(f"The chat template refused the messages: {exc}") from None
        return list(tokenizer(text, add_special_tokens=False)["input_ids"]), str(text)
    if "input_ids" in inputs:
        data = np.asarray(inputs["input_ids"].data)
        if data.dtype.kind not in "iu":
            raise InvalidInput("input_ids must hold integer token ids")
        ids = data.reshape(-1).tolist()
        vocabulary = len(tokenizer)
        if any(not 0 <= t < vocabulary for t in ids):
            raise InvalidInput(f"input_ids holds a token id outside the vocabulary (0 to {vocabulary - 1})")
        return ids, str(tokenizer.decode(ids))
    if text_input not in inputs:
        raise InvalidInput(
            f"Model {model!r} needs a BYTES input {text_input!r} (the prompt), 'input_ids' or 'messages'"
        )
    text = one_text(inputs[text_input])
    return list(tokenizer(text)["input_ids"]), text


def decoded(item: Any) -> str:
    """One BYTES element as text (UTF-8, undecodable bytes replaced)."""
    return (
        bytes(item).decode("utf-8", errors="replace") if isinstance(item, (bytes, bytearray)) else str(item)
    )


def one_text(inp: Any) -> str:
    """The one text a BYTES input holds; more or none is refused."""
    items = np.asarray(inp.data, dtype=object).reshape(-1)
    if items.size != 1:
        raise InvalidInput(f"{inp.name} must hold one prompt, got {items.size}")
    return decoded(items[0])


def json_input(inp: Any) -> Any:
    """The JSON document a BYTES input holds, read."""
    try:
        return orjson.loads(one_text(inp))
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"{inp.name} must be JSON: {exc}") from None
