"""A language model's token counts, as the metrics read them."""

from __future__ import annotations

from runtime.telemetry.tokens import E2E_BUCKETS, TTFT_BUCKETS, TokenStats


def test_counts_and_histograms() -> None:
    stats = TokenStats()
    stats.first_token(0.003)
    stats.next_token(0.02)
    stats.next_token(0.03)
    stats.ended(7, 3, "length", 0.053)
    stats.ended(0, 0, "abort", None)
    snapshot = stats.snapshot()
    assert (snapshot["prompt_tokens"], snapshot["generation_tokens"]) == (7, 3)
    assert snapshot["requests"] == {"length": 1, "abort": 1}
    counts, total = snapshot["ttft"]
    assert len(counts) == len(TTFT_BUCKETS) + 1 and sum(counts) == 1 and total == 0.003
    assert sum(snapshot["inter_token"][0]) == 2
    e2e_counts, _ = snapshot["e2e"]
    assert len(e2e_counts) == len(E2E_BUCKETS) + 1 and sum(e2e_counts) == 1  # the abort had no token
