"""Counts a language model keeps about the tokens it generates, read by the metrics at scrape time.

A text-generation model (``runtime.huggingface``) holds one :class:`TokenStats` as its
``token_stats`` and tells it of each stream: its prompt's tokens once it is prefilled, each
generated token's time, and its end. The metrics module exposes them under vLLM's family names
(``vllm:prompt_tokens_total``, ``vllm:time_to_first_token_seconds``...; see docs/metrics.md), so
that vLLM's dashboards read this server unchanged. The counters add exactly what the answers'
``usage`` reports. Plain numbers, no metrics library; only the event loop's thread writes them.
"""

from __future__ import annotations

from typing import Any

from runtime.telemetry.counts import Histogram

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
"""Seconds to the first token (vLLM's buckets)."""

ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
"""Seconds between two tokens of a stream (vLLM's buckets, with its smallest added)."""

E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)
"""Seconds from a request's arrival to its last token (vLLM's buckets)."""


class TokenStats:
    """The tokens of one loaded language model."""

    __slots__ = ("e2e", "generation_tokens", "inter_token", "prompt_tokens", "requests", "ttft")

    def __init__(self) -> None:
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.requests: dict[str, int] = {}
        """Streams ended, by finish reason (``stop``, ``length``, ``abort``)."""
        self.ttft = Histogram(len(TTFT_BUCKETS))
        self.inter_token = Histogram(len(ITL_BUCKETS))
        self.e2e = Histogram(len(E2E_BUCKETS))

    def first_token(self, seconds: float) -> None:
        """A stream produced its first token ``seconds`` after its request arrived."""
        self.ttft.observe(seconds, TTFT_BUCKETS)

    def next_token(self, seconds: float) -> None:
        """A stream produced another token ``seconds`` after its previous one."""
        self.inter_token.observe(seconds, ITL_BUCKETS)

    def ended(self, prompt_tokens: int, generated: int, reason: str, seconds: float | None) -> None:
        """A stream ended: the tokens it was answered with (its usage), why, and its seconds from
        arrival to its last token (None when it produced none)."""
        self.prompt_tokens += prompt_tokens
        self.generation_tokens += generated
        self.requests[reason] = self.requests.get(reason, 0) + 1
        if seconds is not None:
            self.e2e.observe(seconds, E2E_BUCKETS)

    def snapshot(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "generation_tokens": self.generation_tokens,
            "requests": dict(self.requests),
            "ttft": (list(self.ttft.counts), self.ttft.sum),
            "inter_token": (list(self.inter_token.counts), self.inter_token.sum),
            "e2e": (list(self.e2e.counts), self.e2e.sum),
        }
