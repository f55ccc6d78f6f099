"""The batched KV cache alone: streams prefilled one by one, decoded together, one sitting steps
out and coming back, one freed mid-way; every stream's greedy tokens are ``generate``'s alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.huggingface.tiny_llm import reference, sentences, tokenize

torch = pytest.importorskip("torch", reason="the Hugging Face runtime needs torch")


def _model(folder: Path) -> Any:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model.eval()  # type: ignore[no-untyped-call]
    return model


def test_rows_rearranged_as_streams_come_sit_out_and_go(tiny_llm: Path) -> None:
    from runtime.huggingface.kv_cache import BatchCache, Sequence

    cache = BatchCache(_model(tiny_llm))
    prompts = [tokenize(tiny_llm, text) for text in sentences(4, seed=5)]
    steps = 14
    expected = [reference(tiny_llm, p, steps) for p in prompts]
    sequences = [Sequence() for _ in prompts]
    tokens: list[list[int]] = [[] for _ in prompts]
    with torch.inference_mode():
        for step in range(steps + 4):
            # stream 3 joins late; stream 1 sits out steps 5 and 6; stream 2 is freed at step 9
            active = [i for i in range(4) if (i != 3 or step >= 3) and not (i == 1 and step in (5, 6))]
            active = [i for i in active if len(tokens[i]) < steps and not (i == 2 and step >= 9)]
            if step == 9:
                cache.free(sequences[2])
                assert sequences[2] not in cache.rows
            if not active:
                break
            rows: dict[int, Any] = {}
            decoding = [i for i in active if sequences[i].length]
            for i in active:
                if not sequences[i].length:
                    rows[i] = cache.prefill(sequences[i], prompts[i])
            if decoding:
                logits = cache.decode([sequences[i] for i in decoding], [tokens[i][-1] for i in decoding])
                rows.update({i: logits[j] for j, i in enumerate(decoding)})
            for i in active:
                tokens[i].append(int(rows[i].argmax()))
    assert tokens[0] == expected[0] and tokens[1] == expected[1] and tokens[3] == expected[3]
    assert tokens[2] == expected[2][: len(tokens[2])] and len(tokens[2]) == 9
    for sequence in sequences:
        cache.free(sequence)
    assert cache.rows == [] and cache.tokens == 0


def test_a_model_whose_layers_do_not_all_attend_to_everything_is_refused(tiny_llm: Path) -> None:
    from transformers import AutoModelForCausalLM, LlamaConfig

    from runtime.huggingface.kv_cache import BatchCache

    config = LlamaConfig.from_pretrained(tiny_llm)
    config.layer_types = ["sliding_attention", "full_attention"]
    config.sliding_window = 8
    model = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    with pytest.raises(ValueError, match="DynamicLayer"):
        BatchCache(model)
