"""Finding a codec (``runtime.codecs.lookup``): by content type, else type hint, else payload; a
model's own codecs first."""

from __future__ import annotations

from typing import Any

import numpy as np

from runtime.codecs.datetime import DatetimeCodec
from runtime.codecs.interfaces import InputCodec
from runtime.codecs.lookup import INPUT_CODECS, find_input_codec, find_request_codec
from runtime.codecs.numpy import NumpyCodec, NumpyRequestCodec
from runtime.codecs.string import Base64Codec, StringCodec, StringRequestCodec


class Pandas(InputCodec):
    ContentType = "pd"
    TypeHint = dict[str, Any]

    @classmethod
    def can_encode(cls, payload: Any) -> bool:
        return isinstance(payload, dict)


class OwnStrings(StringCodec):
    """A model's own codec for the content type of a built-in one."""


def test_a_type_hint_finds_the_codec_of_that_type() -> None:
    assert find_input_codec(type_hint=np.ndarray) is NumpyCodec
    assert find_input_codec(type_hint=list[str]) is StringCodec
    assert find_input_codec(type_hint=list[bytes]) is Base64Codec
    assert find_input_codec(type_hint=int) is None
    assert find_request_codec(type_hint=list[str]) is StringRequestCodec


def test_the_content_type_decides_before_the_payload() -> None:
    assert find_input_codec(content_type="str", payload=np.zeros(1)) is StringCodec
    assert find_request_codec(payload=np.zeros(1)) is NumpyRequestCodec
    assert find_request_codec(payload=["a"]) is StringRequestCodec
    assert find_input_codec() is None and find_input_codec(payload=3) is None


def test_a_models_own_codecs_come_first_and_the_set_stays_fixed() -> None:
    assert find_input_codec(content_type="pd") is None
    assert find_input_codec(content_type="pd", extra=[Pandas]) is Pandas
    assert find_input_codec(payload={"a": 1}, extra=[Pandas]) is Pandas
    assert find_input_codec(content_type="str", extra=[OwnStrings]) is OwnStrings
    assert INPUT_CODECS == (NumpyCodec, StringCodec, Base64Codec, DatetimeCodec)
