"""A generation request's parameters, read and checked."""

from __future__ import annotations

from typing import Any

import pytest

from runtime.errors import InvalidInput
from runtime.huggingface.options import GenerationOptions, read_options


def test_defaults_and_every_option() -> None:
    assert read_options({}) == GenerationOptions()
    options = read_options(
        {
            "max_tokens": 9,
            "min_tokens": 2,
            "temperature": 0,
            "top_p": 0.5,
            "top_k": -1,
            "seed": 4,
            "stop": "END",
            "stop_token_ids": [7],
            "ignore_eos": True,
            "logprobs": 2,
            "top_logprobs": 3,
            "details": True,
            "max_tokens_unknown": "ignored",
        }
    )
    assert options.greedy and options.top_k == 0 and options.stop == ("END",)
    assert options.stop_token_ids == frozenset({7}) and options.logprobs and options.top_logprobs == 3
    assert read_options({"logprobs": True}).top_logprobs == 0
    assert read_options({"top_k": 1, "temperature": 1}).greedy
    assert read_options({"max_tokens": 3.0}).max_tokens == 3
    assert read_options({"echo": True}).echo


@pytest.mark.parametrize(
    ("parameters", "named"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": "9"}, "max_tokens"),
        ({"min_tokens": 5, "max_tokens": 2}, "min_tokens"),
        ({"temperature": -1}, "temperature"),
        ({"temperature": True}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"n": 3}, "n must be 1"),
        ({"stop": 5}, "stop"),
        ({"stop": [""]}, "stop"),
        ({"stop": ["a"] * 17}, "stop"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
        ({"ignore_eos": "yes"}, "ignore_eos"),
        ({"logprobs": "x"}, "logprobs"),
        ({"logprobs": 21}, "top_logprobs"),
        ({"top_logprobs": 2}, "top_logprobs needs logprobs"),
        ({"echo": True, "logprobs": 1}, "echo"),
    ],
)
def test_bad_values_are_refused_naming_the_parameter(parameters: dict[str, Any], named: str) -> None:
    with pytest.raises(InvalidInput, match=named):
        read_options(parameters)
