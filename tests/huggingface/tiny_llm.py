"""A tiny Llama-style language model and its tokenizer, made at test time (nothing is downloaded).

The tokenizer is a byte-level BPE trained with the ``tokenizers`` library on generated text,
wrapped as a ``PreTrainedTokenizerFast`` with a chat template and an end-of-sequence token; the
model is a randomly initialised ``LlamaConfig`` (hidden size 64, 2 layers) saved with
``save_pretrained`` as safetensors beside it.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

WORDS = (
    "the a cat dog runs jumps over under quick lazy fox river mountain blue red green sings reads "
    "writes code model server token stream batch"
).split()

CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant:{% endif %}"
)

CONTEXT = 256


def sentences(count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 16))) + "." for _ in range(count)]


def build(folder: Path, hidden: int = 64, layers: int = 2, vocabulary: int = 300, seed: int = 0) -> Path:
    """Write the model and tokenizer into ``folder``; returns it."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocabulary,
        special_tokens=["<unk>", "<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    corpus = sentences(2000, seed)
    if vocabulary > 300:  # a larger vocabulary needs more words than WORDS: made-up ones
        rng = random.Random(seed)
        syllables = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
        made_up = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(3000)]
        corpus += [" ".join(rng.choice(made_up) for _ in range(12)) for _ in range(3000)]
    bpe.train_from_iterator(corpus, trainer)
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=CONTEXT,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        initializer_range=0.2,  # peaked logits: greedy choices are clear-cut
    )
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(folder, safe_serialization=True)
    return folder


_LOADED: dict[Path, Any] = {}


def reference(folder: Path, prompt: str | list[int], max_new_tokens: int) -> list[int]:
    """The tokens ``model.generate(do_sample=False)`` gives ``prompt`` alone (float32, CPU)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if folder not in _LOADED:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        model.eval()  # type: ignore[no-untyped-call]
        _LOADED[folder] = (model, AutoTokenizer.from_pretrained(folder))
    model, tokenizer = _LOADED[folder]
    ids = prompt if isinstance(prompt, list) else tokenizer(prompt)["input_ids"]
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            do_sample=False,
            max_new_tokens=max_new_tokens,
        )
    tokens: list[int] = out[0, len(ids) :].tolist()
    return tokens


def tokenize(folder: Path, text: str) -> list[int]:
    from transformers import AutoTokenizer

    ids: list[int] = AutoTokenizer.from_pretrained(folder)(text)["input_ids"]
    return ids
