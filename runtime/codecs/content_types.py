"""MLServer's content-type rules: which codec decodes a request, and each of its inputs.

- An input is decoded by its own ``parameters.content_type``, else by the one its declared tensor
  (the model's metadata) gives, else by the caller's default codec (none: it stays as it came).
- A request is decoded by its own ``parameters.content_type``, else by the model's default
  content type (``parameters.content_type`` in model-settings.json, or what the model's runtime
  sets, e.g. ``pd`` for an MLflow model with a column signature), else by the caller's default
  codec (none: the request stays as it came). An unknown content type leaves it as it came too,
  as MLServer does.
- Input-level content types win inside a request codec: ``pd`` decodes each column by its own
  rule, and a single-input codec (``np``, ``str``) whose one input says another content type
  decodes that input by it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runtime.codecs.interfaces import InputCodec, RequestCodec
from runtime.codecs.lookup import find_input_codec, find_request_codec
from runtime.codecs.pandas import PandasCodec, column_content_type
from runtime.types import InferenceRequest, MetadataTensor, RequestInput


def input_codec(
    request_input: RequestInput,
    declared: Mapping[str, MetadataTensor] | None = None,
    default_codec: type[InputCodec] | None = None,
) -> type[InputCodec] | None:
    """The codec that decodes ``request_input`` (see the module docstring)."""
    content_type = column_content_type(request_input, declared)
    if content_type is not None:
        return find_input_codec(content_type=content_type)
    return default_codec


def request_content_type(request: InferenceRequest, model_content_type: str | None = None) -> str | None:
    """The content type a request is decoded by: its own, else the model's default."""
    if request.parameters is not None and request.parameters.content_type:
        return request.parameters.content_type
    return model_content_type


def decode_inference_request(
    request: InferenceRequest,
    model_content_type: str | None = None,
    declared: Mapping[str, MetadataTensor] | None = None,
    default_codec: type[RequestCodec] | None = None,
) -> Any:
    """The Python value a request stands for, by the rules of the module docstring."""
    content_type = request_content_type(request, model_content_type)
    codec = find_request_codec(content_type=content_type) if content_type else default_codec
    if codec is None:
        return request
    if codec is PandasCodec:
        return PandasCodec.decode_request(request, inputs=declared)
    if len(request.inputs) == 1:
        own = column_content_type(request.inputs[0], declared)
        if own is not None and own != codec.ContentType:
            single = find_input_codec(content_type=own)
            if single is not None:
                return single.decode_input(request.inputs[0])
    return codec.decode_request(request)
