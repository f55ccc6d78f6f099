"""Settings of the Hugging Face runtime, read from model-settings.json as MLServer writes them.

MLServer's Hugging Face runtime is configured by ``parameters.extra``: ``task``,
``pretrained_model`` (a local folder here: nothing is downloaded), ``pretrained_tokenizer``,
``device`` and so on; a model-settings.json written for it is served unchanged. The keys this
runtime reads are described by :class:`HuggingFaceSettings`; MLServer's other keys
(``framework``, ``optimum_model``, ``batch_size``...) are accepted and ignored, and any key
neither knows fails the load, so that a misspelt setting is not silently ignored. The model's
folder is ``parameters.extra.pretrained_model``, else ``parameters.uri``, else the folder of
model-settings.json. This module does not import torch nor transformers.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from runtime.field_docs import documented
from runtime.settings import ModelSettings

Task = Literal["text-generation", "feature-extraction"]
"""What the model does: generate text (served with continuous batching) or embed it."""

FloatDtype = Literal["auto", "float32", "float16", "bfloat16"]

Pooling = Literal["mean", "cls", "last"]

DEFAULT_STREAMS = 16
"""Streams generated together when the settings leave ``max_batch_size`` unset (MLServer's
settings, whose default is no batching)."""

_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")

MLSERVER_KEYS = frozenset(
    {
        "framework",
        "optimum_model",
        "batch_size",
        "inter_op_threads",
        "model_kwargs",
        "pipeline_kwargs",
        "tokenizer_kwargs",
        "config_kwargs",
        "compile",
    }
)
"""Keys of MLServer's Hugging Face settings that this runtime accepts and does not use."""


@documented
class HuggingFaceSettings(BaseModel):
    """The Hugging Face runtime's settings: ``parameters.extra`` in model-settings.json."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    task: Task = "text-generation"
    """``text-generation`` (a causal language model, served with continuous batching: OIP
    generate, ``infer``, gRPC streams and the OpenAI completions and chat routes) or
    ``feature-extraction`` (embeddings: OIP ``infer`` and the OpenAI embeddings route)."""

    pretrained_model: str | None = None
    """The folder ``save_pretrained`` wrote (config, weights, tokenizer files), relative to the
    model's folder; by default ``parameters.uri``, else the model's folder itself."""

    pretrained_tokenizer: str | None = None
    """A folder with the tokenizer's files, when they are not beside the weights."""

    device: str | int = "auto"
    """Where the model runs: ``auto`` (the first CUDA device when torch sees one, else the CPU),
    ``cpu``, ``cuda`` or ``cuda:N``; MLServer's integers are read too (-1: the CPU, N: ``cuda:N``)."""

    dtype: FloatDtype | None = None
    """Floating-point dtype of the weights. None: ``float32`` on the CPU, the checkpoint's own
    dtype on a GPU (``auto``)."""

    intra_op_threads: int | None = Field(default=None, ge=1)
    """torch's intra-op CPU threads for this model's forward calls (MLServer's name). None: 1 when
    the model runs on the CPU (a small model is fastest on one thread on a busy machine); give
    more for a large model on a CPU of its own."""

    max_model_len: int | None = Field(default=None, ge=1)
    """The context length: the most tokens of prompt plus generated text. None: the model's
    ``max_position_embeddings``."""

    max_tokens: int | None = Field(default=None, ge=1)
    """Tokens generated for a request that names no ``max_tokens``. None: up to the context length
    (the OpenAI completions route sends OpenAI's default, 16)."""

    chat_template: str | None = None
    """A Jinja chat template that replaces the tokenizer's own (the OpenAI chat route and
    requests with ``messages``)."""

    pooling: Pooling = "mean"
    """feature-extraction: how a text's token vectors become one embedding: ``mean`` over its
    tokens (the attention mask), the first token's (``cls``) or the last one's (``last``)."""

    normalize: bool = False
    """feature-extraction: scale each embedding to unit length (L2)."""

    @field_validator("device")
    @classmethod
    def _device(cls, value: str | int) -> str:
        if isinstance(value, int):
            return "cpu" if value < 0 else f"cuda:{value}"
        if not _DEVICE.match(value):
            raise ValueError(f"must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {value!r}")
        return value


class HuggingFaceConfig(BaseModel):
    """Everything the runtime reads from a model's settings, checked."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    path: Path
    tokenizer_path: Path
    options: HuggingFaceSettings


def read_config(settings: ModelSettings) -> HuggingFaceConfig:
    """The runtime's configuration from a model's settings; ValueError saying what is wrong."""
    parameters = settings.parameters
    given: dict[str, Any] = dict(parameters.extra) if parameters is not None else {}
    given = {key: value for key, value in given.items() if key not in MLSERVER_KEYS}
    try:
        options = HuggingFaceSettings.model_validate(given)
    except ValidationError as exc:
        raise ValueError("invalid Hugging Face settings in parameters.extra: " + _summary(exc)) from None
    uri = parameters.uri if parameters is not None else None
    where = options.pretrained_model or uri
    path = _resolve(where, settings.folder)
    if path is None:
        raise ValueError(
            "the Hugging Face runtime needs the model's folder: parameters.extra.pretrained_model "
            "or parameters.uri (a folder written by save_pretrained)"
        )
    if not (path / "config.json").is_file():
        raise ValueError(f"{path} is not a folder written by save_pretrained: it has no config.json")
    tokenizer = (
        _resolve(options.pretrained_tokenizer, settings.folder) if options.pretrained_tokenizer else None
    )
    return HuggingFaceConfig(path=path, tokenizer_path=tokenizer or path, options=options)


def _resolve(where: str | None, folder: Path | None) -> Path | None:
    if where is None:
        return folder
    path = Path(where)
    if not path.is_absolute() and folder is not None:
        path = folder / path
    return path


def _summary(exc: ValidationError) -> str:
    problems = []
    for error in exc.errors(include_url=False, include_context=False, include_input=False):
        where = ".".join(str(part) for part in error["loc"]) or "extra"
        problems.append(f"{where}: {error['msg']}")
    return "; ".join(problems)
