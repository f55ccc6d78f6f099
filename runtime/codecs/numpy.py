"""numpy arrays: the codec most models use ("np")."""

from __future__ import annotations

from typing import Any

import numpy as np

from runtime.codecs.interfaces import InputCodec, RequestCodec, make_tensor
from runtime.errors import InvalidInput
from runtime.tensors import datatype_of, input_array, output_array
from runtime.types import InferenceRequest, InferenceResponse, Parameters, RequestInput, ResponseOutput


def _array(payload: Any) -> tuple[np.ndarray, str]:
    arr = np.asarray(payload)
    if arr.dtype.kind in "SU":
        arr = arr.astype(object)
    return arr, datatype_of(arr.dtype)


class NumpyCodec(InputCodec):
    """A tensor as a numpy array of its shape; BYTES tensors are object arrays of ``bytes``."""

    ContentType = "np"
    TypeHint = np.ndarray

    @classmethod
    def can_encode(cls, payload: Any) -> bool:
        return isinstance(payload, np.ndarray)

    @classmethod
    def encode_output(cls, name: str, payload: Any, **kwargs: Any) -> ResponseOutput:
        return make_tensor(ResponseOutput, name, *_array(payload), cls.ContentType)

    @classmethod
    def decode_output(cls, response_output: ResponseOutput) -> np.ndarray:
        return output_array(response_output).reshape(response_output.shape)

    @classmethod
    def encode_input(cls, name: str, payload: Any, **kwargs: Any) -> RequestInput:
        return make_tensor(RequestInput, name, *_array(payload), cls.ContentType)

    @classmethod
    def decode_input(cls, request_input: RequestInput) -> np.ndarray:
        data = request_input.data
        if isinstance(data, np.ndarray) and list(data.shape) == list(request_input.shape):
            return data
        return input_array(request_input)


class NumpyRequestCodec(RequestCodec):
    """A request of a single tensor as one numpy array."""

    ContentType = NumpyCodec.ContentType
    TypeHint = np.ndarray
    InputCodec = NumpyCodec

    @classmethod
    def can_encode(cls, payload: Any) -> bool:
        return isinstance(payload, np.ndarray)

    @classmethod
    def encode_response(
        cls, model_name: str, payload: Any, model_version: str | None = None, **kwargs: Any
    ) -> InferenceResponse:
        return InferenceResponse(
            model_name=model_name,
            model_version=model_version,
            parameters=Parameters(content_type=cls.ContentType),
            outputs=[NumpyCodec.encode_output("output-1", payload)],
        )

    @classmethod
    def decode_response(cls, response: InferenceResponse) -> np.ndarray:
        if len(response.outputs) != 1:
            raise InvalidInput(f"{cls.__name__} decodes responses of one output, got {len(response.outputs)}")
        return NumpyCodec.decode_output(response.outputs[0])

    @classmethod
    def encode_request(cls, payload: Any, **kwargs: Any) -> InferenceRequest:
        return InferenceRequest(
            parameters=Parameters(content_type=cls.ContentType),
            inputs=[NumpyCodec.encode_input("input-1", payload)],
        )

    @classmethod
    def decode_request(cls, request: InferenceRequest) -> np.ndarray:
        if len(request.inputs) != 1:
            raise InvalidInput(f"{cls.__name__} decodes requests of one input, got {len(request.inputs)}")
        return NumpyCodec.decode_input(request.inputs[0])
