"""Loading a folder written by ``save_pretrained``: the model on its device, in its dtype, and its tokenizer.

Nothing is downloaded: the folders are local (``HF_HUB_OFFLINE`` is set for the call), and a
folder that is not a complete checkpoint fails the load with transformers' own reason.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from runtime.huggingface.hf_settings import HuggingFaceConfig


@dataclass
class Loaded:
    model: Any
    tokenizer: PreTrainedTokenizerBase
    device: torch.device


def resolve_device(name: str) -> torch.device:
    """``auto`` → the first CUDA device when torch sees one, else the CPU; CUDA must be present if asked."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} was asked for but torch sees no CUDA device")
    return device


def load(config: HuggingFaceConfig) -> Loaded:
    """The model and tokenizer that ``config`` names (blocking: run it off the event loop)."""
    options = config.options
    device = resolve_device(str(options.device))
    dtype: Any = options.dtype or ("float32" if device.type == "cpu" else "auto")
    if dtype != "auto":
        dtype = getattr(torch, dtype)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    tokenizer = AutoTokenizer.from_pretrained(str(config.tokenizer_path), local_files_only=True)
    if options.chat_template is not None:
        tokenizer.chat_template = options.chat_template
    factory = AutoModelForCausalLM if options.task == "text-generation" else AutoModel
    model: Any = factory.from_pretrained(str(config.path), dtype=dtype, local_files_only=True)
    model.to(device)
    model.eval()
    return Loaded(model=model, tokenizer=tokenizer, device=device)
