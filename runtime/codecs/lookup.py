"""Finding a codec by content type, by payload or by type hint, over a fixed, immutable set.

There is no mutable global registry: a model that needs another codec passes it explicitly
(``default_codec=``) or lists it in its own ``codecs`` attribute.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

from runtime.codecs.datetime import DatetimeCodec
from runtime.codecs.interfaces import InputCodec, RequestCodec
from runtime.codecs.numpy import NumpyCodec, NumpyRequestCodec
from runtime.codecs.pandas import PandasCodec
from runtime.codecs.string import Base64Codec, StringCodec, StringRequestCodec

INPUT_CODECS: tuple[type[InputCodec], ...] = (NumpyCodec, StringCodec, Base64Codec, DatetimeCodec)
REQUEST_CODECS: tuple[type[RequestCodec], ...] = (NumpyRequestCodec, StringRequestCodec, PandasCodec)

_Codec = TypeVar("_Codec", type[InputCodec], type[RequestCodec])


def _find(
    codecs: tuple[_Codec, ...], content_type: str | None, payload: Any, type_hint: Any
) -> _Codec | None:
    if content_type is not None:
        return next((c for c in codecs if c.ContentType == content_type), None)
    if type_hint is not None:
        return next((c for c in codecs if c.TypeHint == type_hint), None)
    if payload is not None:
        return next((c for c in codecs if c.can_encode(payload)), None)
    return None


def find_input_codec(
    content_type: str | None = None,
    payload: Any = None,
    type_hint: Any = None,
    extra: Iterable[type[InputCodec]] = (),
) -> type[InputCodec] | None:
    """An input codec by content type, else by type hint, else by what can encode ``payload``."""
    return _find((*extra, *INPUT_CODECS), content_type, payload, type_hint)


def find_request_codec(
    content_type: str | None = None,
    payload: Any = None,
    type_hint: Any = None,
    extra: Iterable[type[RequestCodec]] = (),
) -> type[RequestCodec] | None:
    """A request codec by content type, else by type hint, else by what can encode ``payload``."""
    return _find((*extra, *REQUEST_CODECS), content_type, payload, type_hint)
