"""A generation request's prompt read without a server (``runtime.huggingface.hf_prompt``), with the
tiny model's real tokenizer and chat template."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from runtime.errors import InvalidInput
from runtime.huggingface.hf_prompt import decoded, json_input, one_text, prompt_of
from runtime.types import Datatype, InferenceRequest, RequestInput


@pytest.fixture(scope="module")
def tokenizer(tiny_llm: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_llm)


def _request(name: str, data: Any, datatype: Datatype = Datatype.BYTES) -> InferenceRequest:
    return InferenceRequest(inputs=[RequestInput(name=name, shape=[len(data)], datatype=datatype, data=data)])


def test_text_token_ids_and_messages(tokenizer: Any) -> None:
    ids, text = prompt_of(_request("text_input", [b"the cat"]), tokenizer, "m", "text_input")
    assert ids == list(tokenizer("the cat")["input_ids"]) and text == "the cat"
    given = np.array(ids, dtype=np.int64)
    assert prompt_of(_request("input_ids", given, Datatype.INT64), tokenizer, "m", "text_input")[0] == ids
    messages = orjson.dumps([{"role": "user", "content": "hi"}])
    chat_ids, chat_text = prompt_of(_request("messages", [messages]), tokenizer, "m", "text_input")
    assert chat_text == "<s>user: hi</s><s>assistant:" and chat_ids


def test_bad_prompts_are_refused_naming_the_input(tokenizer: Any) -> None:
    with pytest.raises(InvalidInput, match="'prompt'"):
        prompt_of(_request("other", [b"x"]), tokenizer, "m", "prompt")
    with pytest.raises(InvalidInput, match="outside the vocabulary"):
        prompt_of(_request("input_ids", np.array([10**6]), Datatype.INT64), tokenizer, "m", "text_input")
    with pytest.raises(InvalidInput, match="integer token ids"):
        prompt_of(_request("input_ids", np.array([1.5]), Datatype.FP64), tokenizer, "m", "text_input")
    with pytest.raises(InvalidInput, match="list of objects"):
        prompt_of(_request("messages", [b'"hi"']), tokenizer, "m", "text_input")
    with pytest.raises(InvalidInput, match="one prompt, got 2"):
        one_text(RequestInput(name="text_input", shape=[2], datatype=Datatype.BYTES, data=[b"a", b"b"]))
    with pytest.raises(InvalidInput, match="messages must be JSON"):
        json_input(RequestInput(name="messages", shape=[1], datatype=Datatype.BYTES, data=[b"{"]))


def test_bytes_are_read_as_utf_8() -> None:
    assert decoded(b"caf\xc3\xa9") == "café" and decoded(b"\xff") == "\ufffd" and decoded("s") == "s"
