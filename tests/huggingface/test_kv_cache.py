"""The batched KV cache alone: prompts of different lengths prefilled together, streams decoded
together, one joining late, one sitting steps out and coming back, one freed mid-way; every
stream's greedy tokens are ``generate``'s alone."""

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
            joining = [i for i in active if not sequences[i].length]
            if joining:
                logits = cache.prefill([sequences[i] for i in joining], [prompts[i] for i in joining])
                rows.update({i: logits[j] for j, i in enumerate(joining)})
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


def test_prompts_of_different_lengths_prefilled_together_compute_what_each_would_alone(
    tiny_llm: Path,
) -> None:
    from runtime.huggingface.kv_cache import BatchCache, Sequence

    model = _model(tiny_llm)
    prompts = [tokenize(tiny_llm, text) for text in sentences(6, seed=11)]
    lengths = sorted({len(p) for p in prompts})
    assert len(lengths) >= 3, lengths  # real padding: the rows are of different lengths
    steps = 12
    with torch.inference_mode():
        alone = []
        for prompt in prompts:
            single = BatchCache(model)
            sequence = Sequence()
            alone.append((single.prefill([sequence], [prompt])[0], sequence.kv))
        cache = BatchCache(model)
        sequences = [Sequence() for _ in prompts]
        logits = cache.prefill(sequences, prompts)
        assert logits.shape == (len(prompts), model.config.vocab_size)
        for row, (prompt, sequence) in enumerate(zip(prompts, sequences, strict=True)):
            own_logits, own_kv = alone[row]
            torch.testing.assert_close(logits[row], own_logits, rtol=1e-4, atol=1e-4)
            assert sequence.length == len(prompt) and sequence.kv is not None and own_kv is not None
            for (keys, values), (own_keys, own_values) in zip(sequence.kv, own_kv, strict=True):
                assert keys.shape == own_keys.shape == (1, own_keys.shape[1], len(prompt), own_keys.shape[3])
                torch.testing.assert_close(keys, own_keys, rtol=1e-4, atol=1e-4)
                torch.testing.assert_close(values, own_values, rtol=1e-4, atol=1e-4)
        tokens = [[int(row.argmax())] for row in logits]
        for _ in range(steps - 1):
            logits = cache.decode(sequences, [t[-1] for t in tokens])
            for row, t in enumerate(tokens):
                t.append(int(logits[row].argmax()))
    assert tokens == [reference(tiny_llm, p, steps) for p in prompts]


def test_a_model_whose_layers_do_not_all_attend_to_everything_is_refused(tiny_llm: Path) -> None:
    from transformers import AutoModelForCausalLM, LlamaConfig

    from runtime.huggingface.kv_cache import BatchCache

    config = LlamaConfig.from_pretrained(tiny_llm)
    config.layer_types = ["sliding_attention", "full_attention"]
    config.sliding_window = 8
    model = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    with pytest.raises(ValueError, match="DynamicLayer"):
        BatchCache(model)
