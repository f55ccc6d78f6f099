"""Choosing each row's next token: greedy, banned tokens, top-k / top-p sampling with a seed, log-probabilities."""

from __future__ import annotations

import math

import pytest

from runtime.huggingface.options import GenerationOptions

torch = pytest.importorskip("torch", reason="the Hugging Face runtime needs torch")

from runtime.huggingface.sampling import choose  # noqa: E402

GREEDY = GenerationOptions(temperature=0)


def test_greedy_rows_take_the_arg_max_and_banned_tokens_are_skipped() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0], [5.0, 0.0, 4.0]])
    choices = choose(logits, [GREEDY, GREEDY], [None, None], [None, [0]])
    assert [c.token for c in choices] == [1, 2]
    assert choices[0].logprob is None  # not asked for


def test_log_probabilities_are_the_raw_log_softmax() -> None:
    logits = torch.tensor([[1.0, 2.0, 3.0]])
    options = GenerationOptions(temperature=0.5, logprobs=True, top_logprobs=2, seed=1)
    generator = torch.Generator().manual_seed(1)
    (choice,) = choose(logits, [options], [generator], [None])
    expected = torch.log_softmax(logits[0], -1)
    assert choice.logprob == pytest.approx(float(expected[choice.token]))
    assert choice.top is not None and [t for t, _ in choice.top] == [2, 1]
    assert math.exp(choice.top[0][1]) == pytest.approx(float(torch.softmax(logits[0], -1)[2]))


def test_sampling_follows_the_seed_and_top_k_top_p_narrow_the_choice() -> None:
    logits = torch.zeros(1, 50)
    logits[0, :5] = torch.tensor([4.0, 3.9, 3.8, 3.7, 3.6])

    def draw(options: GenerationOptions, seed: int, times: int = 30) -> list[int]:
        generator = torch.Generator().manual_seed(seed)
        return [choose(logits, [options], [generator], [None])[0].token for _ in range(times)]

    sampled = GenerationOptions(temperature=1.0)
    assert draw(sampled, 3) == draw(sampled, 3)
    assert set(draw(GenerationOptions(temperature=1.0, top_k=2), 4)) <= {0, 1}
    assert set(draw(GenerationOptions(temperature=1.0, top_p=0.3), 5)) <= {0, 1}
    assert draw(GenerationOptions(temperature=1.0, top_p=1e-6), 6, 5) == [0] * 5
