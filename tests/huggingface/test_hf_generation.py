"""A stream's generation without a server (``runtime.huggingface.hf_generation``): its token budget,
what each token gives it, and its ending, with the tiny model's real tokenizer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runtime.errors import InvalidInput
from runtime.huggingface.hf_generation import (
    Generation,
    banned,
    ending,
    eos_ids,
    max_tokens_of,
    start,
    take,
)
from runtime.huggingface.options import read_options
from runtime.huggingface.sampling import Choice


@pytest.fixture(scope="module")
def tokenizer(tiny_llm: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_llm)


def _generation(tokenizer: Any, max_tokens: int = 8, **parameters: Any) -> Generation:
    prompt = list(tokenizer("the cat")["input_ids"])
    return start(read_options(parameters), prompt, "the cat", max_tokens, tokenizer, "cpu")


def test_the_budget_is_the_request_s_or_the_context_s_room() -> None:
    assert max_tokens_of(read_options({"max_tokens": 5}), 10, 20, None) == 5
    assert max_tokens_of(read_options({}), 10, 20, None) == 10
    assert max_tokens_of(read_options({}), 10, 20, 4) == 4
    with pytest.raises(InvalidInput, match="requested 25 tokens"):
        max_tokens_of(read_options({"max_tokens": 15}), 10, 20, None)
    with pytest.raises(InvalidInput, match="no room is left"):
        max_tokens_of(read_options({}), 20, 20, None)


def test_tokens_give_text_and_the_budget_ends_it(tokenizer: Any) -> None:
    words = list(tokenizer(" dog runs", add_special_tokens=False)["input_ids"])
    g = _generation(tokenizer, max_tokens=len(words), logprobs=True, temperature=0)
    assert g.generator is None and g.sequence is not None  # greedy: no random generator
    pieces = [take(g, Choice(t, -0.5, [(t, -0.5)]), frozenset(), tokenizer) for t in words]
    assert "".join(p.piece for p in pieces) == " dog runs"
    assert [p.finish for p in pieces][-1] == "length" and all(p.finish is None for p in pieces[:-1])
    assert [e["id"] for e in g.entries] == words and g.entries[0]["top_logprobs"][0]["logprob"] == -0.5
    assert ending(g) == {
        "finish_reason": "length",
        "prompt_tokens": len(g.prompt),
        "completion_tokens": len(words),
        "token_ids": words,
    }


def test_end_of_sequence_min_tokens_echo_and_details(tokenizer: Any) -> None:
    eos = frozenset({tokenizer.eos_token_id})
    g = _generation(tokenizer, min_tokens=1, echo=True, details=True, temperature=1.0, seed=3)
    assert g.generator is not None  # sampling: its own seeded generator
    assert banned(g, eos) == [tokenizer.eos_token_id]
    dog = list(tokenizer(" dog", add_special_tokens=False)["input_ids"])
    first = take(g, Choice(dog[-1]), eos, tokenizer)
    assert first.piece.startswith("the cat") and banned(g, eos) is None
    last = take(g, Choice(tokenizer.eos_token_id), eos, tokenizer)
    assert last.finish == "eos_token" and ending(g)["details"] == {
        "generated_tokens": 2,
        "prompt_tokens": len(g.prompt),
    }


def test_the_end_of_sequence_tokens_come_from_the_model_else_the_tokenizer(tokenizer: Any) -> None:
    class Config:
        eos_token_id: Any = None

    class Model:
        config = Config()

    assert eos_ids(Model(), tokenizer) == frozenset({tokenizer.eos_token_id})
    Model.config.eos_token_id = [5, 6]
    assert eos_ids(Model(), tokenizer) == frozenset({5, 6})
