"""The next token of every stream of a step, from its logits: greedy or sampled, per stream.

Greedy rows take the arg-max of the raw logits, as ``model.generate(do_sample=False)`` does.
Sampled rows divide the logits by the temperature, keep the ``top_k`` most likely tokens and the
smallest set whose probability reaches ``top_p``, and draw from what is left with the stream's
own generator (seeded by the request's ``seed``: the same request draws the same tokens,
whatever else shares the step). Before ``min_tokens`` tokens, the end-of-sequence and stop
tokens cannot be chosen. Log-probabilities are the model's raw log-softmax (before temperature
and truncation), as OpenAI and vLLM report them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from runtime.huggingface.options import GenerationOptions


@dataclass(slots=True)
class Choice:
    """The token chosen for one row, and its log-probabilities when asked for."""

    token: int
    logprob: float | None = None
    top: list[tuple[int, float]] | None = None


def choose(
    logits: torch.Tensor,
    options: list[GenerationOptions],
    generators: list[torch.Generator | None],
    banned: list[list[int] | None],
) -> list[Choice]:
    """One token per row of ``logits`` [rows, vocabulary]; ``banned``: the tokens a row may not
    take this step (None: any)."""
    logits = logits.float()
    masked = logits
    if any(b for b in banned):
        masked = logits.clone()
        for row, tokens in enumerate(banned):
            if tokens:
                masked[row, tokens] = float("-inf")
    tokens = masked.argmax(dim=-1).tolist()
    for row, option in enumerate(options):
        if not option.greedy:
            tokens[row] = _sample(masked[row], option, generators[row])
    wants = [row for row, option in enumerate(options) if option.logprobs]
    choices = [Choice(token) for token in tokens]
    if wants:
        logprobs = torch.log_softmax(logits[wants], dim=-1)
        for index, row in enumerate(wants):
            choice = choices[row]
            choice.logprob = float(logprobs[index, choice.token])
            top = options[row].top_logprobs
            if top:
                values, ids = torch.topk(logprobs[index], top)
                choice.top = list(zip(ids.tolist(), values.tolist(), strict=True))
    return choices


def _sample(logits: torch.Tensor, option: GenerationOptions, generator: torch.Generator | None) -> int:
    scores = logits / option.temperature
    if option.top_k > 0 and option.top_k < scores.shape[-1]:
        kth = torch.topk(scores, option.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probabilities = torch.softmax(scores, dim=-1)
    if option.top_p < 1:
        ordered, order = torch.sort(probabilities, descending=True)
        outside = torch.cumsum(ordered, 0) - ordered >= option.top_p  # the first token always stays
        ordered = ordered.masked_fill(outside, 0.0)
        probabilities = torch.zeros_like(probabilities).scatter(0, order, ordered)
    return int(torch.multinomial(probabilities, 1, generator=generator))
