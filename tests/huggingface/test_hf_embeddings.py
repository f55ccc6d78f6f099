"""Embeddings without a server (``runtime.huggingface.hf_embeddings``): the texts read, pooled by
each rule with the tiny model (a real transformers model made at test time), and the answer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from runtime.errors import InvalidInput
from runtime.huggingface.hf_embeddings import embed, embeddings_response, texts_of
from runtime.huggingface.hf_settings import HuggingFaceSettings
from runtime.tensors import output_array
from runtime.types import Datatype, InferenceRequest, RequestInput


@pytest.fixture(scope="module")
def parts(tiny_llm: Path) -> tuple[Any, Any]:
    from transformers import AutoModel, AutoTokenizer

    return AutoModel.from_pretrained(tiny_llm), AutoTokenizer.from_pretrained(tiny_llm)


def test_the_texts_are_read_from_the_named_input() -> None:
    request = InferenceRequest(
        inputs=[RequestInput(name="text_input", shape=[2], datatype=Datatype.BYTES, data=[b"a", b"b"])]
    )
    assert texts_of(request, "text_input", "e") == ["a", "b"]
    with pytest.raises(InvalidInput, match="'texts'"):
        texts_of(request, "texts", "e")


@pytest.mark.parametrize("pooling", ["mean", "cls", "last"])
def test_one_vector_per_text_by_each_pooling(parts: tuple[Any, Any], pooling: str) -> None:
    model, tokenizer = parts
    options = HuggingFaceSettings(pooling=pooling, normalize=True)
    vectors, tokens = embed(model, tokenizer, "cpu", options, 64, ["the cat", "a dog runs over the river"])
    assert vectors.dtype == np.float32 and vectors.shape == (2, model.config.hidden_size)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert tokens == len(tokenizer("the cat")["input_ids"]) + len(
        tokenizer("a dog runs over the river")["input_ids"]
    )
    alone, _ = embed(model, tokenizer, "cpu", options, 64, ["the cat"])
    assert np.allclose(alone[0], vectors[0], atol=1e-4)  # padding does not change a text's vector


def test_the_answer_is_fp32_embedding_with_the_tokens() -> None:
    vectors = np.ones((2, 3), dtype=np.float32)
    response = embeddings_response("e", vectors, 7)
    assert response.outputs[0].name == "embedding" and response.outputs[0].datatype == "FP32"
    assert output_array(response.outputs[0]).tolist() == vectors.tolist()
    assert response.parameters is not None and response.parameters.model_extra == {"prompt_tokens": 7}
