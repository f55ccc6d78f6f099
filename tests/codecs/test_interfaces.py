"""runtime.codecs for code written against MLServer's codec API: a user's own codec that implements
only some directions, lookup that prefers a user's codecs, and decode_args' refusals."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from runtime.codecs import InputCodec, NumpyCodec, RequestCodec, decode_args
from runtime.codecs.lookup import find_input_codec, find_request_codec
from runtime.errors import InvalidInput
from runtime.types import Datatype, InferenceRequest, InferenceResponse, RequestInput, ResponseOutput


class UpperCodec(InputCodec):
    """Decodes a BYTES input to upper-case text and nothing else."""

    ContentType = "upper"

    @classmethod
    def decode_input(cls, request_input: RequestInput) -> list[str]:
        return [bytes(item).decode().upper() for item in request_input.data]


class CountRequestCodec(RequestCodec):
    """Decodes a request to its number of inputs and nothing else."""

    ContentType = "count"

    @classmethod
    def decode_request(cls, request: InferenceRequest) -> int:
        return len(request.inputs)


def test_a_codec_refuses_the_directions_it_does_not_implement() -> None:
    inp = RequestInput(name="t", shape=[1], datatype=Datatype.BYTES, data=[b"hi"])
    assert UpperCodec.decode_input(inp) == ["HI"]
    assert UpperCodec.can_encode("hi") is False
    out = ResponseOutput(name="t", shape=[1], datatype=Datatype.BYTES, data=[b"hi"])
    with pytest.raises(TypeError, match="UpperCodec cannot encode outputs"):
        UpperCodec.encode_output("t", ["hi"])
    with pytest.raises(TypeError, match="UpperCodec cannot decode outputs"):
        UpperCodec.decode_output(out)
    with pytest.raises(TypeError, match="UpperCodec cannot encode inputs"):
        UpperCodec.encode_input("t", ["hi"])


def test_a_request_codec_refuses_the_directions_it_does_not_implement() -> None:
    request = InferenceRequest(inputs=[RequestInput(name="t", shape=[1], datatype=Datatype.INT32, data=[1])])
    assert CountRequestCodec.decode_request(request) == 1
    assert CountRequestCodec.can_encode(1) is False
    with pytest.raises(TypeError, match="CountRequestCodec cannot encode responses"):
        CountRequestCodec.encode_response("m", 1)
    with pytest.raises(TypeError, match="CountRequestCodec cannot decode responses"):
        CountRequestCodec.decode_response(InferenceResponse(model_name="m", outputs=[]))
    with pytest.raises(TypeError, match="CountRequestCodec cannot encode requests"):
        CountRequestCodec.encode_request(1)


def test_lookup_finds_a_users_codecs_by_content_type_and_nothing_for_nothing() -> None:
    assert find_input_codec("upper", extra=[UpperCodec]) is UpperCodec
    assert find_request_codec("count", extra=[CountRequestCodec]) is CountRequestCodec
    assert find_input_codec("upper") is None
    assert find_input_codec() is None
    assert find_request_codec() is None
    assert find_input_codec(payload=np.zeros(2)) is NumpyCodec


def test_decode_args_refuses_an_argument_it_has_no_codec_for() -> None:
    with pytest.raises(TypeError, match="no codec for argument 'x'"):

        @decode_args
        async def predict(self: Any, x: dict[str, int]) -> np.ndarray:  # pragma: no cover - never called
            return np.zeros(1)


class _Model:
    name = "m"
    version = None


@pytest.mark.anyio
async def test_decode_args_needs_every_argument_without_a_default() -> None:
    @decode_args
    async def predict(self: Any, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        total: np.ndarray = x + y
        return total

    request = InferenceRequest(inputs=[RequestInput(name="x", shape=[1], datatype=Datatype.INT32, data=[1])])
    with pytest.raises(InvalidInput, match="Missing input 'y'"):
        await predict(_Model(), request)


@pytest.mark.anyio
async def test_decode_args_names_a_result_it_cannot_encode() -> None:
    @decode_args
    async def predict(self: Any, x: np.ndarray) -> Any:
        return {"not": "a tensor"}

    request = InferenceRequest(inputs=[RequestInput(name="x", shape=[1], datatype=Datatype.INT32, data=[1])])
    with pytest.raises(TypeError, match="no codec can encode a dict"):
        await predict(_Model(), request)
