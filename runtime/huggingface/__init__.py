"""Hugging Face models (a folder written by ``save_pretrained``): text generation on the continuous batcher, embeddings."""

from runtime.huggingface.hf_model import HuggingFaceModel

__all__ = ["HuggingFaceModel"]
