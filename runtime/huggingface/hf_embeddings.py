"""Embeddings (``feature-extraction``): texts in, one pooled vector per text out.

:func:`texts_of` reads the BYTES text input's N texts; :func:`embed` runs the model once over
them (padded, truncated to the context) and pools each text's last hidden state (``pooling``:
``mean`` over its tokens, ``cls`` its first token, ``last`` its last real token; ``normalize``
scales each vector to length 1); :func:`embeddings_response` answers the FP32 ``embedding``
[N, hidden size] with the tokens read as ``prompt_tokens``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from runtime.errors import InvalidInput
from runtime.huggingface.hf_prompt import decoded
from runtime.huggingface.hf_settings import HuggingFaceSettings
from runtime.types import InferenceRequest, InferenceResponse, Parameters, ResponseOutput


def texts_of(payload: InferenceRequest, name: str, model: str) -> list[str]:
    """The texts to embed: every element of the BYTES input ``name``."""
    inp = next((i for i in payload.inputs if i.name == name), None)
    if inp is None:
        raise InvalidInput(f"Model {model!r} needs a BYTES input {name!r}: the texts to embed")
    texts = [decoded(item) for item in np.asarray(inp.data, dtype=object).reshape(-1)]
    if not texts:
        raise InvalidInput(f"Input {name!r} holds no text")
    return texts


def embed(
    model: Any, tokenizer: Any, device: Any, options: HuggingFaceSettings, context: int, texts: list[str]
) -> tuple[np.ndarray, int]:
    """The texts' pooled vectors (FP32, one row per text) and the tokens read: runs on the model's thread."""
    import torch

    with torch.inference_mode():
        encoded = tokenizer(texts, padding=True, truncation=True, max_length=context, return_tensors="pt").to(
            device
        )
        hidden = model(**encoded).last_hidden_state.float()
        mask = encoded["attention_mask"]
        if options.pooling == "mean":
            weights = mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1)
        elif options.pooling == "cls":
            pooled = hidden[:, 0]
        elif tokenizer.padding_side == "left":
            pooled = hidden[:, -1]
        else:  # the last real token of each row
            pooled = hidden[torch.arange(hidden.shape[0]), mask.sum(1) - 1]
        if options.normalize:
            pooled = torch.nn.functional.normalize(pooled, dim=-1)
    return pooled.cpu().numpy().astype(np.float32, copy=False), int(mask.sum())


def embeddings_response(model: str, vectors: np.ndarray, tokens: int) -> InferenceResponse:
    """The answer: the FP32 ``embedding`` output, and ``prompt_tokens`` as a parameter."""
    return InferenceResponse(
        model_name=model,
        parameters=Parameters(prompt_tokens=tokens),
        outputs=[ResponseOutput(name="embedding", shape=list(vectors.shape), datatype="FP32", data=vectors)],
    )
