"""Dates and times carried in BYTES tensors as ISO 8601 text ("datetime"), MLServer's DatetimeCodec."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from runtime.codecs.interfaces import InputCodec, make_tensor
from runtime.codecs.string import bytes_column, bytes_elements
from runtime.errors import InvalidInput
from runtime.types import RequestInput, ResponseOutput


def _iso(item: Any) -> bytes:
    if isinstance(item, bytes):
        return item
    if isinstance(item, str):  # already ISO text, as MLServer takes it
        return item.encode("ascii")
    if isinstance(item, datetime):
        return item.isoformat().encode("ascii")
    raise TypeError(f"DatetimeCodec encodes datetimes or ISO 8601 strings, not {type(item).__name__}")


def _parse(name: str, item: bytes) -> datetime:
    try:
        return datetime.fromisoformat(item.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise InvalidInput(
            f"Tensor {name!r} holds {item[:64]!r}, which is not an ISO 8601 date and time"
        ) from None


class DatetimeCodec(InputCodec):
    """A BYTES tensor of ISO 8601 texts as a list of ``datetime`` (shape ``[n, 1]`` when encoding)."""

    ContentType = "datetime"
    TypeHint = list[datetime]

    @classmethod
    def can_encode(cls, payload: Any) -> bool:
        return isinstance(payload, list) and bool(payload) and all(isinstance(i, datetime) for i in payload)

    @classmethod
    def encode_output(cls, name: str, payload: list[Any], **kwargs: Any) -> ResponseOutput:
        return make_tensor(
            ResponseOutput, name, bytes_column([_iso(i) for i in payload]), "BYTES", cls.ContentType
        )

    @classmethod
    def decode_output(cls, response_output: ResponseOutput) -> list[datetime]:
        return [_parse(response_output.name, item) for item in bytes_elements(response_output)]

    @classmethod
    def encode_input(cls, name: str, payload: list[Any], **kwargs: Any) -> RequestInput:
        return make_tensor(
            RequestInput, name, bytes_column([_iso(i) for i in payload]), "BYTES", cls.ContentType
        )

    @classmethod
    def decode_input(cls, request_input: RequestInput) -> list[datetime]:
        return [_parse(request_input.name, item) for item in bytes_elements(request_input)]
