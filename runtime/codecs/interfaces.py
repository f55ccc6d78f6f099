"""The two codec interfaces of MLServer's model API: one tensor, or a whole request."""

from __future__ import annotations

from typing import Any, ClassVar, TypeVar

import numpy as np

from runtime.types import InferenceRequest, InferenceResponse, Parameters, RequestInput, ResponseOutput

Tensor = TypeVar("Tensor", RequestInput, ResponseOutput)


def make_tensor(kind: type[Tensor], name: str, array: np.ndarray, datatype: str, content_type: str) -> Tensor:
    """A request input or response output holding ``array``, tagged with the codec's content type."""
    return kind(
        name=name,
        shape=list(array.shape),
        datatype=datatype,
        parameters=Parameters(content_type=content_type),
        data=array,
    )


class InputCodec:
    """Turns one tensor into a Python value and back."""

    ContentType: ClassVar[str] = ""
    TypeHint: ClassVar[Any] = type(None)

    @classmethod
    def can_encode(cls, payload: Any) -> bool:
        return False

    @classmethod
    def encode_output(cls, name: str, payload: Any, **kwargs: Any) -> ResponseOutput:
        raise TypeError(f"{cls.__name__} cannot encode outputs")

    @classmethod
    def decode_output(cls, response_output: ResponseOutput) -> Any:
        raise TypeError(f"{cls.__name__} cannot decode outputs")

    @classmethod
    def encode_input(cls, name: str, payload: Any, **kwargs: Any) -> RequestInput:
        raise TypeError(f"{cls.__name__} cannot encode inputs")

    @classmethod
    def decode_input(cls, request_input: RequestInput) -> Any:
        raise TypeError(f"{cls.__name__} cannot decode inputs")


class RequestCodec:
    """Turns a whole request into a Python value, and a value into a whole response."""

    ContentType: ClassVar[str] = ""
    TypeHint: ClassVar[Any] = type(None)

    @classmethod
    def can_encode(cls, payload: Any) -> bool:
        return False

    @classmethod
    def encode_response(
        cls, model_name: str, payload: Any, model_version: str | None = None, **kwargs: Any
    ) -> InferenceResponse:
        raise TypeError(f"{cls.__name__} cannot encode responses")

    @classmethod
    def decode_response(cls, response: InferenceResponse) -> Any:
        raise TypeError(f"{cls.__name__} cannot decode responses")

    @classmethod
    def encode_request(cls, payload: Any, **kwargs: Any) -> InferenceRequest:
        raise TypeError(f"{cls.__name__} cannot encode requests")

    @classmethod
    def decode_request(cls, request: InferenceRequest) -> Any:
        raise TypeError(f"{cls.__name__} cannot decode requests")
