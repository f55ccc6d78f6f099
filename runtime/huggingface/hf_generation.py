"""One stream's generation: its state, its token budget, and what each new token gives it.

A stream's :class:`Generation` is made when it joins (:func:`start`: the prompt's room in the
context, the sampler's seed), then every step :func:`take` adds the token chosen for it: its text
(through :class:`~runtime.huggingface.text.TextStream`, which holds back a possible stop string),
its log-probability entry when asked, and why it ends (``eos_token``, ``stop_sequence``,
``length``) or None. :func:`ending` is what its last chunk and its unary answer carry.
The model (:mod:`.hf_model`) runs the forward calls; nothing here calls the model.
"""

from __future__ import annotations

import random
from typing import Any

from runtime.errors import InvalidInput
from runtime.huggingface.options import GenerationOptions
from runtime.huggingface.text import TextStream

CONTEXT_TOKENS = 6
"""Prompt tokens a stream's text decoder starts from, so that its first word reads as it will."""


class Generation:
    """One stream's generation, from its joining to its end."""

    __slots__ = (
        "count",
        "counted",
        "entries",
        "finish",
        "first",
        "generator",
        "last",
        "last_at",
        "max_tokens",
        "options",
        "pending",
        "prompt",
        "prompt_text",
        "sequence",
        "text",
        "token_ids",
    )

    def __init__(
        self,
        options: GenerationOptions,
        prompt: list[int],
        prompt_text: str,
        max_tokens: int,
        text: TextStream,
    ) -> None:
        self.options = options
        self.prompt = prompt
        self.prompt_text = prompt_text
        self.max_tokens = max_tokens
        self.text = text
        self.sequence: Any = None
        self.generator: Any = None
        self.count = 0
        self.counted = False
        """Its tokens were added to the model's ``token_stats``."""
        self.last = -1
        self.finish: str | None = None
        self.first = True
        self.pending: list[dict[str, Any]] = []
        """Log-probability entries not sent yet."""
        self.entries: list[dict[str, Any]] = []
        """Every log-probability entry (a unary answer lists them)."""
        self.token_ids: list[int] = []
        self.last_at = 0.0


class Produced:
    """What one step gave one stream: its new text, why it ended (or None), its new tokens'
    log-probability entries (when asked for)."""

    __slots__ = ("finish", "logprobs", "piece")

    def __init__(self, piece: str, finish: str | None, logprobs: list[dict[str, Any]] | None) -> None:
        self.piece, self.finish, self.logprobs = piece, finish, logprobs


def max_tokens_of(options: GenerationOptions, length: int, context: int, default: int | None) -> int:
    """The tokens a stream may generate: the request's ``max_tokens`` if the context has room for
    them after the prompt's ``length`` tokens, else the model's ``default`` (or up to the context's
    end); a request that cannot fit is refused, saying by how much."""
    max_tokens = options.max_tokens
    if max_tokens is None:
        max_tokens = min(default, context - length) if default else context - length
        if max_tokens < 1:
            raise InvalidInput(
                f"This model's maximum context length is {context} tokens, and the prompt has "
                f"{length} tokens: no room is left to generate. Please reduce the prompt."
            )
    elif length + max_tokens > context:
        raise InvalidInput(
            f"This model's maximum context length is {context} tokens. However, you requested "
            f"{length + max_tokens} tokens ({length} in the prompt, {max_tokens} for the "
            "completion). Please reduce the prompt or max_tokens."
        )
    return max_tokens


def start(
    options: GenerationOptions,
    prompt: list[int],
    prompt_text: str,
    max_tokens: int,
    tokenizer: Any,
    device: Any,
) -> Generation:
    """A joining stream's generation: its text decoder, its empty KV-cache sequence, and (when
    it samples) its own random generator, seeded by the request's ``seed`` or at random."""
    import torch

    from runtime.huggingface.kv_cache import Sequence

    g = Generation(
        options,
        prompt,
        prompt_text,
        max_tokens,
        TextStream(tokenizer, options.stop, prompt[-CONTEXT_TOKENS:]),
    )
    g.sequence = Sequence()
    if not options.greedy:
        seed = options.seed if options.seed is not None else random.getrandbits(63)
        g.generator = torch.Generator(device=device).manual_seed(seed)
    return g


def banned(g: Generation, eos: frozenset[int]) -> list[int] | None:
    """Tokens that may not end the stream yet (``min_tokens``)."""
    if g.count >= g.options.min_tokens:
        return None
    return sorted(g.options.stop_token_ids | (set() if g.options.ignore_eos else eos))


def take(g: Generation, choice: Any, eos: frozenset[int], tokenizer: Any) -> Produced:
    """The token ``choice`` (the sampler's) added to ``g``: what the step gives its client."""
    token = choice.token
    g.count += 1
    g.last = token
    g.token_ids.append(token)
    options = g.options
    stop_token = token in options.stop_token_ids
    g.text.add(token, text=not stop_token)
    if options.logprobs:
        entry = log_entry(tokenizer, token, choice.logprob)
        entry["top_logprobs"] = [log_entry(tokenizer, t, lp) for t, lp in choice.top or ()]
        g.pending.append(entry)
        g.entries.append(entry)
    finish = None
    if stop_token or (token in eos and not options.ignore_eos):
        finish = "eos_token"
    elif g.text.stopped:
        finish = "stop_sequence"
    elif g.count >= g.max_tokens:
        finish = "length"
    g.finish = finish
    piece = g.text.flush() if finish is not None else g.text.take()
    if g.first and options.echo:
        piece = g.prompt_text + piece
    if not piece and finish is None:
        return Produced("", None, None)
    g.first = False
    logprobs = None
    if options.logprobs:
        logprobs, g.pending = g.pending, []
    return Produced(piece, finish, logprobs)


def log_entry(tokenizer: Any, token: int, logprob: float | None) -> dict[str, Any]:
    """A token's log-probability entry: its id, text, log-probability and UTF-8 bytes."""
    text = str(tokenizer.decode([token]))
    return {"id": token, "token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def ending(g: Generation) -> dict[str, Any]:
    """The parameters of a generation's last chunk (and of its unary answer)."""
    found: dict[str, Any] = {
        "finish_reason": g.finish,
        "prompt_tokens": len(g.prompt),
        "completion_tokens": g.count,
        "token_ids": g.token_ids,
    }
    if g.options.details:
        found["details"] = {"generated_tokens": g.count, "prompt_tokens": len(g.prompt)}
    return found


def eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    """The tokens that end a generation: the generation config's, else the tokenizer's."""
    found = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if found is None:
        found = getattr(model.config, "eos_token_id", None)
    if found is None:
        found = tokenizer.eos_token_id
    if found is None:
        return frozenset()
    return frozenset(found if isinstance(found, list) else [found])
