"""Strings and base64 payloads carried in BYTES tensors ("str", "base64")."""

from __future__ import annotations

import base64
import binascii
from typing import Any

import numpy as np

from runtime.codecs.interfaces import InputCodec, RequestCodec, make_tensor
from runtime.errors import InvalidInput
from runtime.tensors import input_array, output_array
from runtime.types import (
    InferenceRequest,
    InferenceResponse,
    Parameters,
    RequestInput,
    ResponseOutput,
)


def bytes_elements(tensor: RequestInput | ResponseOutput) -> list[bytes]:
    data = tensor.data
    if isinstance(data, np.ndarray) and data.dtype == object:
        arr = data
    elif isinstance(tensor, RequestInput):
        arr = input_array(tensor)
    else:
        arr = output_array(tensor)
    return [item if isinstance(item, bytes) else str(item).encode("utf-8") for item in arr.reshape(-1)]


def bytes_column(items: list[bytes]) -> np.ndarray:
    arr = np.empty((len(items), 1), dtype=object)
    arr[:, 0] = items
    return arr


def _str_bytes(item: Any) -> bytes:
    return item if isinstance(item, bytes) else str(item).encode("utf-8")


class StringCodec(InputCodec):
    """A BYTES tensor as a list of UTF-8 strings (shape ``[n, 1]`` when encoding)."""

    ContentType = "str"
    TypeHint = list[str]

    @classmethod
    def can_encode(cls, payload: Any) -> bool:
        return isinstance(payload, list) and all(isinstance(item, str) for item in payload)

    @classmethod
    def encode_output(
        cls, name: str, payload: list[str], use_bytes: bool = True, **kwargs: Any
    ) -> ResponseOutput:
        return make_tensor(
            ResponseOutput,
            name,
            bytes_column([_str_bytes(item) for item in payload]),
            "BYTES",
            cls.ContentType,
        )

    @classmethod
    def decode_output(cls, response_output: ResponseOutput) -> list[str]:
        return [item.decode("utf-8") for item in bytes_elements(response_output)]

    @classmethod
    def encode_input(
        cls, name: str, payload: list[str], use_bytes: bool = True, **kwargs: Any
    ) -> RequestInput:
        return make_tensor(
            RequestInput, name, bytes_column([_str_bytes(item) for item in payload]), "BYTES", cls.ContentType
        )

    @classmethod
    def decode_input(cls, request_input: RequestInput) -> list[str]:
        try:
            return [item.decode("utf-8") for item in bytes_elements(request_input)]
        except UnicodeDecodeError:
            raise InvalidInput(f"Input {request_input.name!r} is not valid UTF-8 text") from None


class Base64Codec(InputCodec):
    """A BYTES tensor whose elements are base64 text, as a list of the decoded ``bytes``."""

    ContentType = "base64"
    TypeHint = list[bytes]

    @classmethod
    def can_encode(cls, payload: Any) -> bool:
        return isinstance(payload, list) and all(isinstance(item, bytes) for item in payload)

    @classmethod
    def encode_output(
        cls, name: str, payload: list[bytes], use_bytes: bool = True, **kwargs: Any
    ) -> ResponseOutput:
        return make_tensor(
            ResponseOutput,
            name,
            bytes_column([base64.b64encode(item) for item in payload]),
            "BYTES",
            cls.ContentType,
        )

    @classmethod
    def decode_output(cls, response_output: ResponseOutput) -> list[bytes]:
        return [_b64decode(response_output.name, item) for item in bytes_elements(response_output)]

    @classmethod
    def encode_input(
        cls, name: str, payload: list[bytes], use_bytes: bool = True, **kwargs: Any
    ) -> RequestInput:
        return make_tensor(
            RequestInput,
            name,
            bytes_column([base64.b64encode(item) for item in payload]),
            "BYTES",
            cls.ContentType,
        )

    @classmethod
    def decode_input(cls, request_input: RequestInput) -> list[bytes]:
        return [_b64decode(request_input.name, item) for item in bytes_elements(request_input)]


def _b64decode(name: str, item: bytes) -> bytes:
    try:
        return base64.b64decode(item, validate=True)
    except binascii.Error:
        raise InvalidInput(f"Tensor {name!r} holds an element that is not valid base64") from None


class StringRequestCodec(RequestCodec):
    """A request of a single BYTES tensor as a list of strings."""

    ContentType = StringCodec.ContentType
    TypeHint = list[str]
    InputCodec = StringCodec

    @classmethod
    def can_encode(cls, payload: Any) -> bool:
        return StringCodec.can_encode(payload)

    @classmethod
    def encode_response(
        cls, model_name: str, payload: list[str], model_version: str | None = None, **kwargs: Any
    ) -> InferenceResponse:
        return InferenceResponse(
            model_name=model_name,
            model_version=model_version,
            parameters=Parameters(content_type=cls.ContentType),
            outputs=[StringCodec.encode_output("output-1", payload)],
        )

    @classmethod
    def decode_response(cls, response: InferenceResponse) -> list[str]:
        if len(response.outputs) != 1:
            raise InvalidInput(f"{cls.__name__} decodes responses of one output, got {len(response.outputs)}")
        return StringCodec.decode_output(response.outputs[0])

    @classmethod
    def encode_request(cls, payload: list[str], **kwargs: Any) -> InferenceRequest:
        return InferenceRequest(
            parameters=Parameters(content_type=cls.ContentType),
            inputs=[StringCodec.encode_input("input-1", payload)],
        )

    @classmethod
    def decode_request(cls, request: InferenceRequest) -> list[str]:
        if len(request.inputs) != 1:
            raise InvalidInput(f"{cls.__name__} decodes requests of one input, got {len(request.inputs)}")
        return StringCodec.decode_input(request.inputs[0])
